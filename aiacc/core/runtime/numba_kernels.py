"""numba kernels for aiacc::FusedElementwise: the op's program becomes one loop over memory (numpy
broadcasting included, no temporaries), compiled by numba with `@njit` (fastmath off), in a parallel
(`prange`) and a serial variant; a call picks the parallel one from `PARALLEL_MIN_ELEMENTS` elements on
(measured: below that, starting the threads costs more than it saves).

    fn = fused_elementwise_kernel("t0=Mul(i0,i1);t1=Relu(t0)", 2, "float32")
    y = fn(a, b)                  # a new array
    fn(a, b, out=y)               # into a given array (any memory order; channels-last stays channels-last)
    fn = compile_fused_node(node) # the same from an aiacc::FusedElementwise IR node

The stable entry points other backends build on:
  - `compile_fused_node(node)` / `fused_elementwise_kernel(program, n_inputs, dtype)`: a `FusedKernel`,
    callable on numpy arrays as `fn(*inputs, out=None)`; `fn.calls` counts the calls that ran numba code.
  - `program_statements(program, args)` and `generate_source(program, n_inputs)`: the program as scalar
    Python statements / one scalar function `_kernel(i0, ...)` using `math.*` only, which numba.cuda can
    compile as a device function just as well (aiacc/core/runtime/cuda_kernels.py reuses them).

Compiled kernels live in generated modules under `cache_dir()` ($AIACC_CACHE_DIR, else
$XDG_CACHE_HOME/aiacc/numba, else ~/.cache/aiacc/numba), compiled with numba's `cache=True`: a fresh
process optimizing the same model loads the machine code from numba's cache index instead of compiling.
Without numba (or for other dtypes) a kernel falls back to the reference evaluation (one numpy call per op).

`FastInterpreter` runs a graph with these kernels for FusedElementwise nodes and the reference kernels for
everything else; `run_fast(graph, feeds)` is the one-call form.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import sys
import tempfile
import threading
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from aiacc.core.ir import Graph, Node
from aiacc.core.ops import get_schema
from aiacc.core.ops.fused import eval_program, parse_program
from aiacc.core.runtime.executor import Interpreter
from aiacc.errors import KernelError


def _f(x) -> str:
    return repr(float(x))


def _clip(a, at):
    out = a[0]
    if len(a) > 1:
        out = f"max({out}, {a[1]})"
    if len(a) > 2:
        out = f"min({out}, {a[2]})"
    return out


def _fold(fn):
    def gen(a, at):
        out = a[0]
        for x in a[1:]:
            out = f"{fn}({out}, {x})"
        return out
    return gen


# op -> scalar expression generator (args: source names, attrs: dict with schema defaults filled in)
SCALAR_OPS: dict[str, Callable[[list[str], dict], str]] = {
    "Add": lambda a, at: f"({a[0]} + {a[1]})",
    "Sub": lambda a, at: f"({a[0]} - {a[1]})",
    "Mul": lambda a, at: f"({a[0]} * {a[1]})",
    "Div": lambda a, at: f"({a[0]} / {a[1]})",
    "Pow": lambda a, at: f"({a[0]} ** {a[1]})",
    "Neg": lambda a, at: f"(-{a[0]})",
    "Abs": lambda a, at: f"abs({a[0]})",
    "Reciprocal": lambda a, at: f"(1.0 / {a[0]})",
    "Sqrt": lambda a, at: f"math.sqrt({a[0]})",
    "Exp": lambda a, at: f"math.exp({a[0]})",
    "Log": lambda a, at: f"math.log({a[0]})",
    "Sin": lambda a, at: f"math.sin({a[0]})",
    "Cos": lambda a, at: f"math.cos({a[0]})",
    "Tanh": lambda a, at: f"math.tanh({a[0]})",
    "Erf": lambda a, at: f"math.erf({a[0]})",
    "Relu": lambda a, at: f"({a[0]} if not ({a[0]} < 0.0) else 0.0)",
    "LeakyRelu": lambda a, at: f"({a[0]} if {a[0]} >= 0.0 else {a[0]} * {_f(at['alpha'])})",
    "Elu": lambda a, at: f"({a[0]} if {a[0]} > 0.0 else {_f(at['alpha'])} * math.expm1({a[0]}))",
    "Sigmoid": lambda a, at: f"(1.0 / (1.0 + math.exp(-{a[0]})))",
    "HardSigmoid": lambda a, at: f"min(max({a[0]} * {_f(at['alpha'])} + {_f(at['beta'])}, 0.0), 1.0)",
    "HardSwish": lambda a, at: f"({a[0]} * min(max({a[0]} / 6.0 + 0.5, 0.0), 1.0))",
    "Softplus": lambda a, at: f"(math.log1p(math.exp(-abs({a[0]}))) + max({a[0]}, 0.0))",
    "Softsign": lambda a, at: f"({a[0]} / (1.0 + abs({a[0]})))",
    "Gelu": lambda a, at: (
        f"(0.5 * {a[0]} * (1.0 + math.tanh(0.7978845608028654 * ({a[0]} + 0.044715 * {a[0]} ** 3))))"
        if at.get("approximate", "none") == "tanh" else
        f"(0.5 * {a[0]} * (1.0 + math.erf({a[0]} * 0.7071067811865476)))"),
    "Clip": _clip,
    "Max": _fold("max"),
    "Min": _fold("min"),
    "Identity": lambda a, at: a[0],
}

# From this many output elements on a call runs the prange variant. Measured on the 2-core machine
# (benchmarks/elementwise.py --kernels, workqueue layer): at 10k elements the serial (SIMD) kernel wins
# (mul+add+relu 3.2 vs 5.4 us), at 100k the parallel one (16 vs 19 us; SiLU 192 vs 396 us).
PARALLEL_MIN_ELEMENTS = int(os.environ.get("AIACC_NUMBA_PARALLEL_MIN", "65536"))
# numba's threading layer: unless the user picked one (NUMBA_THREADING_LAYER), the workqueue layer. The
# OpenMP layer is a second OpenMP runtime next to torch's: on 2 cores its spinning threads and torch's
# made a parallel launch take 4-8 ms instead of ~30 us. workqueue must not be entered from two threads at
# once, so parallel launches are serialized by _PARALLEL_LOCK.
_PARALLEL_LOCK = threading.Lock()


def _configure_threading() -> None:
    if "NUMBA_THREADING_LAYER" in os.environ:
        return
    import numba

    if numba.config.THREADING_LAYER == "default":
        numba.config.THREADING_LAYER = "workqueue"


def supported_op(op_type: str) -> bool:
    """Whether the numba kernel generator knows the op."""
    return op_type in SCALAR_OPS


def program_statements(program: str, args: Sequence[str] | None = None,
                       n_inputs: int | None = None) -> list[str]:
    """The program as scalar Python assignments `tK = <expr>`, in order; the last one's target is the
    result. Input `iN` is read as `args[N]` (default: the name `iN`). The expressions use arithmetic,
    comparisons, `abs`/`max`/`min` and `math.*` only, so numba (CPU or CUDA) compiles them for any float
    scalar type. Raises KernelError for an op without scalar code or an input the node does not have."""
    n = len(args) if args is not None else n_inputs
    out = []
    for target, op_type, ins, attrs in parse_program(program):
        if op_type not in SCALAR_OPS:
            raise KernelError(f"FusedElementwise: no numba code for {op_type}")
        schema = get_schema(op_type)
        full = {k: (attrs[k] if k in attrs else spec.default) for k, spec in schema.attrs.items()}
        names = []
        for a in ins:
            if a.startswith("i"):
                k = int(a[1:])
                if n is not None and k >= n:
                    raise KernelError(f"FusedElementwise program reads {a} but the node has {n} inputs")
                names.append(args[k] if args is not None else a)
            else:
                names.append(a)
        out.append(f"{target} = {SCALAR_OPS[op_type](names, full)}")
    return out


def generate_source(program: str, n_inputs: int) -> str:
    """Python source of the scalar function `_kernel(i0, ..., i{n-1})` the program stands for (one
    element in, one element out). numba.vectorize / numba.cuda.jit(device=True) compile it as it is."""
    args = [f"i{k}" for k in range(n_inputs)]
    body = program_statements(program, n_inputs=n_inputs)
    last = body[-1].split("=", 1)[0].strip()
    lines = [f"def _kernel({', '.join(args)}):"] + [f"    {s}" for s in body] + [f"    return {last}"]
    return "\n".join(lines) + "\n"


_FLOAT_LITERAL = re.compile(r"(?<![\w.])(\d+\.\d*(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+)")


def _typed_constants(lines: list[str]) -> tuple[list[str], list[str]]:
    """Float literals replaced by module constants of the kernel's dtype (`_kN = _DT(...)`): numba
    freezes globals as typed constants, so a float32 kernel computes in float32 (as the ops it replaces)
    instead of promoting every element to float64."""
    consts: dict[str, str] = {}

    def sub(m):
        lit = m.group(1)
        if lit not in consts:
            consts[lit] = f"_k{len(consts)}"
        return consts[lit]
    return [_FLOAT_LITERAL.sub(sub, s) for s in lines], [f"{name} = _DT({lit})" for lit, name in consts.items()]


def generate_loop_source(program: str, n_inputs: int, inner: Sequence[int], dtype: str) -> str:
    """Source of a module defining `run_parallel` and `run_serial`, the program as one loop over flat
    C-ordered memory: `run_*(out, last, chunk, tpr, odims, strides, i0, ...)` computes
    out[o*last + j] for every outer index o (decomposed over `odims`, input k at offset sum(q_d *
    strides[k, d])) and inner index j; input k moves along the inner axis with stride inner[k] (1) or is
    constant there (0). Rows are cut into `tpr` tiles of `chunk` elements so that prange has work to
    share when there are few rows. (program_statements is the element-level part.)"""
    xs = [f"x{k}" for k in range(n_inputs)]
    body, consts = _typed_constants(program_statements(program, xs))
    last_t = body[-1].split("=", 1)[0].strip()
    ins = ", ".join(f"i{k}" for k in range(n_inputs))
    src = ["import math", "import numpy as np", "import numba", f"_DT = np.{np.dtype(dtype).name}", *consts]
    if np.dtype(dtype) == np.float32:
        # vectorizable exp/tanh (numba's call libm per element); the helpers' hash keys numba's cache
        body = [s.replace("math.exp(", "exp32(").replace("math.tanh(", "tanh32(") for s in body]
        src += [f"from aiacc.core.runtime._numba_math import exp32, tanh32  # {_math_version()}"]
    src += [""]
    for name, loop, parallel in (("run_parallel", "numba.prange", "True"), ("run_serial", "range", "False")):
        src += [f"@numba.njit(parallel={parallel}, fastmath=False, error_model='numpy', cache=True, nogil=True)",
                f"def {name}(out, last, chunk, tpr, odims, strides, {ins}):",
                "    nd = odims.shape[0]",
                "    ntiles = (out.shape[0] // last) * tpr",
                f"    for t in {loop}(ntiles):",
                "        o = t // tpr",
                "        j0 = (t - o * tpr) * chunk",
                "        j1 = min(last, j0 + chunk)"]
        src += [f"        b{k} = 0" for k in range(n_inputs)]
        # one outer dim (the common case: rows of a channels-last tensor) needs no index decomposition
        src += ["        if nd == 1:"]
        src += [f"            b{k} = o * strides[{k}, 0]" for k in range(n_inputs)]
        src += ["        else:",
                "            rem = o",
                "            for d in range(nd - 1, -1, -1):",
                "                q = rem % odims[d]",
                "                rem = rem // odims[d]"]
        src += [f"                b{k} += q * strides[{k}, d]" for k in range(n_inputs)]
        # slices indexed from 0: LLVM proves the indices non-negative and vectorizes the loop
        src += ["        base = o * last + j0",
                "        w = out[base:base + (j1 - j0)]"]
        src += [f"        s{k} = i{k}[b{k} + j0:b{k} + j1]" if inner[k] else f"        c{k} = i{k}[b{k}]"
                for k in range(n_inputs)]
        src += ["        for j in range(j1 - j0):"]
        src += [f"            x{k} = s{k}[j]" if inner[k] else f"            x{k} = c{k}"
                for k in range(n_inputs)]
        src += [f"            {s}" for s in body]
        src += [f"            w[j] = {last_t}", ""]
    return "\n".join(src) + "\n"


def _math_version() -> str:
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_numba_math.py")
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:16]


def numba_available() -> bool:
    """Whether numba can be imported."""
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


def cache_dir() -> str:
    """Where the generated kernel modules (and, in their __pycache__, numba's cache) live."""
    from aiacc.core.runtime.cache import cache_dir as folder

    return folder("numba")


_MODULES: dict[str, Any] = {}
_LOCK = threading.Lock()


def _load_module(source: str):
    """Import the generated source as a module file named by its hash (written once, atomically): numba's
    cache=True needs a real file to key its on-disk cache on."""
    key = hashlib.sha256(source.encode()).hexdigest()[:24]
    mod = _MODULES.get(key)
    if mod is not None:
        return mod
    with _LOCK:
        mod = _MODULES.get(key)
        if mod is not None:
            return mod
        name = f"aiacc_fused_{key}"
        folder = cache_dir()
        path = os.path.join(folder, name + ".py")
        try:
            os.makedirs(folder, exist_ok=True)
            if not os.path.exists(path):
                fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
                with os.fdopen(fd, "w") as f:
                    f.write(source)
                os.replace(tmp, path)
        except OSError:
            # no writable cache: a private temporary folder (compiled once per process, nothing reused)
            folder = tempfile.mkdtemp(prefix="aiacc-numba-")
            path = os.path.join(folder, name + ".py")
            with open(path, "w") as f:
                f.write(source)
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        _MODULES[key] = mod
        return mod


class _Layout:
    """How one combination of input/output shapes and strides maps onto the flat loop: a permutation
    putting the output's memory order first, the collapsed outer dims, each input's strides there, the
    inner pattern and the tiling."""

    __slots__ = ("shape", "perm", "inv", "odims", "strides", "inner", "last", "chunk", "tpr", "size")


def _plan_layout(shapes: list[tuple[int, ...]], order: tuple[int, ...] | None) -> _Layout:
    out_shape = tuple(np.broadcast_shapes(*shapes)) if shapes else ()
    r = len(out_shape)
    lay = _Layout()
    lay.shape = out_shape
    lay.perm = order if order is not None else tuple(range(r))
    lay.inv = tuple(np.argsort(lay.perm)) if r else ()
    pshape = [out_shape[p] for p in lay.perm]
    # each input's element strides over the permuted output dims (0 where it is broadcast)
    strides = []
    for s in shapes:
        full = (1,) * (r - len(s)) + tuple(s)
        ps = [full[p] for p in lay.perm]
        st, acc = [0] * r, 1
        for d in range(r - 1, -1, -1):
            st[d] = 0 if ps[d] == 1 and pshape[d] != 1 else acc
            acc *= ps[d]
        strides.append(st)
    dims: list[int] = []
    cols: list[list[int]] = [[] for _ in shapes]
    for d in range(r):
        if pshape[d] == 1:
            continue
        if dims and all(cols[k][-1] == strides[k][d] * pshape[d] for k in range(len(shapes))):
            dims[-1] *= pshape[d]  # contiguous for every input: one dim
            for k in range(len(shapes)):
                cols[k][-1] = strides[k][d]
            continue
        dims.append(pshape[d])
        for k in range(len(shapes)):
            cols[k].append(strides[k][d])
    if not dims:
        dims, cols = [1], [[0] for _ in shapes]
    lay.size = int(np.prod(dims))
    lay.last = dims[-1]
    lay.inner = tuple(1 if c[-1] else 0 for c in cols)
    lay.odims = np.asarray(dims[:-1], np.int64)
    lay.strides = np.asarray([c[:-1] for c in cols], np.int64).reshape(len(shapes), len(dims) - 1)
    rows = lay.size // lay.last
    want = 4 * _threads()
    lay.tpr = 1 if rows >= want else max(1, min(-(-lay.last // 4096), -(-want // rows)))
    lay.chunk = -(-lay.last // lay.tpr)
    return lay


def _threads() -> int:
    try:
        import numba

        return int(numba.get_num_threads())
    except Exception:  # noqa: BLE001
        return os.cpu_count() or 1


def _memory_order(a: np.ndarray) -> tuple[int, ...] | None:
    """The axis permutation that makes `a` C-contiguous (channels-last -> (0, 2, 3, 1)), or None."""
    if a.flags.c_contiguous:
        return None
    order = tuple(sorted(range(a.ndim), key=lambda d: (-a.strides[d], d)))
    return order if a.transpose(order).flags.c_contiguous else None


class FusedKernel:
    """A FusedElementwise program compiled for one dtype: `fn(*inputs, out=None)` on numpy arrays,
    broadcasting like numpy; the result (or `out`) has the output's shape. Inputs of another dtype are
    converted. `calls` counts the calls that ran compiled numba code; `source(inner)` is the generated
    module for an inner-stride pattern."""

    def __init__(self, program: str, n_inputs: int, dtype: str):
        self.program, self.n_inputs, self.dtype = program, n_inputs, np.dtype(dtype)
        self.scalar_source = generate_source(program, n_inputs)  # validates the program even without numba
        self.compiled = self.dtype.name in ("float32", "float64") and numba_available()
        self.calls = 0
        self._layouts: dict[tuple, _Layout] = {}
        self._fns: dict[tuple[int, ...], Any] = {}

    def source(self, inner: Sequence[int]) -> str:
        """The generated module source for inputs moving (1) or constant (0) along the inner axis."""
        return generate_loop_source(self.program, self.n_inputs, tuple(inner), self.dtype.name)

    def functions(self, inner: tuple[int, ...]):
        """(parallel, serial) numba dispatchers for an inner pattern (compiled, or loaded from the disk
        cache, on first use)."""
        fns = self._fns.get(inner)
        if fns is None:
            _configure_threading()
            mod = _load_module(self.source(inner))
            fns = self._fns[inner] = (mod.run_parallel, mod.run_serial)
        return fns

    def __call__(self, *xs: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        if len(xs) != self.n_inputs:
            raise KernelError(f"FusedElementwise kernel takes {self.n_inputs} inputs, got {len(xs)}")
        arrays = [x if isinstance(x, np.ndarray) and x.dtype == self.dtype else np.asarray(x, self.dtype)
                  for x in xs]
        if not self.compiled:
            y = np.asarray(eval_program(self.program, arrays), self.dtype)
            if out is None:
                return y
            np.copyto(out, y)
            return out
        ref = out
        if ref is None:
            for a in arrays:
                if a.ndim and a.flags.c_contiguous is False and _memory_order(a) is not None:
                    ref = a  # follow the memory order of the first permuted-contiguous input
                    break
        order = _memory_order(ref) if ref is not None and ref.ndim else None
        key = (order, *[a.shape for a in arrays])
        lay = self._layouts.get(key)
        if lay is None:
            lay = self._layouts[key] = _plan_layout([a.shape for a in arrays], order)
        if out is not None and out.shape != lay.shape:
            raise KernelError(f"FusedElementwise kernel: out has shape {list(out.shape)}, the inputs broadcast "
                              f"to {list(lay.shape)}")
        if out is None:
            target = np.empty(tuple(lay.shape[p] for p in lay.perm), self.dtype)
            result = view = target.transpose(lay.inv) if order is not None else target
        else:
            result = out
            view = out.transpose(lay.perm) if order is not None else out
            target = view if out.dtype == self.dtype and view.flags.c_contiguous else np.empty(view.shape, self.dtype)
        flats = []
        for a in arrays:
            if a.ndim < len(lay.shape):
                a = a.reshape((1,) * (len(lay.shape) - a.ndim) + a.shape)
            if order is not None:
                a = a.transpose(lay.perm)
            if not a.flags.c_contiguous:
                a = np.ascontiguousarray(a)
            flats.append(a.reshape(-1))
        par, ser = self.functions(lay.inner)
        args = (target.reshape(-1), lay.last, lay.chunk, lay.tpr, lay.odims, lay.strides, *flats)
        if lay.size >= PARALLEL_MIN_ELEMENTS:
            with _PARALLEL_LOCK:
                par(*args)
        else:
            ser(*args)
        self.calls += 1
        if target is not view and out is not None:
            np.copyto(view, target)  # an out of another layout or dtype: computed, then copied
        return result


_CACHE: dict[tuple[str, int, str], FusedKernel] = {}


def fused_elementwise_kernel(program: str, n_inputs: int, dtype: str) -> FusedKernel:
    """The `FusedKernel` computing the program on arrays of `dtype` (broadcasting like numpy), one per
    (program, input count, dtype) in this process; its machine code is compiled on first call with a new
    inner-stride pattern, or loaded from numba's disk cache."""
    key = (program, n_inputs, np.dtype(dtype).name)
    fn = _CACHE.get(key)
    if fn is None:
        with _LOCK:
            fn = _CACHE.get(key)
            if fn is None:
                fn = _CACHE[key] = FusedKernel(program, n_inputs, key[2])
    return fn


def compile_fused_node(node: Node) -> FusedKernel:
    """The kernel of an aiacc::FusedElementwise IR node: `fn(*input_arrays, out=None)` (see FusedKernel).
    The dtype is the node output's (float32 when unknown). Raises KernelError naming the node when the
    program has no numba code."""
    if node.domain != "aiacc" or node.op != "FusedElementwise":
        raise KernelError(f"node {node.name} ({node.qualified_op}) is not an aiacc::FusedElementwise")
    try:
        return fused_elementwise_kernel(node.attrs["program"], len(node.inputs), node.output.dtype or "float32")
    except KernelError as e:
        raise KernelError(f"node {node.name} (aiacc::FusedElementwise): {e}") from e


def _compile(program: str, n_inputs: int, dtype: str) -> FusedKernel:
    """A fresh (uncached in this process) kernel; the numpy evaluation when numba is missing."""
    return FusedKernel(program, n_inputs, dtype)


def cache_size() -> int:
    """How many kernels this process holds."""
    return len(_CACHE)


class FastInterpreter(Interpreter):
    """The reference interpreter, except that FusedElementwise nodes run their compiled numba kernel."""

    def run_node(self, node: Node, args: list[np.ndarray | None]) -> list[np.ndarray]:
        if node.domain == "aiacc" and node.op == "FusedElementwise" and "kernel" not in node.meta:
            dtype = node.output.dtype or (args[0].dtype.name if args and args[0] is not None else "float32")
            try:
                fn = fused_elementwise_kernel(node.attrs["program"], len(args), dtype)
                with np.errstate(all="ignore"):
                    return [fn(*args)]
            except KernelError as e:
                raise KernelError(f"node {node.name} (aiacc::FusedElementwise): {e}") from e
        return super().run_node(node, args)


def run_fast(graph: Graph, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run `graph` with numba kernels for fused elementwise nodes (reference kernels elsewhere)."""
    return FastInterpreter(graph).run(inputs)


__all__: Sequence[str] = ["fused_elementwise_kernel", "compile_fused_node", "FusedKernel", "generate_source",
                          "program_statements", "generate_loop_source", "supported_op", "SCALAR_OPS",
                          "FastInterpreter", "run_fast", "numba_available", "cache_dir", "PARALLEL_MIN_ELEMENTS"]
