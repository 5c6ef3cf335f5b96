"""aiacc.core.quant: the int8 plan in the IR (calibration, Q/DQ placement, sensitivity, report), run on the
reference executor and on onnxruntime with matching results, around opaque nodes, and its clear errors."""
from __future__ import annotations

import numpy as np
import pytest

from aiacc.core.ir import Graph, TensorType
from aiacc.core.onnx import to_onnx
from aiacc.core.quant import check_calibration, choose_range, parse_tolerance, quantize, score
from aiacc.core.quant.calibration import TensorStats
from aiacc.core.runtime.executor import run
from aiacc.errors import ShapeError, UnsupportedError

ort = pytest.importorskip("onnxruntime")

# reference executor vs onnxruntime on the same QDQ graph: relative L2 difference of the float outputs.
# Both compute the same integers; what differs is float rounding of the rescale (a level, rarely).
MATCH = 1e-3


def _rng(seed=0):
    return np.random.default_rng(seed)


def cnn(opaque: bool = False) -> Graph:
    """conv-relu -> conv-relu (+ residual) -> maxpool -> [opaque] -> conv -> global pool -> flatten -> gemm
    -> softmax; plus a concat of two branches."""
    r = _rng(1)
    g = Graph("cnn")
    x = g.add_input("x", "float32", [2, 3, 8, 8])

    def conv(v, cin, cout, name):
        w = g.add_initializer(f"{name}.w", (r.standard_normal((cout, cin, 3, 3)) * 0.3).astype(np.float32))
        b = g.add_initializer(f"{name}.b", (r.standard_normal(cout) * 0.1).astype(np.float32))
        return g.op("Conv", v, w, b, name=name, pads=[1, 1, 1, 1], kernel_shape=[3, 3])

    y1 = g.op("Relu", conv(x, 3, 8, "conv1"), name="relu1")
    y2 = g.op("Relu", conv(y1, 8, 8, "conv2"), name="relu2")
    s = g.op("Add", y2, y1, name="res")
    p = g.op("MaxPool", s, name="pool", kernel_shape=[2, 2], strides=[2, 2])
    if opaque:
        node = g.add_opaque("Mystery", [p], domain="test", name="mystery",
                            output_types=[TensorType("float32", (2, 8, 4, 4))],
                            meta={"kernel": lambda a: np.tanh(a) * 2})
        p = node.output
    c3 = g.op("Relu", conv(p, 8, 8, "conv3"), name="relu3")
    c4 = g.op("Relu", conv(p, 8, 8, "conv4"), name="relu4")
    cat = g.op("Concat", c3, c4, name="cat", axis=1)
    gap = g.op("GlobalAveragePool", cat, name="gap")
    f = g.op("Flatten", gap, name="flat", axis=1)
    w = g.add_initializer("fc.w", (r.standard_normal((10, 16)) * 0.3).astype(np.float32))
    b = g.add_initializer("fc.b", np.zeros(10, np.float32))
    out = g.op("Softmax", g.op("Gemm", f, w, b, name="fc", transB=1), name="softmax", axis=-1)
    g.add_output(out)
    return g


def feeds(n=6, seed=0):
    r = _rng(seed)
    return [{"x": r.standard_normal((2, 3, 8, 8)).astype(np.float32)} for _ in range(n)]


def _ort_outputs(g: Graph, f):
    from aiacc.backends.onnxruntime import OrtGraphRunner

    return OrtGraphRunner(g).run(f)


def _rel(a, b):
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


def test_plan_runs_on_reference_and_onnxruntime_with_matching_results():
    from aiacc.backends.quant import weight_qmax

    g = cnn()
    qg, rep = quantize(g, feeds(), weight_qmax=weight_qmax())
    ops = qg.op_histogram()
    assert ops.get("QuantizeLinear", 0) >= 6 and ops.get("DequantizeLinear", 0) >= 6
    # every conv/gemm got an int8 per-channel weight and an int32 bias
    assert {v.const.dtype.name for v in qg.initializers.values() if v.name.endswith("_int8")} == {"int8"}
    assert sum(v.name.endswith("_int32") for v in qg.initializers.values()) == 5
    assert set(rep.quantized) >= {"conv1", "conv2", "conv3", "conv4", "fc", "res", "cat", "gap"}
    for f in feeds(3, seed=7):  # fresh inputs, not the calibration ones
        ref = run(qg, f)["softmax"]
        fl = run(g, f)["softmax"]
        got = _ort_outputs(qg, f)[0]
        assert _rel(got, ref) < MATCH
        assert _rel(ref, fl) < 0.05  # int8 stays close to float
    # onnxruntime really runs integer kernels for the plan
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    import tempfile, os, onnx

    with tempfile.TemporaryDirectory() as d:
        so.optimized_model_filepath = os.path.join(d, "opt.onnx")
        ort.InferenceSession(to_onnx(qg).SerializeToString(), so, providers=["CPUExecutionProvider"])
        kinds = {n.op_type for n in onnx.load(so.optimized_model_filepath).graph.node}
    assert {"QLinearConv", "QLinearAdd", "QLinearConcat", "QGemm"} <= kinds
    assert "Conv" not in kinds and "Gemm" not in kinds


def test_relu_is_folded_and_passthrough_keeps_the_scale():
    qg, _ = quantize(cnn(), feeds(3))
    conv1 = next(n for n in qg if n.name == "conv1")
    # conv1's output goes straight to its Relu (the pair is after the Relu, zero point 0)
    assert [u.op for u in conv1.output.users()] == ["Relu"]
    q_relu = next(n for n in qg if n.op == "QuantizeLinear" and n.inputs[0].name == "relu1")
    assert int(q_relu.inputs[2].const) == 0
    # MaxPool's output pair reuses the input's scale (onnxruntime then drops the pair)
    pool = next(n for n in qg if n.name == "pool")
    q_in = pool.inputs[0].producer.inputs[0].producer
    q_out = next(u for u in pool.output.users() if u.op == "QuantizeLinear")
    assert float(q_in.inputs[1].const) == float(q_out.inputs[1].const)


def test_opaque_node_is_quantized_around():
    from aiacc.backends.quant import weight_qmax

    g = cnn(opaque=True)
    qg, rep = quantize(g, feeds(), weight_qmax=weight_qmax())
    node = next(n for n in qg if n.name == "mystery")
    assert node.is_opaque
    src = node.inputs[0].producer  # reads dequantized int8 (through the float MaxPool before it)
    assert src.op == "DequantizeLinear" or (src.op == "MaxPool" and src.inputs[0].producer.op == "DequantizeLinear")
    assert any(u.op == "QuantizeLinear" for u in node.output.users())  # quantized for conv3/conv4
    assert {"conv1", "conv2", "conv3", "conv4", "fc"} <= set(rep.quantized)
    assert "mystery" not in rep.quantized
    for f in feeds(2, seed=9):
        ref = run(qg, f)["softmax"]
        assert _rel(_ort_outputs(qg, f)[0], ref) < MATCH  # the opaque node runs its kernel between segments
        assert _rel(ref, run(g, f)["softmax"]) < 0.05


def test_calibration_errors_name_the_input():
    g = cnn()
    with pytest.raises(ShapeError, match="empty"):
        check_calibration(g, [])
    with pytest.raises(ShapeError, match=r"sample 1: graph input 'x': dimension 0 should be 2.*\[2, 3, 8, 8\]"):
        check_calibration(g, [feeds(1)[0], {"x": np.zeros((4, 3, 8, 8), np.float32)}])
    with pytest.raises(ShapeError, match="sample 0: graph input 'x': expected dtype float32, got float64"):
        check_calibration(g, [{"x": np.zeros((2, 3, 8, 8))}])
    with pytest.raises(ShapeError, match="no input named 'y'"):
        check_calibration(g, [{"y": np.zeros((2, 3, 8, 8), np.float32)}])


def test_range_choice_clips_heavy_tails_and_keeps_a_dense_range():
    """The range is chosen by quantization error on the observed values: a heavy-tailed tensor gets a
    clipped range (a full min/max range would waste the levels on the tails), a uniform one its full
    range."""
    r = _rng(3)
    st = TensorStats()
    st.observe(r.standard_t(1.5, 100_000).astype(np.float32), r)
    clipped = choose_range(st)
    assert clipped.method != "minmax" and clipped.hi - clipped.lo < 0.5 * (st.max - st.min)
    st2 = TensorStats()
    st2.observe(r.uniform(-1, 1, 100_000).astype(np.float32), r)
    dense = choose_range(st2)
    assert dense.hi > 0.95 and dense.lo < -0.95


def test_sensitivity_and_pins():
    g = cnn()
    qg, rep = quantize(g, feeds(), sensitivity=True, keep_float=["conv1", "fc"])
    assert set(rep.kept_float) >= {"conv1", "fc"} and "conv1" not in rep.quantized
    conv1 = next(n for n in qg if n.name == "conv1")
    assert conv1.inputs[1].producer is None  # its weight stays the float initializer
    assert [e.label for e in rep.sensitivity] and all(e.score >= 0 for e in rep.sensitivity)
    assert rep.sensitivity == sorted(rep.sensitivity, key=lambda e: -e.score)
    with pytest.raises(UnsupportedError, match="conv99"):
        quantize(g, feeds(2), keep_float=["conv99"])


def test_auto_plan_returns_the_sensitive_layer_to_float():
    """A layer whose input has a huge outlier channel breaks per-tensor int8: the automatic plan finds it
    by sensitivity and keeps it float; the pinned plan (keep_float=[]) misses and reports it worst."""
    r = _rng(4)
    g = Graph("outlier")
    x = g.add_input("x", "float32", [8, 16])
    w1 = (r.standard_normal((16, 16)) * 0.3).astype(np.float32)
    w1[:, 0] *= 1000  # output column 0 of fc1 is ~1000x the others
    h = g.op("MatMul", x, g.add_initializer("w1", w1), name="fc1")
    w2 = (r.standard_normal((16, 4)) * 0.3).astype(np.float32)
    w2[0, :] = 0  # ... and fc2 ignores it: everything that matters lives in the small columns
    y = g.op("MatMul", h, g.add_initializer("w2", w2), name="fc2")
    g.add_output(y)
    cal = [{"x": r.standard_normal((8, 16)).astype(np.float32)} for _ in range(4)]
    _, pinned = quantize(g, cal, keep_float=[], tolerance=0.05)
    assert not pinned.ok and pinned.sensitivity[0].label in ("fc1", "fc2")
    _, auto = quantize(g, cal, tolerance=0.05)
    assert auto.ok and set(auto.kept_float) & {"fc1", "fc2"}


def test_tolerance_forms():
    assert parse_tolerance(0.2).kind == "rel"
    assert parse_tolerance({"top1": 0.99}).value == 0.99
    for bad in (0, -1, {"top5": 0.9}, "x", {"top1": 2}):
        with pytest.raises(UnsupportedError):
            parse_tolerance(bad)
    a = [[np.array([[0.1, 0.9], [0.8, 0.2]])]]
    b = [[np.array([[0.2, 0.8], [0.3, 0.7]])]]
    assert score(parse_tolerance({"top1": 0.5}), a, b) == 0.5


def attention_block() -> Graph:
    """A BERT-style block: LayerNorm -> qkv projection -> Reshape/Transpose/Gather into q, k, v ->
    softmax(q k^T * 0.25) v -> Transpose/Reshape -> output projection -> residual Add -> LayerNorm."""
    r = _rng(3)
    g = Graph("attention")
    x = g.add_input("x", "float32", [2, 16, 32])

    def const(name, shape, s=0.2):
        return g.add_initializer(name, (r.standard_normal(shape) * s).astype(np.float32))

    def i64(name, v):
        return g.add_initializer(name, np.asarray(v, np.int64))

    ln = g.op("LayerNormalization", x, const("ln.g", [32], 1), const("ln.b", [32]), name="ln", axis=-1)
    qkv = g.op("Add", g.op("MatMul", ln, const("wqkv", [32, 96]), name="qkv"), const("bqkv", [96]), name="qkv_b")
    t = g.op("Transpose", g.op("Reshape", qkv, i64("s5", [2, 16, 3, 2, 16]), name="split_heads"), name="heads",
             perm=[2, 0, 3, 1, 4])
    q, k, v = (g.op("Gather", t, i64(f"i{j}", j), name=f"take{j}", axis=0) for j in range(3))
    kt = g.op("Transpose", k, name="kt", perm=[0, 1, 3, 2])
    s = g.op("Mul", g.op("MatMul", q, kt, name="scores"), g.add_initializer("c", np.float32(0.25)), name="scale")
    p = g.op("Softmax", s, name="softmax", axis=-1)
    o = g.op("MatMul", p, v, name="mix")
    o = g.op("Reshape", g.op("Transpose", o, name="merge", perm=[0, 2, 1, 3]), i64("s3", [2, 16, 32]), name="flat")
    proj = g.op("Add", g.op("MatMul", o, const("wo", [32, 32]), name="proj"), const("bo", [32]), name="proj_b")
    res = g.op("Add", ln, proj, name="residual")
    g.add_output(g.op("LayerNormalization", res, const("ln2.g", [32], 1), const("ln2.b", [32]), name="ln2", axis=-1))
    return g


def test_attention_block_runs_int8_end_to_end_without_requantizing_around_float_ops(tmp_path):
    """Placement for transformers: data movement (Reshape, Transpose, Gather) moves uint8; the 1/sqrt(d)
    scale is folded into the quantization; Softmax, the residual Add and LayerNorm stay float with no
    requantize/dequantize pair around them (the gemms output float); reference and onnxruntime agree."""
    import onnx

    from aiacc.backends.quant import weight_qmax

    g = attention_block()
    r = _rng(5)
    cal = [{"x": r.standard_normal((2, 16, 32)).astype(np.float32)} for _ in range(4)]
    qg, rep = quantize(g, cal, weight_qmax=weight_qmax())
    ops = qg.op_histogram()
    assert ops.get("Mul", 0) == 0  # the scale is folded into the scores matmul's dequantize scale
    by_name = {n.name: n for n in qg}
    assert by_name["softmax"].inputs[0].producer.op == "MatMul"  # float scores straight from the matmul
    assert by_name["mix"].inputs[0].producer.op == "DequantizeLinear"  # probabilities in uint8
    assert all(x.producer.op not in ("DequantizeLinear", "QuantizeLinear") for x in by_name["residual"].inputs)
    assert "residual" in rep.kept_float and "reads it" in rep.kept_float["residual"]
    for f in [{"x": r.standard_normal((2, 16, 32)).astype(np.float32)} for _ in range(2)]:
        ref = run(qg, f)[g.outputs[0].name]
        assert _rel(_ort_outputs(qg, f)[0], ref) < MATCH
        assert _rel(ref, run(g, f)[g.outputs[0].name]) < 0.05
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    ort.InferenceSession(to_onnx(qg).SerializeToString(), so, providers=["CPUExecutionProvider"])
    kinds = [n.op_type for n in onnx.load(so.optimized_model_filepath).graph.node]
    # the two projections in QGemm (float out), q k^T with float output, p v in uint8; the only
    # conversions left: quantize the LayerNorm output (once, for the projection) and the probabilities
    assert kinds.count("QGemm") == 2 and "MatMulIntegerToFloat" in kinds and "QLinearMatMul" in kinds
    assert "DequantizeLinear" not in kinds and kinds.count("QuantizeLinear") == 2
    assert "QLinearSoftmax" not in kinds and "Softmax" in kinds
