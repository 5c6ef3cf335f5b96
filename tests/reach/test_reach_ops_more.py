"""Constructs found by the reach sweep (benchmarks/reach.py) in models nobody here wrote, in small
modules: addcmul / addcdiv (timm ResMLP's Affine), an integer tensor times a Python float (timm MViTv2's
relative positions), baddbmm with keyword operands (BLOOM's ALiBi scores), an index list after an
ellipsis (Falcon's fused QKV split), torch's RMSNorm, narrow and one_hot, Longformer's overlapping chunks
(as_strided, stride, views to computed sizes) and band masks (tril, Tensor.where, torch.masked_fill). Each
traces with no opaque node and equals the original."""
from __future__ import annotations

import io
import warnings

import pytest
import torch
from torch import nn

import aiacc
from tests.plugins.torch._helpers import assert_close_rel, assert_translates_whole_and_equal


class _AddC(nn.Module):
    def forward(self, x, a, b):
        y = torch.addcmul(x, a, b, value=0.5) + torch.addcmul(x, a, b)
        return y + torch.addcdiv(x, a, b.abs() + 1, value=2.0) + x.addcmul(a, b, value=-1.0)


class _IntTimesFloat(nn.Module):
    def forward(self, x):
        pos = torch.arange(x.shape[-1])[None, :] - torch.arange(x.shape[-1])[:, None]  # int64
        mask = x > 0  # bool
        return x + pos * 0.5 + (mask * 3).to(x.dtype) + 2.0 * pos


class _Baddbmm(nn.Module):
    def forward(self, bias, q, k):
        return bias.baddbmm(batch1=q, batch2=k, beta=1.0, alpha=0.25) + torch.baddbmm(bias, q, k) \
            + torch.baddbmm(bias, q, k, beta=0.0)


class _EllipsisIndex(nn.Module):
    def forward(self, qkv):
        return qkv[..., :-2, :].sum(-2, keepdim=True) + qkv[..., [-2], :] * qkv[..., [-1], :]


class _RmsNarrowOneHot(nn.Module):
    """nn.RMSNorm and F.rms_norm (torch's own, as Llama-style models written on torch >= 2.4 use), narrow,
    F.one_hot with a given width (mixture-of-experts routing masks), torch.multiply / subtract / divide /
    true_divide (ConvBERT)."""

    def __init__(self):
        super().__init__()
        self.norm = nn.RMSNorm(8, eps=1e-6)

    def forward(self, x, ids):
        y = self.norm(x) + torch.nn.functional.rms_norm(x, (8,)) + x.narrow(1, 1, 3).sum(1, keepdim=True)
        hot = torch.nn.functional.one_hot(ids, 8).to(x.dtype)
        return y + hot + torch.narrow(x, -1, -4, 4).repeat(1, 1, 2) + torch.multiply(x, 2.0) \
            - torch.subtract(x, x.abs()) + x.divide(torch.true_divide(x.abs(), 2) + 1)


class _OverlappingChunks(nn.Module):
    """Longformer's _chunk and its value chunks: a view to a chunk count computed with torch.div on a size,
    the strides read with x.stride(), as_strided to overlapping windows (of a contiguous tensor and of a
    transposed-then-reshaped view whose memory is not in its logical order), torch.as_strided with an
    explicit storage_offset, and new_zeros sized by tensor ops on sizes."""

    def forward(self, x):
        w = 2
        b, n, d = x.shape
        chunks = x.view(b, torch.div(n, w * 2, rounding_mode="trunc"), w * 2, d)
        size, stride = list(chunks.size()), list(chunks.stride())
        size[1], stride[1] = size[1] * 2 - 1, stride[1] // 2
        overlapping = chunks.as_strided(size=size, stride=stride)
        # (n, b, d) memory read as (b, n, d): as_strided follows the memory, not the logical order
        t = x.transpose(0, 1).contiguous().transpose(0, 1)
        count = torch.div(n, w, rounding_mode="trunc") - 1
        s = t.stride()
        windows = t.as_strided(size=(b, count, 2 * w, d), stride=(s[0], w * s[1], s[1], s[2]))
        shifted = torch.as_strided(x, (b, 3, d), (n * d, d, 1), storage_offset=d)
        return overlapping.sum(2) * 1.5, windows + x.new_zeros((b, count + 1, 1, 1))[:, 1:], shifted


class _BandMasks(nn.Module):
    """Longformer's band masks: x.tril() / torch.tril / triu with a diagonal, x.where(cond, other),
    torch.masked_fill and x.masked_fill."""

    def forward(self, x, mask):
        band = x.new_ones(x.shape[-2], x.shape[-1]).tril().flip(dims=[0])
        y = torch.full_like(x, -1e4).where(band.bool(), x) + torch.tril(x, -1) + x.triu(1) * 2 + torch.triu(x)
        return torch.masked_fill(y, mask, 0.0) + x.masked_fill(~mask, 3.0)


CASES = {
    "overlapping_chunks": (_OverlappingChunks, lambda: (torch.randn(2, 8, 3),)),
    "band_masks": (_BandMasks, lambda: (torch.randn(2, 4, 5), torch.rand(2, 4, 5) > 0.5)),
    "rms_norm_narrow_one_hot": (_RmsNarrowOneHot, lambda: (torch.randn(2, 5, 8), torch.randint(0, 8, (2, 5)))),
    "addcmul": (_AddC, lambda: (torch.randn(2, 5, 8), torch.randn(2, 5, 8), torch.randn(8))),
    "int_times_float": (_IntTimesFloat, lambda: (torch.randn(2, 6, 6),)),
    "baddbmm": (_Baddbmm, lambda: (torch.randn(3, 4, 5), torch.randn(3, 4, 8), torch.randn(3, 8, 5))),
    "ellipsis_index": (_EllipsisIndex, lambda: (torch.randn(2, 3, 6, 4),)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_translates_whole_and_equal(name):
    cls, feed = CASES[name]
    assert_translates_whole_and_equal(cls().eval(), feed(), feed())


class _UnfoldFold(nn.Module):
    """timm VOLO's outlook attention: unfold to patches, fold the weighted patches back (overlaps summed)."""

    def __init__(self, k=3, padding=1, stride=2):
        super().__init__()
        self.unfold = nn.Unfold(k, padding=padding, stride=stride)
        self.k, self.padding, self.stride = k, padding, stride

    def forward(self, x):
        u = self.unfold(x)                                   # (N, C*k*k, L)
        v = torch.nn.functional.unfold(x, (2, 3), dilation=(1, 2), padding=(1, 0), stride=1)
        y = torch.nn.functional.fold(u * 0.5, x.shape[-2:], self.k, padding=self.padding, stride=self.stride)
        return y, v


def test_unfold_and_fold_are_convolutions():
    model = _UnfoldFold().eval()
    x, fresh = (torch.randn(2, 3, 9, 10),), (torch.randn(2, 3, 9, 10),)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = aiacc.trace(model, x)
        assert [n.op for n in graph if n.is_opaque] == [], graph.meta.get("torch.opaque_reasons")
        assert {"Conv", "ConvTranspose"} <= {n.op for n in graph}
        fast = aiacc.optimize(model, x)
    with torch.no_grad():
        assert_close_rel(model(*fresh), fast(*fresh), 1e-5)


class _StridedOutside(nn.Module):
    """as_strided reading storage the view does not own (rows of the tensor x[:2] is a view of), and of an
    expanded tensor (several elements, one memory location): no value-level meaning, kept opaque."""

    def forward(self, x):
        outside = x[:2].as_strided((3, 4), (4, 1))
        shared = x[:1].expand(3, 4).as_strided((2, 2), (1, 1))
        return outside * 2, shared


def test_as_strided_outside_the_tensors_own_elements_stays_opaque_and_correct():
    model = _StridedOutside().eval()
    x, fresh = (torch.randn(4, 4),), (torch.randn(4, 4),)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = aiacc.trace(model, x)
        reasons = sorted(graph.meta["torch.opaque_reasons"].values())
        assert len(reasons) == 2 and any("outside the tensor's own elements" in r for r in reasons) \
            and any("share memory" in r for r in reasons), reasons
        fast = aiacc.optimize(model, x)
    with torch.no_grad():
        assert_close_rel(model(*fresh), fast(*fresh), 1e-5)


class _TensorFill(nn.Module):
    """masked_fill with a 0-d tensor as the fill value (torch takes no other tensor): a buffer (GPT-2's old
    masked_bias), a value computed from the input, an input, a float value into an integer tensor (cast as
    torch writes it), a mask that broadcasts, and a parameter filled by an expression of itself."""

    def __init__(self):
        super().__init__()
        self.register_buffer("neg", torch.tensor(-1e4))
        self.w = nn.Parameter(torch.tensor(0.5))

    def forward(self, x, mask, v=None):
        a = x.masked_fill(mask, self.neg)
        b = torch.masked_fill(x, ~mask, x.amax())
        c = x.masked_fill(mask[0], self.w * 3 if v is None else v)
        i = (x * 10).long().masked_fill(mask, torch.tensor(2.7))
        return a + b * self.w.masked_fill(torch.tensor(True), self.w * 2) + c, i


def _fill_inputs():
    return torch.randn(2, 3, 4), torch.rand(2, 3, 4) > 0.5, torch.tensor(3.0)


@pytest.mark.parametrize("frontend", ["fx", "export"])
def test_masked_fill_with_a_tensor_value_is_a_where(frontend):
    model, x, fresh = _TensorFill().eval(), _fill_inputs(), _fill_inputs()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = aiacc.trace(model, x, frontend=frontend)
        assert [n.op for n in graph if n.is_opaque] == [], graph.meta.get("torch.opaque_reasons")
        assert sum(n.op == "Where" for n in graph) >= 5
        # torch.export: translated itself, not replaced by PyTorch's decomposition as a way around a refusal
        assert "aten.masked_fill.Tensor" not in graph.meta.get("torch.export", {}).get("decomposed", [])
        fast = aiacc.optimize(model, x, frontend=frontend)
    with torch.no_grad():
        expected, actual = model(*fresh), fast(*fresh)
    assert actual[1].dtype == torch.int64 and torch.equal(expected[1], actual[1])
    assert_close_rel(expected[0], actual[0], 1e-6)


def test_masked_fill_with_a_tensor_value_trains():
    """mode='train': the gradients reach the fill value (a parameter) and x through the Where."""
    torch.manual_seed(0)
    model = _TensorFill().train()
    x, mask, _ = _fill_inputs()
    x.requires_grad_(True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fast = aiacc.optimize(model, (x, mask), mode="train")
        assert [n.op for n in aiacc.trace(model, (x, mask), mode="train") if n.is_opaque] == []
    grads = []
    for m in (model, fast):
        x.grad = None
        m.zero_grad()
        out, _ = m(x, mask)
        (out ** 2).sum().backward()
        grads.append((dict(m.named_parameters())["w"].grad.clone(), x.grad.clone()))
    for a, b in zip(*grads):
        assert_close_rel(a, b, 1e-5)


class _ReadsMemory(nn.Module):
    """as_strided on the input itself: overlapping windows of its storage."""

    def forward(self, x):
        return x.as_strided((3, 2, 4), (4, 4, 1)) * 2


class _ReadsAfterLinear(nn.Module):
    """as_strided on a Linear's output: a fresh contiguous tensor whatever the input's layout."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x)
        s = y.stride()
        return y.as_strided((3, 2, 4), (s[0] // 2, s[1], s[2]))


def _layouts():
    base = torch.randn(4, 2, 4, generator=torch.Generator().manual_seed(1))
    return {"contiguous": base.clone(),
            "permuted": base.permute(2, 0, 1).contiguous().permute(1, 2, 0)}  # same values, other memory order


@pytest.mark.parametrize("frontend,backend", [("fx", "native"), ("export", "native"), ("fx", "onnxruntime")])
@pytest.mark.parametrize("example", ["contiguous", "permuted"])
def test_as_strided_is_guarded_to_the_examples_memory_layout(example, frontend, backend):
    """as_strided reads memory: the optimized model equals the original on an input of the example's layout
    and raises GuardError naming the input and the as_strided on one of another layout (same values: the
    original gives another answer there, which the Gather built for the example's layout would not)."""
    from aiacc.errors import GuardError

    model, layouts = _ReadsMemory().eval(), _layouts()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = aiacc.trace(model, (layouts[example],), frontend=frontend)
        assert [n.op for n in graph if n.is_opaque] == []
        fast = aiacc.optimize(model, (layouts[example],), frontend=frontend, backend=backend)
    other = next(k for k in layouts if k != example)
    with torch.no_grad():
        same = layouts[example] * 1.5
        same = torch.empty_strided(same.shape, layouts[example].stride()).copy_(same)  # a fresh input, same layout
        assert_close_rel(model(same), fast(same), 1e-6)
        assert not torch.allclose(model(layouts[other]), model(layouts[example]))  # torch's answer does change
        with pytest.raises(GuardError, match=r"input 'x' .* has strides .*as_strided \(node"):
            fast(layouts[other])
    if backend == "native":  # the check is in the saved module's code
        buf = io.BytesIO()
        torch.save(fast, buf)
        buf.seek(0)
        loaded = torch.load(buf, weights_only=False)
        with torch.no_grad(), pytest.raises(GuardError, match="as_strided"):
            loaded(layouts[other])


def test_as_strided_of_a_fresh_tensor_takes_any_input_layout():
    """Through a Linear (its output is allocated contiguous) the input's layout does not reach the as_strided:
    no guard, and an input of another layout than the example's is answered right."""
    torch.manual_seed(0)
    model, layouts = _ReadsAfterLinear().eval(), _layouts()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = aiacc.trace(model, (layouts["contiguous"],))
        fast = aiacc.optimize(model, (layouts["contiguous"],))
    assert not graph.meta.get("torch.layout_guards")
    with torch.no_grad():
        for x in layouts.values():
            assert_close_rel(model(x), fast(x), 1e-6)


class _AbsoluteOffset(nn.Module):
    def forward(self, x):
        return torch.as_strided(x, (2, 3), (3, 1), storage_offset=3) + 1  # rows 1-2 of a contiguous (4, 3) x


def test_as_strided_with_a_storage_offset_guards_the_inputs_offset():
    """An absolute storage_offset reads relative to the storage, not the tensor: a view of a larger tensor
    (same shape and strides, another offset) is refused, a plain tensor is answered right."""
    from aiacc.errors import GuardError

    model = _AbsoluteOffset().eval()
    x = torch.randn(4, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fast = aiacc.optimize(model, (x,))
    fresh = torch.randn(4, 3)
    with torch.no_grad():
        assert_close_rel(model(fresh), fast(fresh), 1e-6)
        view = torch.randn(5, 3)[1:]
        assert view.stride() == fresh.stride() and not torch.allclose(model(view), model(view.clone()))
        with pytest.raises(GuardError, match="storage offset 3; the model was optimized for strides .* storage "
                                             "offset 0"):
            fast(view)


class _EveryOtherRow(nn.Module):
    def forward(self, x):
        return x.as_strided((2, 4), (8, 2)) - 1  # reads storage rows 0 and 1 of a view with gaps


@pytest.mark.parametrize("case", ["gaps", "offset"])
def test_as_strided_of_an_example_view_reads_the_views_own_layout(case):
    """An example that is a view with gaps (x[:, ::2]) or at a storage offset (x[1:]) is traced in that layout
    (the example run's copies keep it; clone() would lay it out densely at offset 0 and the guard would then
    refuse the example itself): optimize verifies, and a fresh input of the same layout is answered right."""
    model = _EveryOtherRow().eval() if case == "gaps" else _AbsoluteOffset().eval()

    def feed():
        return torch.randn(4, 8)[:, ::2] if case == "gaps" else torch.randn(5, 3)[1:]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fast = aiacc.optimize(model, (feed(),))
    with torch.no_grad():
        fresh = feed()
        assert_close_rel(model(fresh), fast(fresh), 1e-6)
