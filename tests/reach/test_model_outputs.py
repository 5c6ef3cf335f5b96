"""What transformers models return with their configs' defaults: use_cache=True puts the key/value states in
a DynamicCache (an EncoderDecoderCache for seq2seq) inside the ModelOutput, and transformers' default sdpa
attention. The optimized module returns an object of the same class holding its own key/value tensors (equal to
the original's within 1e-4, a new object on each call, kept through torch.save/load, as is the ModelOutput class itself); passing a cache back in is
refused. Also the two ops the cache's update brought up: torch.cat of a 1-d empty tensor (skipped, as torch
does) and of mixed dtypes (promoted)."""
from __future__ import annotations

import io
import warnings

import pytest
import torch

import aiacc
from aiacc.errors import UnsupportedError
from tests.reach import _models as M
from tests.reach.test_reach import _call, check_whole_and_verified, needs_hf


def _layers(cache):
    """(keys, values) of every layer of a DynamicCache, or of both caches of an EncoderDecoderCache."""
    if hasattr(cache, "self_attention_cache"):
        return _layers(cache.self_attention_cache) + _layers(cache.cross_attention_cache)
    return [(layer.keys, layer.values) for layer in cache.layers]


def _check_cache(expected, actual):
    assert type(actual) is type(expected)
    e, a = _layers(expected), _layers(actual)
    assert len(a) == len(e) > 0
    for (ek, ev), (ak, av) in zip(e, a):
        for p, q in ((ek, ak), (ev, av)):
            assert p.shape == q.shape
            assert float((p - q).abs().max()) <= 1e-4 * (float(p.abs().max()) or 1.0)


def _optimized(model, x):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return aiacc.optimize(model, x)


@needs_hf
@pytest.mark.parametrize("name", ["gpt2_lm", "llama_lm", "bart"])
def test_the_returned_cache_is_rebuilt_from_the_optimized_graphs_tensors(name):
    model, x, fresh = M.hf_model(name, cache=True, attn=None)
    assert model.config.use_cache and model.config._attn_implementation == "sdpa"
    check_whole_and_verified(model, x, fresh)  # 0 opaque nodes, the tensors outside the cache, the type
    fast = _optimized(model, x)
    expected, first, second = _call(model, fresh), _call(fast, fresh), _call(fast, fresh)
    assert list(first.keys()) == list(expected.keys())
    _check_cache(expected.past_key_values, first.past_key_values)
    assert first.past_key_values is not second.past_key_values  # never one object shared by the calls
    assert _layers(first.past_key_values)[0][0] is not _layers(second.past_key_values)[0][0]
    buf = io.BytesIO()
    torch.save(fast, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    again = _call(loaded, fresh)
    assert type(again) is type(expected)  # torch.load re-traces the code: it returned a plain dict before
    _check_cache(expected.past_key_values, again.past_key_values)


@needs_hf
def test_passing_a_cache_back_is_refused():
    model, x, fresh = M.hf_model("gpt2_lm", cache=True, attn=None)
    fast = _optimized(model, x)
    past = _call(model, x).past_key_values
    with pytest.raises(UnsupportedError, match="past_key_values"):
        fast(**fresh, past_key_values=past)


class _CacheLikeCat(torch.nn.Module):
    def forward(self, x, ids):
        start = torch.tensor([], dtype=x.dtype)
        grown = torch.cat([start, x], dim=-2)  # the 1-d empty tensor is skipped
        return grown, torch.cat([x, ids], dim=1)  # int64 promoted to float32


def test_cat_skips_a_1d_empty_tensor_and_promotes_dtypes():
    x, ids = torch.randn(2, 3, 4), torch.randint(0, 5, (2, 2, 4))
    model = _CacheLikeCat().eval()
    check_whole_and_verified(model, (x, ids), (torch.randn(2, 3, 4), torch.randint(0, 5, (2, 2, 4))))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = aiacc.trace(model, (x, ids))
    assert [n.op for n in graph if n.op == "Cast"] == ["Cast"]


@needs_hf
@pytest.mark.parametrize("name", ["gpt2_lm", "bart"])
def test_torch_export_returns_the_cache_too(name):
    # torch.export returns only pytree nodes: the cache's class is one while aiacc exports, and no longer after
    from torch.utils import _pytree as pytree

    model, x, fresh = M.hf_model(name, cache=True, attn=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = aiacc.trace(model, x, frontend="export")
        fast = aiacc.optimize(model, x, frontend="export")
    assert graph.meta["torch.frontend"] == "export" and not [n for n in graph if n.is_opaque]
    expected, actual = _call(model, fresh), _call(fast, fresh)
    assert type(actual) is type(expected)
    _check_cache(expected.past_key_values, actual.past_key_values)
    assert type(expected.past_key_values) not in pytree.SUPPORTED_NODES


@needs_hf
def test_a_plain_keyword_the_example_passed_is_fixed_and_another_value_refused():
    # output_hidden_states=True is a constant of the translation: called with False, the optimized module
    # would still return the hidden states (another structure than the original's), so it refuses
    model, x, fresh = M.hf_model("bert")
    x, fresh = dict(x, output_hidden_states=True), dict(fresh, output_hidden_states=True)
    check_whole_and_verified(model, x, fresh)
    fast = _optimized(model, x)
    assert len(_call(fast, fresh).hidden_states) == model.config.num_hidden_layers + 1
    with pytest.raises(UnsupportedError, match="output_hidden_states=True"):
        fast(**dict(fresh, output_hidden_states=False))


@needs_hf
@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_return_dict_false_gives_the_originals_tuple(name):
    # transformers' can_return_tuple reads return_dict from **kwargs and branches on it in Python: traced as the
    # example's constant, the optimized module returns a tuple of the same length as the original's, not a
    # ModelOutput; a call asking for the dataclass again is refused (the structure was fixed by the example)
    model, x, fresh = M.hf_model(name)
    x, fresh = dict(x, return_dict=False), dict(fresh, return_dict=False)
    check_whole_and_verified(model, x, fresh)
    fast = _optimized(model, x)
    expected, actual = _call(model, fresh), _call(fast, fresh)
    assert type(actual) is tuple and len(actual) == len(expected)
    for e, a in zip(expected, actual):
        if isinstance(e, torch.Tensor):
            assert float((e - a).abs().max()) <= 1e-4 * (float(e.abs().max()) or 1.0)
    with pytest.raises(UnsupportedError, match="return_dict=False"):
        fast(**dict(fresh, return_dict=True))
