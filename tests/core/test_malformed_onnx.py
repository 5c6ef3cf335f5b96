"""Malformed ONNX files (issue 16): truncated, bit-flipped and field-mutated models end in an AiaccError that
says what is wrong, or load into a graph that verifies and runs (or refuses to run with an AiaccError).

Never another exception type (a bare ValueError/DecodeError traceback from deep inside protobuf or numpy),
never a hang. aiacc's ONNX importer is pure Python over protobuf, so these run in-process; onnxruntime is
not involved.
"""
from __future__ import annotations

import time

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
onnx = pytest.importorskip("onnx")

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from aiacc.core.onnx import from_onnx, load  # noqa: E402
from aiacc.core.runtime.executor import run  # noqa: E402
from aiacc.errors import AiaccError  # noqa: E402

SECONDS = 10.0  # per file: loading, verifying and running a tiny model


def _seed_model() -> onnx.ModelProto:
    """A small valid model: Conv (+bias) -> Relu -> Flatten -> Gemm, raw_data initializers."""
    r = np.random.default_rng(0)
    inits = [numpy_helper.from_array(r.standard_normal((4, 2, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(r.standard_normal(4).astype(np.float32), "b"),
             numpy_helper.from_array(r.standard_normal((3, 64)).astype(np.float32), "fw")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Flatten", ["r"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "fw"], ["y"], name="fc", transB=1)]
    g = helper.make_graph(nodes, "seed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(m)
    return m


SEED = _seed_model()
SEED_BYTES = SEED.SerializeToString()
FEEDS = {"x": np.random.default_rng(1).standard_normal((1, 2, 4, 4)).astype(np.float32)}


def check_file(path) -> str:
    """Load `path` the way `aiacc inspect` does and run it; 'error: ...' or 'ok'. Fails the test on any
    non-aiacc exception or when it takes too long."""
    t0 = time.monotonic()
    try:
        g = load(path)
        g.verify()
        try:
            run(g, FEEDS)
        except AiaccError:
            pass
        outcome = "ok"
    except AiaccError as e:
        assert str(e).strip(), "an aiacc error with no message"
        outcome = f"error: {e}"
    assert time.monotonic() - t0 < SECONDS, f"took {time.monotonic() - t0:.1f} s"
    return outcome


@given(st.integers(0, len(SEED_BYTES) - 1))
def test_truncated_files(tmp_path_factory, n):
    path = tmp_path_factory.mktemp("trunc") / "m.onnx"
    path.write_bytes(SEED_BYTES[:n])
    check_file(path)


@given(st.lists(st.tuples(st.integers(0, len(SEED_BYTES) - 1), st.integers(0, 7)), min_size=1, max_size=8))
def test_bit_flipped_files(tmp_path_factory, flips):
    data = bytearray(SEED_BYTES)
    for pos, bit in flips:
        data[pos] ^= 1 << bit
    path = tmp_path_factory.mktemp("flip") / "m.onnx"
    path.write_bytes(bytes(data))
    check_file(path)


def _mutations():
    """(name, function that mutates a ModelProto in place, expected words of the error or None if it may load)."""
    def truncated_raw(m):
        t = m.graph.initializer[0]
        t.raw_data = t.raw_data[:10]

    def dims_mismatch(m):
        m.graph.initializer[1].dims[0] = 7

    def negative_dim(m):
        m.graph.initializer[1].dims[0] = -4

    def no_graph(m):
        m.ClearField("graph")

    def opset_999(m):
        m.opset_import[0].version = 999

    def unknown_default_op(m):
        m.graph.node[1].op_type = "NoSuchOp"

    def dangling_input(m):
        m.graph.node[1].input[0] = "nowhere"

    def duplicate_initializer(m):
        m.graph.initializer.append(m.graph.initializer[0])

    def undefined_dtype(m):
        m.graph.initializer[1].data_type = 0

    def bad_attribute(m):
        m.graph.node[0].attribute[0].ints[:] = [0, 0]

    def missing_output(m):
        m.graph.output[0].name = "not_made"

    def wrong_input_rank(m):
        del m.graph.input[0].type.tensor_type.shape.dim[1:]

    return [("truncated raw_data", truncated_raw, ["initializer 'w'"]),
            ("dims do not match the data", dims_mismatch, ["initializer 'b'"]),
            ("negative dim", negative_dim, ["initializer 'b'"]),
            ("no graph", no_graph, ["no graph"]),
            ("opset 999", opset_999, ["opset 999"]),
            ("unknown op in the default domain", unknown_default_op, None),
            ("dangling input", dangling_input, ["'nowhere'"]),
            ("duplicate initializer", duplicate_initializer, ["defined twice"]),
            ("undefined dtype", undefined_dtype, ["initializer 'b'"]),
            ("zero kernel", bad_attribute, ["conv"]),
            ("output nobody makes", missing_output, ["'not_made'"]),
            ("input of the wrong rank", wrong_input_rank, None)]


@pytest.mark.parametrize("name,mutate,words", _mutations(), ids=[m[0] for m in _mutations()])
def test_field_mutated_models(tmp_path, name, mutate, words):
    m = onnx.ModelProto()
    m.CopyFrom(SEED)
    mutate(m)
    path = tmp_path / "m.onnx"
    path.write_bytes(m.SerializeToString())
    outcome = check_file(path)
    if words is not None:
        assert outcome.startswith("error: "), f"{name}: loaded without an error"
        for w in words:
            assert w in outcome, f"{name}: {outcome}"


def test_empty_and_garbage_files(tmp_path):
    for data, what in ((b"", "empty"), (b"\x00" * 64, "zeros"), (bytes(range(256)) * 4, "garbage"),
                       (b"ir_version: 8\ngraph {", "text")):
        path = tmp_path / f"{what}.onnx"
        path.write_bytes(data)
        outcome = check_file(path)
        assert outcome.startswith("error: "), f"{what}: {outcome}"


def test_seed_model_loads_and_matches_onnx_reference():
    """The corpus seed itself is fine (so the mutations are what the errors are about)."""
    g = from_onnx(SEED)
    y = run(g, FEEDS)["y"]
    ort = pytest.importorskip("onnxruntime")
    want = ort.InferenceSession(SEED_BYTES, providers=["CPUExecutionProvider"]).run(None, FEEDS)[0]
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
