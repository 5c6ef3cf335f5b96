"""Example models as ONNX files, built in code (random weights, fixed seeds, no downloads, no framework):

    aiacc.examples.resnet50_onnx("resnet50.onnx")        # ResNet-50 v1.5 (ImageNet shape), opset 17
    aiacc.examples.bert_encoder_onnx("bert.onnx")         # BERT-style encoder: embeddings, attention, FFN

They back the README's first command (`aiacc example resnet50 -o model.onnx && aiacc inspect model.onnx`)
and the tests that compare aiacc's executor and ONNX export with onnxruntime. The builders are the model
catalogue's (aiacc.zoo.onnx_models); "bert" is the catalogue's "bert_encoder" (aiacc.zoo.ALIASES).
"""
from __future__ import annotations

import os
from typing import Callable

import numpy as np

from aiacc.zoo import canonical_name
from aiacc.zoo.onnx_models import bert_encoder_onnx, resnet50_onnx

__all__ = ["EXAMPLES", "bert_encoder_onnx", "example_feeds", "resnet50_onnx", "write_example"]

# the names `aiacc example` and `--example` take
EXAMPLES: dict[str, Callable] = {"resnet50": resnet50_onnx, "bert": bert_encoder_onnx}


def example_feeds(name: str, model=None, *, batch: int = 1, seq: int = 16, image_size: int | None = None,
                  seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs for an example model (fixed seed)."""
    rng = np.random.default_rng(seed)
    kind = canonical_name(name)
    if kind == "resnet50":
        size = image_size or 224
        return {"input": rng.standard_normal((batch, 3, size, size)).astype(np.float32)}
    if kind == "bert_encoder":
        ids = rng.integers(0, 1000, (batch, seq), dtype=np.int64)
        mask = np.ones((batch, seq), np.int64)
        mask[:, seq - seq // 4:] = 0  # padding at the end
        return {"input_ids": ids, "attention_mask": mask}
    raise KeyError(f"unknown example {name!r} (known: {', '.join(EXAMPLES)})")


def write_example(name: str, path: str | os.PathLike, **kw):
    """Write example `name` (one of EXAMPLES, or its catalogue name: "bert_encoder" for "bert") to an .onnx
    file."""
    found = [fn for key, fn in EXAMPLES.items() if canonical_name(key) == canonical_name(name)]
    if not found:
        from aiacc.errors import UnsupportedError

        raise UnsupportedError(f"unknown example {name!r} (known: {', '.join(sorted(EXAMPLES))})")
    return found[0](path, **kw)
