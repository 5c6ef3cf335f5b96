"""Models nobody here wrote (torchvision, timm, transformers with random weights): traced with no opaque
node, optimized, and equal to the original on an input aiacc never saw (1e-4 of the output's magnitude),
returning the same type. Skipped when the library is not installed."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch.utils import _pytree as pytree

import aiacc
from tests.reach import _models as M


def _library(loader):
    try:
        loader()
        return True
    except Exception:  # noqa: BLE001 - missing or not importable here: those cases skip
        return False


needs_tv = pytest.mark.skipif(not _library(M.torchvision), reason="torchvision is not installed")
needs_timm = pytest.mark.skipif(not _library(M.timm), reason="timm is not installed")
needs_hf = pytest.mark.skipif(not _library(M.transformers), reason="transformers is not installed")


def _call(model, inputs):
    with torch.no_grad():
        return model(**inputs) if isinstance(inputs, dict) else model(*inputs)


def check_whole_and_verified(model, x, fresh, opaque_ops=()):
    """No opaque node (or exactly the ops `opaque_ops`), and the optimized model equals the original."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = aiacc.trace(model, x)
        opaque = [n.op for n in graph if n.is_opaque]
        assert opaque == list(opaque_ops), f"opaque nodes {opaque}: {graph.meta.get('torch.opaque_reasons')}"
        fast = aiacc.optimize(model, x)
    expected, actual = _call(model, fresh), _call(fast, fresh)
    assert type(actual) is type(expected)
    e = [t for t in pytree.tree_leaves(expected) if isinstance(t, torch.Tensor)]
    a = [t for t in pytree.tree_leaves(actual) if isinstance(t, torch.Tensor)]
    assert len(a) == len(e)
    for i, (p, q) in enumerate(zip(e, a)):
        assert p.shape == q.shape, f"output {i}: {tuple(q.shape)} != {tuple(p.shape)}"
        scale = float(p.abs().max()) or 1.0
        err = float((p.double() - q.double()).abs().max())
        assert err <= 1e-4 * scale, f"output {i}: max error {err:.3g} > 1e-4 * {scale:.3g}"


@needs_tv
@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v3_small", "efficientnet_b0", "convnext_tiny", "swin_t"])
def test_torchvision_classification(name):
    check_whole_and_verified(*M.tv_model(name, 64))


@needs_tv
def test_torchvision_segmentation_returns_its_ordered_dict():
    check_whole_and_verified(*M.tv_segmentation("lraspp_mobilenet_v3_large", 64))


@needs_timm
@pytest.mark.parametrize("name,size", [("levit_128s", 224), ("mobilevit_xxs", 64), ("convnext_atto", 64),
                                       ("pvt_v2_b0", 64)])
def test_timm(name, size):
    check_whole_and_verified(*M.timm_model(name, size))


@needs_timm
def test_timm_edgenext_div_rounding_mode_and_float_cumsum_translate():
    # its positional encoding's torch.div(..., rounding_mode="floor") ended the whole trace before, and its
    # float cumsums stayed opaque until the IR had CumSum
    check_whole_and_verified(*M.timm_model("edgenext_xx_small", 64))


@needs_hf
@pytest.mark.parametrize("name", ["bert", "roberta", "albert", "gpt2", "llama", "t5_encoder", "deberta_v2", "vit",
                                  "mistral", "falcon", "gpt_neox", "opt"])
def test_transformers_returns_its_model_output(name):
    check_whole_and_verified(*M.hf_model(name))


@needs_hf
def test_transformers_without_mask_gets_only_the_given_input():
    model, x, fresh = M.hf_model("bert", with_mask=False)
    check_whole_and_verified(model, x, fresh)


@needs_hf
@pytest.mark.parametrize("name", ["wav2vec2", "fnet", "convnextv2", "efficientnet_hf"])
def test_transformers_found_opaque_by_the_sweep(name):
    # weight-norm parametrized positional conv (Wav2Vec2), FNet's fft(...).real, ConvNeXt-V2's GRN norm,
    # EfficientNet's pooler window longer than its 1 x 1 input: each kept nodes opaque or failed before
    check_whole_and_verified(*M.hf_model(name))
