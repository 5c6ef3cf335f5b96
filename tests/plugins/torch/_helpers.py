"""Shared assertions for the torch plugin tests."""
from __future__ import annotations

import copy

import torch
from torch.utils import _pytree as pytree


def leaves(out):
    return [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


def assert_close_rel(expected, actual, rtol=1e-5, what="output"):
    """Every tensor leaf within rtol of the original, relative to the leaf's largest magnitude."""
    e, a = leaves(expected), leaves(actual)
    assert len(e) == len(a), f"{what}: {len(a)} tensors, expected {len(e)}"
    for i, (x, y) in enumerate(zip(e, a)):
        assert x.shape == y.shape, f"{what} {i}: shape {tuple(y.shape)} != {tuple(x.shape)}"
        scale = float(x.detach().abs().max()) or 1.0
        err = float((x.detach().double() - y.detach().double()).abs().max())
        assert err <= rtol * scale, f"{what} {i}: max error {err:.3g} > {rtol} * {scale:.3g}"


def assert_translates_whole_and_equal(model, x, fresh, rtol=1e-5):
    """`model` traces with no opaque node (the reasons shown if any) and its optimized module answers a fresh
    input within rtol of the original."""
    import warnings

    import aiacc

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = aiacc.trace(model, x)
        assert [n.op for n in graph if n.is_opaque] == [], graph.meta.get("torch.opaque_reasons")
        fast = aiacc.optimize(model, x)
    with torch.no_grad():
        assert_close_rel(model(*fresh), fast(*fresh), rtol)


def train_step(model, inputs, seed=123):
    """One forward (seeded, so dropout draws the same masks) and backward of sum of squares."""
    torch.manual_seed(seed)
    out = model(*inputs)
    loss = sum((t.float() ** 2).sum() for t in leaves(out) if t.is_floating_point())
    loss.backward()
    return out


def assert_same_training_step(original, optimized, inputs, rtol=1e-5):
    """Outputs, every parameter's gradient and every buffer after one step equal the original's."""
    out_a = train_step(original, inputs)
    out_b = train_step(optimized, inputs)
    assert_close_rel(out_a, out_b, rtol, "train output")
    grads_b = {k: p.grad for k, p in optimized.named_parameters()}
    checked = 0
    for name, p in original.named_parameters():
        assert name in grads_b, f"parameter {name} missing from the optimized module"
        if p.grad is None:
            assert grads_b[name] is None or float(grads_b[name].abs().max()) == 0.0
            continue
        assert grads_b[name] is not None, f"{name}: no gradient in the optimized module"
        assert_close_rel(p.grad, grads_b[name], rtol, f"gradient of {name}")
        checked += 1
    assert checked > 0
    buffers_b = dict(optimized.named_buffers())
    for name, buf in original.named_buffers():
        assert name in buffers_b, f"buffer {name} missing from the optimized module"
        assert_close_rel(buf, buffers_b[name], rtol, f"buffer {name}")


def fresh(model):
    return copy.deepcopy(model)


def conv_stack(*blocks):
    """An eval-mode 3->8-channel stem convolution followed by `blocks`, seeded, with every BatchNorm given
    non-trivial running statistics (so folding it is not the identity)."""
    from torch import nn

    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), *(b() for b in blocks)).eval()
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm2d):
                mod.running_mean.uniform_(-0.1, 0.1)
                mod.running_var.uniform_(0.5, 1.5)
    return m


def image_batch(batch=2):
    """A seeded [batch, 3, 10, 10] input for conv_stack models."""
    return torch.randn(batch, 3, 10, 10, generator=torch.Generator().manual_seed(1))


def assert_timed_choice(monkeypatch, model, x, call, what, count):
    """aiacc.optimize(level=3) of `model` with the optimize-time timer faked: a candidate form 2x slower than
    level 2's, then 2x faster. Only when faster is `call` in the exported code, and `count` of the pass's notes
    end with `kept: {what} 0.50x` (else `dropped: {what} slower 2.00x`); outputs equal the original (1e-4)."""
    import aiacc
    from aiacc.plugins.torch import numba_op

    for times, kept in (((2.0, 1.0), False), ((1.0, 2.0), True)):
        monkeypatch.setattr(numba_op, "_time_pair", lambda f, u, t=times: t)  # the timer the choices read
        m = aiacc.optimize(model, x, level=3)
        notes = m.aiacc_report["elementwise_fusion"].notes
        assert (call in m.code) is kept
        want = f"kept: {what} 0.50x" if kept else f"dropped: {what} slower 2.00x"
        assert sum(n.endswith(want) for n in notes) == count, notes
        with torch.no_grad():
            assert (m(x) - model(x)).abs().max().item() < 1e-4


def saved_and_loaded(module):
    """`module` through torch.save and torch.load (in memory), as a user saves an optimized model."""
    import io

    buf = io.BytesIO()
    torch.save(module, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


def assert_kernel_runs_and_reloads(level2, level3, x, calls, per_run):
    """level3(x) equals level2(x) (1e-5, relative to the largest output) while `calls()` (a kernel's call
    counter) grows by `per_run`; the module saved with torch.save and loaded again answers the same (1e-6) and
    runs the kernel again. Returns (level 2's output, level 3's)."""
    before = calls()
    with torch.no_grad():
        want, got = level2(x), level3(x)
    assert calls() == before + per_run, f"the kernel ran {calls() - before} times, expected {per_run}"
    assert (got - want).abs().max().item() <= 1e-5 * max(1.0, want.abs().max().item())
    loaded = saved_and_loaded(level3)
    with torch.no_grad():
        assert (loaded(x) - got).abs().max().item() <= 1e-6
    assert calls() == before + 2 * per_run, "the loaded module did not run the kernel"
    return want, got
