"""numba.cuda kernels for aiacc::FusedElementwise (aiacc/core/runtime/cuda_kernels.py) against the reference
evaluation of the program: on CPU under numba's CUDA simulator (in a subprocess, since
NUMBA_ENABLE_CUDASIM must be set before numba.cuda is first imported), on a real device when there is one.
Also: the measured choice keeps the faster candidate, and the kernel is never chosen under the simulator."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

pytest.importorskip("numba")
from aiacc.core.runtime import cuda_kernels  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# every op the scalar generator knows, in programs with 1-3 inputs, and the input shapes to broadcast
PROGRAMS = [
    ("t0=Mul(i0,i1);t1=Add(t0,i2);t2=Relu(t1)", [(2, 3, 4), (3, 1), ()]),
    ("t0=Sub(i0,i1);t1=Div(t0,i2);t2=Abs(t1);t3=Sqrt(t2)", [(4, 5), (4, 5), (5,)]),
    ("t0=Sigmoid(i0);t1=Mul(i0,t0)", [(6, 7)]),
    ("t0=Tanh(i0);t1=Exp(t0);t2=Log(t1);t3=Neg(t2)", [(33,)]),
    ("t0=Erf(i0);t1=Sin(t0);t2=Cos(t1);t3=Reciprocal(t2)", [(3, 9)]),
    ("t0=Gelu(i0)", [(2, 300)]),
    ('t0=Gelu(i0){"approximate":"tanh"}', [(2, 10)]),
    ('t0=LeakyRelu(i0){"alpha":0.1};t1=Elu(t0){"alpha":0.5}', [(5, 6)]),
    ('t0=HardSigmoid(i0){"alpha":0.25,"beta":0.4};t1=HardSwish(i0);t2=Add(t0,t1)', [(4, 4)]),
    ("t0=Softplus(i0);t1=Softsign(t0);t2=Identity(t1)", [(7,)]),
    ("t0=Clip(i0,i1,i2);t1=Max(t0,i0,i1);t2=Min(t1,i2)", [(3, 4), (), ()]),
    ("t0=Abs(i0);t1=Pow(t0,i1)", [(2, 1, 4), (3, 1)]),
]

SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    from aiacc.core.ops.fused import eval_program
    from aiacc.core.runtime import cuda_kernels
    from numba import cuda
    cases = json.loads(sys.argv[1])
    report = {"simulator": bool(cuda.simulator_enabled) if hasattr(cuda, "simulator_enabled") else None,
              "available": cuda_kernels.cuda_available(), "results": []}
    rng = np.random.default_rng(0)
    for program, shapes in cases:
        for dtype in ("float32", "float64"):
            xs = [rng.standard_normal(s).astype(dtype) for s in shapes]
            if program.startswith("t0=Clip"):
                xs[1], xs[2] = np.asarray(-0.5, dtype), np.asarray(0.7, dtype)
            fn = cuda_kernels.cuda_fused_kernel(program, len(shapes), dtype)
            with np.errstate(all="ignore"):
                expected = np.asarray(eval_program(program, xs), dtype)
            got = fn(*xs).copy_to_host()
            out = cuda.device_array(expected.shape, dtype)
            fn(*xs, out=out)
            report["results"].append({
                "program": program, "dtype": dtype, "shape": list(got.shape),
                "expected_shape": list(expected.shape), "dtype_out": got.dtype.name,
                "err": float(np.nanmax(np.abs(got - expected) / (1 + np.abs(expected)))) if got.size else 0.0,
                "out_err": float(np.nanmax(np.abs(out.copy_to_host() - expected) / (1 + np.abs(expected)))),
                "nan_same": bool(np.array_equal(np.isnan(got), np.isnan(expected))),
                "modes": [list(m) for m in fn.sources], "calls": fn.calls})
    print(json.dumps(report))
""")


def _run(env_extra):
    env = dict(os.environ, PYTHONPATH=ROOT, **env_extra)
    proc = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(PROGRAMS)], capture_output=True, text=True,
                          env=env, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _check(report, rtol32):
    assert len(report["results"]) == 2 * len(PROGRAMS)
    for r in report["results"]:
        what = f"{r['program']} {r['dtype']}"
        assert r["shape"] == r["expected_shape"], what
        assert r["dtype_out"] == r["dtype"], what
        assert r["nan_same"], what
        tol = rtol32 if r["dtype"] == "float32" else 1e-12
        assert r["err"] <= tol and r["out_err"] <= tol, f"{what}: error {r['err']:.3g}"
        assert r["calls"] == 2, what
    # the three ways of indexing an input were all compiled and checked
    modes = {m for r in report["results"] for pattern in r["modes"] for m in pattern}
    assert modes == {"f", "s", "b"}


def test_kernels_match_the_reference_under_the_cuda_simulator():
    report = _run({"NUMBA_ENABLE_CUDASIM": "1"})
    assert report["available"] is False  # the simulator is never "a CUDA device" for the choice
    _check(report, 2e-6)


@pytest.mark.skipif(not cuda_kernels.cuda_available(), reason="numba sees no CUDA device")
def test_kernels_match_the_reference_on_the_device():
    report = _run({"NUMBA_ENABLE_CUDASIM": "0"})
    assert report["available"] is True
    _check(report, 2e-6)


def test_kernel_source_indexes_each_input_by_its_mode():
    src = cuda_kernels.kernel_source("t0=Add(i0,i1);t1=Mul(t0,i2)", 3, "fsb")
    assert "out[j] = _kernel(i0[j], i1[0], i2[b2])" in src
    assert "b2 += q * strides[2, d]" in src and "b0 +=" not in src
    with pytest.raises(Exception, match="modes"):
        cuda_kernels.kernel_source("t0=Relu(i0)", 1, "x")


def test_unsupported_dtype_and_op_are_errors():
    from aiacc.errors import KernelError

    with pytest.raises(KernelError, match="float32 and float64"):
        cuda_kernels.CudaFusedKernel("t0=Relu(i0)", 1, "int32")
    with pytest.raises(KernelError):
        cuda_kernels.CudaFusedKernel("t0=Where(i0,i1,i2)", 3, "float32")


def test_measured_choice_keeps_the_faster_and_remembers():
    import time

    calls = []

    def slow():
        calls.append("slow")
        time.sleep(0.004)

    def fast():
        calls.append("fast")

    def broken():
        raise RuntimeError("cannot run")

    key = ("test", object())
    assert cuda_kernels.measured_choice(key, {"framework": slow, "numba.cuda": fast, "x": broken},
                                        sync=lambda: None, repeat=2) == "numba.cuda"
    n = len(calls)
    assert cuda_kernels.measured_choice(key, {"framework": slow, "numba.cuda": fast}, sync=lambda: None) == \
        "numba.cuda"
    assert len(calls) == n  # measured once per key
    assert cuda_kernels.choices()[key] == "numba.cuda"
    key2 = ("test2",)
    assert cuda_kernels.measured_choice(key2, {"framework": fast, "numba.cuda": slow}, sync=lambda: None,
                                        repeat=2) == "framework"
