"""Planned execution: every intermediate value lives in one preallocated arena, at the offset the memory
plan gave it (`aiacc.core.memory.plan_memory`).

`ArenaInterpreter` runs the plan's schedule. For the common ops a kernel writes straight into the value's
view of the arena (numpy `out=`; a convolution as one matrix product per image into the output view);
an op without such a kernel runs its reference kernel and its result is copied into the planned slot, so
every op works and the plan is always honoured. In-place values get the very view of the input they take
over. Outputs are copied out of the arena at the end (the arena is reused by the next run).
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from aiacc.core.ir import Graph, Node
from aiacc.core.memory import MemoryPlan, plan_memory
from aiacc.core.ops.nn import sliding_windows, window_params
from aiacc.core.runtime.executor import Interpreter, check_inputs
from aiacc.core.translate import OpTable
from aiacc.errors import AiaccError, KernelError, ShapeError

IntoKernel = Callable[[Node, list, np.ndarray], bool]  # writes the node's output into the view; False: cannot

# standard (domain "") op name -> a kernel writing into the output's arena view
INTO_KERNELS = OpTable("arena into-kernels")


_UFUNCS = {"Relu": None, "Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Tanh": np.tanh, "Exp": np.exp,
           "Neg": np.negative, "Abs": np.abs, "Sqrt": np.sqrt, "Max": np.maximum, "Min": np.minimum, "Sum": np.add}


@INTO_KERNELS.register(*_UFUNCS)
def _ufunc(node: Node, args: list, out: np.ndarray) -> bool:
    if any(a is None or a.dtype != out.dtype for a in args):
        return False
    if node.op == "Relu":
        np.maximum(args[0], out.dtype.type(0), out=out)
        return True
    fn = _UFUNCS[node.op]
    if fn.nin == 1:
        fn(args[0], out=out)
        return True
    if len(args) == 1:  # variadic Max / Min / Sum of one input
        np.copyto(out, args[0])
        return True
    fn(args[0], args[1], out=out)
    for a in args[2:]:  # variadic Max / Min / Sum
        fn(out, a, out=out)
    return True


@INTO_KERNELS.register("Clip")
def _clip(node: Node, args: list, out: np.ndarray) -> bool:
    x, lo, hi = (args + [None, None])[:3]
    np.clip(x, None if lo is None else lo.astype(x.dtype), None if hi is None else hi.astype(x.dtype), out=out)
    return True


@INTO_KERNELS.register("Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze")
def _alias(node: Node, args: list, out: np.ndarray) -> bool:
    x = args[0]
    if x.size != out.size or x.dtype != out.dtype:
        return False
    if not _same_memory(x, out):
        np.copyto(out.reshape(-1), x.reshape(-1))  # C order: what reshaping means
    return True  # in place: the bytes already are the output


def _same_memory(a: np.ndarray, b: np.ndarray) -> bool:
    """Both C-contiguous views starting at the same address (an in-place hand-over)."""
    return (a.__array_interface__["data"][0] == b.__array_interface__["data"][0] and a.flags.c_contiguous
            and b.flags.c_contiguous and a.nbytes == b.nbytes)


@INTO_KERNELS.register("BatchNormalization")
def _batch_norm(node: Node, args: list, out: np.ndarray) -> bool:
    if node.attr("training_mode", 0) or len(node.outputs) != 1:
        return False
    x, scale, bias, mean, var = args
    shape = (1, -1) + (1,) * (x.ndim - 2)
    inv = (scale / np.sqrt(var.astype(np.float64) + node.attr("epsilon", 1e-5))).astype(x.dtype)
    np.multiply(x, inv.reshape(shape), out=out)
    np.add(out, (bias - mean * inv).astype(x.dtype).reshape(shape), out=out)
    return True


@INTO_KERNELS.register("Concat")
def _concat(node: Node, args: list, out: np.ndarray) -> bool:
    np.concatenate(args, axis=node.attr("axis"), out=out)
    return True


@INTO_KERNELS.register("MatMul")
def _matmul(node: Node, args: list, out: np.ndarray) -> bool:
    a, b = args
    if a.ndim < 2 or b.ndim < 2 or a.dtype != out.dtype or b.dtype != out.dtype:
        return False
    np.matmul(a, b, out=out)
    return True


@INTO_KERNELS.register("Gemm")
def _gemm(node: Node, args: list, out: np.ndarray) -> bool:
    a, b = args[0], args[1]
    c = args[2] if len(args) > 2 else None
    a = a.T if node.attr("transA", 0) else a
    b = b.T if node.attr("transB", 0) else b
    np.matmul(a, b, out=out)
    alpha, beta = node.attr("alpha", 1.0), node.attr("beta", 1.0)
    if alpha != 1.0:
        out *= out.dtype.type(alpha)
    if c is not None:
        out += c * c.dtype.type(beta) if beta != 1.0 else c
    return True


@INTO_KERNELS.register("MaxPool", "AveragePool")
def _pool(node: Node, args: list, out: np.ndarray) -> bool:
    """2-d pooling as a running max / sum over the kernel's shifted strided slices (no window copies).
    Average pooling only without padding (else the divisor varies: the reference kernel does it)."""
    x = args[0]
    kernel = node.attr("kernel_shape")
    if (x.ndim != 4 or len(kernel) != 2 or len(node.outputs) != 1 or node.attr("ceil_mode", 0)
            or any(d != 1 for d in (node.attr("dilations") or [1, 1])) or x.dtype.kind != "f"):
        return False
    strides, _, pads = window_params(x.shape[2:], kernel, {
        "auto_pad": node.attr("auto_pad"), "strides": node.attr("strides"), "dilations": None,
        "pads": node.attr("pads")})
    avg = node.op == "AveragePool"
    if avg and any(pads):
        return False
    if any(pads):
        xp = np.full((*x.shape[:2], x.shape[2] + pads[0] + pads[2], x.shape[3] + pads[1] + pads[3]), -np.inf,
                     dtype=x.dtype)
        xp[:, :, pads[0]:pads[0] + x.shape[2], pads[1]:pads[1] + x.shape[3]] = x
    else:
        xp = x
    oh, ow = out.shape[2:]
    sh, sw = strides
    first = True
    for ki in range(kernel[0]):
        for kj in range(kernel[1]):
            sl = xp[:, :, ki:ki + sh * (oh - 1) + 1:sh, kj:kj + sw * (ow - 1) + 1:sw]
            if first:
                np.copyto(out, sl)
                first = False
            elif avg:
                np.add(out, sl, out=out)
            else:
                np.maximum(out, sl, out=out)
    if avg:
        out *= out.dtype.type(1.0 / (kernel[0] * kernel[1]))
    return True


#: elements of the patch matrix one convolution tile may hold (the kernel's only scratch memory)
CONV_TILE_ELEMENTS = 1 << 13


def _depthwise(x, w, out, kernel, strides, dilations, pads) -> None:
    """One image of a depthwise convolution, a band of channels at a time: a multiply-add of the kernel's
    shifted strided slices (scratch: the band padded, and one product)."""
    c, oh, ow = out.shape
    band = max(1, CONV_TILE_ELEMENTS // max((x.shape[1] + pads[0] + pads[2]) * (x.shape[2] + pads[1] + pads[3]), 1))
    sh, sw = strides
    for c0 in range(0, c, band):
        c1 = min(c, c0 + band)
        xp = np.pad(x[c0:c1], [(0, 0), (pads[0], pads[2]), (pads[1], pads[3])])
        o = out[c0:c1]
        tmp = np.empty_like(o)
        for ki in range(kernel[0]):
            for kj in range(kernel[1]):
                r, q = ki * dilations[0], kj * dilations[1]
                sl = xp[:, r:r + sh * (oh - 1) + 1:sh, q:q + sw * (ow - 1) + 1:sw]
                wk = w[c0:c1, 0, ki, kj].reshape(-1, 1, 1)
                if ki == 0 and kj == 0:
                    np.multiply(sl, wk, out=o)
                else:
                    np.multiply(sl, wk, out=tmp)
                    o += tmp


@INTO_KERNELS.register("Conv")
def _conv(node: Node, args: list, out: np.ndarray, tile: int | None = None) -> bool:
    """Matrix products written into the output view: per image, group and band of output rows,
    (M, C*k*k) x (C*k*k, rows*W) with a patch matrix of at most CONV_TILE_ELEMENTS elements. A 1x1
    stride-1 unpadded convolution needs no patch matrix; a depthwise one is a windowed multiply-add."""
    x, w = args[0], args[1]
    b = args[2] if len(args) > 2 else None
    if x.ndim != 4 or x.dtype != out.dtype or w.dtype != out.dtype:
        return False
    kernel = list(node.attr("kernel_shape") or w.shape[2:])
    strides, dilations, pads = window_params(x.shape[2:], kernel, {
        "auto_pad": node.attr("auto_pad"), "strides": node.attr("strides"),
        "dilations": node.attr("dilations"), "pads": node.attr("pads")})
    group = node.attr("group", 1)
    n, c = x.shape[:2]
    m = w.shape[0]
    cg, mg = c // group, m // group
    oh, ow = out.shape[2], out.shape[3]
    kk = kernel[0] * kernel[1]
    pointwise = kernel == [1, 1] and strides == [1, 1] and not any(pads)
    depthwise = group == c and group == m and not pointwise
    rows = max(1, (tile or CONV_TILE_ELEMENTS) // max(cg * kk * ow, 1))
    for i in range(n):
        if depthwise:
            _depthwise(x[i], w, out[i], kernel, strides, dilations, pads)
            continue
        yi = out[i].reshape(m, oh * ow)
        for g in range(group):
            xs = x[i:i + 1, g * cg:(g + 1) * cg]
            wg = w[g * mg:(g + 1) * mg].reshape(mg, -1)
            if pointwise:
                np.matmul(wg, xs[0].reshape(cg, -1), out=yi[g * mg:(g + 1) * mg])
                continue
            win = sliding_windows(xs, kernel, strides, dilations, pads)[0]  # Cg, H, W, kh, kw
            for r0 in range(0, oh, rows):
                r1 = min(oh, r0 + rows)
                cols = win[:, r0:r1].transpose(0, 3, 4, 1, 2).reshape(cg * kk, (r1 - r0) * ow)
                np.matmul(wg, cols, out=yi[g * mg:(g + 1) * mg, r0 * ow:r1 * ow])
    if b is not None:
        out += b.reshape(1, -1, 1, 1)
    return True


#: elements one chunk of a chunked reference kernel covers
CHUNK_ELEMENTS = 1 << 12

_ROWWISE = {"Softmax", "LogSoftmax", "LayerNormalization"}


def _chunked(node: Node, args: list, out: np.ndarray) -> bool:
    """Run the reference kernel piece by piece into the output view, so its float64 or other temporaries
    stay small: elementwise ops over flat chunks, last-axis softmax / layer norm over bands of rows.
    Each piece is computed before it is written, so this is safe in place too."""
    schema = node.schema
    if schema is None or len(node.outputs) != 1 or out.size <= CHUNK_ELEMENTS:
        return False
    attrs = schema.resolved_attrs(node)
    if schema.elementwise:
        if any(a is not None and a.shape != out.shape and a.size != 1 for a in args):
            return False
        full = [a is not None and a.shape == out.shape for a in args]
        flat = [a.reshape(-1) if f else a for a, f in zip(args, full)]
        dst = out.reshape(-1)
        for lo in range(0, out.size, CHUNK_ELEMENTS):
            hi = min(out.size, lo + CHUNK_ELEMENTS)
            dst[lo:hi] = schema.kernel(*(a[lo:hi] if f else a for a, f in zip(flat, full)), **attrs)
        return True
    if node.op in _ROWWISE and node.domain == "":
        x = args[0]
        if attrs["axis"] not in (-1, x.ndim - 1):
            return False
        last = x.shape[-1]
        rows = x.reshape(-1, last)
        dst = out.reshape(-1, last)
        band = max(1, CHUNK_ELEMENTS // max(last, 1))
        for lo in range(0, rows.shape[0], band):
            r = schema.kernel(rows[lo:lo + band], *args[1:], **attrs)
            dst[lo:lo + band] = r[0] if isinstance(r, tuple) else r
        return True
    return False


class ArenaInterpreter(Interpreter):
    """Runs a graph on a memory plan, all intermediates in one arena allocated once.

    `plan` defaults to `plan_memory(graph, dims=...)`, with symbolic dims bound by `dims` (e.g. {"N": 1}).
    """

    def __init__(self, graph: Graph, plan: MemoryPlan | None = None, *, dims: Mapping[str, int] | None = None):
        super().__init__(graph)
        self.plan = plan or plan_memory(graph, dims=dims)
        if self.plan.graph is not graph:
            raise AiaccError(f"the memory plan was made for graph {self.plan.graph.name}, not this graph")
        self.set_schedule(self.plan.schedule)
        align = self.plan.alignment
        self._raw = np.empty(self.plan.arena_bytes + align, dtype=np.uint8)
        start = (-self._raw.ctypes.data) % align
        self.arena = self._raw[start:start + self.plan.arena_bytes]
        self.views: dict[str, np.ndarray] = {}
        for name, a in self.plan.allocations.items():
            self.views[name] = self.arena[a.offset:a.offset + a.nbytes].view(a.dtype).reshape(a.shape)
        self.copied = 0  # nodes whose result was computed aside and copied into the arena (last run)
        self.unplanned_runs = 0  # nodes run outside the arena: their outputs are not in the plan (last run)

    @property
    def arena_bytes(self) -> int:
        return self.plan.arena_bytes

    def run(self, inputs: Mapping[str, Any], *, validate: bool = True) -> dict[str, np.ndarray]:
        feeds = check_inputs(self.graph, inputs) if validate else {k: np.asarray(x) for k, x in inputs.items()}
        types = self.plan.dims
        for v in self.graph.inputs:
            want = tuple(types.get(d, d) if isinstance(d, str) else d for d in (v.shape or ()))
            if v.shape is not None and feeds[v.name].shape != want:
                raise ShapeError(f"graph input {v.name!r} has shape {list(feeds[v.name].shape)}, but the memory plan "
                                 f"was made for {list(want)} (dims={self.plan.dims}); plan again for this shape")
        self.copied = self.unplanned_runs = 0
        outs = super().run(feeds, validate=False)
        planned = set(self.views)
        return {k: (a.copy() if k in planned else a) for k, a in outs.items()}

    def run_node(self, node: Node, args: list[np.ndarray | None]) -> list[np.ndarray]:
        if any(v.name not in self.views for v in node.outputs):
            # a value the plan left out of the arena (plan_memory(unplanned="skip")): allocated aside
            self.unplanned_runs += 1
            # a reference kernel may return a view of its input (Reshape): a view into the arena would be
            # overwritten when that slot is reused, so such a result gets its own copy
            return [r.copy() if np.may_share_memory(r, self.arena) else r for r in super().run_node(node, args)]
        views = [self.views[v.name] for v in node.outputs]
        into = INTO_KERNELS.get(node.op) if node.domain == "" and node.meta.get("kernel") is None else None
        if into is not None and len(views) == 1:
            try:
                with np.errstate(all="ignore"):
                    if into(node, list(args), views[0]):
                        return views
            except AiaccError:
                raise
            except Exception as e:
                shapes = ", ".join("_" if a is None else f"{a.dtype.name}{list(a.shape)}" for a in args)
                raise KernelError(f"node {node.name} ({node.qualified_op}) failed writing into its arena slot "
                                  f"on inputs ({shapes}): {e}") from e
        if node.meta.get("kernel") is None and len(views) == 1:
            with np.errstate(all="ignore"):
                try:
                    if _chunked(node, list(args), views[0]):
                        return views
                except AiaccError:
                    raise
                except Exception:
                    pass  # the whole-array reference run below reports the failure with context
        results = super().run_node(node, args)
        self.copied += 1
        for v, r, view in zip(node.outputs, results, views):
            if r.shape != view.shape or r.dtype != view.dtype:
                raise KernelError(f"node {node.name} ({node.qualified_op}): output %{v.name} is "
                                  f"{r.dtype.name}{list(r.shape)}, the memory plan expected "
                                  f"{view.dtype.name}{list(view.shape)}")
            if not _same_memory(r, view):
                np.copyto(view, r)
        return views[:len(results)] + results[len(views):]


def run_planned(graph: Graph, inputs: Mapping[str, Any], plan: MemoryPlan | None = None, *,
                dims: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
    """Run `graph` in one arena (planning it first unless `plan` is given); returns {output name: array}."""
    return ArenaInterpreter(graph, plan, dims=dims).run(inputs)


__all__ = ["ArenaInterpreter", "run_planned"]
