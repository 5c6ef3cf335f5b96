"""transformers models from outside the reach tables, each from one generic tiny config (M.hf_generic), as
the unseen-model sweep found them (`benchmarks/reach.py --unseen-hf`): each failed before this stop's fix
named beside it; now 0 opaque nodes and equal to the original on a fresh input, or a clear GuardError where
the model's routing is data-dependent."""
from __future__ import annotations

import warnings

import pytest
import torch

import aiacc
from aiacc.errors import GuardError
from tests.reach import _models as M
from tests.reach.test_reach import check_whole_and_verified, needs_hf

FIXED = {
    "mamba": "torch.tensor_split with an empty part, under torch.export",
    "falcon_h1": "torch.tensor_split",
    "ctrl": "a forward that reassigns its buffer (fx deleted the buffer table; export's no-op write-back)",
    "vitdet": "index tensors after a full slice, under torch.export",
    "ministral3": "true division of integer tensors",
    "recurrent_gemma": "a bfloat16 buffer read through a cast; torch.export's in-place writes into views",
}


@needs_hf
@pytest.mark.parametrize("kind", list(FIXED), ids=list(FIXED))
def test_generic_config_translates_whole(kind):
    model, x, fresh = M.hf_generic(kind)
    check_whole_and_verified(model, x, fresh)


@needs_hf
def test_jetmoe_routing_is_checked_not_frozen():
    """JetMoE's router sizes a split with `expert_size.tolist()`: the trace fixes those numbers, so a fresh
    input routed otherwise raises GuardError (it gave outputs 0.35-0.39 off, silently), and the example's
    routing still computes equal."""
    model, x, fresh = M.hf_generic("jetmoe")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fast = aiacc.optimize(model, x)
    with torch.no_grad():
        torch.testing.assert_close(fast(**x).last_hidden_state, model(**x).last_hidden_state, rtol=1e-4, atol=1e-5)
        with pytest.raises(GuardError, match="tolist at node .* returned the Python values"):
            fast(**fresh)
