"""backend='auto' (torch, inference): native or onnxruntime, measured at optimize time; an explicit backend wins.
No timing is asserted: the measurement is replaced where a test needs one outcome."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch.utils import _pytree as pytree

import aiacc
from aiacc.errors import AiaccNotice
from aiacc.plugins.torch import backend_choice
from tests.plugins.torch._helpers import assert_close_rel
from tests.zoo.torch_models import ZOO

pytest.importorskip("onnxruntime")


def _notes(fast):
    return [line for r in fast.aiacc_report.records for line in r.notes if "backend='auto'" in line]


def _auto_mlp():
    """The zoo MLP, its example inputs and its backend='auto' optimization (warnings silenced)."""
    model, inputs = ZOO["mlp"]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model, inputs, aiacc.optimize(model, inputs, backend="auto")


def _fresh(inputs):
    g = torch.Generator().manual_seed(1)
    return tuple(torch.randn(x.shape, generator=g) if x.is_floating_point() else x for x in inputs)


@pytest.mark.parametrize("winner", ["native", "onnxruntime"])
def test_auto_keeps_the_faster_and_says_so(monkeypatch, winner):
    """The measured faster backend is returned, equal to the original on an input it never saw, and the
    choice is in the report, on the module and in an AiaccNotice (strict accepts it)."""
    times = {"native": 10.0, "onnxruntime": 5.0} if winner == "onnxruntime" else {"native": 5.0, "onnxruntime": 10.0}
    seen = []

    def fake_measure(steps, **kw):
        seen.append(sorted(steps))
        for step in steps.values():  # both candidates really run on the example
            step()
        return dict(times)
    monkeypatch.setattr(backend_choice, "measure", fake_measure)
    model, inputs = ZOO["bert_encoder"]()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fast = aiacc.optimize(model, inputs, backend="auto", strict=True)
    assert seen == [["native", "onnxruntime"]], fast.aiacc_backend_choice.reason
    assert fast.aiacc_backend == winner
    assert isinstance(fast, backend_choice.ShapeDispatch if winner == "onnxruntime" else torch.fx.GraphModule), \
        fast.aiacc_backend_choice.reason
    if winner == "onnxruntime":
        assert type(fast.ort).__name__ == "OrtModule"
    assert fast.aiacc_backend_choice.ms == times
    notices = [w for w in caught if issubclass(w.category, AiaccNotice) and "backend='auto'" in str(w.message)]
    assert len(notices) == 1 and f"chose {winner}" in str(notices[0].message)
    assert len(_notes(fast)) == 1 and f"chose {winner}" in _notes(fast)[0]
    fresh = _fresh(inputs)
    with torch.no_grad():
        assert_close_rel(model(*fresh), fast(*fresh), 1e-4)


def test_auto_needs_a_clear_margin(monkeypatch):
    """onnxruntime within the margin of native (noise) leaves native."""
    monkeypatch.setattr(backend_choice, "measure", lambda steps, **kw: {"native": 10.0, "onnxruntime": 9.9})
    model, inputs, fast = _auto_mlp()
    assert fast.aiacc_backend == "native" and "not at least" in fast.aiacc_backend_choice.reason


def test_auto_falls_back_to_native_when_onnxruntime_differs(monkeypatch):
    """An onnxruntime module whose outputs differ from the original's is never chosen, however fast."""
    from aiacc.plugins.torch import ort

    real = ort.OrtModule.forward
    monkeypatch.setattr(ort.OrtModule, "forward",
                        lambda self, *a, **k: pytree.tree_map(lambda t: t + 1.0, real(self, *a, **k)))
    monkeypatch.setattr(backend_choice, "measure", lambda steps, **kw: {"native": 10.0, "onnxruntime": 1.0})
    model, inputs, fast = _auto_mlp()
    assert fast.aiacc_backend == "native"
    assert "differ" in fast.aiacc_backend_choice.reason
    with torch.no_grad():
        assert_close_rel(model(*inputs), fast(*inputs), 1e-4)


@pytest.mark.parametrize("backend,cls", [("native", torch.fx.GraphModule), ("onnxruntime", None)])
def test_explicit_backend_is_not_measured(monkeypatch, backend, cls):
    """backend='native'/'onnxruntime' is what runs: nothing is measured, nothing is said."""
    def refuse(steps, **kw):
        raise AssertionError("an explicit backend must not be measured")
    monkeypatch.setattr(backend_choice, "measure", refuse)
    model, inputs = ZOO["mlp"]()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fast = aiacc.optimize(model, inputs, backend=backend)
    assert isinstance(fast, cls) if cls else type(fast).__name__ == "OrtModule"
    assert not hasattr(fast, "aiacc_backend_choice")
    assert not [w for w in caught if "backend='auto'" in str(w.message)]


def test_auto_measures_for_real():
    """Unpatched: both candidates timed (positive medians) and the faster-by-margin rule applied."""
    model, inputs, fast = _auto_mlp()
    ms = fast.aiacc_backend_choice.ms
    assert set(ms) == {"native", "onnxruntime"} and min(ms.values()) > 0
    assert fast.aiacc_backend == ("onnxruntime" if ms["onnxruntime"] <= ms["native"] * backend_choice.MARGIN
                                  else "native")
    with torch.no_grad():
        assert_close_rel(model(*inputs), fast(*inputs), 1e-4)


def test_auto_onnxruntime_keeps_other_batch_sizes(monkeypatch):
    """onnxruntime's session is built for the example's shapes: another batch size runs natively, equal to
    the original, exactly as backend='native' would take it."""
    monkeypatch.setattr(backend_choice, "measure", lambda steps, **kw: {"native": 10.0, "onnxruntime": 1.0})
    model, inputs, fast = _auto_mlp()
    assert fast.aiacc_backend == "onnxruntime"
    calls = []
    fast.ort.register_forward_pre_hook(lambda m, a: calls.append("ort"))
    fast.native.register_forward_pre_hook(lambda m, a: calls.append("native"))
    with torch.no_grad():
        assert_close_rel(model(*inputs), fast(*inputs), 1e-4)
        bigger = tuple(torch.cat([x, x + 0.5]) for x in inputs)
        assert_close_rel(model(*bigger), fast(*bigger), 1e-4)
    assert calls == ["ort", "native"]
