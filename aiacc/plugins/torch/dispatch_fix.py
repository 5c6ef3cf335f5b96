"""Arguments torch's __torch_function__ dispatch loses, put back while aiacc captures a model.

torch 2.13's F.l1_loss passes its `weight=` to `handle_torch_function` only among the relevant arguments,
not in the call's keywords. Whatever intercepts the call there records it unweighted: torch.fx's Proxy
(symbolic tracing) and the TorchFunctionMode of non-strict torch.export alike, so a weighted L1 loss would
be captured as a plain one (torch.export's own program computes the unweighted loss). While
`keep_dropped_arguments()` is active, the weight goes back into the keywords. It is patched where l1_loss
looks it up (a global of torch.nn.functional), so every way of calling l1_loss is seen; once torch passes
weight= itself, the patch changes nothing.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch.nn.functional as F


@contextlib.contextmanager
def keep_dropped_arguments() -> Iterator[None]:
    """While active, F.l1_loss's weight reaches __torch_function__ handlers as the keyword weight=."""
    original = F.handle_torch_function
    l1_loss = F.l1_loss

    def handle(public_api, relevant_args, *args, **kwargs):
        # l1_loss(input, target, ...): relevant_args is (input, target, weight), args (input, target)
        if public_api is l1_loss and len(args) == 2 and len(relevant_args) == 3 and relevant_args[2] is not None \
                and "weight" not in kwargs:
            kwargs["weight"] = relevant_args[2]
        return original(public_api, relevant_args, *args, **kwargs)

    F.handle_torch_function = handle
    try:
        yield
    finally:
        F.handle_torch_function = original
