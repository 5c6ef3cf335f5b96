"""ONNX <-> IR: ResNet-50 and a BERT-style encoder built with onnx.helper at test time, run by the reference
executor against onnxruntime, exported back, and round-tripped through the text form; opset upgrades;
opaque ops; error reporting."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402

from aiacc import examples  # noqa: E402
from aiacc.core import parse, run  # noqa: E402
from aiacc.core.onnx import from_onnx, to_onnx  # noqa: E402
from aiacc.errors import KernelError, ParseError, ShapeError, UnsupportedError  # noqa: E402

RTOL = 1e-4  # relative to the largest reference magnitude of each output


def ort_run(model, feeds):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def assert_close(actual, expected, rtol=RTOL):
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    scale = float(np.abs(expected).max())
    err = float(np.abs(actual.astype(np.float64) - expected).max())
    assert err <= rtol * scale, f"max error {err:.3g} exceeds {rtol} x {scale:.3g}"


@pytest.fixture(scope="module", params=["resnet50", "bert"])
def case(request):
    name = request.param
    if name == "resnet50":
        model = examples.resnet50_onnx(image_size=64)
        feeds = examples.example_feeds(name, batch=2, image_size=64)
    else:
        model = examples.bert_encoder_onnx(layers=2)
        feeds = examples.example_feeds(name, batch=2, seq=12)
    onnx.checker.check_model(model)
    return name, model, feeds, ort_run(model, feeds)


def test_import_and_run_equals_onnxruntime(case):
    name, model, feeds, ref = case
    g = from_onnx(model)
    g.verify()
    if name == "resnet50":
        assert g.op_histogram() == {"BatchNormalization": 53, "Conv": 53, "Relu": 49, "Add": 16, "Flatten": 1,
                                    "Gemm": 1, "GlobalAveragePool": 1, "MaxPool": 1}
        assert str(g.outputs[0].type) == "float32[N,1000]"
    else:
        hist = g.op_histogram()
        assert hist["LayerNormalization"] == 5 and hist["Softmax"] == 2 and hist["Gather"] == 2
        assert [str(v.type) for v in g.inputs] == ["int64[N,S]", "int64[N,S]"]
    out = run(g, feeds)
    assert list(out) == [o.name for o in model.graph.output]
    for r, (k, a) in zip(ref, out.items()):
        assert_close(a, r)


def test_export_runs_in_onnxruntime_like_the_original(case):
    name, model, feeds, ref = case
    exported = to_onnx(from_onnx(model))
    onnx.checker.check_model(exported, full_check=True)
    for r, a in zip(ref, ort_run(exported, feeds)):
        assert_close(a, r, rtol=1e-6)
    # and importing the export gives the same graph back
    assert from_onnx(exported).equals(from_onnx(model))


def test_text_round_trip_is_exact(case):
    _, model, feeds, _ = case
    g = from_onnx(model)
    text = str(g)
    weights = {k: v.const for k, v in g.initializers.items()}
    g2 = parse(text, weights)
    assert str(g2) == text
    assert g2.equals(g)
    g2.verify()


def _model(nodes, inputs, outputs, inits=(), opset=17, domains=()):
    graph = helper.make_graph(nodes, "t", inputs, outputs, initializer=list(inits))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]
                          + [helper.make_opsetid(d, 1) for d in domains])
    m.ir_version = 8
    return m


def _vi(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def test_old_opset_attributes_become_inputs():
    """Opset-11 Squeeze/Unsqueeze/ReduceMean axes, Split sizes and softmax's 2-D coercion are upgraded."""
    nodes = [
        helper.make_node("Unsqueeze", ["x"], ["u"], axes=[0]),
        helper.make_node("Squeeze", ["u"], ["s"], axes=[0]),
        helper.make_node("ReduceMean", ["s"], ["m"], axes=[2], keepdims=1),
        helper.make_node("Split", ["s"], ["a", "b"], axis=1, split=[1, 2]),
        helper.make_node("Softmax", ["s"], ["sm"], axis=1),  # opset 11: flattens [2, 3*4] then softmax
        helper.make_node("Clip", ["s"], ["c"], min=-0.5, max=0.5),
        helper.make_node("Pad", ["x"], ["p"], mode="constant", pads=[0, 1, 0, 0, 1, 0], value=2.0),
    ]
    m = _model(nodes, [_vi("x", [2, 3, 4])],
               [_vi(n, None) for n in ("m", "a", "b", "sm", "c", "p")], opset=10)
    g = from_onnx(m)
    g.verify()
    assert g.find_nodes("Squeeze")[0].inputs[1].const.tolist() == [0]
    assert g.find_nodes("ReduceMean")[0].inputs[1].const.tolist() == [2]
    assert [str(v.type) for v in g.outputs] == ["float32[2,3,1]", "float32[2,1,4]", "float32[2,2,4]",
                                                "float32[2,3,4]", "float32[2,3,4]", "float32[2,5,4]"]
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    ref = ort_run(m, {"x": x})
    ours = run(g, {"x": x})
    for r, a in zip(ref, ours.values()):
        assert_close(a, r, 1e-6)
    exported = to_onnx(g)  # written at opset 18 in the new forms
    assert exported.opset_import[0].version >= 18
    for r, a in zip(ref, ort_run(exported, {"x": x})):
        assert_close(a, r, 1e-6)


def test_symbols_and_cast_codes():
    nodes = [helper.make_node("Cast", ["x"], ["y"], to=TensorProto.INT32)]
    m = _model(nodes, [_vi("x", ["batch", None, 3])], [_vi("y", None, TensorProto.INT32)])
    g = from_onnx(m)
    assert str(g.inputs[0].type) == "float32[batch,?,3]"
    assert g.nodes[0].attrs["to"] == "int32"
    assert str(g.outputs[0].type) == "int32[batch,?,3]"
    back = to_onnx(g)
    assert back.graph.node[0].attribute[0].i == TensorProto.INT32
    assert back.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"


def test_unknown_op_is_opaque_and_survives_export():
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("MyOp", ["r"], ["y"], domain="com.example", alpha=0.5, modes=["a", "b"])]
    m = _model(nodes, [_vi("x", [2, 3])], [_vi("y", [2, 3])], domains=["com.example"])
    g = from_onnx(m)
    g.verify()
    node = g.nodes[1]
    assert node.is_opaque and node.domain == "com.example"
    assert node.attrs == {"alpha": 0.5, "modes": ["a", "b"]}
    assert str(node.output.type) == "float32[2,3]"  # from the model's declared output
    with pytest.raises(KernelError, match="no kernel for com.example::MyOp at node myop"):
        run(g, {"x": np.zeros((2, 3), np.float32)})
    node.meta["kernel"] = lambda r: r * 2  # a plugin may attach a numpy callable
    assert run(g, {"x": np.ones((2, 3), np.float32)})["y"].tolist() == [[2.0] * 3] * 2
    back = to_onnx(g)
    op = back.graph.node[1]
    assert (op.op_type, op.domain) == ("MyOp", "com.example")
    assert {a.name: helper.get_attribute_value(a) for a in op.attribute} == {"alpha": 0.5, "modes": [b"a", b"b"]}
    assert any(i.domain == "com.example" for i in back.opset_import)


def test_subgraph_attributes_kept_on_opaque_nodes():
    then = helper.make_graph([helper.make_node("Identity", ["x"], ["t"])], "then", [], [_vi("t", [2])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [_vi("e", [2])])
    nodes = [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)]
    m = _model(nodes, [_vi("c", [], TensorProto.BOOL), _vi("x", [2])], [_vi("y", [2])])
    g = from_onnx(m)
    assert g.nodes[0].is_opaque and len(g.nodes[0].meta["onnx_attributes"]) == 2
    back = to_onnx(g)
    x = np.array([1.0, -2.0], np.float32)
    assert ort_run(back, {"c": np.array(False), "x": x})[0].tolist() == [-1.0, 2.0]


def test_errors_name_the_node():
    nodes = [helper.make_node("Add", ["x", "nowhere"], ["y"], name="add1")]
    m = _model(nodes, [_vi("x", [2])], [_vi("y", [2])])
    with pytest.raises(ParseError, match="ONNX node 'add1': input 'nowhere' is not defined"):
        from_onnx(m)
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 5, 3, 3], np.zeros(180, np.float32))
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], name="c1")]
    m = _model(nodes, [_vi("x", [1, 3, 8, 8])], [_vi("y", None)], inits=[w])
    with pytest.raises(ShapeError, match=r"node c1 \(Conv\): input has 3 channels but the weight expects 5"):
        from_onnx(m)
    nodes = [helper.make_node("Cast", ["x"], ["y"], name="c2", to=TensorProto.STRING)]
    m = _model(nodes, [_vi("x", [2])], [_vi("y", None)])
    with pytest.raises(UnsupportedError, match="c2.*STRING"):
        from_onnx(m)


def test_constant_nodes_stay_constant_nodes():
    nodes = [helper.make_node("Constant", [], ["k"], value=helper.make_tensor("v", TensorProto.INT64, [2], [3, 4])),
             helper.make_node("Reshape", ["x", "k"], ["y"])]
    m = _model(nodes, [_vi("x", [12])], [_vi("y", None)])
    g = from_onnx(m)
    assert [n.op for n in g] == ["Constant", "Reshape"]
    assert str(g.outputs[0].type) == "float32[3,4]"  # inference reads the Constant's value
    assert to_onnx(g).graph.node[0].op_type == "Constant"
