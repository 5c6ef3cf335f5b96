"""aiacc's own runtime (backend="aiacc"): planned execution (arena, numba kernels) equals the reference
executor on every model of the catalogue, the arena is allocated once and reused, a value the arena cannot
plan falls back with a warning, and `aiacc.optimize(model, x, backend="aiacc")` works for torch, Keras,
Gluon, Caffe and ONNX models with the native path's outputs."""
import importlib.util
import tracemalloc
import warnings

import numpy as np
import pytest

import aiacc
from aiacc.core import Graph, run
from aiacc.core.ir import TensorType
from aiacc.core.passes import run_passes
from aiacc.core.runtime.backend import AiaccRuntime
from aiacc.errors import AiaccWarning
from aiacc.zoo import ir_models, small


def _rel_err(ref, out):
    return max(float(np.max(np.abs(ref[k].astype(np.float64) - out[k]), initial=0.0))
               / (float(np.max(np.abs(ref[k]), initial=0.0)) + 1e-30) for k in ref)


def _catalogue():
    """(framework, name) of every model in aiacc.zoo's test-size catalogue and its IR reference nets."""
    cases = [("ir", n) for n in ir_models.SMALL]
    cases += [("torch", n) for n in ("resnet18", "resnet50", "mobilenet_v2", "bert_encoder", "mlp")]
    cases += [("tf", n) for n in ("resnet50", "mobilenet_v2", "bert_encoder", "mlp", "small_cnn")]
    cases += [("mxnet", n) for n in ("resnet50_v1", "mobilenet_v2", "bert_encoder", "mlp")]
    cases += [("caffe", n) for n in ("lenet", "resnet", "squeezenet", "alexnet")]
    return cases


_PACKAGES = {"torch": "torch", "tf": "tensorflow", "mxnet": "mxnet", "caffe": "google.protobuf"}


def _model_graph(framework, name):
    """The model's IR graph (level 3 optimized, so fused ops and FusedElementwise are in it) and feeds."""
    if framework == "ir":
        g = ir_models.SMALL[name]()
        run_passes(g, level=3)
        return g, ir_models.example_feeds(g, batch=2)
    if importlib.util.find_spec(_PACKAGES[framework]) is None:
        pytest.skip(f"{framework} is not installed")
    mod = small.module(framework)
    from aiacc.plugins import get_plugin

    plugin = get_plugin(framework)
    if framework == "caffe":
        model = mod.build(name)
        rng = np.random.default_rng(0)
        inputs = {v.name: rng.standard_normal([d if isinstance(d, int) else 1 for d in v.shape]).astype(np.float32)
                  for v in model.graph.inputs}
    else:
        model, inputs = (mod.TF_ZOO if framework == "tf" else mod.ZOO)[name]()
    g = plugin.trace(model, inputs)
    feeds = plugin.feeds(g, inputs)
    run_passes(g, level=3)
    return g, feeds


@pytest.mark.parametrize("framework,name", _catalogue(), ids=[f"{f}-{n}" for f, n in _catalogue()])
def test_planned_equals_unplanned_on_the_catalogue(framework, name):
    g, feeds = _model_graph(framework, name)
    ref = run(g, feeds)
    rt = AiaccRuntime(g)
    out = rt.run_dict(feeds)
    assert set(out) == set(ref)
    assert _rel_err(ref, out) < 1e-5  # float32 sums in another order (conv as W @ patches)
    again = rt.run_dict(feeds)
    assert all(np.array_equal(again[k], out[k]) for k in out) and rt.plans_made == 1
    assert rt.report()["unplanned_values"] == []


def test_arena_is_reused_and_calls_allocate_far_less_than_the_values():
    g = ir_models.SMALL["resnet50"]()
    run_passes(g, level=3)
    feeds = ir_models.example_feeds(g, batch=8)  # batch 8: the values (7 MiB) dwarf one conv tile's scratch
    rt = AiaccRuntime(g)
    rt.run(feeds)
    interp = rt.interpreter(rt.bind(feeds))
    arena = interp.arena
    tracemalloc.start()
    try:
        rt.run(feeds)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert interp.arena is arena and rt.plans_made == 1
    report = rt.report()
    # intermediates live in the arena: one call allocates (outputs, kernel scratch) well under the naive sum
    assert peak < 0.5 * report["naive_bytes"], (peak, report)
    # another batch size gets its own plan, the first one is kept
    rt.run(ir_models.example_feeds(g, batch=1))
    assert rt.plans_made == 2
    rt.run(feeds)
    assert rt.plans_made == 2


def test_fused_elementwise_runs_the_numba_kernel_into_the_arena():
    pytest.importorskip("numba")
    from aiacc.core.runtime.numba_kernels import compile_fused_node

    g = Graph("fused")
    x = g.add_input("x", "float32", (4, 64))
    y = g.op("Relu", g.op("Mul", g.op("Exp", x), g.add_initializer("s", np.full((64,), 0.5, np.float32))))
    g.add_output(g.op("Tanh", y))
    run_passes(g, passes=["elementwise_fusion"])
    fused = [n for n in g if n.op == "FusedElementwise"]
    assert fused
    feeds = {"x": np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)}
    kernel = compile_fused_node(fused[0])
    before = kernel.calls
    rt = AiaccRuntime(g)
    out = rt.run_dict(feeds)
    assert kernel.calls == before + 1 and rt.report()["numba_nodes"] == [fused[0].name]
    assert _rel_err(run(g, feeds), out) < 1e-6


def test_a_value_the_arena_cannot_plan_falls_back_with_a_warning():
    g = Graph("opaque")
    x = g.add_input("x", "float32", (3, 4))
    r = g.op("Relu", x)
    mystery = g.add_node("Mystery", [r], domain="custom", name="mystery")  # no output type: not plannable
    mystery.meta["kernel"] = lambda a: a.reshape(4, 3) * 2  # a view-producing kernel, then arithmetic
    after = g.op("Exp", g.op("Neg", r))
    g.add_output(mystery.output)
    g.add_output(after)
    feeds = {"x": np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)}
    rt = AiaccRuntime(g)
    with pytest.warns(AiaccWarning, match="mystery"):
        out = rt.run_dict(feeds)
    assert rt.report()["unplanned_values"] == [mystery.output.name]
    ref = run(g, feeds)
    for k in ref:
        np.testing.assert_allclose(out[k], ref[k], rtol=1e-6)
    g2 = Graph("typed")  # given output types, the same opaque node is planned like any other
    x = g2.add_input("x", "float32", (3, 4))
    n = g2.add_node("Mystery", [g2.op("Relu", x)], domain="custom", name="mystery",
                    output_types=[TensorType("float32", (4, 3))])
    n.meta["kernel"] = lambda a: a.reshape(4, 3) * 2
    g2.add_output(n.output)
    with warnings.catch_warnings():
        warnings.simplefilter("error", AiaccWarning)
        AiaccRuntime(g2).run(feeds)


# ------------------------------------------------------------------------------------------ the plugins
def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5)


def test_optimize_backend_aiacc_torch():
    torch = pytest.importorskip("torch")
    model, x = small.module("torch").ZOO["resnet18"]()
    fast = aiacc.optimize(model, x, backend="aiacc", level=3)
    native = aiacc.optimize(model, x, level=3)
    assert isinstance(fast, torch.nn.Module) and fast.aiacc_runtime.plans_made == 1
    with torch.no_grad():
        out, ref = fast(*x), native(*x)
    assert isinstance(out, torch.Tensor) and out.shape == ref.shape
    _same([out.numpy()], [ref.numpy()])
    fast(*x)
    assert fast.aiacc_runtime.plans_made == 1  # the arena of the first call is reused


def test_optimize_backend_aiacc_torch_keeps_the_output_structure():
    pytest.importorskip("torch")
    model, x = small.module("torch").ZOO["bert_encoder"]()
    fast = aiacc.optimize(model, x, backend="aiacc", level=3)
    native = aiacc.optimize(model, x, level=3)
    out, ref = fast(*x), native(*x)
    assert type(out) is type(ref)
    import torch.utils._pytree as pytree

    _same([t.detach().numpy() for t in pytree.tree_leaves(out)], [t.detach().numpy() for t in pytree.tree_leaves(ref)])


def test_optimize_backend_aiacc_keras():
    tf = pytest.importorskip("tensorflow")
    model, x = small.module("tf").TF_ZOO["small_cnn"]()
    fast = aiacc.optimize(model, x, backend="aiacc", level=3)
    native = aiacc.optimize(model, x, level=3)
    out, ref = fast(tf.constant(x)), native(tf.constant(x))
    assert isinstance(out, tf.Tensor)
    _same([out.numpy()], [ref.numpy()])


def test_optimize_backend_aiacc_gluon():
    pytest.importorskip("mxnet")
    import mxnet as mx

    model, x = small.module("mxnet").ZOO["mobilenet_v2"]()
    fast = aiacc.optimize(model, x, backend="aiacc", level=3)
    assert isinstance(fast, mx.gluon.Block)
    nd = [mx.nd.array(a) for a in x]
    out, ref = fast(*nd), model(*nd)
    _same([o.asnumpy() for o in (out if isinstance(out, list) else [out])],
          [o.asnumpy() for o in (ref if isinstance(ref, (list, tuple)) else [ref])])


def test_optimize_backend_aiacc_caffe():
    pytest.importorskip("google.protobuf")
    model = small.module("caffe").build("resnet")
    rng = np.random.default_rng(0)
    x = {v.name: rng.standard_normal([d if isinstance(d, int) else 1 for d in v.shape]).astype(np.float32)
         for v in model.graph.inputs}
    fast = aiacc.optimize(model, x, backend="aiacc", level=3)
    out, ref = fast.forward(**x), model.forward(**x)
    assert list(out) == list(ref) == model.outputs  # the same blob names
    _same(list(out.values()), list(ref.values()))


def test_optimize_backend_aiacc_onnx():
    pytest.importorskip("onnx")
    from aiacc.zoo import onnx_models

    model, feeds = onnx_models.mobilenet_v2(batch=1, size=32)
    fast = aiacc.optimize(model, feeds, backend="aiacc")
    names = [o.name for o in fast.get_outputs()]
    assert names == [o.name for o in model.graph.output]
    ref = aiacc.plugins.get_plugin("onnx").run(model, feeds)
    _same(fast.run(None, feeds), ref)


def test_backend_aiacc_refuses_training():
    pytest.importorskip("torch")
    model, x = small.module("torch").ZOO["mlp"]()
    with pytest.raises(aiacc.errors.UnsupportedError, match="inference only"):
        aiacc.optimize(model, x, backend="aiacc", mode="train")
