"""numba kernels for aiacc::FusedElementwise: the op's program becomes one scalar function that
numba.vectorize compiles into a ufunc, so the whole expression runs in a single pass over memory (numpy
broadcasting included, no temporaries). Compiled kernels are cached by (program, input count, dtype).
Without numba the kernel falls back to the reference evaluation (one numpy call per op).

    fn = fused_elementwise_kernel("t0=Mul(i0,i1);t1=Relu(t0)", 2, "float32")
    y = fn(a, b)

`FastInterpreter` runs a graph with these kernels for FusedElementwise nodes and the reference kernels for
everything else; `run_fast(graph, feeds)` is the one-call form.
"""
from __future__ import annotations

import threading
from typing import Callable, Mapping, Sequence

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


def supported_op(op_type: str) -> bool:
    """Whether the numba kernel generator knows the op."""
    return op_type in SCALAR_OPS


def generate_source(program: str, n_inputs: int) -> str:
    """Python source of the scalar function a program stands for."""
    args = [f"i{k}" for k in range(n_inputs)]
    lines = [f"def _kernel({', '.join(args)}):"]
    last = None
    for target, op_type, ins, attrs in parse_program(program):
        if op_type not in SCALAR_OPS:
            raise KernelError(f"FusedElementwise: no numba code for {op_type}")
        schema = get_schema(op_type)
        full = {k: (attrs[k] if k in attrs else spec.default) for k, spec in schema.attrs.items()}
        for a in ins:
            if a.startswith("i") and int(a[1:]) >= n_inputs:
                raise KernelError(f"FusedElementwise program reads {a} but the node has {n_inputs} inputs")
        lines.append(f"    {target} = {SCALAR_OPS[op_type](ins, full)}")
        last = target
    lines.append(f"    return {last}")
    return "\n".join(lines) + "\n"


_CACHE: dict[tuple[str, int, str], Callable[..., np.ndarray]] = {}
_LOCK = threading.Lock()


def numba_available() -> bool:
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


def fused_elementwise_kernel(program: str, n_inputs: int, dtype: str) -> Callable[..., np.ndarray]:
    """A callable computing the program on arrays of `dtype` (broadcasting like numpy), compiled once."""
    key = (program, n_inputs, np.dtype(dtype).name)
    fn = _CACHE.get(key)
    if fn is not None:
        return fn
    with _LOCK:
        fn = _CACHE.get(key)
        if fn is None:
            fn = _compile(program, n_inputs, key[2])
            _CACHE[key] = fn
    return fn


def _compile(program: str, n_inputs: int, dtype: str) -> Callable[..., np.ndarray]:
    source = generate_source(program, n_inputs)  # validates the program even without numba
    if dtype not in ("float32", "float64") or not numba_available():
        return lambda *xs: eval_program(program, xs)
    import math

    import numba

    namespace: dict = {"math": math}
    exec(compile(source, f"<aiacc fused elementwise {program}>", "exec"), namespace)  # noqa: S102
    sig = f"{dtype}({', '.join([dtype] * n_inputs)})"
    ufunc = numba.vectorize([sig], nopython=True)(namespace["_kernel"])
    np_dtype = np.dtype(dtype)

    def run(*xs: np.ndarray) -> np.ndarray:
        return ufunc(*(np.asarray(x, dtype=np_dtype) for x in xs))

    run.source = source  # type: ignore[attr-defined]
    return run


def cache_size() -> int:
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


__all__: Sequence[str] = ["fused_elementwise_kernel", "generate_source", "supported_op", "SCALAR_OPS",
                          "FastInterpreter", "run_fast", "numba_available"]
