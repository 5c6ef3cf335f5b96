"""Property-based tests (issue 16): random valid ONNX graphs through the importer, every pass alone, the
level 1/2/3 pipelines, the text form, to_onnx, the memory planner and planned execution.

A hypothesis strategy builds graphs from the core op set with random shapes, broadcasting, attributes
within each op's domain, fan-out and fan-in, shared constants, graph outputs that are also consumed
inside, an output that is a graph input and duplicate outputs. For each graph:

- the reference executor on the imported graph agrees with onnxruntime on the original (1e-5 relative);
- every inference pass alone, and each level's pipeline, leaves a graph that `verify()`s, keeps the
  output names in order and gives the same outputs;
- after each pipeline: the text form round-trips to the same outputs, `to_onnx` re-imports to the same
  outputs, `plan_memory` + `check_plan` hold and planned (arena) execution equals unplanned.

CI runs the "ci" profile (tests/conftest.py: 200 examples, derandomized, about a minute);
`pytest --hypothesis-profile=long tests/core/test_property_graphs.py` runs 3,000 locally. Shrunk failures found so far are kept as
regular regression tests at the end of this file.
"""
from __future__ import annotations

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from aiacc.core.memory import check_plan, plan_memory  # noqa: E402
from aiacc.core.onnx import from_onnx, to_onnx  # noqa: E402
from aiacc.core.passes import all_passes, run_passes  # noqa: E402
from aiacc.core.runtime.arena import run_planned  # noqa: E402
from aiacc.core.runtime.executor import run  # noqa: E402
from aiacc.core.text import parse, print_graph  # noqa: E402

RTOL, ATOL = 1e-5, 1e-6
UNARY = ("Relu", "Sigmoid", "Tanh", "Abs", "Neg", "Identity", "Softplus", "LeakyRelu", "Clip", "Erf")
BINARY = ("Add", "Sub", "Mul", "Max", "Min")


class _Builder:
    """Collects ONNX nodes, initializers and the (name, shape) of every float value made so far."""

    def __init__(self):
        self.nodes, self.inits, self.values = [], [], []  # values: (name, shape)
        self.counter = 0

    def name(self, base: str) -> str:
        self.counter += 1
        return f"{base}{self.counter}"

    def const(self, array: np.ndarray) -> str:
        n = self.name("c")
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(array, dtype=np.float32), n))
        return n

    def node(self, op: str, inputs: list[str], shape: tuple, **attrs) -> str:
        out = self.name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        self.values.append((out, tuple(shape)))
        return out


def _broadcasts_to(small: tuple, shape: tuple) -> bool:
    """Whether `small` broadcasts to exactly `shape`."""
    try:
        return np.broadcast_shapes(small, shape) == tuple(shape)
    except ValueError:
        return False


def _broadcast_shape(draw, shape: tuple) -> tuple:
    """A shape that broadcasts to `shape`: a suffix of it with some dims set to 1."""
    k = draw(st.integers(0, len(shape)))
    tail = shape[len(shape) - k:]
    return tuple(1 if draw(st.booleans()) else d for d in tail)


@st.composite
def onnx_models(draw):
    """A valid ONNX ModelProto (opset 18) over float32 inputs, with its feeds."""
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 16)))
    b = _Builder()
    rank4 = draw(st.booleans())
    shape = (draw(st.integers(1, 2)), draw(st.integers(1, 4)), draw(st.integers(1, 5)), draw(st.integers(1, 5))) \
        if rank4 else (draw(st.integers(1, 3)), draw(st.integers(1, 6)))
    inputs = [("x", shape)]
    if draw(st.booleans()):
        inputs.append(("y", _broadcast_shape(draw, shape) or (1,)))
    b.values.extend(inputs)
    shared: list[tuple[str, tuple]] = []  # constants a later node may reuse
    for _ in range(draw(st.integers(1, 12))):
        # mostly chains (the newest value), sometimes fan-out from an older one
        pick = len(b.values) - 1 if draw(st.integers(0, 2)) else draw(st.integers(0, len(b.values) - 1))
        src, s = b.values[pick]
        kind = draw(st.sampled_from(["unary", "binary", "binary_const", "transpose", "transpose_pair",
                                     "reshape", "concat", "matmul", "gemm", "conv", "bn", "softmax",
                                     "reduce", "pad", "motif", "motif"]))
        if kind == "motif":
            _motif(draw, b, rng, src, s)
            continue
        if kind == "unary":
            op = draw(st.sampled_from(UNARY))
            attrs = {"alpha": 0.1} if op == "LeakyRelu" else {}
            ins = [src]
            if op == "Clip":
                ins += [b.const(np.array(-0.5)), b.const(np.array(0.75))]
            b.node(op, ins, s, **attrs)
        elif kind == "binary":  # fan-in of two values of broadcastable shapes
            others = [(n, t) for n, t in b.values if _broadcasts_to(t, s)]
            other, _ = others[draw(st.integers(0, len(others) - 1))]
            b.node(draw(st.sampled_from(BINARY)), [src, other], s)
        elif kind == "binary_const":
            reuse = [c for c in shared if _broadcasts_to(c[1], s)]
            if reuse and draw(st.booleans()):
                c = reuse[draw(st.integers(0, len(reuse) - 1))][0]
            else:
                cs = _broadcast_shape(draw, s)
                c = b.const(rng.standard_normal(cs))
                shared.append((c, cs))
            ins = [src, c] if draw(st.booleans()) else [c, src]
            b.node(draw(st.sampled_from(BINARY)), ins, s)
        elif kind in ("transpose", "transpose_pair"):
            perm = list(draw(st.permutations(range(len(s)))))
            t = b.node("Transpose", [src], tuple(s[p] for p in perm), perm=perm)
            if kind == "transpose_pair":
                inv = list(np.argsort(perm))
                b.node("Transpose", [t], s, perm=[int(i) for i in inv])
        elif kind == "reshape":
            target = (s[0], int(np.prod(s[1:]))) if draw(st.booleans()) else (int(np.prod(s)),)
            b.node("Reshape", [src, _int_const(b, target)], target)
        elif kind == "concat":
            same = [n for n, t in b.values if t == s]
            axis = draw(st.integers(-len(s), len(s) - 1))
            other = same[draw(st.integers(0, len(same) - 1))]
            out = list(s)
            out[axis] *= 2
            b.node("Concat", [src, other], tuple(out), axis=axis)
        elif kind == "matmul":
            m = draw(st.integers(1, 6))
            b.node("MatMul", [src, b.const(rng.standard_normal((s[-1], m)))], s[:-1] + (m,))
        elif kind == "gemm" and len(s) == 2:
            m = draw(st.integers(1, 6))
            trans_b = draw(st.integers(0, 1))
            w = rng.standard_normal((m, s[1]) if trans_b else (s[1], m))
            ins = [src, b.const(w)] + ([b.const(rng.standard_normal((m,)))] if draw(st.booleans()) else [])
            b.node("Gemm", ins, (s[0], m), transB=trans_b, alpha=float(draw(st.sampled_from([1.0, 0.5]))))
        elif kind == "conv" and len(s) == 4:
            k = draw(st.integers(1, min(3, s[2], s[3]) if min(s[2], s[3]) >= 1 else 1))
            group = draw(st.sampled_from([g for g in (1, s[1]) if s[1] % g == 0]))
            o = draw(st.integers(1, 3)) * group
            pad = draw(st.integers(0, k - 1)) if k > 1 else 0
            w = b.const(rng.standard_normal((o, s[1] // group, k, k)) * 0.5)
            ins = [src, w] + ([b.const(rng.standard_normal((o,)))] if draw(st.booleans()) else [])
            h, wd = s[2] + 2 * pad - k + 1, s[3] + 2 * pad - k + 1
            b.node("Conv", ins, (s[0], o, h, wd), kernel_shape=[k, k], pads=[pad] * 4, group=group)
        elif kind == "bn" and len(s) == 4:
            c = s[1]
            ins = [src, b.const(rng.uniform(0.5, 1.5, c)), b.const(rng.standard_normal(c)),
                   b.const(rng.standard_normal(c) * 0.1), b.const(rng.uniform(0.5, 2.0, c))]
            b.node("BatchNormalization", ins, s, epsilon=1e-5)
        elif kind == "softmax":
            b.node("Softmax", [src], s, axis=draw(st.integers(-len(s), len(s) - 1)))
        elif kind == "reduce":
            axis = draw(st.integers(0, len(s) - 1))
            out = list(s)
            out[axis] = 1
            b.node("ReduceMean", [src, _int_const(b, (axis,))], tuple(out), keepdims=1)
        elif kind == "pad" and len(s) == 4:
            p = [0, 0, draw(st.integers(0, 1)), draw(st.integers(0, 1))] * 2
            out = (s[0], s[1], s[2] + 2 * p[2], s[3] + 2 * p[3])
            b.node("Pad", [src, _int_const(b, tuple(p))], out, mode="constant")
    # outputs: the last value, maybe an intermediate (also consumed inside), maybe a graph input, maybe twice
    made = b.values[len(inputs):]
    outs = [made[-1]] if made else [inputs[0]]
    for _ in range(draw(st.integers(0, 2))):
        outs.append(b.values[draw(st.integers(0, len(b.values) - 1))])
    if draw(st.booleans()):
        outs.append(outs[0])  # a duplicate output
    graph = helper.make_graph(
        b.nodes, "random",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(t)) for n, t in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(t)) for n, t in outs],
        initializer=b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    feeds = {n: rng.standard_normal(t).astype(np.float32) for n, t in inputs}
    return model, feeds


def _motif(draw, b: _Builder, rng, src: str, s: tuple) -> None:
    """A pattern that a fusion pass looks for, written the way exporters write it."""
    kind = draw(st.sampled_from(["conv_bn_relu", "linear_act", "gelu", "layernorm", "affine", "attention",
                                 "pad_conv"]))
    if kind in ("conv_bn_relu", "pad_conv", "affine") and len(s) != 4:
        kind = "linear_act"
    if kind == "attention" and len(s) < 2:
        kind = "gelu"
    if kind == "conv_bn_relu":
        o = draw(st.integers(1, 4))
        y = b.node("Conv", [src, b.const(rng.standard_normal((o, s[1], 1, 1)))], (s[0], o, s[2], s[3]),
                   kernel_shape=[1, 1])
        y = b.node("BatchNormalization", [y, b.const(rng.uniform(0.5, 1.5, o)), b.const(rng.standard_normal(o)),
                                          b.const(rng.standard_normal(o) * 0.1), b.const(rng.uniform(0.5, 2, o))],
                   (s[0], o, s[2], s[3]))
        b.node(draw(st.sampled_from(["Relu", "Sigmoid", "Identity"])), [y], (s[0], o, s[2], s[3]))
    elif kind == "pad_conv":
        p = draw(st.integers(1, 2))
        y = b.node("Pad", [src, _int_const(b, (0, 0, p, p, 0, 0, p, p))], (s[0], s[1], s[2] + 2 * p, s[3] + 2 * p))
        k = 1 + p
        b.node("Conv", [y, b.const(rng.standard_normal((2, s[1], k, k)) * 0.3)],
               (s[0], 2, s[2] + 2 * p - k + 1, s[3] + 2 * p - k + 1), kernel_shape=[k, k])
    elif kind == "affine":
        c = (1, s[1], 1, 1)
        y = b.node("Mul", [src, b.const(rng.standard_normal(c))], s)
        b.node("Add", [y, b.const(rng.standard_normal(c))], s)
    elif kind == "linear_act":
        m = draw(st.integers(1, 6))
        out = s[:-1] + (m,)
        y = b.node("MatMul", [src, b.const(rng.standard_normal((s[-1], m)))], out)
        y = b.node("Add", [y, b.const(rng.standard_normal((m,)))], out)
        if draw(st.booleans()):
            y = b.node(draw(st.sampled_from(["Relu", "Tanh", "Sigmoid"])), [y], out)
        if draw(st.booleans()):  # a residual
            b.node("Add", [y, y], out)
    elif kind == "gelu":
        h = b.node("Div", [src, b.const(np.array(np.sqrt(2.0)))], s)
        h = b.node("Erf", [h], s)
        h = b.node("Add", [h, b.const(np.array(1.0))], s)
        h = b.node("Mul", [src, h], s)
        b.node("Mul", [h, b.const(np.array(0.5))], s)
    elif kind == "layernorm":
        last = _int_const(b, (len(s) - 1,))
        red = s[:-1] + (1,)
        mean = b.node("ReduceMean", [src, last], red, keepdims=1)
        d = b.node("Sub", [src, mean], s)
        sq = b.node("Mul", [d, d], s)
        var = b.node("ReduceMean", [sq, last], red, keepdims=1)
        # (epsilon 1e-3, not 1e-5: a constant row would amplify float rounding 300x and test nothing)
        var = b.node("Add", [var, b.const(np.array(1e-3))], red)
        std = b.node("Sqrt", [var], red)
        y = b.node("Div", [d, std], s)
        y = b.node("Mul", [y, b.const(rng.standard_normal(s[-1:]))], s)
        b.node("Add", [y, b.const(rng.standard_normal(s[-1:]))], s)
    elif kind == "attention":
        rank = len(s)
        swap = list(range(rank - 2)) + [rank - 1, rank - 2]
        kt = b.node("Transpose", [src], tuple(s[i] for i in swap), perm=swap)
        scores = s[:-1] + (s[-2],)
        sc = b.node("MatMul", [src, kt], scores)
        sc = b.node("Mul", [sc, b.const(np.array(1.0 / np.sqrt(s[-1])))], scores)
        p = b.node("Softmax", [sc], scores, axis=-1)
        b.node("MatMul", [p, src], s)


def _int_const(b: _Builder, values: tuple) -> str:
    n = b.name("i")
    b.inits.append(numpy_helper.from_array(np.asarray(values, dtype=np.int64), n))
    return n


def _outputs(graph, feeds) -> list[np.ndarray]:
    got = run(graph, feeds)
    return [np.asarray(got[v.name]) for v in graph.outputs]


def _close(expected, actual, what: str) -> None:
    assert len(expected) == len(actual), what
    for i, (e, a) in enumerate(zip(expected, actual)):
        assert e.shape == a.shape, f"{what}: output {i} shape {a.shape}, expected {e.shape}"
        # relative to the output's scale: a difference of float rounding near zero is not an error
        scale = float(np.max(np.abs(e))) if e.size else 0.0
        np.testing.assert_allclose(a, e, rtol=RTOL, atol=ATOL + RTOL * scale, err_msg=f"{what}: output {i}")


def _ort(model, feeds) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return [np.asarray(o) for o in sess.run(None, feeds)]


# canonicalize is left out on purpose: it moves a Transpose next to a graph input or output into the
# interface (recorded in graph.meta["canonical_layout"]) for cross-framework comparison, so it changes
# input/output shapes by design; no optimization level runs it (tests/crossframework covers it)
INFERENCE_PASSES = sorted(name for name, p in all_passes().items()
                          if "inference" in p.modes and name != "canonicalize")


def check_model(model, feeds, event=lambda what: None) -> None:
    """Every property of the module docstring, for one model (`event` records what the passes did)."""
    names = [o.name for o in model.graph.output]
    reference = _ort(model, feeds)
    g0 = from_onnx(model)
    assert [v.name for v in g0.outputs] == names
    _close(reference, _outputs(g0, feeds), "reference executor vs onnxruntime")
    for name in INFERENCE_PASSES:
        g = from_onnx(model)
        run_passes(g, passes=[name])
        g.verify()
        assert [v.name for v in g.outputs] == names, f"pass {name} renamed the outputs"
        _close(reference, _outputs(g, feeds), f"pass {name} alone")
    for level in (1, 2, 3):
        g = from_onnx(model)
        report = run_passes(g, level=level)
        for r in report.records:  # --hypothesis-show-statistics: how often each pass really rewrote
            if r.rewrites or r.removed or r.added:
                event(f"level {level}: {r.name} rewrote")
        g.verify()
        what = f"level {level}"
        assert [v.name for v in g.outputs] == names, f"{what} renamed the outputs"
        got = _outputs(g, feeds)
        _close(reference, got, what)
        _close(reference, _outputs(parse(print_graph(g), {k: v.const for k, v in g.initializers.items()}), feeds),
               f"{what}: text round trip")
        _close(reference, _outputs(from_onnx(to_onnx(g)), feeds), f"{what}: to_onnx re-import")
        plan = plan_memory(g)
        check_plan(plan)
        planned = run_planned(g, feeds, plan)
        _close(got, [np.asarray(planned[v.name]) for v in g.outputs], f"{what}: planned execution")


@given(onnx_models())
def test_random_graphs_keep_numerics_through_every_pass(case):
    model, feeds = case
    hypothesis.note(onnx.printer.to_text(model.graph))  # shown with a failing (shrunk) example
    check_model(model, feeds, hypothesis.event)


# -- shrunk failures, kept as regression tests ------------------------------------------------------------

def _model(nodes, inputs, outputs, inits=()):
    graph = helper.make_graph(nodes, "regression",
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs],
                              initializer=list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_identity_transpose_of_an_input_that_is_also_an_output_keeps_every_name():
    """Found by the property test: transpose_propagation removed a dead identity Transpose of graph input
    `y`, which was also a graph output, and renamed the input (and that output) to the Transpose's name."""
    model = _model([helper.make_node("Transpose", ["y"], ["t"], perm=[0], name="t"),
                    helper.make_node("Relu", ["x"], ["r"], name="r")],
                   [("x", [1, 1]), ("y", [1])], [("r", [1, 1]), ("y", [1])])
    g = from_onnx(model)
    run_passes(g, passes=["transpose_propagation"])
    assert [v.name for v in g.inputs] == ["x", "y"] and [v.name for v in g.outputs] == ["r", "y"]
    check_model(model, {"x": np.array([[0.5]], np.float32), "y": np.array([-0.25], np.float32)})


def test_transpose_pair_around_an_input_that_is_also_an_output_keeps_every_name():
    """Issue 16's example: a graph output that is also a graph input, read through a Transpose pair that
    cancels."""
    model = _model([helper.make_node("Transpose", ["x"], ["t1"], perm=[1, 0], name="t1"),
                    helper.make_node("Transpose", ["t1"], ["t2"], perm=[1, 0], name="t2"),
                    helper.make_node("Relu", ["t2"], ["r"], name="r")],
                   [("x", [2, 3])], [("r", [2, 3]), ("x", [2, 3]), ("t2", [2, 3])])
    for level in (1, 2):
        g = from_onnx(model)
        run_passes(g, level=level)
        assert [v.name for v in g.inputs] == ["x"]
        assert [v.name for v in g.outputs] == ["r", "x", "t2"], level
    check_model(model, {"x": np.arange(6, dtype=np.float32).reshape(2, 3) - 2})
