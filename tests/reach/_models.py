"""Models nobody here wrote, built the way a user builds them: torchvision, timm and Hugging Face
transformers with random weights (no downloads), shared by the reach tests and benchmarks/reach.py.

Each builder returns (model in eval mode, example inputs, a fresh input of the same shapes) or raises
ImportError when its library is missing.
"""
from __future__ import annotations

import contextlib
import functools
import os

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # random weights from configs; never a download


@functools.lru_cache(maxsize=None)
def torchvision():
    """Import torchvision. The PyPI wheel installed beside the CPU torch is a CUDA build: its C ops cannot
    load, and registering their fake (meta) kernels with `torch.library.register_fake` raises at import.
    The models are pure Python and never call those ops on CPU (torchvision.ops' Python fallbacks aside),
    so for this import only register_fake becomes a decorator that registers nothing. A test helper
    only: the aiacc package never patches torch."""
    with contextlib.ExitStack() as stack:
        original = torch.library.register_fake

        def no_fake(*args, **kwargs):
            if args and callable(args[0]) and not isinstance(args[0], str):
                return args[0]
            return lambda fn: fn
        torch.library.register_fake = no_fake
        stack.callback(setattr, torch.library, "register_fake", original)
        import torchvision as tv  # noqa: F401
        import torchvision.models  # noqa: F401
        import torchvision.models.segmentation  # noqa: F401
    return tv


def timm():
    torchvision()  # timm imports torchvision
    import timm as t
    return t


def transformers():
    torchvision()  # transformers may import torchvision for its image processors
    import transformers as tr
    return tr


def _images(size, batch=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 3, size, size, generator=g), torch.randn(batch, 3, size, size, generator=g)


def _seeded(builder):
    @functools.wraps(builder)
    def build(*args, **kwargs):
        torch.manual_seed(0)
        model, x, fresh = builder(*args, **kwargs)
        return model.eval(), x, fresh
    return build


@_seeded
def tv_model(name, size=64):
    """A torchvision classification model (random weights) at size x size."""
    tv = torchvision()
    model = tv.models.get_model(name, weights=None, num_classes=10)
    x, fresh = _images(size)
    return model, (x,), (fresh,)


@_seeded
def tv_segmentation(name, size=64):
    tv = torchvision()
    kwargs = {"weights_backbone": None} if "lraspp" not in name else {"weights_backbone": None}
    model = tv.models.get_model(name, weights=None, num_classes=4, **kwargs)
    x, fresh = _images(size)
    return model, (x,), (fresh,)


@_seeded
def timm_model(name, size=64, **kwargs):
    model = timm().create_model(name, pretrained=False, num_classes=10, **kwargs)
    x, fresh = _images(size)
    return model, (x,), (fresh,)


_HF = {
    # name: (model class, config class, config kwargs)
    "bert": ("BertModel", "BertConfig", {}),
    "roberta": ("RobertaModel", "RobertaConfig", {}),
    "electra": ("ElectraModel", "ElectraConfig", {"embedding_size": 32}),
    "distilbert": ("DistilBertModel", "DistilBertConfig", {"dim": 32, "n_layers": 2, "n_heads": 2,
                                                           "hidden_dim": 64}),
    "albert": ("AlbertModel", "AlbertConfig", {"embedding_size": 16}),
    "gpt2": ("GPT2Model", "GPT2Config", {"n_embd": 32, "n_layer": 2, "n_head": 2, "n_positions": 64}),
    "llama": ("LlamaModel", "LlamaConfig", {"num_key_value_heads": 2}),
    "t5_encoder": ("T5EncoderModel", "T5Config", {"d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 2,
                                                  "num_heads": 4}),
    "bart": ("BartModel", "BartConfig", {"d_model": 32, "encoder_layers": 2, "decoder_layers": 2,
                                         "encoder_attention_heads": 2, "decoder_attention_heads": 2,
                                         "encoder_ffn_dim": 64, "decoder_ffn_dim": 64}),
    "deberta_v2": ("DebertaV2Model", "DebertaV2Config", {}),
    "vit": ("ViTModel", "ViTConfig", {"image_size": 32, "patch_size": 8}),
    # more families (benchmarks/reach.py's sweep)
    "mistral": ("MistralModel", "MistralConfig", {"num_key_value_heads": 1}),
    "qwen2": ("Qwen2Model", "Qwen2Config", {"num_key_value_heads": 1}),
    "gemma": ("GemmaModel", "GemmaConfig", {"num_key_value_heads": 1, "head_dim": 16}),
    "phi": ("PhiModel", "PhiConfig", {}),
    "gpt_neo": ("GPTNeoModel", "GPTNeoConfig", {"num_layers": 2, "attention_types": [[["global", "local"], 1]],
                                               "num_heads": 2, "window_size": 8}),
    "gpt_neox": ("GPTNeoXModel", "GPTNeoXConfig", {}),
    "opt": ("OPTModel", "OPTConfig", {"ffn_dim": 64, "word_embed_proj_dim": 32}),
    "bloom": ("BloomModel", "BloomConfig", {"n_layer": 2, "n_head": 2}),
    "falcon": ("FalconModel", "FalconConfig", {}),
    "mobilebert": ("MobileBertModel", "MobileBertConfig", {"embedding_size": 16, "intra_bottleneck_size": 16,
                                                           "true_hidden_size": 16, "num_feedforward_networks": 2}),
    "xlm_roberta": ("XLMRobertaModel", "XLMRobertaConfig", {}),
    "deberta": ("DebertaModel", "DebertaConfig", {}),
    "mpnet": ("MPNetModel", "MPNetConfig", {}),
    "squeezebert": ("SqueezeBertModel", "SqueezeBertConfig", {"embedding_size": 32}),
    "clip_text": ("CLIPTextModel", "CLIPTextConfig", {}),
    "bert_mlm": ("BertForMaskedLM", "BertConfig", {}),
    "gpt2_lm": ("GPT2LMHeadModel", "GPT2Config", {"n_embd": 32, "n_layer": 2, "n_head": 2, "n_positions": 64}),
    "llama_lm": ("LlamaForCausalLM", "LlamaConfig", {"num_key_value_heads": 2}),
}
_COMMON = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
           "vocab_size": 100, "max_position_embeddings": 64}


@_seeded
def hf_model(name, batch=2, seq=16, with_mask=True):
    """A transformers model from a tiny config with random weights; inputs as a dict of keywords."""
    tr = transformers()
    model_cls, config_cls, extra = _HF[name]
    config_cls = getattr(tr, config_cls)
    accepted = config_cls().to_dict()
    kwargs = {k: v for k, v in _COMMON.items() if k in accepted}
    kwargs.update(extra)
    if "bos_token_id" in accepted:  # token ids inside the tiny vocabulary
        kwargs.update(bos_token_id=1, eos_token_id=2, pad_token_id=0)
    config = config_cls(**kwargs)
    # inference without a key/value cache: the cache objects (DynamicCache) are generate()'s state, which
    # aiacc does not translate (out of scope, see issue 21)
    if hasattr(config, "use_cache"):
        config.use_cache = False
    if hasattr(config, "_attn_implementation"):
        config._attn_implementation = "eager"
    model = getattr(tr, model_cls)(config)
    g = torch.Generator().manual_seed(0)
    if name == "vit":
        x, fresh = _images(config.image_size, batch)
        return model, {"pixel_values": x}, {"pixel_values": fresh}
    vocab = config.vocab_size

    def feed():
        d = {"input_ids": torch.randint(0, vocab, (batch, seq), generator=g)}
        if with_mask:
            mask = torch.ones(batch, seq, dtype=torch.int64)
            mask[1, seq - 3:] = 0
            d["attention_mask"] = mask
        if name == "bart":
            d["decoder_input_ids"] = torch.randint(0, vocab, (batch, seq // 2), generator=g)
        return d
    return model, feed(), feed()


# benchmarks/reach.py --speed: the latency configs (random weights, batch 1, seq 128, ViT at 224)
SPEED_SIZES = {
    # size: (hidden, heads, ffn, layers); "base" is BERT-base's width with 4 of its 12 layers (2 cores)
    "small": (256, 4, 1024, 4),
    "base": (768, 12, 3072, 4),
}


@_seeded
def hf_speed_model(name, size="small", batch=1, seq=128, image=224, attn="sdpa"):
    """BERT, DistilBERT, GPT-2 or ViT at one of SPEED_SIZES (random weights, no cache, attention
    implementation `attn`: "sdpa", transformers' default, or "eager"): (model, inputs as keywords, a
    fresh input of the same shapes)."""
    tr = transformers()
    hidden, heads, ffn, layers = SPEED_SIZES[size]
    if name == "bert":
        config = tr.BertConfig(hidden_size=hidden, num_attention_heads=heads, intermediate_size=ffn,
                               num_hidden_layers=layers)
        model_cls = tr.BertModel
    elif name == "distilbert":
        config = tr.DistilBertConfig(dim=hidden, n_heads=heads, hidden_dim=ffn, n_layers=layers)
        model_cls = tr.DistilBertModel
    elif name == "gpt2":
        config = tr.GPT2Config(n_embd=hidden, n_head=heads, n_inner=ffn, n_layer=layers)
        model_cls = tr.GPT2Model
    elif name == "vit":
        config = tr.ViTConfig(hidden_size=hidden, num_attention_heads=heads, intermediate_size=ffn,
                              num_hidden_layers=layers, image_size=image, patch_size=16)
        model_cls = tr.ViTModel
    else:
        raise KeyError(f"no speed config for {name!r}")
    if hasattr(config, "use_cache"):
        config.use_cache = False
    config._attn_implementation = attn
    model = model_cls(config)
    g = torch.Generator().manual_seed(0)
    if name == "vit":
        x, fresh = (torch.randn(batch, 3, image, image, generator=g) for _ in range(2))
        return model, {"pixel_values": x}, {"pixel_values": fresh}

    def feed():
        return {"input_ids": torch.randint(0, config.vocab_size, (batch, seq), generator=g),
                "attention_mask": torch.ones(batch, seq, dtype=torch.int64)}
    return model, feed(), feed()
