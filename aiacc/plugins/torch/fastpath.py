"""oneDNN fast paths for the inference exports' convolutions and matrix products.

Eager F.conv2d hands oneDNN a plain OIHW weight, which oneDNN reorders into its blocked layout on every
call, and runs on NCHW activations it reorders too; F.linear goes to the BLAS gemm. What
torch.jit.optimize_for_inference and torch.compile's oneDNN fusion do instead, done here per call:

- the convolution weight is reordered once (torch.ops.mkldnn._reorder_convolution_weight) and cached;
  activations stay channels-last (the layout oneDNN convolves without a reorder, and the layout the
  packed convolution returns), and the activation runs as a oneDNN post-op
  (torch.ops.mkldnn._convolution_pointwise);
- a matrix product with a bias (and activation) is one oneDNN inner product
  (torch.ops.mkldnn._linear_pointwise) on a weight reordered once per row count
  (torch.ops.mkldnn._reorder_linear_weight), or, where linear_kernel.py timed it faster for that shape,
  MKL's packed sgemm (torch.ops.mkl._mkl_linear on torch.ops.mkl._mkl_reorder_linear_weight) with the
  activation after it.

The module's plain parameters stay the source of truth: the cache is keyed by the weight tensor (weakly)
and re-prepared when its storage, version (in-place updates, load_state_dict), device or dtype or the input
shape changes, so .to(), torch.save / torch.load and load_state_dict work as on any module. (A write through
`param.data` bypasses the version counter and is not seen until the storage or version changes; the
peers freeze weights altogether.) The fast path
is taken only for CPU float32 tensors when no gradient is needed, and never while torch.jit traces or
scripts, torch.compile compiles or torch.fx traces symbolically; everywhere else the same function runs
F.conv2d / F.linear and the activation, so gradients, other devices and other dtypes behave as before.
"""
from __future__ import annotations

import functools
import weakref

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch.utils.weak import WeakTensorKeyDictionary

_PACKED: WeakTensorKeyDictionary = WeakTensorKeyDictionary()
_F32 = torch.float32
_MKLDNN = torch.backends.mkldnn.is_available()
MKL_LINEAR = bool(getattr(torch._C, "has_mkl", False)) and hasattr(torch.ops.mkl, "_mkl_linear")
_MAX_SHAPES = 4  # packed variants kept per weight (one per input shape seen)
FC_AS_LINEAR = True  # conv2d of a [N, C, 1, 1] map by a 1x1 kernel as F.linear (False: oneDNN, measurements)

# oneDNN post-op name -> the same activation applied in place on a fresh tensor (the fallback)
_UNARY = {
    "none": lambda y, s, a: y,
    "relu": lambda y, s, a: torch.relu_(y),
    "sigmoid": lambda y, s, a: torch.sigmoid_(y),
    "tanh": lambda y, s, a: torch.tanh_(y),
    "hardswish": lambda y, s, a: F.hardswish(y, inplace=True),
    "swish": lambda y, s, a: F.silu(y, inplace=True),
    "leaky_relu": lambda y, s, a: F.leaky_relu(y, s[0], inplace=True),
    "hardtanh": lambda y, s, a: F.hardtanh(y, s[0], s[1], inplace=True),
    "gelu": lambda y, s, a: F.gelu(y, approximate=a or "none"),
    "hardsigmoid": lambda y, s, a: F.hardsigmoid(y, inplace=True),
}


def _fx_leaf(fn):
    """Make fn a leaf for torch.fx symbolic tracing (GraphModule deserialization re-traces its code): called
    with an fx Proxy among the tensors it records one call_function node instead of running fn's Python."""
    @functools.wraps(fn)
    def wrapper(x, *args, **kwargs):
        if isinstance(x, fx.Proxy) or any(isinstance(a, fx.Proxy) for a in args[:2]):
            tracer = (x if isinstance(x, fx.Proxy) else next(a for a in args if isinstance(a, fx.Proxy))).tracer
            return tracer.create_proxy("call_function", wrapper, (x, *args), kwargs)
        return fn(x, *args, **kwargs)
    return wrapper


def usable(x, weight, bias) -> bool:
    """Whether the oneDNN path may run: CPU float32 tensors, no autograd, no tracer or compiler watching.
    (Called per convolution: the cheapest, most often deciding checks come first.)"""
    if type(x) is not torch.Tensor or x.dtype is not _F32 or not x.is_cpu or x.is_mkldnn or x.is_sparse \
            or not isinstance(weight, torch.Tensor) or weight.dtype is not _F32 or not weight.is_cpu \
            or weight.is_mkldnn:
        return False  # fx Proxy, FakeTensor, tensor subclasses, other dtypes and devices
    if bias is not None and (bias.dtype is not _F32 or not bias.is_cpu):
        return False
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                    or (bias is not None and bias.requires_grad)):
        return False
    if torch.jit.is_tracing() or torch.jit.is_scripting() or torch.compiler.is_compiling():
        return False
    return _MKLDNN and torch._C._get_mkldnn_enabled()


def _version(t: torch.Tensor) -> int:
    try:
        return t._version
    except RuntimeError:  # inference tensors keep no version counter (and cannot change outside inference mode)
        return -1


def _packed(weight: torch.Tensor, key: tuple, make) -> torch.Tensor:
    """The oneDNN-ready copy of `weight` for `key` (input shape and conv parameters), made by make() on a
    miss; every copy is dropped once the weight's storage, version, device, dtype or shape changes."""
    # the entry pins its source storage, so an equal data_ptr means the same storage (device, dtype); the
    # version counter catches in-place updates and resize_
    state = (weight.data_ptr(), _version(weight))
    entry = _PACKED.get(weight)
    if entry is None or entry[0] != state:
        entry = (state, {}, weight.untyped_storage())
        _PACKED[weight] = entry
    variants = entry[1]
    packed = variants.get(key)
    if packed is None:
        if len(variants) >= _MAX_SHAPES:
            variants.clear()
        with torch.no_grad():
            packed = make(weight.detach())
        variants[key] = packed
    return packed


_PREPARED: dict[tuple, tuple] = {}  # (tag, ids of the tensors) -> (weak refs, their states, the prepared value)
_PREPARED_MAX = 4096  # entries before the ones whose tensors died are swept


def _none_ref():
    return None


def prepared(tag, tensors: tuple, make):
    """make(*tensors), cached per call site (`tag`, hashable) and the tensors' identities: the cheap per-call
    form of the weight preparation aiacc's own kernels need (transposed weights, numpy views of biases), re-made
    when a tensor is another object or its storage or version changed (in-place updates, load_state_dict).
    `tensors` may hold None. The cache holds weak references only (plus what `make` returns)."""
    key = (tag, *map(id, tensors))
    entry = _PREPARED.get(key)
    if entry is not None:
        refs, states, value = entry
        for r, t, st in zip(refs, tensors, states):
            if r() is not t or (t is not None and (t.data_ptr(), _version(t)) != st):
                break
        else:
            return value
    if len(_PREPARED) >= _PREPARED_MAX:
        for k in [k for k, e in _PREPARED.items() if any(r() is None for r, t in zip(e[0], k[1:]) if t != id(None))]:
            del _PREPARED[k]
        if len(_PREPARED) >= _PREPARED_MAX:
            _PREPARED.clear()
    with torch.no_grad():
        value = make(*tensors)
    _PREPARED[key] = (tuple(_none_ref if t is None else weakref.ref(t) for t in tensors),
                      tuple(None if t is None else (t.data_ptr(), _version(t)) for t in tensors), value)
    return value


def _plain(weight) -> None:
    """The plain path runs on `weight`: once it has left CPU float32 (.to(device or dtype)), drop its
    packed copies and the CPU storage they pin."""
    if isinstance(weight, torch.Tensor) and not (weight.is_cpu and weight.dtype is _F32) and _PACKED:
        _PACKED.pop(weight, None)


def _packed_conv(weight, x, padding, stride, dilation, groups) -> torch.Tensor:
    return _packed(weight, (x.shape, tuple(padding), tuple(stride), tuple(dilation), groups),
                   lambda w: torch.ops.mkldnn._reorder_convolution_weight(
                       w, list(padding), list(stride), list(dilation), groups, list(x.shape)))


@_fx_leaf
def conv2d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride: list[int],
           padding: list[int], dilation: list[int], groups: int, attr: str = "none",
           scalars: list | tuple = (), algorithm: str | None = None) -> torch.Tensor:
    """attr(F.conv2d(x, weight, bias, stride, padding, dilation, groups)); attr is a oneDNN post-op name
    (see _UNARY) with its scalars and algorithm. The result is a fresh tensor (channels-last on the fast
    path)."""
    if x.dim() == 4 and usable(x, weight, bias):
        if FC_AS_LINEAR and x.shape[2] == 1 and x.shape[3] == 1 and groups == 1 and weight.dim() == 4 \
                and weight.shape[2] == 1 and weight.shape[3] == 1 and not any(padding):
            # a 1x1 convolution of a 1x1 map (squeeze-excite's FC layers) is a matrix product: oneDNN sets a
            # convolution up in 80-140 us per call whatever its size, BLAS's gemm takes 6-34 us (2 threads)
            n, c = x.shape[:2]
            y = F.linear(x.reshape(n, c), weight.reshape(weight.shape[0], c), bias)
            return _UNARY[attr](y, scalars, algorithm).view(n, -1, 1, 1)
        if not x.is_contiguous(memory_format=torch.channels_last):
            x = x.contiguous(memory_format=torch.channels_last)
        w = _packed_conv(weight, x, padding, stride, dilation, groups)
        return torch.ops.mkldnn._convolution_pointwise(x, w, bias, padding, stride, dilation, groups, attr, scalars,
                                                       algorithm)
    _plain(weight)
    y = F.conv2d(x, weight, bias, stride, padding, dilation, groups)
    return _UNARY[attr](y, scalars, algorithm)


@_fx_leaf
def conv2d_add_(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride: list[int],
                padding: list[int], dilation: list[int], groups: int, residual: torch.Tensor, attr: str = "none",
                scalars: list | tuple = (), algorithm: str | None = None) -> torch.Tensor:
    """attr(conv2d(x, weight, bias, ...) + residual). On the fast path the sum is accumulated into
    `residual`'s memory (one oneDNN convolution with a sum post-op) and residual is returned: the exporter
    uses it only where nothing reads `residual` afterwards. oneDNN fuses only ReLU (or nothing) after the
    sum; elsewhere a fresh tensor, residual untouched."""
    if attr in ("none", "relu") and x.dim() == 4 and usable(x, weight, bias) and type(residual) is torch.Tensor \
            and residual.dtype is torch.float32 and residual.device.type == "cpu" \
            and not (torch.is_grad_enabled() and residual.requires_grad) \
            and residual.is_contiguous(memory_format=torch.channels_last):
        if not x.is_contiguous(memory_format=torch.channels_last):
            x = x.contiguous(memory_format=torch.channels_last)
        w = _packed_conv(weight, x, padding, stride, dilation, groups)
        return torch.ops.mkldnn._convolution_pointwise_.binary(
            residual, x, w, bias, padding, stride, dilation, groups, "add", None,
            None if attr == "none" else attr, [], None)
    _plain(weight)
    y = F.conv2d(x, weight, bias, stride, padding, dilation, groups).add_(residual)
    return _UNARY[attr](y, scalars, algorithm)


@_fx_leaf
def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, attr: str = "none",
           scalars: list | tuple = (), algorithm: str | None = None, kernel: str = "onednn") -> torch.Tensor:
    """attr(F.linear(x, weight, bias)) (weight [out, in]) on the fast path: one oneDNN inner product with the
    activation as its post-op, or (kernel="mkl", linear_kernel.py's measured choice) MKL's packed sgemm with
    the activation after it; both on a weight packed once per row count."""
    if usable(x, weight, bias) and x.dim() >= 1 and x.numel() > 0:
        if weight.dim() == 2:
            rows = x.numel() // x.shape[-1]
            if kernel == "mkl" and MKL_LINEAR and x.dim() >= 2:
                packed = _packed(weight, ("mkl", rows),
                                 lambda w: torch.ops.mkl._mkl_reorder_linear_weight(w, rows))
                return _UNARY[attr](torch.ops.mkl._mkl_linear(x, packed, weight, bias, rows), scalars, algorithm)
            weight = _packed(weight, rows, lambda w: torch.ops.mkldnn._reorder_linear_weight(w, rows))
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, attr, scalars, algorithm)
    _plain(weight)
    y = F.linear(x, weight, bias)
    return _UNARY[attr](y, scalars, algorithm)


@_fx_leaf
def dense(x):
    """x in the default contiguous layout where the fast path left it channels-last (graph outputs and the
    inputs of opaque callables see what the original model gave them); other values pass through."""
    if isinstance(x, torch.Tensor) and x.dim() == 4 and not x.is_contiguous() \
            and x.is_contiguous(memory_format=torch.channels_last):
        return x.contiguous()
    return x


def onednn_activation(act: str, params) -> tuple[str, list, str | None] | None:
    """aiacc's fused activation (name, params) as a oneDNN post-op (attr, scalars, algorithm), or None."""
    params = list(params or [])
    if not act:
        return "none", [], None
    if act in ("Relu", "Sigmoid", "Tanh"):
        return act.lower(), [], None
    if act == "HardSwish":
        return "hardswish", [], None
    if act == "LeakyRelu":
        return "leaky_relu", [float(params[0]) if params else 0.01], None
    if act == "Clip":
        lo, hi = (params + [float("-inf"), float("inf")][len(params):])[:2]
        if abs(lo) == float("inf") or abs(hi) == float("inf"):
            return None
        return "hardtanh", [float(lo), float(hi)], None
    if act == "Gelu":
        return "gelu", [], "none"
    if act == "GeluTanh":
        return "gelu", [], "tanh"
    if act == "HardSigmoid":
        alpha, beta = (params + [0.2, 0.5][len(params):])[:2]
        if abs(alpha - 1 / 6) < 1e-7 and beta == 0.5:
            return "hardsigmoid", [], None
    return None
