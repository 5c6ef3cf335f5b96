"""Every op the numba generator knows, compiled and compared with the reference evaluation on random inputs
that broadcast (per-channel, scalar, leading-axis), in both memory orders and through out=."""
import numpy as np
import pytest

from aiacc.core.ops import get_schema
from aiacc.core.ops.fused import eval_program
from aiacc.core.runtime import numba_kernels as nk

pytestmark = pytest.mark.skipif(not nk.numba_available(), reason="numba is not installed")

POSITIVE = {"Log", "Sqrt", "Pow"}  # defined on positive inputs only
ARITY = {"Add": 2, "Sub": 2, "Mul": 2, "Div": 2, "Pow": 2, "Clip": 3, "Max": 3, "Min": 3}
SHAPES = [(2, 3, 4, 5), (1, 3, 1, 1), ()]  # full, per-channel, scalar


def _inputs(op, n, dtype, rng):
    xs = []
    for k in range(n):
        shape = SHAPES[k]
        if op in POSITIVE:
            a = rng.uniform(0.2, 2.0, shape)
        elif op == "Clip" and k:
            a = np.asarray(-0.5 if k == 1 else 0.7)  # min <= max
        else:
            a = rng.standard_normal(shape) * 2
        xs.append(np.asarray(a, dtype))
    return xs


def test_every_scalar_op_is_tested_here():
    assert all(get_schema(op) is not None and get_schema(op).elementwise for op in nk.SCALAR_OPS)


def _program(op):
    n = ARITY.get(op, 1)
    # the op on the inputs, then a Mul by a per-channel input so the kernel always has a broadcast operand
    return f"t0={op}({','.join(f'i{k}' for k in range(n))});t1=Mul(t0,i{n})", n


@pytest.mark.parametrize("op", sorted(nk.SCALAR_OPS))
def test_op_matches_reference_with_broadcasting(op):
    rng = np.random.default_rng(abs(hash(op)) % 1000)
    program, n = _program(op)
    xs = _inputs(op, n, "float32", rng) + [rng.standard_normal((1, 3, 1, 1)).astype(np.float32)]
    fn = nk.fused_elementwise_kernel(program, n + 1, "float32")
    want = eval_program(program, xs)
    calls = fn.calls
    got = fn(*xs)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=3e-6, atol=1e-6)
    assert fn.calls == calls + 1  # the numba code ran
    out = np.empty(want.shape, np.float32)
    assert fn(*xs, out=out) is out
    np.testing.assert_allclose(out, want, rtol=3e-6, atol=1e-6)


def test_every_op_in_float64():
    # one kernel for all ops (each compile costs ~0.5 s): the sum of every op's result, weighted apart
    rng = np.random.default_rng(3)
    stmts, xs, k = [], [], 0
    acc = None
    for j, op in enumerate(sorted(nk.SCALAR_OPS)):
        n = ARITY.get(op, 1)
        args = []
        for a in _inputs(op, n, "float64", rng):
            xs.append(a)
            args.append(f"i{len(xs) - 1}")
        stmts.append(f"t{k}={op}({','.join(args)})")
        xs.append(np.asarray(1.0 + j / 7, np.float64))
        stmts.append(f"t{k + 1}=Mul(t{k},i{len(xs) - 1})")
        if acc is not None:
            stmts.append(f"t{k + 2}=Add(t{acc},t{k + 1})")
            acc, k = k + 2, k + 3
        else:
            acc, k = k + 1, k + 2
    program = ";".join(stmts)
    fn = nk.fused_elementwise_kernel(program, len(xs), "float64")
    np.testing.assert_allclose(fn(*xs), eval_program(program, xs), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("op", ["Add", "Clip", "HardSwish"])
def test_channels_last_follows_memory_order(op):
    rng = np.random.default_rng(4)
    program, n = _program(op)
    xs = _inputs(op, n, "float32", rng) + [rng.standard_normal((1, 3, 1, 1)).astype(np.float32)]
    fn = nk.fused_elementwise_kernel(program, n + 1, "float32")
    want = eval_program(program, xs)
    cl = np.ascontiguousarray(xs[0].transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    got = fn(cl, *xs[1:])
    np.testing.assert_allclose(got, want, rtol=3e-6, atol=1e-6)
    assert got.strides == cl.strides  # a channels-last result for a channels-last input
    for out in (np.empty(want.shape, np.float32), np.empty_like(cl)):
        assert fn(cl, *xs[1:], out=out) is out
        np.testing.assert_allclose(out, want, rtol=3e-6, atol=1e-6)


@pytest.mark.parametrize("shapes", [[(7,), (7,)], [(3, 1, 5), (1, 4, 1)], [(1,), (6, 1)], [(), ()],
                                    [(2, 1, 3), (3,)], [(64, 4096), (4096,)], [(3, 200003), ()]])
def test_broadcast_shapes_and_tiling(shapes):
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    p = "t0=Sub(i0,i1);t1=Mul(t0,t0);t2=Add(t1,i1)"
    fn = nk.fused_elementwise_kernel(p, 2, "float32")
    np.testing.assert_allclose(fn(*xs), eval_program(p, xs), rtol=1e-6, atol=1e-6)


def test_parallel_variant_matches(monkeypatch):
    monkeypatch.setattr(nk, "PARALLEL_MIN_ELEMENTS", 0)  # every call takes the prange kernel
    rng = np.random.default_rng(2)
    x, b = rng.standard_normal((4, 8, 9, 9)).astype(np.float32), rng.standard_normal((1, 8, 1, 1)).astype(np.float32)
    p = "t0=Add(i0,i1);t1=Sigmoid(t0);t2=Mul(t0,t1)"
    fn = nk.fused_elementwise_kernel(p, 2, "float32")
    np.testing.assert_allclose(fn(x, b), eval_program(p, [x, b]), rtol=2e-6, atol=1e-7)


def test_out_with_wrong_shape_is_an_aiacc_error():
    fn = nk.fused_elementwise_kernel("t0=Add(i0,i1);t1=Neg(t0)", 2, "float32")
    with pytest.raises(nk.KernelError, match="out has shape"):
        fn(np.ones((2, 3), np.float32), np.ones(3, np.float32), out=np.empty((3, 2), np.float32))


def test_compile_fused_node_names_the_node():
    from aiacc.core.text import parse

    g = parse("""graph g(%x: float32[2,3]) {
  %y: float32[2,3] = aiacc::FusedElementwise<f>(%x) {program="t0=Relu(i0);t1=Neg(t0)"}
  return %y
}""")
    fn = nk.compile_fused_node(g.find_nodes("FusedElementwise", "aiacc")[0])
    x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(fn(x), -np.maximum(x, 0))
