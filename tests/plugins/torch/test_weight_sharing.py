"""Large models' weights are held once: the IR's initializers are read-only views of the model's parameters,
and the inference export registers the original's own tensors wherever no pass changed a weight (issue 21:
vit_h_14's 2.5 GB of weights were held four to five times during optimize). The original's parameters are
never changed, by optimize or by running its result; a training export owns its parameters. Written in place
afterwards, a shared weight is followed, but a source of a folded or copied one is a StaleWeightsError on the
next call (source_watch.py): never a silent mix of old and new weights."""
from __future__ import annotations

import copy
import io
import tracemalloc
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import aiacc
from aiacc.errors import StaleWeightsError
from aiacc.plugins.torch.source_watch import WATCH_NAME


class Wide(nn.Module):
    """Large Linears (the weights dominate; the activations are tiny), a LayerNorm and a GELU between them."""

    def __init__(self, d: int = 512, layers: int = 4):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fcs = nn.ModuleList(nn.Linear(d, d) for _ in range(layers))

    def forward(self, x):
        x = self.ln(x)
        for fc in self.fcs:
            x = nn.functional.gelu(fc(x))
        return x


class ConvBN(nn.Module):
    """BatchNorm folds into the convolution: a weight a pass changes (it must get its own copy)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).mean((2, 3)))


def _built(cls, *args):
    torch.manual_seed(0)
    m = cls(*args).eval()
    for p in m.parameters():  # LayerNorm/BN start at 1/0: random values, so a changed weight shows
        with torch.no_grad():
            p.add_(torch.randn_like(p) * 0.1)
    if isinstance(m, ConvBN):
        m.bn.running_mean.normal_()
        m.bn.running_var.uniform_(0.5, 2.0)
    return m


def _param_bytes(m: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in m.parameters())


def _optimize(m, x, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return aiacc.optimize(m, x, **kw)


def test_initializers_are_read_only_views_of_the_parameters():
    m = _built(Wide)
    g = aiacc.trace(m, torch.randn(2, 512))
    w = g.initializers["fcs.0.weight"].const
    assert np.shares_memory(w, m.fcs[0].weight.detach().numpy())
    assert not w.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        w[0, 0] = 1.0  # a pass that wrote into it would change the model's weights: it fails instead


def test_the_export_shares_unchanged_weights_with_the_original():
    m = _built(Wide)
    x = torch.randn(2, 512)
    fast = _optimize(m, x)
    ptrs = {p.data_ptr() for p in m.parameters()}
    own = sum(t.numel() * t.element_size() for t in fast.state_dict().values() if t.data_ptr() not in ptrs)
    # before sharing, every weight was a copy (own == the parameter bytes): now the linears' are the original's
    assert own < 0.05 * _param_bytes(m), own
    torch.testing.assert_close(fast(x), m(x), rtol=1e-4, atol=1e-5)


def test_optimize_allocates_far_less_than_the_weights():
    """numpy's allocations are what tracemalloc sees: the IR's initializers were copies (> 1x the parameter
    bytes at the peak); as views of the parameters the IR allocates only what passes make."""
    m = _built(Wide, 1024, 4)  # 16 MiB of weights
    x = torch.randn(2, 1024)
    _optimize(m, x)  # warm: imports, caches
    tracemalloc.start()
    try:
        _optimize(m, x)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 0.5 * _param_bytes(m), (peak, _param_bytes(m))


@pytest.mark.parametrize("cls,shape", [(Wide, (2, 512)), (ConvBN, (2, 3, 8, 8))])
def test_the_original_parameters_are_never_changed(cls, shape):
    m = _built(cls)
    before = {k: t.clone() for k, t in m.state_dict().items()}
    x = torch.randn(*shape)
    expected = m(x)
    fast = _optimize(m, x)
    with torch.no_grad():
        first, second = fast(x), fast(x)
    torch.testing.assert_close(first, second, rtol=0, atol=0)
    torch.testing.assert_close(first, expected, rtol=1e-4, atol=1e-5)
    for k, t in m.state_dict().items():
        assert torch.equal(t, before[k]), k


def test_a_folded_weight_is_a_copy_the_original_keeps_its_own():
    m = _built(ConvBN)
    fast = _optimize(m, torch.randn(2, 3, 8, 8))
    ptr = m.conv.weight.data_ptr()
    assert all(t.data_ptr() != ptr for t in fast.state_dict().values())  # BN folded into it: another array


def test_a_training_export_owns_its_parameters():
    m = _built(Wide, 64, 2).train()
    fast = _optimize(m, torch.randn(4, 64), mode="train")
    ptrs = {p.data_ptr() for p in m.parameters()}
    assert all(p.data_ptr() not in ptrs for p in fast.parameters())
    before = {k: t.clone() for k, t in m.state_dict().items()}
    opt = torch.optim.SGD(fast.parameters(), lr=0.1)
    fast(torch.randn(4, 64)).pow(2).mean().backward()
    opt.step()
    assert all(torch.equal(t, before[k]) for k, t in m.state_dict().items())


# -- the in-place-change hazard: shared weights follow the original, folded copies do not -------------------------
def _other_weights(m: nn.Module) -> dict:
    """m's state_dict with every floating point tensor scaled by 1.5 (variances stay positive)."""
    return {k: t * 1.5 if t.is_floating_point() else t.clone() for k, t in m.state_dict().items()}


def test_a_folded_weights_source_changed_in_place_is_an_error_naming_it():
    m = _built(ConvBN)
    x = torch.randn(2, 3, 8, 8)
    fast = _optimize(m, x)
    with torch.no_grad():
        fast(x)  # optimize's own runs of the original (verify, measuring) did not count as changes
    m.load_state_dict(_other_weights(m))  # new weights into the original: conv + bn were folded
    with pytest.raises(StaleWeightsError, match=r"ConvBN's parameter or buffer conv\.weight .*changed in place"
                                               r".*aiacc\.optimize on the original again"):
        fast(x)
    again = _optimize(m, x)  # the fix the message gives
    with torch.no_grad():
        torch.testing.assert_close(again(x), m(x), rtol=1e-4, atol=1e-5)


def test_a_buffer_written_in_place_is_named():
    m = _built(ConvBN)
    x = torch.randn(2, 3, 8, 8)
    fast = _optimize(m, x)
    with torch.no_grad():
        m.bn.running_mean.add_(1.0)  # a training step of the original would update it so
    with pytest.raises(StaleWeightsError, match=r"bn\.running_mean"):
        fast(x)


def test_a_shared_weight_changed_in_place_is_followed_consistently():
    """fc is held as the original's own tensor (and no copy came from it): training the original's fc moves the
    optimized module's too (the fast path repacks it), and it still equals the original exactly as that now is."""
    m = _built(ConvBN)
    x = torch.randn(2, 3, 8, 8)
    fast = _optimize(m, x)
    opt = torch.optim.SGD(m.fc.parameters(), lr=0.5)
    m.fc(torch.randn(3, 8)).square().sum().backward()
    opt.step()
    with torch.no_grad():
        torch.testing.assert_close(fast(x), m(x), rtol=1e-4, atol=1e-5)
    w = _built(Wide)  # everything shared: no watch at all, and the module follows a new state_dict
    xw = torch.randn(2, 512)
    fw = _optimize(w, xw)
    assert not hasattr(fw, WATCH_NAME)
    w.load_state_dict(_built(Wide, 512, 4).state_dict() | {"ln.weight": torch.randn(512)})
    with torch.no_grad():
        torch.testing.assert_close(fw(xw), w(xw), rtol=1e-4, atol=1e-5)


def test_an_opaque_submodules_own_weights_are_watched():
    class _Loop(nn.Module):
        """Kept opaque (a trip count read from the data): its Linear is a copy inside the optimized module."""

        def __init__(self):
            super().__init__()
            self.inner = nn.Linear(4, 4)

        def forward(self, x):
            for _ in range(int((x > 100).sum())):
                x = x + 1
            return self.inner(x)

    class _Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.loop = _Loop()

        def forward(self, x):
            return self.loop(torch.relu(self.fc(x)))

    torch.manual_seed(0)
    m = _Model().eval()
    x = torch.randn(2, 4)
    fast = _optimize(m, x)
    with torch.no_grad():
        torch.testing.assert_close(fast(x), m(x))
        m.loop.inner.weight.mul_(2.0)
    with pytest.raises(StaleWeightsError, match=r"loop\.inner\.weight"):
        fast(x)


@pytest.mark.parametrize("how", ["torch.save", "deepcopy"])
def test_a_saved_or_copied_module_is_independent_of_the_original(how):
    m = _built(ConvBN)
    x = torch.randn(2, 3, 8, 8)
    fast = _optimize(m, x)
    with torch.no_grad():
        before = m(x)
    if how == "torch.save":
        buf = io.BytesIO()
        torch.save(fast, buf)
        buf.seek(0)
        copy_ = torch.load(buf, weights_only=False)
    else:
        copy_ = copy.deepcopy(fast)
    assert getattr(copy_, WATCH_NAME).watched == []  # it holds its own tensors: nothing to watch
    m.load_state_dict(_other_weights(m))
    with torch.no_grad():
        torch.testing.assert_close(copy_(x), before, rtol=1e-4, atol=1e-5)  # the snapshot, whole
    with pytest.raises(StaleWeightsError):
        fast(x)  # the original optimized module still shares fc with m


def test_training_the_original_batchnorm_is_caught():
    """BatchNorm's kernel updates its running statistics without bumping their version: a train-mode forward of
    the original is seen through num_batches_tracked, which it increments."""
    m = _built(ConvBN)
    x = torch.randn(2, 3, 8, 8)
    fast = _optimize(m, x)
    m.train()
    m(torch.randn(4, 3, 8, 8))  # the statistics the optimized module folded have moved
    m.eval()
    with pytest.raises(StaleWeightsError, match=r"bn\.running_mean \(its BatchNorm's bn\.num_batches_tracked moved"):
        fast(x)


# -- .to() of the optimized module: the watch holds no tensor, and is dropped once nothing is shared -----------------
@pytest.mark.parametrize("to", [("cpu",), (torch.float32,), ("cpu", torch.float32)])
def test_a_to_that_changes_nothing_keeps_the_watch(to):
    """.to() to the device and dtype it already has returns the same tensors: still shared with the original."""
    m = _built(ConvBN)
    x = torch.randn(2, 3, 8, 8)
    fast = _optimize(m, x)
    same = fast.to(*to)
    with torch.no_grad():
        same(x)
    assert len(getattr(same, WATCH_NAME).watched) > 0
    m.load_state_dict(_other_weights(m))
    with pytest.raises(StaleWeightsError, match=r"conv\.weight"):
        same(x)


def test_a_to_meta_drops_the_watch():
    """.to("meta") gives every tensor new memory: nothing is shared, a change of the original is no hazard."""
    m = _built(ConvBN)
    x = torch.randn(2, 3, 8, 8)
    fast = _optimize(m, x)
    meta = fast.to("meta")
    m.load_state_dict(_other_weights(m))
    y = meta(x.to("meta"))
    assert y.device.type == "meta" and tuple(y.shape) == (2, 4)
    assert getattr(meta, WATCH_NAME).watched == []


def test_a_to_float64_drops_the_watch_and_keeps_the_snapshot():
    m = _built(ConvBN)
    x = torch.randn(2, 3, 8, 8)
    fast = _optimize(m, x)
    with torch.no_grad():
        before = copy.deepcopy(m).double()(x.double())
    fast64 = fast.to(torch.float64)
    m.load_state_dict(_other_weights(m))  # the float64 module holds its own converted tensors: unaffected
    with torch.no_grad():
        torch.testing.assert_close(fast64(x.double()), before, rtol=1e-6, atol=1e-6)
    assert getattr(fast64, WATCH_NAME).watched == []


def test_the_original_converted_then_changed_is_no_error():
    """m.double() gives the original's tensors new memory: the optimized module keeps the old memory, its own
    consistent snapshot, so a later change of the original is no mix of old and new weights."""
    m = _built(ConvBN)
    x = torch.randn(2, 3, 8, 8)
    fast = _optimize(m, x)
    with torch.no_grad():
        before = fast(x)
    m.double()
    m.load_state_dict(_other_weights(m))
    with torch.no_grad():
        torch.testing.assert_close(fast(x), before)
    assert getattr(fast, WATCH_NAME).watched == []


def test_a_deleted_source_is_no_longer_watched():
    """The watch holds the original's tensors by weak reference (an optimized module keeps its original alive
    for its shape specializations, so this is the watch alone): a source gone can no longer change in place."""
    from aiacc.plugins.torch.source_watch import SourceWatch

    shared = torch.ones(3)
    root = nn.Module()
    root.register_buffer("b", shared.detach())  # the module holds the original's memory

    def watched():
        src = torch.ones(3)
        return src, SourceWatch([("w", src)], [shared], root, "M")

    src, w = watched()
    w()
    src.add_(1.0)
    with pytest.raises(StaleWeightsError, match=r"M's parameter or buffer w "):
        w()
    src, w = watched()
    del src
    w()
    assert w.watched == []
