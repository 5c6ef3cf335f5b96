"""aiacc.plugins.torch.dropout: the same output, gradient and RNG state afterwards as F.dropout from the same
seed (so aiacc's training graph reproduces the original model's masks), for float32 and float64, contiguous,
transposed and sliced inputs and the ratios at both ends; a BERT-style encoder's training graph uses it and its
step (dropout on) equals the original module's from the same seed."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from aiacc.plugins.torch.dropout import dropout  # noqa: E402


def inputs(dtype):
    x = torch.randn(70, 33, dtype=dtype, generator=torch.Generator().manual_seed(3)) + 4.0
    return {"contiguous": x, "transposed": x.t(), "sliced": x[:, ::2], "4d": x.reshape(5, 14, 3, 11)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("p", [0.1, 0.5, 1e-3, 0.999])
def test_same_masks_output_gradient_and_rng_state_as_f_dropout(dtype, p):
    for name, x in inputs(dtype).items():
        for seed in (0, 1):
            got = []
            for fn in (F.dropout, dropout):
                torch.manual_seed(seed)
                xr = x.detach().requires_grad_()  # x's own layout
                y = fn(xr, p, True)
                (y * torch.arange(y.numel(), dtype=dtype).reshape(y.shape)).sum().backward()
                got.append((y.detach(), xr.grad, torch.get_rng_state()))
            (ya, ga, sa), (yb, gb, sb) = got
            assert torch.equal(ya, yb), (name, seed)
            assert torch.equal(ga, gb), (name, seed)
            assert torch.equal(sa, sb), (name, seed)  # the generator advanced exactly as F.dropout's
            kept = float((ya != 0).double().mean())
            assert abs(kept - (1 - p)) < 0.05


def test_eval_mode_zero_ratio_and_integer_inputs_are_f_dropout():
    x = torch.randn(4, 5)
    assert torch.equal(dropout(x, 0.3, False), x)
    assert torch.equal(dropout(x, 0.0, True), x)
    torch.manual_seed(0)
    a = F.dropout(x.half(), 0.3, True)
    torch.manual_seed(0)
    assert torch.equal(dropout(x.half(), 0.3, True), a)
    assert dropout(torch.empty(0, 3), 0.2, True).shape == (0, 3)


def test_bert_encoder_training_graph_uses_it_and_matches_the_original_with_dropout_on():
    import aiacc
    from aiacc import zoo

    m, (ids,) = zoo.build("torch", "bert_encoder", batch=2, seq=8, layers=1, hidden=32, heads=2, ffn=64,
                          vocab=64)
    m.train()
    fast = aiacc.optimize(m, (ids,), mode="train", framework_compile=False)
    assert sum(n.target is dropout for n in fast.graph.nodes) == 5  # embeddings, attention, 3 in the layer
    results = []
    for model in (m, fast):
        torch.manual_seed(7)
        h, pooled = model(ids)
        loss = (h ** 2).mean() + (pooled ** 2).mean()
        names = sorted(n for n, _ in model.named_parameters())
        grads = torch.autograd.grad(loss, [dict(model.named_parameters())[n] for n in names])
        results.append((loss.item(), dict(zip(names, grads))))
    (la, ga), (lb, gb) = results
    assert abs(la - lb) <= 1e-5 * abs(la)
    for k in ga:
        a, b = ga[k].double().numpy(), gb[k].double().numpy()
        assert np.abs(a - b).max() <= 1e-5 * max(1.0, np.abs(a).max()), k


def test_the_numba_mt19937_continues_the_generator_and_the_random_form_is_the_same(monkeypatch):
    """aiacc's MT19937 is the engine in use here (its self-check passed); over many twists and from a state
    mid-block its masks and the generator's state afterwards are F.dropout's, and so are the random_ form's
    (the fallback without numba)."""
    from aiacc.plugins.torch import dropout as module

    assert module._engine() is not None
    x = torch.ones(3, 100_003)
    for engine in (module._ENGINE[0], None):
        monkeypatch.setattr(module, "_ENGINE", [engine])
        for seed, before in ((11, 0), (12, 311), (13, 623)):
            got = []
            for fn in (F.dropout, dropout):
                torch.manual_seed(seed)
                torch.empty(before, dtype=torch.int64).random_()
                got.append((fn(x, 0.2, True), torch.get_rng_state()))
            assert torch.equal(got[0][0], got[1][0]) and torch.equal(got[0][1], got[1][1]), (engine, seed)
