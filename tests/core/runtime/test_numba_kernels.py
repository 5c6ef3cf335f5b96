import numpy as np
import pytest

from aiacc.core.ops.fused import eval_program
from aiacc.core.runtime import numba_kernels as nk
from aiacc.errors import AiaccError

PROGRAMS = [
    ("t0=Mul(i0,i1);t1=Add(t0,i2);t2=Relu(t1)", 3),
    ("t0=Sigmoid(i0);t1=Mul(i0,t0);t2=Tanh(t1);t3=Sub(t2,i1)", 2),
    ('t0=LeakyRelu(i0){"alpha":0.2};t1=Elu(t0){"alpha":0.5};t2=HardSigmoid(t1){"alpha":0.3,"beta":0.4}', 1),
    ('t0=Gelu(i0);t1=Gelu(i0){"approximate":"tanh"};t2=Sub(t0,t1);t3=Softplus(t2);t4=Softsign(t3)', 1),
    ("t0=Clip(i0,i1,i2);t1=Max(t0,i0);t2=Min(t1,i1);t3=Abs(t2);t4=Sqrt(t3);t5=Exp(t4);t6=Log(t5)", 3),
    ("t0=Div(i0,i1);t1=Abs(t0);t2=Pow(t1,i1);t3=Reciprocal(t2);t4=Neg(t3);t5=Erf(t4);t6=HardSwish(t5)", 2),
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("program,n", PROGRAMS)
def test_kernel_matches_reference(program, n, dtype):
    rng = np.random.default_rng(0)
    shapes = [(2, 3, 4), (3, 1), ()][:n]
    xs = [rng.uniform(0.2, 2.0, s).astype(dtype) if k else rng.standard_normal(s).astype(dtype)
          for k, s in enumerate(shapes)]
    fn = nk.fused_elementwise_kernel(program, n, dtype)
    got = fn(*xs)
    want = eval_program(program, xs)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=2e-5 if dtype == "float32" else 1e-12, atol=1e-6)


def test_kernels_are_cached_by_program():
    p = "t0=Add(i0,i1);t1=Neg(t0)"
    a = nk.fused_elementwise_kernel(p, 2, "float32")
    assert nk.fused_elementwise_kernel(p, 2, "float32") is a
    assert nk.fused_elementwise_kernel(p, 2, "float64") is not a


def test_generated_source_is_one_scalar_function():
    src = nk.generate_source("t0=Mul(i0,i1);t1=Relu(t0)", 2)
    assert src.startswith("def _kernel(i0, i1):") and "t1 =" in src


def test_bad_program_is_an_aiacc_error():
    with pytest.raises(AiaccError, match="reads 't3' before it is defined"):
        nk.fused_elementwise_kernel("t0=Add(i0,t3)", 1, "float32")
    with pytest.raises(AiaccError, match="not a registered elementwise op"):
        nk.generate_source("t0=MatMul(i0,i0)", 1)


def test_numpy_fallback_without_numba(monkeypatch):
    monkeypatch.setattr(nk, "numba_available", lambda: False)
    p = "t0=Mul(i0,i0);t1=Sigmoid(t0)"
    fn = nk._compile(p, 1, "float32")
    x = np.linspace(-2, 2, 7, dtype=np.float32)
    np.testing.assert_array_equal(fn(x), eval_program(p, [x]))


def test_float32_exp_loop_is_vectorized(monkeypatch, tmp_path):
    """The SiLU loop compiles to 8-wide AVX2 code where the CPU has AVX2 (exp32's int32 steps stay vector:
    float->int32 conversion and the exponent shift on ymm registers, no int64 or float64 detour)."""
    import re

    import llvmlite.binding as llvm
    import numba

    if "avx2" not in llvm.get_host_cpu_features().flatten():
        pytest.skip("the CPU has no AVX2")
    monkeypatch.setenv("AIACC_CACHE_DIR", str(tmp_path))  # compiled here, so the assembly is available
    fn = nk._compile("t0=Sigmoid(i0);t1=Mul(i0,t0)", 1, "float32")
    x = np.linspace(-100, 100, 1001, dtype=np.float32)
    lay = nk._plan_layout([x.shape], None)
    _, serial = fn.functions(lay.inner)
    out = np.empty_like(x)
    serial(out, lay.last, lay.chunk, lay.tpr, lay.odims, lay.strides, x)
    np.testing.assert_allclose(out, eval_program("t0=Sigmoid(i0);t1=Mul(i0,t0)", [x]), rtol=2e-6, atol=1e-30)
    # numba refuses inspect_asm on a dispatcher it loaded from its disk cache (an earlier test or run compiled
    # the same kernel there), so the assembly is read from the same function compiled again without the cache
    options = {k: v for k, v in serial.targetoptions.items() if k not in ("cache", "nopython")}
    fresh = numba.njit(**options)(serial.py_func)
    fresh(out, lay.last, lay.chunk, lay.tpr, lay.odims, lay.strides, x)
    asm = "\n".join(fresh.inspect_asm().values())
    # 8-wide (ymm) on AVX2; on AVX-512 hosts LLVM may pick 16-wide zmm registers instead
    for insn in ("vcvttps2dq", "vpslld", "vdivps"):
        assert re.search(rf"\b{insn}\s[^\n]*%[yz]mm", asm), insn
    assert not re.search(r"\bvcvt\w*pd\w*\s[^\n]*%[yz]mm", asm), "a float64 detour in the exp loop"


def test_float32_exp_tanh_accuracy():
    """exp32 / tanh32 against float64 numpy on a dense grid: within 1.5 ulp; inf, nan and underflow as libm."""
    import warnings

    import numba

    from aiacc.core.runtime._numba_math import exp32, tanh32

    @numba.njit
    def both(x, e, t):
        for j in range(x.shape[0]):
            e[j] = exp32(x[j])
            t[j] = tanh32(x[j])

    x = np.concatenate([np.linspace(-100, 100, 400_001, dtype=np.float32),
                        np.array([np.inf, -np.inf, np.nan, 88.72283, 88.7229, -87.33654, -87.4, 0.0, 1e-30],
                                 np.float32)])
    e, t = np.empty_like(x), np.empty_like(x)
    both(x, e, t)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for got, f in ((e, np.exp), (t, np.tanh)):
            exact = f(x.astype(np.float64))
            r32 = exact.astype(np.float32)
            normal = np.isfinite(r32) & (np.abs(r32) >= np.finfo(np.float32).tiny)
            ulp = np.abs(got[normal] - exact[normal]) / np.spacing(np.abs(r32[normal])).astype(np.float64)
            assert ulp.max() <= 1.5, (f.__name__, ulp.max())
            np.testing.assert_array_equal(got[~np.isfinite(r32)], r32[~np.isfinite(r32)])
            assert np.all(got[np.isfinite(r32) & ~normal & (r32 != 0)] == 0)  # subnormal results flushed
