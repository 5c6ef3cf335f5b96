"""`torch.ops.aiacc.fused_elementwise(inputs, program)`: aiacc::FusedElementwise as a torch operator whose
CPU kernel runs the numba kernel (aiacc.core.runtime.numba_kernels) on the tensors' own memory, no copies:
the output is allocated by torch (`empty_like` of a full-size input, so channels-last stays channels-last)
and both sides are handed to numba as numpy views (`Tensor.numpy()`).

Registered on import of this module (the torch exporter imports it). It has
  - a fake (meta) kernel, so torch.jit.trace, torch.fx and torch.compile see the output's shape and dtype;
  - an autograd formula: the gradient of the same program evaluated with torch ops (`torch_program`),
    so a module exported for inference still differentiates correctly if someone asks.

What survives torch.save: an exported fx.GraphModule pickles its generated code, which calls
`torch.ops.aiacc.fused_elementwise.default(...)` with the program as a string literal; torch.load needs the
op registered first, i.e. `import aiacc` (or aiacc.plugins.torch.numba_op) before torch.load. The kernels
themselves are not pickled: the first call after loading compiles them (or loads them from numba's disk
cache). A torch.jit.trace of such a module records the op call the same way (torch.jit.save/load: the same
import first).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from aiacc.core.ops import get_schema
from aiacc.core.ops.fused import parse_program
from aiacc.core.runtime.numba_kernels import FusedKernel, fused_elementwise_kernel
from aiacc.errors import UnsupportedError
from aiacc.plugins.timing import KEEP_BELOW

QUALNAME = "aiacc::fused_elementwise"
_NP_DTYPES = {torch.float32: "float32", torch.float64: "float64"}


_SHAPES: dict[tuple, tuple[int, int]] = {}  # input shapes -> (output shape, index of a full-size input or -1)


def _out_like(inputs: Sequence[torch.Tensor]) -> torch.Tensor:
    key = tuple(tuple(t.shape) for t in inputs)
    got = _SHAPES.get(key)
    if got is None:
        shape = tuple(np.broadcast_shapes(*key))
        got = _SHAPES[key] = (shape, next((k for k, s in enumerate(key) if s == shape), -1))
    if got[1] >= 0:
        return torch.empty_like(inputs[got[1]])  # preserve_format: that input's memory order
    return torch.empty(got[0], dtype=inputs[0].dtype, device=inputs[0].device)


_KERNELS: dict[tuple, FusedKernel] = {}


def kernel_for(program: str, inputs: Sequence[torch.Tensor]) -> FusedKernel:
    """The numba kernel the op runs for these inputs (one per program and dtype in the process)."""
    key = (program, len(inputs), inputs[0].dtype)
    fn = _KERNELS.get(key)
    if fn is None:
        dt = _NP_DTYPES.get(inputs[0].dtype)
        if dt is None:
            raise UnsupportedError(f"aiacc::fused_elementwise runs float32/float64, not {inputs[0].dtype}")
        fn = _KERNELS[key] = fused_elementwise_kernel(program, len(inputs), dt)
    return fn


def _cpu(inputs: list[torch.Tensor], program: str) -> torch.Tensor:
    fn = kernel_for(program, inputs)
    out = _out_like(inputs)
    dt = inputs[0].dtype
    fn(*[t.numpy() if t.dtype is dt else t.to(dt).numpy() for t in inputs], out=out.numpy())
    return out


def _fake(inputs: list[torch.Tensor], program: str) -> torch.Tensor:
    return _out_like(inputs)


# ------------------------------------------------------------------------------------------------ torch ops
def _clip(x, lo=None, hi=None):
    if lo is not None:
        x = torch.maximum(x, lo)
    if hi is not None:
        x = torch.minimum(x, hi)
    return x


def _fold(fn):
    def run(*xs, **_):
        y = xs[0]
        for x in xs[1:]:
            y = fn(y, x)
        return y
    return run


# op -> torch function(*tensors, **attrs) with the ONNX op's semantics (used for the gradient)
TORCH_OPS = {
    "Add": lambda a, b: a + b, "Sub": lambda a, b: a - b, "Mul": lambda a, b: a * b, "Div": lambda a, b: a / b,
    "Pow": lambda a, b: torch.pow(a, b), "Neg": lambda a: -a, "Abs": torch.abs,
    "Reciprocal": torch.reciprocal, "Sqrt": torch.sqrt, "Exp": torch.exp, "Log": torch.log, "Sin": torch.sin,
    "Cos": torch.cos, "Tanh": torch.tanh, "Erf": torch.erf, "Relu": torch.relu,
    "LeakyRelu": lambda x, alpha: F.leaky_relu(x, alpha), "Elu": lambda x, alpha: F.elu(x, alpha),
    "Sigmoid": torch.sigmoid,
    "HardSigmoid": lambda x, alpha, beta: torch.clamp(x * alpha + beta, 0.0, 1.0),
    "HardSwish": F.hardswish, "Softplus": F.softplus, "Softsign": F.softsign,
    "Gelu": lambda x, approximate="none": F.gelu(x, approximate=approximate),
    "Clip": _clip, "Max": _fold(torch.maximum), "Min": _fold(torch.minimum), "Identity": lambda x: x,
}
_ATTRS = {"LeakyRelu": ("alpha",), "Elu": ("alpha",), "HardSigmoid": ("alpha", "beta"), "Gelu": ("approximate",)}


def torch_program(program: str, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
    """The program evaluated op by op with torch operations (differentiable)."""
    env = {f"i{k}": t for k, t in enumerate(inputs)}
    last = None
    for target, op_type, args, attrs in parse_program(program):
        schema = get_schema(op_type)
        full = {k: (attrs[k] if k in attrs else spec.default) for k, spec in schema.attrs.items()}
        kw = {k: full[k] for k in _ATTRS.get(op_type, ())}
        last = env[target] = TORCH_OPS[op_type](*[env[a] for a in args], **kw)
    return last


class _Fused(torch.autograd.Function):
    """Forward: the numba kernel; backward: the gradient of the program in torch ops (recomputed)."""

    @staticmethod
    def forward(ctx, program, *tensors):
        ctx.program = program
        ctx.save_for_backward(*tensors)
        with torch._C._AutoDispatchBelowAutograd():
            return OP(list(tensors), program)

    @staticmethod
    def backward(ctx, grad):
        xs = [t.detach().requires_grad_(True) for t in ctx.saved_tensors]
        with torch.enable_grad():
            y = torch_program(ctx.program, xs)
            grads = torch.autograd.grad(y, xs, grad, allow_unused=True)
        return (None, *grads)


def _autograd(inputs: list[torch.Tensor], program: str) -> torch.Tensor:
    if torch.is_grad_enabled() and any(t.requires_grad for t in inputs):
        return _Fused.apply(program, *inputs)
    if all(type(t) is torch.Tensor and t.device.type == "cpu" for t in inputs):
        return _cpu(inputs, program)  # plain CPU tensors: the kernel directly (saves a second dispatch)
    with torch._C._AutoDispatchBelowAutograd():  # fake / meta / subclass tensors: the kernel below
        return OP(inputs, program)


def _register() -> None:
    lib = torch.library.Library("aiacc", "FRAGMENT")
    lib.define("fused_elementwise(Tensor[] inputs, str program) -> Tensor")
    lib.impl("fused_elementwise", _cpu, "CPU")
    lib.impl("fused_elementwise", _autograd, "Autograd")
    torch.library.register_fake(QUALNAME, _fake, lib=lib)
    globals()["_LIB"] = lib  # the registrations live as long as the library object


def _has_op() -> bool:
    try:
        torch.ops.aiacc.fused_elementwise.default  # noqa: B018
    except (AttributeError, RuntimeError):
        return False
    return True


if not _has_op():
    _register()

OP = torch.ops.aiacc.fused_elementwise.default

__all__ = ["OP", "QUALNAME", "TORCH_OPS", "torch_program", "kernel_for", "choose_fusions", "epilogue_conv",
           "EPILOGUES"]


# ------------------------------------------------------------------------------------------------ measured choice
# AIACC_FUSED_ELEMENTWISE: "measure" (default: time both, keep the faster), "numba" (always the kernel),
# "torch" (never: the program's ops as torch calls)
MODE_ENV = "AIACC_FUSED_ELEMENTWISE"
META_KEY = "torch.fused_elementwise"  # node.meta: (kept: bool, note) as choose_fusions decided


class _Eager:
    """A stand-in for the exporter's Builder that runs each call at once (what the exported code would do)."""

    inference = True
    inplace_ok = False

    @staticmethod
    def call(fn, *args, **kwargs):
        return fn(*args, **kwargs)

    @staticmethod
    def method(name, obj, *args, **kwargs):
        return getattr(obj, name)(*args, **kwargs)


def _time_pair(fused, unfused, rounds: int = 7) -> tuple[float, float]:
    """Min seconds of each callable, interleaved (one call of each per round, after two warm-ups)."""
    import time

    best = [float("inf"), float("inf")]
    with torch.no_grad():
        for _ in range(2):
            fused(), unfused()
        for _ in range(rounds):
            for k, fn in enumerate((fused, unfused)):
                t = time.perf_counter()
                fn()
                best[k] = min(best[k], time.perf_counter() - t)
    return best[0], best[1]


def _example_inputs(node, rng) -> list[torch.Tensor] | None:
    from aiacc.core.passes.utils import const_value

    out = []
    for v in node.inputs:
        c = const_value(v) if v is not None else None
        if c is not None:
            out.append(torch.from_numpy(np.array(c, copy=True)))
            continue
        if v is None or v.shape is None or not all(isinstance(d, int) for d in v.shape) or v.dtype not in (
                "float32", "float64"):
            return None
        out.append(torch.from_numpy(rng.standard_normal(v.shape).astype(v.dtype)))
    return out


# programs of one input that oneDNN runs as a convolution post-op: program -> (attr, scalars, algorithm)
EPILOGUES = {"t0=Sigmoid(i0);t1=Mul(i0,t0)": ("swish", [], None), "t0=Sigmoid(i0);t1=Mul(t0,i0)": ("swish", [], None)}
EPILOGUE_KEY = "torch.conv_epilogue"  # FusedConv node.meta: the post-op its reader's program became


def epilogue_conv(node):
    """The Conv / aiacc::FusedConv whose epilogue the FusedElementwise `node` can become (oneDNN post-op), or
    None: `node`'s program is one of EPILOGUES on its only input, which is a 2-D convolution's float32
    output without activation or residual, read by `node` alone and not a graph output."""
    if node.attrs.get("program") not in EPILOGUES or len(node.inputs) != 1:
        return None
    v = node.inputs[0]
    conv = v.producer if v is not None else None
    if conv is None or (conv.domain, conv.op) not in (("aiacc", "FusedConv"), ("", "Conv")) \
            or conv.attrs.get("activation") or len(conv.inputs) < 2 or conv.inputs[1] is None \
            or conv.inputs[1].shape is None or len(conv.inputs[1].shape) != 4 \
            or v.is_graph_output or v.dtype != "float32" or v.shape is None or len(v.shape) != 4 \
            or not all(isinstance(d, int) for d in v.shape) or len(v.uses) != 1:
        return None
    ins = list(conv.inputs)
    if len(ins) > 3 and ins[3] is not None:
        return None  # a residual sum
    x = ins[0]
    if x is None or x.shape is None or not all(isinstance(d, int) for d in x.shape) \
            or any(w is None or w.const is None for w in ins[1:3] if w is not None) or ins[1] is None:
        return None
    return conv


def _epilogue_pair(conv, program, rng):
    """(conv with the post-op, conv then the program's level-2 ops) as eager calls on random channels-last
    input of the conv's shape and its constant weights."""
    from aiacc.plugins.torch.export_ops.fused import lower_program
    from aiacc.plugins.torch.export_ops.nn import conv as lower_conv
    from aiacc.plugins.torch.exporter import LNode, resolved_attrs

    x = torch.from_numpy(rng.standard_normal(conv.inputs[0].shape).astype("float32"))
    x = x.contiguous(memory_format=torch.channels_last)  # as a previous oneDNN convolution returns it
    ws = [torch.from_numpy(np.array(v.const, copy=True)) for v in conv.inputs[1:3] if v is not None]
    ln = LNode(_Eager, conv.op, resolved_attrs(conv), list(conv.inputs[:1 + len(ws)]), conv.outputs, conv.name,
               domain=conv.domain, args=[x, *ws])
    ln.shape = lambda i, vs=conv.inputs: vs[i].shape if i < len(vs) and vs[i] is not None else None
    post = EPILOGUES[program]
    return (lambda: lower_conv(_Eager, ln, onednn=post),
            lambda: lower_program(_Eager, program, [lower_conv(_Eager, ln)], [None]))


def choose_fusions(graph, timer=None) -> dict[str, str]:
    """For each aiacc::FusedElementwise node of an inference graph decide between the numba op, the
    program's ops as torch calls (the exporter's own lowering, peepholes included) and, for a SiLU right after
    a convolution (epilogue_conv), the convolution's oneDNN post-op: time each against the torch calls on
    random tensors of the node's input shapes (constants as they are), keep the fastest where it timed under
    timing.KEEP_BELOW of the torch calls. Writes
    node.meta[META_KEY] = (kept numba op, note), on an absorbing FusedConv meta[EPILOGUE_KEY] = its post-op,
    and returns {node name: note} ("kept: numba 0.41x", "kept: conv epilogue swish 0.80x", "dropped:
    slower 1.30x", "dropped: ..." when it cannot run). After the level-3 pass (graph.meta["elementwise_fusion"])
    it also runs se_gate.choose (squeeze-excite's squeeze as one numba kernel, its gate in the projection GEMM)
    and then pointwise.choose (the other 1x1 convolutions as one GEMM) and numba_op_depthwise.choose (depthwise
    convolutions as one numba kernel) and returns their notes too.
    `timer(fused, unfused) -> (s, s)` replaces the timing (tests)."""
    import os

    from aiacc.core.runtime.numba_kernels import numba_available
    from aiacc.plugins.torch.export_ops.fused import lower_program

    mode = os.environ.get(MODE_ENV, "measure")
    timer = timer or _time_pair
    rng = np.random.default_rng(0)
    notes: dict[str, str] = {}
    seen: dict[tuple, tuple] = {}
    for node in graph:
        if node.domain != "aiacc" or node.op != "FusedElementwise":
            continue
        conv = epilogue_conv(node) if mode == "measure" else None
        if conv is not None:
            conv.meta.pop(EPILOGUE_KEY, None)
        if not numba_available() and conv is None:
            decision = (False, "dropped: numba is not installed")
        elif mode == "numba":
            decision = (True, f"kept: {MODE_ENV}=numba")
        elif mode == "torch":
            decision = (False, f"dropped: {MODE_ENV}=torch")
        else:
            program = node.attrs["program"]
            key = (program, tuple((v.shape, v.dtype, v.const is not None) for v in node.inputs))
            if conv is not None:
                key += (tuple(v.shape for v in conv.inputs if v is not None), tuple(sorted(map(str, conv.attrs.items()))))
            decision = seen.get(key)
            if decision is None:
                ratios = {}
                xs = _example_inputs(node, rng)
                if xs is None:
                    decision = (False, "dropped: input shapes unknown, not measured")
                else:
                    consts = [t.numpy() if v.const is not None else None for t, v in zip(xs, node.inputs)]
                    try:
                        if numba_available():
                            f, u = timer(lambda: OP(xs, program), lambda: lower_program(_Eager, program, xs, consts))
                            ratios["numba"] = f / u if u > 0 else float("inf")
                        if conv is not None:
                            f, u = timer(*_epilogue_pair(conv, program, rng))
                            ratios["epilogue"] = f / u if u > 0 else float("inf")
                    except Exception as e:  # noqa: BLE001  (a kernel that cannot run here is not kept)
                        decision = (False, f"dropped: the kernel failed ({type(e).__name__}: {e})")
                    else:
                        best = min(ratios, key=ratios.get)
                        r = ratios[best]
                        if r >= KEEP_BELOW:
                            told = f"slower {ratios.get('numba', r):.2f}x" if r >= 1.0 else \
                                f"{best} {r:.2f}x, not below {KEEP_BELOW:.2f}x"
                            decision = (False, f"dropped: {told}" + (
                                f" (conv epilogue {ratios['epilogue']:.2f}x)" if "epilogue" in ratios else ""))
                        elif best == "numba":
                            decision = (True, f"kept: numba {r:.2f}x")
                        else:
                            decision = (False, f"kept: conv epilogue {EPILOGUES[program][0]} {r:.2f}x", "epilogue")
                seen[key] = decision
        if len(decision) > 2 and decision[2] == "epilogue":
            conv.meta[EPILOGUE_KEY] = EPILOGUES[node.attrs["program"]]
        node.meta[META_KEY] = decision[:2]
        if len(decision) > 2:
            node.meta[META_KEY + ".form"] = decision[2]
        else:
            node.meta.pop(META_KEY + ".form", None)
        notes[node.name] = decision[1]
    if graph.meta.get("elementwise_fusion"):  # level 3: squeeze-excite's gate folded into the GEMM, measured too
        from aiacc.plugins.torch.numba_op_depthwise import choose as choose_depthwise
        from aiacc.plugins.torch.pointwise import choose as choose_gemms
        from aiacc.plugins.torch.se_gate import choose as choose_se_gates

        notes.update(choose_se_gates(graph))
        for choice in (choose_gemms, choose_depthwise):  # 1x1 convolutions as one GEMM, after se_gate's choice;
            for name, note in choice(graph).items():  # depthwise convolutions as one numba kernel
                notes[name] = f"{notes[name]}; {note}" if name in notes else note
    return notes
