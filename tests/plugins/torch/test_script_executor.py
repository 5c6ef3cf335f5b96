"""The TorchScript executor of torch inference exports (aiacc/plugins/torch/script_executor.py): chosen when
forced (AIACC_TORCHSCRIPT=on), off when told, outputs equal to the fx forward's and the original's, the call
signature and the ModelOutput kept, torch.save/load and deepcopy give a module with its own executor, value
guards still refuse, an in-place weight change is followed, and the report says which executor runs. No timing
is asserted."""
from __future__ import annotations

import copy
import inspect
import io
import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import aiacc  # noqa: E402
from aiacc.plugins.torch import script_executor  # noqa: E402
from tests.reach import _models as M  # noqa: E402


def _optimize(model, x):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return aiacc.optimize(model, x)


def _max_err(a, b) -> float:
    return max(float((p - q).detach().abs().max()) for p, q in zip(a.to_tuple(), b.to_tuple()))


def _executor_notes(fast) -> list[str]:
    return [line for r in fast.aiacc_report.records if r.name == "executor" for line in r.notes]


@pytest.fixture(scope="module")
def bert():
    model, x, fresh = M.hf_speed_model("bert", "small", seq=16)
    return model.eval(), x, fresh


def test_forced_executor_runs_equal_and_keeps_the_interface(bert, monkeypatch):
    model, x, fresh = bert
    monkeypatch.setenv(script_executor.ENV, "on")
    fast = _optimize(model, x)
    ex = script_executor.executor_of(fast)
    assert isinstance(ex, script_executor.ScriptExecutor) and ex.core is not None, _executor_notes(fast)
    assert any(n.startswith("TorchScript") for n in _executor_notes(fast))
    calls = []
    real = ex.core
    ex.core = lambda *a: calls.append(1) or real(*a)  # the core, not the fx forward, answers the call
    with torch.no_grad():
        want, got = model(**fresh), fast(**fresh)
        fx_out = ex.fx_forward(**fresh)
    ex.core = real
    assert calls and type(got) is type(want) and list(got.keys()) == list(want.keys())
    assert _max_err(want, got) <= 1e-4 and _max_err(fx_out, got) <= 1e-5
    # positional call: the same signature as the original's forward (and inspect.signature says fx's, not *args)
    assert inspect.signature(fast.forward) == inspect.signature(type(fast).forward.__get__(fast))
    assert list(inspect.signature(fast.forward).parameters)[:2] == ["input_ids", "attention_mask"]
    with torch.no_grad():
        assert _max_err(want, fast(fresh["input_ids"], fresh["attention_mask"])) <= 1e-4
    # a call with autograd on runs the fx forward (the core was traced without it)
    got_grad = fast(**fresh)
    assert _max_err(want, got_grad) <= 1e-4


def test_off_keeps_fx_and_says_so(bert, monkeypatch):
    model, x, _ = bert
    monkeypatch.setenv(script_executor.ENV, "off")
    fast = _optimize(model, x)
    assert script_executor.executor_of(fast) is None and "forward" not in fast.__dict__
    assert any("AIACC_TORCHSCRIPT=off" in n for n in _executor_notes(fast))


def test_bad_setting_is_an_error(bert, monkeypatch):
    model, x, _ = bert
    monkeypatch.setenv(script_executor.ENV, "sometimes")
    with pytest.raises(aiacc.AiaccError, match="AIACC_TORCHSCRIPT"):
        _optimize(model, x)


def test_save_load_and_deepcopy_trace_their_own_core(bert, monkeypatch):
    model, x, fresh = bert
    monkeypatch.setenv(script_executor.ENV, "on")
    fast = _optimize(model, x)
    buf = io.BytesIO()
    torch.save(fast, buf)
    buf.seek(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = torch.load(buf, weights_only=False)
    copied = copy.deepcopy(fast)
    with torch.no_grad():
        want = model(**fresh)
        for m in (loaded, copied):
            got = m(**fresh)
            ex = script_executor.executor_of(m)
            assert isinstance(ex, script_executor.ScriptExecutor) and ex.core is not None, ex and ex.failed
            assert ex._gm() is m  # its own module's tensors, not the source's
            assert type(got) is type(want) and _max_err(want, got) <= 1e-4
    # the executor's tensors are the module's own: a copy's parameters are not the original module's
    assert copied.embeddings.word_embeddings.weight.data_ptr() != fast.embeddings.word_embeddings.weight.data_ptr()


def test_value_guard_still_refuses(bert, monkeypatch):
    model, x, fresh = bert
    monkeypatch.setenv(script_executor.ENV, "on")
    fast = _optimize(model, x)
    bad = dict(fresh, input_ids=fresh["input_ids"].clone())
    bad["input_ids"][0, 3] = model.config.vocab_size + 5
    with torch.no_grad(), pytest.raises(aiacc.AiaccError, match="embedding"):
        fast(**bad)


def test_in_place_weight_change_is_followed(monkeypatch):
    model, x, fresh = M.hf_speed_model("distilbert", "small", seq=16)
    model.eval()
    monkeypatch.setenv(script_executor.ENV, "on")
    fast = _optimize(model, x)
    ex = script_executor.executor_of(fast)
    assert ex.core is not None
    originals = {t.data_ptr() for t in model.parameters()}
    w = next(t for t in list(fast.parameters()) + list(fast.buffers()) if t.data_ptr() in originals)
    with torch.no_grad():
        w.mul_(1.5)  # shared with the original: the original changes too
        got = fast(**fresh)
        want = model(**fresh)
    assert _max_err(want, got) <= 1e-4


def test_weights_not_held_twice(bert, monkeypatch):
    """The core is traced on the module's own tensors (no frozen constants): no parameter is copied."""
    model, x, _ = bert
    monkeypatch.setenv(script_executor.ENV, "on")
    fast = _optimize(model, x)
    core = script_executor.executor_of(fast).core
    own = {t.data_ptr() for t in list(fast.parameters()) + list(fast.buffers()) if t.layout == torch.strided}
    traced = [t for t in list(core.parameters()) + list(core.buffers()) if t.layout == torch.strided]
    from aiacc.plugins.torch import fastpath

    # the packed weights the core reads are fastpath's own cached ones (which the fx forward uses too)
    cached = {id(p) for entry in fastpath._PACKED.values() for p in entry[1].values()}
    assert traced and all(t.data_ptr() in own for t in traced)
    assert all(id(t) in cached for name, t in core.named_buffers() if name.startswith("aiacc_packed"))
