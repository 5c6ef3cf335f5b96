"""Level 3's whole-network guard (plugins/torch/level3_guard.py): where level 3 kept a per-node kernel, optimize
times the whole level-3 module against level 2's lowering of the same graph and returns level 2's unless level 3
is faster by timing.KEEP_BELOW. The timers are faked here (timings are never asserted)."""
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("numba")

import aiacc  # noqa: E402
from aiacc.plugins.torch import level3_guard, numba_op  # noqa: E402
from tests.plugins.torch.test_numba_op import Net, _inputs  # noqa: E402


def _aiacc_ops(gm):
    """The calls of aiacc's registered torch custom ops (torch.ops.aiacc.*) in the exported graph."""
    return [n for n in gm.graph.nodes if n.op == "call_function"
            and getattr(n.target, "namespace", None) == "aiacc"]


@pytest.fixture
def kernels_win(monkeypatch, tmp_path):
    """Every per-node candidate timed 2x faster than level 2's ops (so level 3 keeps its numba kernels)."""
    monkeypatch.setenv("AIACC_CACHE_DIR", str(tmp_path))
    for env in (*level3_guard.FORCING, level3_guard.GUARD_ENV):
        monkeypatch.delenv(env, raising=False)
    monkeypatch.setattr(numba_op, "_time_pair", lambda f, u: (f(), u(), (1.0, 2.0))[2])


def _whole(monkeypatch, ms3, ms2):
    seen = []

    def timer(l3, l2, args, kwargs):
        seen.append((l3, l2))
        with torch.no_grad():
            l3(*args, **kwargs), l2(*args, **kwargs)
        return ms3, ms2
    monkeypatch.setattr(level3_guard, "TIMER", timer)
    return seen


def test_a_slower_level3_gives_level2s_lowering(monkeypatch, kernels_win):
    model, xs = Net().eval(), _inputs()
    l2 = aiacc.optimize(model, xs, level=2)
    seen = _whole(monkeypatch, 1.03, 1.0)
    m = aiacc.optimize(model, xs, level=3)
    assert len(seen) == 1 and _aiacc_ops(seen[0][0])  # level 3 had its kernel, and was timed
    assert not _aiacc_ops(m)
    with torch.no_grad():
        torch.testing.assert_close(m(*xs), l2(*xs), rtol=1e-5, atol=1e-5)
    notes = m.aiacc_report["elementwise_fusion"].notes
    assert any(n.startswith("level 3 as a whole: dropped: level 3 as a whole slower 1.03x of level 2")
               and n.endswith("level 2's lowering used") for n in notes), notes
    assert not any(": kept" in n for n in notes), notes


def test_a_level3_within_the_margin_is_dropped_too(monkeypatch, kernels_win):
    model, xs = Net().eval(), _inputs()
    _whole(monkeypatch, 0.97, 1.0)
    m = aiacc.optimize(model, xs, level=3)
    assert not _aiacc_ops(m)
    notes = m.aiacc_report["elementwise_fusion"].notes
    assert any("0.97x, not below 0.95x of level 2" in n for n in notes), notes


def test_a_faster_level3_is_kept(monkeypatch, kernels_win):
    model, xs = Net().eval(), _inputs()
    l2 = aiacc.optimize(model, xs, level=2)
    seen = _whole(monkeypatch, 0.88, 1.0)
    m = aiacc.optimize(model, xs, level=3)
    assert len(seen) == 1 and seen[0][0] is m and not _aiacc_ops(seen[0][1])  # level 2's twin: no custom op
    assert _aiacc_ops(m)
    with torch.no_grad():
        torch.testing.assert_close(m(*xs), l2(*xs), rtol=1e-5, atol=1e-5)
    notes = m.aiacc_report["elementwise_fusion"].notes
    assert any(n.startswith("level 3 as a whole: kept 0.88x of level 2") for n in notes), notes


@pytest.mark.parametrize("env", ["guard_off", "forced"])
def test_skipped_when_off_or_a_kernel_is_forced(monkeypatch, kernels_win, env):
    if env == "guard_off":
        monkeypatch.setenv(level3_guard.GUARD_ENV, "off")
    else:
        monkeypatch.setenv(numba_op.MODE_ENV, "numba")
    seen = _whole(monkeypatch, 2.0, 1.0)
    m = aiacc.optimize(Net().eval(), _inputs(), level=3)
    assert not seen and _aiacc_ops(m)
    assert not any("as a whole" in n for n in m.aiacc_report["elementwise_fusion"].notes)


def test_nothing_kept_is_not_timed(monkeypatch, kernels_win):
    monkeypatch.setattr(numba_op, "_time_pair", lambda f, u: (2.0, 1.0))
    seen = _whole(monkeypatch, 2.0, 1.0)
    m = aiacc.optimize(Net().eval(), _inputs(), level=3)
    assert not seen and not _aiacc_ops(m)
