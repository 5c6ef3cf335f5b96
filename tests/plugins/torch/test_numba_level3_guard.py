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
    return tmp_path


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


@pytest.mark.parametrize("ms3, want", [(1.2, "dropped: level 3 as a whole slower 1.20x of level 2"),
                                       (0.5, "kept 0.50x of level 2")])
def test_graph_note_for_inspect(monkeypatch, kernels_win, ms3, want):
    """graph_note (for `aiacc inspect --optimize --level 3`): an imported graph's level-3 and level-2 lowerings
    exported without an original module and timed on random inputs of its input shapes."""
    onnx = pytest.importorskip("onnx")
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from aiacc.cli import load_graph, optimize_graph

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Tanh", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["t"]),
             helper.make_node("Add", ["t", "c"], ["y"])]
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=[w])
    path = kernels_win / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    graph = load_graph(str(path))
    optimize_graph(graph, level=3)
    assert any(v.startswith("kept: numba") for v in numba_op.choose_fusions(graph).values())
    seen = _whole(monkeypatch, ms3, 1.0)
    note = level3_guard.graph_note(graph)
    assert note.startswith(want) and note.endswith("measured now)"), note
    (m3, m2), = seen
    x = torch.randn(1, 3, 16, 16)
    assert _aiacc_ops(m3) and not _aiacc_ops(m2)
    with torch.no_grad():
        torch.testing.assert_close(m3(x), m2(x), rtol=1e-5, atol=1e-5)
    monkeypatch.setenv(level3_guard.GUARD_ENV, "off")
    assert level3_guard.graph_note(graph) is None


@pytest.mark.parametrize("ms3", [0.88, 1.03])
def test_the_guarded_module_saves_and_nothing_stays_pending(monkeypatch, kernels_win, tmp_path, ms3):
    """The level-2 twin is kept beside the exported module (not on it), taken by the guard, and what optimize
    returns, either way, round-trips through torch.save."""
    model, xs = Net().eval(), _inputs()
    _whole(monkeypatch, ms3, 1.0)
    m = aiacc.optimize(model, xs, level=3)
    assert not level3_guard.pending(m)
    torch.save(m, tmp_path / "m.pt")
    loaded = torch.load(tmp_path / "m.pt", weights_only=False)
    with torch.no_grad():
        torch.testing.assert_close(loaded(*xs), m(*xs), rtol=1e-5, atol=1e-5)


def test_a_module_exported_outside_optimize_still_pickles(monkeypatch, kernels_win, tmp_path):
    import pickle

    from aiacc.core.passes import run_passes

    model, xs = Net().eval(), _inputs()
    graph = aiacc.trace(model, xs)
    run_passes(graph, level=3)
    gm = aiacc.export(graph, "torch", original=model)
    assert level3_guard.pending(gm)  # level 3 kept kernels: its level-2 twin waits beside it
    torch.save(gm, tmp_path / "gm.pt")  # a closure on the module would fail here
    assert pickle.loads(pickle.dumps(gm.aiacc_fused_elementwise)) == gm.aiacc_fused_elementwise
