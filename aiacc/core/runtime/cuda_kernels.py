"""numba.cuda kernels for aiacc::FusedElementwise: the program's scalar function (numba_kernels.generate_source,
the same one the CPU kernels start from) becomes a CUDA device function, called by a grid-stride kernel
that computes every element of the output in one pass over device memory (broadcasting included).

    fn = cuda_fused_kernel("t0=Mul(i0,i1);t1=Relu(t0)", 2, "float32")
    y = fn(a, b)                  # a numba device array; a, b: numpy arrays or CUDA arrays (torch tensors)
    fn(a, b, out=t)               # into a CUDA array of the output's shape (e.g. a torch tensor)

Inputs are numpy arrays (copied to the device) or objects with `__cuda_array_interface__` (torch CUDA
tensors, CuPy arrays; used in place, C-contiguous). Each input is indexed one of three ways, chosen per call
from the shapes and compiled once per pattern: with the output's own shape (the flat index), a single
element (index 0), or broadcast (the flat index decomposed over the output's dims, times the input's
strides there, 0 along broadcast dims).

`measured_choice(key, candidates)` times the candidates (this kernel and the framework's own op-by-op
path) on the real inputs once per key and keeps the faster: the kernel is used only where a CUDA device
is present (`cuda_available()`, never under numba's simulator) and measured faster. Tests run the kernels
on CPU under numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1 set before numba.cuda is imported).
"""
from __future__ import annotations

import math
import os
import threading
import time
from typing import Any, Callable, Sequence

import numpy as np

from aiacc.core.runtime.numba_kernels import generate_source
from aiacc.errors import KernelError

THREADS_PER_BLOCK = 256
MAX_BLOCKS = 65535 * 4  # grid-stride: more elements than threads loop


def _cuda():
    """numba.cuda, imported on first use (importing it reads NUMBA_ENABLE_CUDASIM once)."""
    from numba import cuda

    return cuda


def simulator() -> bool:
    """Whether numba.cuda is numba's CPU simulator."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


def cuda_available() -> bool:
    """Whether a real CUDA device is usable through numba (False without numba, without a device or driver,
    and under the simulator)."""
    if simulator():
        return False
    try:
        return bool(_cuda().is_available())
    except Exception:  # noqa: BLE001  (no numba, no driver, a numba without its CUDA target)
        return False


def kernel_source(program: str, n_inputs: int, modes: Sequence[str]) -> str:
    """The module source: the program's device function `_kernel` and the kernel `_launch(out, odims,
    strides, i0, ...)`; modes[k] is "f" (input k has the output's shape), "s" (one element) or "b"
    (broadcast through strides[k])."""
    if len(modes) != n_inputs or any(m not in "fsb" for m in modes):
        raise KernelError(f"FusedElementwise CUDA kernel: modes {list(modes)} for {n_inputs} inputs")
    ins = ", ".join(f"i{k}" for k in range(n_inputs))
    src = ["import math", "from numba import cuda", "", "@cuda.jit(device=True)",
           generate_source(program, n_inputs).rstrip(), "", "", "@cuda.jit",
           f"def _launch(out, odims, strides, {ins}):",
           "    start = cuda.grid(1)",
           "    step = cuda.gridsize(1)",
           "    for j in range(start, out.shape[0], step):"]
    broadcast = [k for k, m in enumerate(modes) if m == "b"]
    if broadcast:
        src += [f"        b{k} = 0" for k in broadcast]
        src += ["        rem = j",
                "        for d in range(odims.shape[0] - 1, -1, -1):",
                "            q = rem % odims[d]",
                "            rem = rem // odims[d]"]
        src += [f"            b{k} += q * strides[{k}, d]" for k in broadcast]
    index = {"f": "j", "s": "0"}
    args = ", ".join(f"i{k}[{index.get(m, f'b{k}')}]" for k, m in enumerate(modes))
    src += [f"        out[j] = _kernel({args})", ""]
    return "\n".join(src)


def _shape_of(x: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in x.shape)


def _dtype_of(x: Any) -> np.dtype:
    if isinstance(x, np.ndarray):
        return x.dtype
    iface = getattr(x, "__cuda_array_interface__", None)
    if iface is not None:
        return np.dtype(iface["typestr"])
    return np.asarray(x).dtype


class CudaFusedKernel:
    """A FusedElementwise program compiled for CUDA at one dtype: `fn(*inputs, out=None, stream=0)`.
    `calls` counts the kernel launches; `sources` holds the generated module per index pattern."""

    def __init__(self, program: str, n_inputs: int, dtype: str):
        self.program, self.n_inputs, self.dtype = program, n_inputs, np.dtype(dtype)
        if self.dtype.name not in ("float32", "float64"):
            raise KernelError(f"FusedElementwise CUDA kernel: dtype {self.dtype.name} (float32 and float64 only)")
        generate_source(program, n_inputs)  # validates the program (every op has scalar code)
        self.calls = 0
        self.sources: dict[tuple[str, ...], str] = {}
        self._kernels: dict[tuple[str, ...], Any] = {}
        self._layouts: dict[tuple, tuple] = {}
        self._lock = threading.Lock()

    def _kernel(self, modes: tuple[str, ...]):
        fn = self._kernels.get(modes)
        if fn is None:
            with self._lock:
                fn = self._kernels.get(modes)
                if fn is None:
                    source = kernel_source(self.program, self.n_inputs, modes)
                    namespace: dict = {"math": math}
                    code = compile(source, f"<aiacc cuda fused elementwise {self.program}>", "exec")
                    exec(code, namespace)  # noqa: S102  (generated from the validated program)
                    self.sources[modes] = source
                    fn = self._kernels[modes] = namespace["_launch"]
        return fn

    def _layout(self, shapes: list[tuple[int, ...]]):
        """(output shape, modes, odims, strides as device arrays) for these input shapes, cached."""
        key = tuple(shapes)
        lay = self._layouts.get(key)
        if lay is not None:
            return lay
        try:
            out_shape = tuple(np.broadcast_shapes(*shapes))
        except ValueError as e:
            raise KernelError(f"FusedElementwise CUDA kernel: inputs of shapes {[list(s) for s in shapes]} do "
                              f"not broadcast") from e
        r = len(out_shape)
        modes, strides = [], []
        for s in shapes:
            full = (1,) * (r - len(s)) + s
            st, acc = [0] * r, 1
            for d in range(r - 1, -1, -1):
                st[d] = 0 if full[d] == 1 and out_shape[d] != 1 else acc
                acc *= full[d]
            strides.append(st)
            modes.append("f" if full == out_shape else "s" if int(np.prod(s, dtype=np.int64)) == 1 else "b")
        cuda = _cuda()
        odims = cuda.to_device(np.asarray(out_shape or (1,), np.int64))
        st = cuda.to_device(np.asarray(strides, np.int64).reshape(len(shapes), max(r, 1)) if r
                            else np.zeros((len(shapes), 1), np.int64))
        lay = self._layouts[key] = (out_shape, tuple(modes), odims, st)
        return lay

    def __call__(self, *xs: Any, out: Any = None, stream: Any = 0) -> Any:
        """The program on the inputs (broadcast like numpy), as a device array of the output's shape, or
        written into `out` (a CUDA array of that shape and the kernel's dtype), which is returned."""
        if len(xs) != self.n_inputs:
            raise KernelError(f"FusedElementwise CUDA kernel takes {self.n_inputs} inputs, got {len(xs)}")
        cuda = _cuda()
        arrays = []
        for k, x in enumerate(xs):
            if _dtype_of(x) != self.dtype:
                raise KernelError(f"FusedElementwise CUDA kernel ({self.dtype.name}): input {k} is "
                                  f"{_dtype_of(x).name}")
            if hasattr(x, "__cuda_array_interface__") and not isinstance(x, np.ndarray):
                arrays.append(cuda.as_cuda_array(x))
            else:
                arrays.append(cuda.to_device(np.ascontiguousarray(x), stream=stream))
        out_shape, modes, odims, strides = self._layout([_shape_of(a) for a in arrays])
        for k, a in enumerate(arrays):
            if not a.is_c_contiguous():
                raise KernelError(f"FusedElementwise CUDA kernel: input {k} is not C-contiguous")
        size = int(np.prod(out_shape, dtype=np.int64)) if out_shape else 1
        if out is None:
            target = cuda.device_array(size, self.dtype, stream=stream)
            result = target.reshape(out_shape) if out_shape else target
        else:
            result = cuda.as_cuda_array(out) if not hasattr(out, "copy_to_host") else out
            if _shape_of(result) != out_shape or result.dtype != self.dtype or not result.is_c_contiguous():
                raise KernelError(f"FusedElementwise CUDA kernel: out must be a C-contiguous {self.dtype.name} "
                                  f"array of shape {list(out_shape)}")
            target = result.reshape(size)
            result = out
        flats = [a.reshape(int(np.prod(_shape_of(a), dtype=np.int64)) or 1) if a.ndim != 1 else a for a in arrays]
        if size:
            blocks = min(MAX_BLOCKS, -(-size // THREADS_PER_BLOCK))
            self._kernel(modes)[blocks, THREADS_PER_BLOCK, stream](target, odims, strides, *flats)
            self.calls += 1
        return result


_CACHE: dict[tuple[str, int, str], CudaFusedKernel] = {}
_CACHE_LOCK = threading.Lock()


def cuda_fused_kernel(program: str, n_inputs: int, dtype: str) -> CudaFusedKernel:
    """The CUDA kernel for a program at a dtype, made once per process (compiled per index pattern on first
    call)."""
    key = (program, n_inputs, np.dtype(dtype).name)
    with _CACHE_LOCK:
        fn = _CACHE.get(key)
        if fn is None:
            fn = _CACHE[key] = CudaFusedKernel(program, n_inputs, key[2])
    return fn


# ------------------------------------------------------------------------------------------------ choice
_CHOICES: dict[Any, str] = {}


def _time(fn: Callable[[], Any], sync: Callable[[], None], repeat: int) -> float:
    fn()
    sync()  # warm-up (compilation, caching allocators) not timed
    best = math.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t0)
    return best


def measured_choice(key: Any, candidates: dict[str, Callable[[], Any]], sync: Callable[[], None] | None = None,
                    repeat: int = 5) -> str:
    """The name of the fastest candidate (each called with no arguments, then `sync()`: default the
    device-wide numba.cuda.synchronize), measured once per key and remembered; a candidate that raises is
    out of the running. Ties go to the first candidate (list the framework's own path first)."""
    got = _CHOICES.get(key)
    if got is not None:
        return got
    sync = sync or _cuda().synchronize
    times: dict[str, float] = {}
    for name, fn in candidates.items():
        try:
            times[name] = _time(fn, sync, repeat)
        except Exception:  # noqa: BLE001  (a candidate that cannot run these inputs loses)
            continue
    if not times:
        raise KernelError(f"no candidate ran for {key!r}")
    best = min(times, key=lambda n: (times[n], list(candidates).index(n)))
    _CHOICES[key] = best
    return best


def choices() -> dict[Any, str]:
    """Every choice measured so far (key -> candidate name)."""
    return dict(_CHOICES)


__all__: Sequence[str] = ["cuda_fused_kernel", "CudaFusedKernel", "kernel_source", "cuda_available", "simulator",
                          "measured_choice", "choices", "THREADS_PER_BLOCK"]
