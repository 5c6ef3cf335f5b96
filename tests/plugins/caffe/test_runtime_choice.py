"""CaffeModel.forward's runtime: "auto" measures aiacc's runtime against onnxruntime on the first call for
each input shape and keeps the faster (runtime_choice says which and the times); "aiacc" and
"onnxruntime" run where asked; every choice gives the same outputs."""
import importlib.util

import numpy as np
import pytest

from aiacc.errors import UnsupportedError
from aiacc.plugins.caffe import CaffeModel
from aiacc.plugins.caffe.model import _runtime
from tests.zoo import caffe_models as zoo

needs_ort = pytest.mark.skipif(importlib.util.find_spec("onnxruntime") is None, reason="onnxruntime not installed")


def _x(model, seed=0):
    rng = np.random.default_rng(seed)
    return {v.name: rng.standard_normal(v.shape).astype(np.float32) for v in model.graph.inputs}


@needs_ort
def test_auto_measures_both_and_runs_the_faster(monkeypatch):
    model = zoo.build("squeezenet")
    x = _x(model)
    out = model.forward(**x)
    choice = model.runtime_choice
    assert choice["runtime"] in ("aiacc", "onnxruntime")
    assert set(choice["ms"]) == {"aiacc", "onnxruntime"}
    assert choice["runtime"] == min(choice["ms"], key=choice["ms"].get)
    # later calls run the chosen one only (nothing measured again)
    runner = _runtime(model, model.graph)
    other = "onnxruntime" if choice["runtime"] == "aiacc" else "aiacc"
    target = runner.aiacc if other == "aiacc" else runner.ort()
    monkeypatch.setattr(target, "run", lambda feeds: pytest.fail(f"{other} ran after the choice"))
    again = model.forward(**x)
    for k in out:
        np.testing.assert_array_equal(again[k], out[k])


@needs_ort
@pytest.mark.parametrize("name", ["squeezenet", "resnet", "alexnet"])
def test_every_runtime_gives_the_same_outputs(name):
    base = zoo.build(name)
    x = _x(base, seed=1)
    outs = {}
    for rt in ("aiacc", "onnxruntime", "auto"):
        m = CaffeModel(base.net, runtime=rt)
        outs[rt] = m.forward(**x)
        assert m.runtime_choice["runtime"] == (rt if rt != "auto" else m.runtime_choice["runtime"])
    for rt in ("onnxruntime", "auto"):
        for k, want in outs["aiacc"].items():
            np.testing.assert_allclose(outs[rt][k], want, rtol=1e-4, atol=1e-5 * float(np.abs(want).max()))


def test_asked_for_aiacc_measures_nothing():
    model = zoo.build("lenet")
    model.runtime = "aiacc"
    model.forward(**_x(model))
    assert model.runtime_choice == {"runtime": "aiacc", "ms": {}, "why": "asked for (runtime='aiacc')"}


def test_an_unknown_runtime_is_refused():
    with pytest.raises(UnsupportedError, match="unknown runtime 'caffe'"):
        zoo.build("lenet").runtime = "caffe"


def test_without_onnxruntime_auto_runs_aiacc_and_says_why(monkeypatch):
    from aiacc.plugins.caffe import model as M

    monkeypatch.setattr(M, "_onnxruntime_available", lambda: False)
    model = zoo.build("lenet")
    model.forward(**_x(model))
    assert model.runtime_choice["runtime"] == "aiacc"
    assert "onnxruntime is not installed" in model.runtime_choice["why"]
    model.runtime = "onnxruntime"
    with pytest.raises(UnsupportedError, match="onnxruntime is not installed"):
        model.forward(**_x(model))


@needs_ort
def test_on_onnxruntime_lrn_runs_the_numba_kernel_between_sessions():
    pytest.importorskip("numba")
    from aiacc.core.runtime import numba_nn

    model = CaffeModel(zoo.build("alexnet").net, runtime="onnxruntime")
    x = _x(model, seed=2)
    runner = _runtime(model, model.graph)
    ort = runner.ort()
    lrn = [n for n in ort.graph.nodes if n.op == "LRN"]
    assert lrn and all(n.is_opaque for n in lrn)  # not onnxruntime's scalar LRN
    calls = []
    real = numba_nn.lrn_into

    def counted(*a):
        calls.append(1)
        return real(*a)
    numba_nn.lrn_into = counted
    try:
        # the kernels bound lrn_into at build time: rebuild to count
        runner._ort = None
        got = model.forward(**x)
    finally:
        numba_nn.lrn_into = real
    assert len(calls) == len(lrn)
    want = CaffeModel(model.net, runtime="aiacc").forward(**x)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5 * float(np.abs(want[k]).max()))


@needs_ort
def test_auto_also_measures_onnxruntimes_own_lrn_in_one_session():
    """A net with LRN: "auto" measures onnxruntime with the numba LRN between sessions and onnxruntime with its
    own LRN in one session (faster on small maps), keeps the fastest of the three, and answers the same."""
    pytest.importorskip("numba")
    from aiacc.plugins.caffe.model import OWN_LRN

    model = CaffeModel(zoo.build("alexnet").net)
    x = _x(model, seed=3)
    got = model.forward(**x)
    choice = model.runtime_choice
    assert set(choice["ms"]) == {"aiacc", "onnxruntime", OWN_LRN}
    best = min(choice["ms"], key=choice["ms"].get)
    assert choice["runtime"] == ("onnxruntime" if best == OWN_LRN else best)
    runner = _runtime(model, model.graph)
    if best == OWN_LRN:  # from now on onnxruntime runs its own LRN, in one session
        assert "own LRN" in choice["why"] and not any(n.is_opaque for n in runner.ort().graph.nodes)
    want = CaffeModel(model.net, runtime="aiacc").forward(**x)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5 * float(np.abs(want[k]).max()))
