"""transformers' return_dict=False tuples (ModelOutput.to_tuple) drop the fields that are None. Under
torch.fx, a field read off an opaque submodule's output (BERT's encoder kept opaque: its
`encoder_outputs.past_key_values`) is a proxy, None only when run; the tracer drops one that is None on the
example, so the optimized module returns the original's tuple exactly (it returned a trailing None, which
verify refused)."""
from __future__ import annotations

import types
import warnings

import pytest
import torch

import aiacc
from tests.reach import _models as M
from tests.reach.test_reach import _call, needs_hf


def _bert_with_opaque_encoder(return_dict):
    model, x, fresh = M.hf_model("bert")
    model.config.return_dict = return_dict
    encoder = model.encoder
    forward = type(encoder).forward

    def data_dependent(self, hidden_states, *args, **kwargs):
        # a count read from a tensor's value with int() (1 here): no trace holds it (a value guard fixes a
        # branch's direction, not a count), so the encoder stays opaque
        for _ in range(int(hidden_states.abs().sum() >= 0)):
            out = forward(self, hidden_states, *args, **kwargs)
        return out

    encoder.forward = types.MethodType(data_dependent, encoder)
    return model.eval(), x, fresh


@needs_hf
@pytest.mark.parametrize("return_dict", [False, True])
def test_an_opaque_encoders_none_fields_are_dropped_as_transformers_does(return_dict):
    model, x, fresh = _bert_with_opaque_encoder(return_dict)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = aiacc.trace(model, x, frontend="fx")
        fast = aiacc.optimize(model, x, frontend="fx")  # verify (on by default) compares the structures too
    assert [n.op for n in graph if n.is_opaque] == ["BertEncoder"]
    expected, actual = _call(model, fresh), _call(fast, fresh)
    assert type(actual) is type(expected)
    if return_dict:
        assert list(actual.keys()) == list(expected.keys())
    assert len(actual) == len(expected) == 2  # (last_hidden_state, pooler_output): no trailing None
    for e, a in zip(expected if not return_dict else expected.values(), actual if not return_dict else
                    actual.values()):
        assert isinstance(a, torch.Tensor)
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-4)
