"""`%` / remainder / fmod / `//`, topk, scatter / scatter_add / scatter_reduce / index_add, index_put with computed indices, `x[idx] = v`
and `x[mask] = v` (aiacc/plugins/torch/import_ops/scatter.py; the IR's TopK / ScatterElements / ScatterND,
aiacc/core/ops/scatter.py): each module traces with no opaque node through torch.fx and torch.export, its
optimized module equals torch on a fresh input, the IR's reference kernels equal torch, and the graph
exported to ONNX runs in onnxruntime with torch's results."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

import aiacc
from aiacc.core.runtime import executor


class _TopK(nn.Module):
    def forward(self, x):
        v, i = torch.topk(x, 3, dim=-1)
        w, j = x.topk(2, dim=1, largest=False)
        return v * 2 + i.to(x.dtype), w.sum(1) + j.sum(1).to(x.dtype)


class _Scatter(nn.Module):
    def forward(self, x, idx):
        a = torch.zeros_like(x).scatter(1, idx, x[:, :3])
        b = x.scatter_add(1, idx, torch.ones_like(x))
        c = x.scatter_reduce(1, idx, x[:, :3] * 2, "amax")
        d = x.scatter(1, idx[:, :2], 7.0)
        return a + b + c + d


class _IndexAdd(nn.Module):
    def forward(self, x, src, idx):
        return x.index_add(0, idx, src, alpha=0.5) + torch.index_add(x, 1, idx[:2] % x.shape[1], x[:, :2] * 2)


class _IndexPut(nn.Module):
    """A mixture-of-experts style routing write and masked assignments, with indices computed in the model."""

    def forward(self, x, ids):
        pos = ids.argmax(-1)  # computed positions
        order = ids[0].topk(x.shape[0])[1]  # distinct computed positions
        y = x.clone()
        y[torch.arange(x.shape[0]), pos] = 0.0  # (batch, row) pairs
        z = x.index_put((pos % x.shape[0],), torch.ones(x.shape[1], x.shape[2]), accumulate=True)
        w = x.clone()
        w[:, order % x.shape[1]] = x[:, :order.shape[0]] * 3  # the indexed axis after a full slice
        m = x.clone()
        m[x > 0.5] = -1.0  # a boolean mask with one value
        return y + z + w + m


class _Remainder(nn.Module):
    """`%`, remainder, fmod and `//` on floats of both signs and on integers (positions wrapped by a size)."""

    def forward(self, x, ids):
        return (x % 1.5 + torch.remainder(-x, 0.7) + torch.fmod(x, 1.2) + x.remainder(x.abs() + 0.5),
                ids % 3 + (ids - 4) // 3 + torch.floor_divide(ids, 2) + (-ids).remainder(5))


def _cases():
    g = torch.Generator().manual_seed(0)

    return {
        "remainder": (_Remainder, lambda: (torch.randn(3, 8, generator=g) * 4, torch.randint(-9, 9, (3, 8), generator=g))),
        "topk": (_TopK, lambda: (torch.randn(2, 5, 7, generator=g),)),
        # distinct positions per row: with repeated ones scatter's result depends on the write order
        "scatter": (_Scatter, lambda: (torch.randn(3, 6, generator=g),
                                       torch.stack([torch.randperm(6, generator=g)[:3] for _ in range(3)]))),
        "index_add": (_IndexAdd, lambda: (torch.randn(5, 4, generator=g), torch.randn(3, 4, generator=g),
                                          torch.tensor([4, 0, 4]))),
        "index_put": (_IndexPut, lambda: (torch.randn(4, 5, 3, generator=g), torch.randn(4, 5, generator=g))),
    }


CASES = _cases()


def _ir(model, x, frontend):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return aiacc.trace(model, x, frontend=frontend)


@pytest.mark.parametrize("frontend", ["fx", "export"])
@pytest.mark.parametrize("name", list(CASES))
def test_translates_whole_and_equal(name, frontend):
    cls, feed = CASES[name]
    model, x, fresh = cls().eval(), feed(), feed()
    graph = _ir(model, x, frontend)
    assert [n.op for n in graph if n.is_opaque] == [], graph.meta.get("torch.opaque_reasons")
    ops = {n.op for n in graph}
    assert ops & {"TopK", "ScatterElements", "ScatterND", "Where", "Mod"}, ops
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fast = aiacc.optimize(model, x, frontend=frontend)
    with torch.no_grad():
        for e, a in zip(model(*fresh) if isinstance(model(*fresh), tuple) else (model(*fresh),),
                        fast(*fresh) if isinstance(fast(*fresh), tuple) else (fast(*fresh),)):
            torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", list(CASES))
def test_reference_kernels_and_onnx_export_equal_torch(name):
    """The IR's numpy kernels (the reference executor) and onnxruntime on the exported ONNX give torch's
    results (the example input: the graph's constants are the example's)."""
    cls, feed = CASES[name]
    model, x = cls().eval(), feed()
    graph = _ir(model, x, "fx")
    with torch.no_grad():
        expected = model(*x)
    expected = expected if isinstance(expected, tuple) else (expected,)
    feeds = {v.name: t.numpy() for v, t in zip(graph.inputs, x)}
    got = executor.run(graph, feeds)
    for v, e in zip(graph.outputs, expected):
        np.testing.assert_allclose(got[v.name], e.numpy(), rtol=1e-5, atol=1e-5)
    ort = pytest.importorskip("onnxruntime")
    from aiacc.core.onnx import to_onnx

    proto = to_onnx(graph)
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    outs = sess.run(None, feeds)
    for o, e in zip(outs, expected):
        np.testing.assert_allclose(o, e.numpy(), rtol=1e-5, atol=1e-5)


def test_topk_ties_come_in_index_order():
    from aiacc.core.ops.scatter import topk

    x = np.array([[1.0, 3.0, 3.0, 2.0, 3.0]], np.float32)
    v, i = topk(x, np.array([3]), axis=-1, largest=1, sorted=1)
    assert i.tolist() == [[1, 2, 4]] and v.tolist() == [[3.0, 3.0, 3.0]]
    v, i = topk(x, np.array([2]), axis=-1, largest=0, sorted=1)
    assert i.tolist() == [[0, 3]]
