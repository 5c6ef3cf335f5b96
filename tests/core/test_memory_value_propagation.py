"""Shape inference propagates the values of integer shape computations (ONNX's data propagation), so
`plan_memory` works on a freshly imported graph whose Reshape / Slice targets come from Shape -> Gather ->
Concat chains: a torch.onnx-exported nn.TransformerEncoderLayer, before any pass ran."""
import io

import numpy as np
import pytest

from aiacc.core import Graph, check_plan, plan_memory, run
from aiacc.core.ops.registry import known_value
from aiacc.core.runtime.arena import ArenaInterpreter


def _int(g, name, values):
    return g.add_initializer(name, np.asarray(values, dtype=np.int64))


def test_shape_chain_values_give_static_types():
    g = Graph("chain")
    x = g.add_input("x", "float32", (2, 6, 8))
    shape = g.op("Shape", x)
    batch = g.op("Unsqueeze", g.op("Gather", shape, _int(g, "i0", 0), axis=0), _int(g, "ax", [0]))
    tail = g.op("Slice", shape, _int(g, "s", [1]), _int(g, "e", [3]))
    prod = g.op("Mul", g.op("ReduceProd", tail, keepdims=1), _int(g, "one", [1]))
    target = g.op("Concat", batch, prod, axis=0)
    flat = g.op("Reshape", x, target)
    n = g.op("Cast", g.op("Gather", shape, _int(g, "i2", 2), axis=0), to="float32")
    scaled = g.op("Div", flat, g.op("Sqrt", n))
    ones = g.op("ConstantOfShape", g.op("Concat", batch, _int(g, "four", [4]), axis=0),
                value=np.array([1.0], dtype=np.float32))
    steps = g.op("Range", _int(g, "r0", 0), g.op("Gather", shape, _int(g, "i1", 1), axis=0), _int(g, "r1", 2))
    g.add_output(scaled)
    g.add_output(ones)
    g.add_output(steps)
    assert known_value(target).tolist() == [2, 48]
    assert flat.type.shape == (2, 48) and ones.type.shape == (2, 4) and steps.type.shape == (3,)
    assert known_value(steps).tolist() == [0, 2, 4]
    plan = plan_memory(g)
    check_plan(plan)
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 6, 8)).astype(np.float32)}
    ref = run(g, feeds)
    out = ArenaInterpreter(g, plan).run(feeds)
    for k in ref:
        np.testing.assert_allclose(out[k], ref[k], rtol=1e-6)


def test_symbolic_dims_are_not_guessed():
    g = Graph("sym")
    x = g.add_input("x", "float32", ("N", 6))
    shape = g.op("Shape", x)
    width = g.op("Shape", x, start=1)
    assert known_value(shape) is None  # N is not known until bound
    assert known_value(width).tolist() == [6]  # the static part is
    g.add_output(g.op("Reshape", x, g.op("Concat", _int(g, "m1", [-1]), width, axis=0)))
    plan = plan_memory(g, dims={"N": 3})  # binding N makes the whole chain known
    check_plan(plan)
    assert plan.allocations[g.outputs[0].name].shape == (3, 6)


def _encoder_onnx(dynamic: bool):
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnx")
    from torch import nn

    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, batch_first=True).eval()

    class Wrap(nn.Module):  # the layer's own forward takes is_causal, which the TorchScript tracer refuses
        def __init__(self):
            super().__init__()
            self.layer = layer

        def forward(self, x):
            return self.layer(x)

    model = Wrap().eval()
    x = torch.randn(2, 5, 32)
    buf = io.BytesIO()
    axes = {"x": {0: "N", 1: "S"}, "y": {0: "N", 1: "S"}} if dynamic else None
    # dynamo=False: the TorchScript exporter writes the decomposed graph with its Shape -> Gather -> Concat
    # chains (the fused fast path is not taken while tracing)
    torch.onnx.export(model, (x,), buf, dynamo=False, opset_version=17, input_names=["x"], output_names=["y"],
                      dynamic_axes=axes)
    with torch.no_grad():
        ref = model(x).numpy()
    return buf.getvalue(), x.numpy(), ref


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic-axes"])
def test_plan_memory_on_the_raw_exported_encoder(dynamic):
    import onnx

    from aiacc.core.onnx import from_onnx

    blob, x, ref = _encoder_onnx(dynamic)
    g = from_onnx(onnx.load_from_string(blob))
    ops = {n.op for n in g}
    assert {"Shape", "Gather", "Concat", "Reshape"} <= ops  # the shape chains are there, nothing folded them
    dims = {"N": 2, "S": 5} if dynamic else None
    plan = plan_memory(g, dims=dims)
    check_plan(plan)
    out = ArenaInterpreter(g, plan).run({"x": x})
    np.testing.assert_allclose(out["y"], ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["y"], run(g, {"x": x})["y"], rtol=1e-5, atol=1e-6)
    if dynamic:  # another batch size for the same graph: the chains follow (the tracer baked S=5 into
        # one of MultiheadAttention's reshape targets, so the sequence length stays)
        x3 = np.random.default_rng(1).standard_normal((3, 5, 32)).astype(np.float32)
        plan3 = plan_memory(g, dims={"N": 3, "S": 5})
        check_plan(plan3)
        np.testing.assert_allclose(ArenaInterpreter(g, plan3).run({"x": x3})["y"], run(g, {"x": x3})["y"],
                                   rtol=1e-5, atol=1e-6)
