"""The oneDNN fast path of inference exports (aiacc/plugins/torch/fastpath.py): same numbers as F.conv2d /
F.linear, weights re-prepared when they change, the plain path wherever oneDNN cannot run, and the
lowering choices it enables (conv post-ops, FusedMatMul as a linear, attention as SDPA)."""
from __future__ import annotations

import io

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import aiacc
from aiacc.plugins.torch import fastpath
from tests.plugins.torch._helpers import assert_close_rel
from tests.zoo.torch_models import ZOO

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")

_ACTS = [("none", [], None, lambda y: y), ("relu", [], None, F.relu), ("sigmoid", [], None, torch.sigmoid),
         ("tanh", [], None, torch.tanh), ("hardswish", [], None, F.hardswish), ("swish", [], None, F.silu),
         ("leaky_relu", [0.1], None, lambda y: F.leaky_relu(y, 0.1)),
         ("hardtanh", [0.0, 6.0], None, F.relu6), ("gelu", [], "none", F.gelu),
         ("gelu", [], "tanh", lambda y: F.gelu(y, approximate="tanh")), ("hardsigmoid", [], None, F.hardsigmoid)]


@pytest.mark.parametrize("attr,scalars,algorithm,ref", _ACTS, ids=[f"{a[0]}-{a[2]}" for a in _ACTS])
def test_conv2d_and_linear_match_plain_torch(attr, scalars, algorithm, ref):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 8, 9, 9, generator=g)
    w = torch.randn(6, 4, 3, 3, generator=g) * 0.3
    b = torch.randn(6, generator=g)
    with torch.no_grad():
        expected = ref(F.conv2d(x, w, b, [2, 1], [1, 0], [1, 1], 2))
        fast = fastpath.conv2d(x, w, b, [2, 1], [1, 0], [1, 1], 2, attr, scalars, algorithm)
        assert_close_rel(expected, fast, 1e-5)
        assert fast.is_contiguous(memory_format=torch.channels_last)  # the oneDNN path ran
        xl, wl = torch.randn(3, 5, 16, generator=g), torch.randn(7, 16, generator=g)
        assert_close_rel(ref(F.linear(xl, wl, b[:1].expand(7).contiguous())),
                         fastpath.linear(xl, wl, b[:1].expand(7).contiguous(), attr, scalars, algorithm), 1e-5)
    # with autograd the plain path runs (same numbers, gradients flow)
    xg = x.clone().requires_grad_()
    y = fastpath.conv2d(xg, w, b, [2, 1], [1, 0], [1, 1], 2, attr, scalars, algorithm)
    assert y.is_contiguous() and y.grad_fn is not None
    y.sum().backward()
    assert xg.grad is not None and xg.grad.shape == x.shape


def test_packed_weight_follows_in_place_updates_and_shapes():
    x = torch.randn(1, 4, 8, 8)
    w = torch.randn(5, 4, 3, 3)
    with torch.no_grad():
        first = fastpath.conv2d(x, w, None, [1, 1], [1, 1], [1, 1], 1)
        assert_close_rel(F.conv2d(x, w, None, 1, 1), first)
        w.mul_(-2.0)  # in place (as load_state_dict copies): the version changes, the packed copy is redone
        assert_close_rel(F.conv2d(x, w, None, 1, 1), fastpath.conv2d(x, w, None, [1, 1], [1, 1], [1, 1], 1))
        w.data = torch.randn(5, 4, 3, 3)  # new storage under the same tensor
        assert_close_rel(F.conv2d(x, w, None, 1, 1), fastpath.conv2d(x, w, None, [1, 1], [1, 1], [1, 1], 1))
        x2 = torch.randn(3, 4, 11, 7)  # another input shape
        assert_close_rel(F.conv2d(x2, w, None, 1, 1), fastpath.conv2d(x2, w, None, [1, 1], [1, 1], [1, 1], 1))
        lw = torch.randn(6, 5)
        for rows in (1, 4, 1):  # packed per row count
            xl = torch.randn(rows, 5)
            assert_close_rel(F.linear(xl, lw), fastpath.linear(xl, lw, None))
        lw.copy_(torch.randn(6, 5))
        assert_close_rel(F.linear(xl, lw), fastpath.linear(xl, lw, None))


def test_packed_copies_dropped_once_the_weight_leaves_cpu_float32():
    conv = nn.Conv2d(3, 4, 3)
    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        fastpath.conv2d(x, conv.weight, conv.bias, [1, 1], [0, 0], [1, 1], 1)
        assert conv.weight in fastpath._PACKED
        conv.double()  # same Parameter objects, new storage
        y = fastpath.conv2d(x.double(), conv.weight, conv.bias, [1, 1], [0, 0], [1, 1], 1)
    assert conv.weight not in fastpath._PACKED and y.dtype == torch.float64


def test_other_dtypes_take_the_plain_path():
    x, w = torch.randn(1, 3, 6, 6, dtype=torch.float64), torch.randn(4, 3, 1, 1, dtype=torch.float64)
    with torch.no_grad():
        y = fastpath.conv2d(x, w, None, [1, 1], [0, 0], [1, 1], 1, "relu")
        assert y.dtype == torch.float64 and y.is_contiguous()
        assert torch.equal(y, F.relu(F.conv2d(x, w)))
        xl, wl = torch.randn(2, 3, dtype=torch.float64), torch.randn(5, 3, dtype=torch.float64)
        assert torch.equal(fastpath.linear(xl, wl, None, "tanh"), torch.tanh(F.linear(xl, wl)))


def test_inference_export_uses_the_fast_path_and_training_export_does_not():
    model, inputs = ZOO["resnet18"]()
    fast = aiacc.optimize(model, inputs)
    assert "fastpath_conv2d" in fast.code and "'relu'" in fast.code  # conv + ReLU as one oneDNN call
    assert "torch.nn.functional.relu" not in fast.code.replace("relu_", "")
    with torch.no_grad():
        out = fast(*inputs)
        assert_close_rel(model(*inputs), out, 1e-5)
    model.train()
    trained = aiacc.optimize(model, inputs)
    assert "fastpath" not in trained.code and "conv2d" in trained.code


def test_exported_module_round_trips_with_the_fast_path():
    model, inputs = ZOO["resnet18"]()
    fast = aiacc.optimize(model, inputs)
    with torch.no_grad():
        expected = model(*inputs)
        first = fast(*inputs)  # packs the weights
        assert first.is_contiguous()  # the output is in the layout the original gives
        buf = io.BytesIO()
        torch.save(fast, buf)
        buf.seek(0)
        loaded = torch.load(buf, weights_only=False)
        assert "fastpath_conv2d" in loaded.code
        assert_close_rel(expected, loaded(*inputs))
        traced = torch.jit.trace(fast, inputs)
        assert_close_rel(expected, traced(*inputs))
        # level 0 keeps the convolution weights as the model's parameters: load_state_dict of other
        # weights, and the outputs follow (the packed copies are redone)
        plain = aiacc.optimize(model, inputs, level=0)
        assert_close_rel(expected, plain(*inputs))
        other, _ = ZOO["resnet18"]()
        for p in other.parameters():
            p.data.mul_(0.5)
        model.load_state_dict(other.state_dict())
        plain.load_state_dict(other.state_dict(), strict=False)
        assert_close_rel(model(*inputs), plain(*inputs), 1e-5)
    # with gradients: the plain path, and they reach the input (on the loaded copy: `fast` shares weights with
    # `model`, whose new state_dict makes its folded copies stale, a StaleWeightsError, source_watch.py)
    x = inputs[0].clone().requires_grad_()
    loaded(x).sum().backward()
    assert x.grad is not None and float(x.grad.abs().sum()) > 0


def test_bert_attention_and_matmuls_lower_to_fused_torch_calls():
    model, inputs = ZOO["bert_encoder"]()
    fast = aiacc.optimize(model, inputs, level=2)
    code = fast.code
    assert code.count("scaled_dot_product_attention(") == 2 and "softmax" not in code
    assert "torch.matmul" not in code and "fastpath_linear" in code
    assert "'gelu'" in code  # GELU runs as the inner product's post-op
    with torch.no_grad():
        assert_close_rel(model(*inputs), fast(*inputs), 1e-5)


def test_attention_with_additive_mask_lowers_to_sdpa():
    class Attn(nn.Module):
        def forward(self, q, k, v, mask):
            s = torch.matmul(q, k.transpose(-1, -2)) / 4.0 + mask
            return torch.matmul(torch.softmax(s, -1), v)

    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 3, 5, 16, generator=g) for _ in range(3))
    mask = torch.randn(2, 1, 5, 5, generator=g)
    model = Attn().eval()
    fast = aiacc.optimize(model, (q, k, v, mask), level=2)
    assert "scaled_dot_product_attention" in fast.code and "softmax" not in fast.code
    with torch.no_grad():
        assert_close_rel(model(q, k, v, mask), fast(q, k, v, mask), 1e-5)


def test_conv2d_add_sums_into_the_residual_on_the_fast_path_only():
    g = torch.Generator().manual_seed(2)
    x, w, b = torch.randn(2, 4, 6, 6, generator=g), torch.randn(4, 4, 3, 3, generator=g), torch.randn(4, generator=g)
    r = torch.randn(2, 4, 6, 6, generator=g).contiguous(memory_format=torch.channels_last)
    expected = F.relu(F.conv2d(x, w, b, 1, 1) + r)
    with torch.no_grad():
        y = fastpath.conv2d_add_(x, w, b, [1, 1], [1, 1], [1, 1], 1, r.clone(), "relu")
        assert_close_rel(expected, y, 1e-5)
        kept = r.clone()
        y = fastpath.conv2d_add_(x, w, b, [1, 1], [1, 1], [1, 1], 1, kept, "relu")
        assert y.data_ptr() == kept.data_ptr()  # accumulated in place
        r64 = r.double()
        y64 = fastpath.conv2d_add_(x.double(), w.double(), b.double(), [1, 1], [1, 1], [1, 1], 1, r64, "relu")
        assert torch.equal(r64, r.double()) and y64.data_ptr() != r64.data_ptr()  # plain path: untouched
        assert_close_rel(expected.double(), y64, 1e-6)


class _Residuals(nn.Module):
    """Three residual convolutions: one may sum into its residual, one reads its residual as input too,
    one's residual is read again afterwards."""

    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(4, 4, 3, padding=1), nn.Conv2d(4, 4, 1)
        self.c3, self.c4, self.c5 = nn.Conv2d(4, 4, 3, padding=1), nn.Conv2d(4, 4, 1), nn.Conv2d(4, 4, 1)

    def forward(self, x):
        a = torch.relu(self.c1(x))
        b = torch.relu(self.c2(a) + a)  # a is c2's input and residual: no in-place sum
        c = torch.relu(self.c3(b))
        d = torch.relu(self.c4(b) + c)  # c read by nothing else: summed in place
        e = torch.relu(self.c5(d) + c)  # c read again after c4: c4 must not have overwritten it ...
        return e + d


def test_residual_summed_in_place_only_when_nothing_reads_it_later():
    torch.manual_seed(3)
    model = _Residuals().eval()
    x = torch.randn(2, 4, 8, 8)
    fast = aiacc.optimize(model, (x,))
    code = fast.code
    # ... so only c5 (the last reader of c) sums in place
    assert code.count("fastpath_conv2d_add_(") == 1
    with torch.no_grad():
        assert_close_rel(model(x), fast(x), 1e-5)
    model50, inputs = ZOO["resnet50"]()
    fast50 = aiacc.optimize(model50, inputs)
    assert fast50.code.count("fastpath_conv2d_add_(") == 16  # every bottleneck's residual
    with torch.no_grad():
        assert_close_rel(model50(*inputs), fast50(*inputs), 1e-5)


class _Conv1D(nn.Module):
    """GPT-2's Conv1D: a [K, N] weight, torch.addmm on the input flattened to a matrix, reshaped back."""

    def __init__(self, k, n, seed):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.weight = nn.Parameter(torch.randn(k, n, generator=g) * 0.2)
        self.bias = nn.Parameter(torch.randn(n, generator=g))

    def forward(self, x):
        size_out = x.size()[:-1] + (self.weight.shape[1],)
        return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(size_out)


def test_gpt2_style_conv1d_runs_as_one_inner_product_with_its_gelu_fused():
    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.proj = _Conv1D(16, 32, 0), _Conv1D(32, 16, 1)

        def forward(self, x):
            return self.proj(F.gelu(self.fc(x), approximate="tanh"))

    model = MLP().eval()
    x = torch.randn(2, 7, 16, generator=torch.Generator().manual_seed(2))
    fast = aiacc.optimize(model, (x,), level=2)
    code = fast.code
    # both products are oneDNN inner products (the [K, N] weights transposed at export), none an addmm, and
    # the GELU is the first one's post-op
    assert "addmm" not in code and code.count("fastpath_linear(") == 2 and "'gelu'" in code
    assert "gelu(" not in code.replace("fastpath_linear(", "")
    with torch.no_grad():
        fresh = torch.randn(2, 7, 16, generator=torch.Generator().manual_seed(3))
        assert_close_rel(model(fresh), fast(fresh), 1e-5)


# ---- the linear's kernel: oneDNN's inner product or MKL's packed sgemm, timed per product shape
from aiacc.plugins.torch import linear_kernel  # noqa: E402

needs_mkl = pytest.mark.skipif(not linear_kernel.mkl_available(), reason="torch built without MKL's packed linear")


def _ran(op: str, fn) -> bool:
    """Whether the profiler saw aten-level op `op` (e.g. 'mkl::_mkl_linear') while fn() ran."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return any(e.key == op for e in prof.key_averages())


@needs_mkl
@pytest.mark.parametrize("attr,scalars,algorithm,ref", _ACTS, ids=[f"{a[0]}-{a[2]}" for a in _ACTS])
def test_mkl_kernel_matches_plain_torch_and_runs_mkl(attr, scalars, algorithm, ref):
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(7, 16, generator=g), torch.randn(7, generator=g)
    with torch.no_grad():
        for x in (torch.randn(3, 5, 16, generator=g), torch.randn(4, 16, generator=g)):
            got = fastpath.linear(x, w, b, attr, scalars, algorithm, kernel="mkl")
            assert_close_rel(ref(F.linear(x, w, b)), got, 1e-5)
            assert_close_rel(ref(F.linear(x, w)), fastpath.linear(x, w, None, attr, scalars, algorithm,
                                                                  kernel="mkl"), 1e-5)
        assert _ran("mkl::_mkl_linear", lambda: fastpath.linear(x, w, b, attr, scalars, algorithm, kernel="mkl"))
        assert not _ran("mkl::_mkl_linear", lambda: fastpath.linear(x, w, b, attr, scalars, algorithm))
    # with autograd the plain path runs, whatever the kernel
    xg = x.clone().requires_grad_()
    fastpath.linear(xg, w, b, attr, scalars, algorithm, kernel="mkl").sum().backward()
    assert xg.grad is not None and xg.grad.shape == x.shape


@needs_mkl
def test_mkl_packed_weight_follows_in_place_updates_and_row_counts():
    w = torch.randn(6, 5)
    with torch.no_grad():
        for rows in (1, 4, 1):
            x = torch.randn(rows, 5)
            assert_close_rel(F.linear(x, w), fastpath.linear(x, w, None, kernel="mkl"), 1e-6)
        w.copy_(torch.randn(6, 5))  # load_state_dict's way: the packed copy is redone
        assert_close_rel(F.linear(x, w), fastpath.linear(x, w, None, kernel="mkl"), 1e-6)


@needs_mkl
def test_the_kernel_choice_keeps_mkl_only_when_timed_clearly_faster(monkeypatch):
    import aiacc.plugins.torch.linear_kernel as lk

    def fake(ratio):
        return lambda fns, **kw: {lk.ONEDNN: [1.0, 1.0, 1.0], lk.MKL: [ratio] * 3}
    monkeypatch.setattr(lk, "_CHOSEN", {})
    monkeypatch.setattr(lk, "interleaved_times", fake(0.9))
    assert lk.choose(8, 16, 32, "none", [], None, True) == ("mkl", "mkl timed 0.90x of onednn")
    monkeypatch.setattr(lk, "interleaved_times", fake(0.99))
    assert lk.choose(8, 16, 33, "gelu", [], "tanh", True) == ("onednn", "mkl timed 0.99x of onednn")
    monkeypatch.setattr(lk, "interleaved_times", fake(0.5))  # a shape is timed once per process
    assert lk.choose(8, 16, 33, "gelu", [], "tanh", True)[0] == "onednn"
    monkeypatch.setenv(lk.ENV, "mkl")
    assert lk.choose(8, 16, 33, "gelu", [], "tanh", True) == ("mkl", f"{lk.ENV}=mkl")


class _MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(32, 64), nn.Linear(64, 8)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


@needs_mkl
def test_optimize_runs_the_chosen_kernel_reports_it_and_round_trips(monkeypatch):
    monkeypatch.setenv(linear_kernel.ENV, "mkl")
    torch.manual_seed(0)
    model = _MLP().eval()
    x = torch.randn(3, 10, 32)
    fast = aiacc.optimize(model, (x,))
    assert fast.code.count("kernel = 'mkl'") == 2
    assert fast.aiacc_report["linear_kernel"].notes == [f"1 x [30 x 32] -> 64: mkl ({linear_kernel.ENV}=mkl)",
                                                         f"1 x [30 x 64] -> 8: mkl ({linear_kernel.ENV}=mkl)"]
    fresh = torch.randn(3, 10, 32)
    with torch.no_grad():
        assert_close_rel(model(fresh), fast(fresh), 1e-5)
        assert _ran("mkl::_mkl_linear", lambda: fast(fresh))
        buf = io.BytesIO()
        torch.save(fast, buf)
        buf.seek(0)
        loaded = torch.load(buf, weights_only=False)
        assert_close_rel(model(fresh), loaded(fresh), 1e-5)
        assert _ran("mkl::_mkl_linear", lambda: loaded(fresh))
        assert_close_rel(model(fresh), torch.jit.trace(fast, (fresh,))(fresh), 1e-5)
    monkeypatch.setenv(linear_kernel.ENV, "onednn")
    plain = aiacc.optimize(model, (x,))
    assert "kernel =" not in plain.code
    with torch.no_grad():
        assert not _ran("mkl::_mkl_linear", lambda: plain(fresh))


def test_without_the_environment_every_linear_shape_is_timed_and_reported():
    torch.manual_seed(0)
    model = _MLP().eval()
    fast = aiacc.optimize(model, (torch.randn(5, 32),))
    notes = fast.aiacc_report["linear_kernel"].notes
    assert len(notes) == 2 and all(("timed" in n) == linear_kernel.mkl_available() for n in notes)
    kernels = [n.split(": ")[1].split(" ")[0] for n in notes]
    assert fast.code.count("kernel = 'mkl'") == kernels.count("mkl")
