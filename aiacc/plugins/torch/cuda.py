"""CUDA-only paths for torch modules (each one runs only when its tensors are on a CUDA device; elsewhere the
same call does what it did before):

- `fused_elementwise(program, *xs)`: an aiacc::FusedElementwise on CUDA tensors runs the numba.cuda kernel
  (aiacc.core.runtime.cuda_kernels) where it was measured faster than torch op by op on these shapes
  (measured once per program, shapes and dtype), on torch's current stream; torch op by op elsewhere;
- `capture(module, example_inputs)`: a CUDA graph of the module's forward for static shapes (small-batch
  latency: one graph launch instead of one launch per kernel); calls with other shapes, dtypes or devices
  run the module eagerly;
- `channels_last_if_faster(module, example_inputs)`: the module converted to channels-last memory where
  that measured faster on these inputs (convolution nets on tensor cores usually are).

Convolutions, linears and attention need nothing here: on CUDA the exporter's fast-path functions run
F.conv2d / F.linear (cuDNN / cuBLAS, the activation applied in place after) and
F.scaled_dot_product_attention, which picks flash or memory-efficient attention itself.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import time
from typing import Any, Callable

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn
from torch.utils import _pytree as pytree

from aiacc.core.ops import get_schema
from aiacc.core.ops.fused import parse_program
from aiacc.errors import UnsupportedError


@contextlib.contextmanager
def exact_fp32():
    """TensorFloat-32 off for matmuls and cuDNN convolutions inside (restored after): verification compares
    the original and the optimized model in full float32, where TF32 alone (10-bit mantissas, on by default
    for cuDNN) would differ by more than the tolerance however equal the two models are."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _cuda_floats(xs) -> bool:
    return bool(xs) and all(isinstance(x, torch.Tensor) and x.is_cuda and x.dtype in (torch.float32, torch.float64)
                            for x in xs)


# the torch form of each op the scalar generator knows (x: tensors, a: attributes with schema defaults)
_TORCH_OPS: dict[str, Callable] = {
    "Add": lambda x, a: x[0] + x[1], "Sub": lambda x, a: x[0] - x[1], "Mul": lambda x, a: x[0] * x[1],
    "Div": lambda x, a: x[0] / x[1], "Pow": lambda x, a: torch.pow(x[0], x[1]), "Neg": lambda x, a: -x[0],
    "Abs": lambda x, a: torch.abs(x[0]), "Reciprocal": lambda x, a: torch.reciprocal(x[0]),
    "Sqrt": lambda x, a: torch.sqrt(x[0]), "Exp": lambda x, a: torch.exp(x[0]), "Log": lambda x, a: torch.log(x[0]),
    "Sin": lambda x, a: torch.sin(x[0]), "Cos": lambda x, a: torch.cos(x[0]), "Tanh": lambda x, a: torch.tanh(x[0]),
    "Erf": lambda x, a: torch.erf(x[0]), "Relu": lambda x, a: torch.relu(x[0]),
    "LeakyRelu": lambda x, a: F.leaky_relu(x[0], a["alpha"]), "Elu": lambda x, a: F.elu(x[0], a["alpha"]),
    "Sigmoid": lambda x, a: torch.sigmoid(x[0]),
    "HardSigmoid": lambda x, a: torch.clamp(x[0] * a["alpha"] + a["beta"], 0.0, 1.0),
    "HardSwish": lambda x, a: F.hardswish(x[0]), "Softplus": lambda x, a: F.softplus(x[0]),
    "Softsign": lambda x, a: F.softsign(x[0]),
    "Gelu": lambda x, a: F.gelu(x[0], approximate=a.get("approximate") or "none"),
    "Clip": lambda x, a: torch.clamp(x[0], *(list(x[1:]) + [None, None])[:2]),
    "Max": lambda x, a: functools.reduce(torch.maximum, x), "Min": lambda x, a: functools.reduce(torch.minimum, x),
    "Identity": lambda x, a: x[0],
}


def eval_program_torch(program: str, *xs: torch.Tensor) -> torch.Tensor:
    """The program op by op in torch (the framework's own path the kernel is measured against)."""
    env = {f"i{k}": x for k, x in enumerate(xs)}
    last = None
    for target, op_type, args, attrs in parse_program(program):
        fn = _TORCH_OPS.get(op_type)
        if fn is None:
            raise UnsupportedError(f"FusedElementwise: no torch form for {op_type}")
        full = {k: (attrs[k] if k in attrs else spec.default) for k, spec in get_schema(op_type).attrs.items()}
        last = env[target] = fn([env[a] for a in args], full)
    return last


def fused_elementwise(program: str, *xs: torch.Tensor) -> torch.Tensor:
    """The program on xs: the numba.cuda kernel where all inputs are CUDA float tensors of one dtype, no
    gradient is needed, numba has a real device, and the kernel measured faster than torch op by op
    (eval_program_torch); torch op by op otherwise. Under torch.fx tracing it is one call node."""
    if any(isinstance(x, fx.Proxy) for x in xs):
        tracer = next(x for x in xs if isinstance(x, fx.Proxy)).tracer
        return tracer.create_proxy("call_function", fused_elementwise, (program, *xs), {})
    fallback = functools.partial(eval_program_torch, program)
    if not _cuda_floats(xs) or len({x.dtype for x in xs}) != 1 or len({x.device for x in xs}) != 1 \
            or (torch.is_grad_enabled() and any(x.requires_grad for x in xs)) or torch.compiler.is_compiling():
        return fallback(*xs)
    from aiacc.core.runtime import cuda_kernels

    if not cuda_kernels.cuda_available():
        return fallback(*xs)
    dtype = str(xs[0].dtype).replace("torch.", "")
    kernel = cuda_kernels.cuda_fused_kernel(program, len(xs), dtype)
    xs = tuple(x.contiguous() for x in xs)
    shape = torch.broadcast_shapes(*(x.shape for x in xs))

    def run_kernel():
        from numba import cuda

        out = torch.empty(shape, dtype=xs[0].dtype, device=xs[0].device)
        stream = cuda.external_stream(torch.cuda.current_stream(xs[0].device).cuda_stream)
        kernel(*xs, out=out, stream=stream)
        return out

    key = ("torch", program, tuple(tuple(x.shape) for x in xs), dtype)
    choice = cuda_kernels.measured_choice(key, {"torch": lambda: fallback(*xs), "numba.cuda": run_kernel},
                                          sync=torch.cuda.synchronize)
    return run_kernel() if choice == "numba.cuda" else fallback(*xs)


def _signature(xs) -> tuple:
    return tuple((tuple(x.shape), x.dtype, x.device) if isinstance(x, torch.Tensor) else ("const", x) for x in xs)


class CudaGraphModule(nn.Module):
    """`module` with its forward captured as one CUDA graph for the example inputs' shapes (inference: no
    gradients). A call whose tensors match the captured shapes, dtypes and devices copies them into the
    graph's static inputs, replays it and returns copies of the outputs; any other call runs `module`."""

    def __init__(self, module: nn.Module, example_inputs: tuple, warmup: int = 3):
        super().__init__()
        xs = tuple(example_inputs)
        if not any(isinstance(x, torch.Tensor) and x.is_cuda for x in xs):
            raise UnsupportedError("CUDA graphs need CUDA tensors: the example inputs are not on a CUDA device")
        if not torch.cuda.is_available():
            raise UnsupportedError("CUDA graphs need a CUDA device (torch.cuda.is_available() is False)")
        self.module = module
        self.captured = _signature(xs)
        self.static_in = [x.clone() if isinstance(x, torch.Tensor) else x for x in xs]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.no_grad(), torch.cuda.stream(side):
            for _ in range(warmup):  # allocations and lazy init outside the graph
                module(*self.static_in)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(self.graph):
            self.static_out = module(*self.static_in)
        self.replays = 0

    def forward(self, *xs: Any) -> Any:
        if _signature(xs) != self.captured or torch.is_grad_enabled() and any(
                isinstance(x, torch.Tensor) and x.requires_grad for x in xs):
            return self.module(*xs)
        for dst, src in zip(self.static_in, xs):
            if isinstance(dst, torch.Tensor):
                dst.copy_(src)
        self.graph.replay()
        self.replays += 1
        return pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, self.static_out)


def capture(module: nn.Module, example_inputs: Any, warmup: int = 3) -> CudaGraphModule:
    """A CudaGraphModule of `module` for the shapes of `example_inputs` (a tensor or a tuple of them)."""
    xs = example_inputs if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    return CudaGraphModule(module, tuple(xs), warmup)


def _best_time(fn: Callable[[], Any], repeat: int) -> float:
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best


def channels_last_if_faster(module: nn.Module, example_inputs: Any, repeat: int = 10) -> tuple[nn.Module, bool]:
    """(module, converted): a channels-last copy of `module` where a forward on 4-D CUDA inputs in
    channels-last memory measured faster than the module as it is; else the module itself."""
    xs = example_inputs if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    if not any(isinstance(x, torch.Tensor) and x.is_cuda and x.dim() == 4 for x in xs):
        return module, False
    cl = copy.deepcopy(module).to(memory_format=torch.channels_last)
    xs_cl = tuple(x.contiguous(memory_format=torch.channels_last) if isinstance(x, torch.Tensor) and x.dim() == 4
                  else x for x in xs)
    with torch.no_grad():
        plain = _best_time(lambda: module(*xs), repeat)
        last = _best_time(lambda: cl(*xs_cl), repeat)
    return (cl, True) if last < plain else (module, False)
