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
def tv_model(name, size=64, **kwargs):
    """A torchvision classification model (random weights) at size x size; `kwargs` go to its builder
    (image_size= of a ViT)."""
    tv = torchvision()
    model = tv.models.get_model(name, weights=None, num_classes=10, **kwargs)
    for m in model.modules():  # ViT's head starts at zero: an all-zero output would verify nothing
        if isinstance(m, torch.nn.Linear) and not m.weight.any():
            torch.nn.init.normal_(m.weight, std=0.02)
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
# the widened sweep (benchmarks/reach.py --full): name -> (model class, config class, config kwargs, input
# kind): "ids" (input_ids + attention_mask), "pixels" (pixel_values at config.image_size, or 32), "audio"
# (input_values, 400 samples), "features" (input_features: num_mel_bins x 2 * max_source_positions); a
# class written "WhisperModel.encoder" takes that submodule of the model
_VISION = {"image_size": 32, "patch_size": 8}
_HF_MORE = {
    "convbert": ("ConvBertModel", "ConvBertConfig", {"embedding_size": 32}, "ids"),
    "funnel": ("FunnelModel", "FunnelConfig", {"d_model": 32, "n_head": 2, "d_head": 16, "d_inner": 64,
                                               "block_sizes": [1, 1], "num_decoder_layers": 1}, "ids"),
    "gptj": ("GPTJModel", "GPTJConfig", {"n_embd": 32, "n_layer": 2, "n_head": 2, "rotary_dim": 8,
                                         "n_positions": 64}, "ids"),
    "phi3": ("Phi3Model", "Phi3Config", {"num_key_value_heads": 1}, "ids"),
    "gemma2": ("Gemma2Model", "Gemma2Config", {"num_key_value_heads": 1, "head_dim": 16, "sliding_window": 8},
               "ids"),
    "qwen3": ("Qwen3Model", "Qwen3Config", {"num_key_value_heads": 1, "head_dim": 16}, "ids"),
    "stablelm": ("StableLmModel", "StableLmConfig", {"num_key_value_heads": 1}, "ids"),
    "starcoder2": ("Starcoder2Model", "Starcoder2Config", {"num_key_value_heads": 1}, "ids"),
    "olmo": ("OlmoModel", "OlmoConfig", {"num_key_value_heads": 1}, "ids"),
    "cohere": ("CohereModel", "CohereConfig", {"num_key_value_heads": 1}, "ids"),
    "granite": ("GraniteModel", "GraniteConfig", {"num_key_value_heads": 1}, "ids"),
    "codegen": ("CodeGenModel", "CodeGenConfig", {"n_embd": 32, "n_layer": 2, "n_head": 2, "rotary_dim": 8,
                                                 "n_positions": 64, "n_ctx": 64}, "ids"),
    "gpt_bigcode": ("GPTBigCodeModel", "GPTBigCodeConfig", {"n_embd": 32, "n_layer": 2, "n_head": 2,
                                                           "n_positions": 64}, "ids"),
    "mpt": ("MptModel", "MptConfig", {"d_model": 32, "n_layers": 2, "n_heads": 2, "max_seq_len": 64}, "ids"),
    "roformer": ("RoFormerModel", "RoFormerConfig", {"embedding_size": 32}, "ids"),
    "megatron_bert": ("MegatronBertModel", "MegatronBertConfig", {}, "ids"),
    "camembert": ("CamembertModel", "CamembertConfig", {}, "ids"),
    "ernie": ("ErnieModel", "ErnieConfig", {}, "ids"),
    "data2vec_text": ("Data2VecTextModel", "Data2VecTextConfig", {}, "ids"),
    # landmarks = seq: with fewer landmarks its own eager forward fails (transformers builds a [batch, 1, seq,
    # seq] mask, with or without attention_mask, that its landmark kernel cannot add)
    "nystromformer": ("NystromformerModel", "NystromformerConfig", {"num_landmarks": 16,
                                                                    "segment_means_seq_len": 16}, "ids"),
    "fnet": ("FNetModel", "FNetConfig", {}, "ids"),
    "rembert": ("RemBertModel", "RemBertConfig", {"input_embedding_size": 16, "output_embedding_size": 16},
                "ids"),
    "xglm": ("XGLMModel", "XGLMConfig", {"d_model": 32, "num_layers": 2, "attention_heads": 2, "ffn_dim": 64},
             "ids"),
    "modernbert": ("ModernBertModel", "ModernBertConfig", {"global_attn_every_n_layers": 2, "local_attention": 8},
                   "ids"),
    "longformer": ("LongformerModel", "LongformerConfig", {"attention_window": 4}, "ids"),
    "big_bird": ("BigBirdModel", "BigBirdConfig", {"attention_type": "original_full"}, "ids"),
    "mixtral": ("MixtralModel", "MixtralConfig", {"num_key_value_heads": 1, "num_local_experts": 4,
                                                 "num_experts_per_tok": 2}, "ids"),
    "t5": ("T5Model", "T5Config", {"d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 2, "num_heads": 4},
           "seq2seq"),
    "mbart": ("MBartModel", "MBartConfig", {"d_model": 32, "encoder_layers": 2, "decoder_layers": 2,
                                           "encoder_attention_heads": 2, "decoder_attention_heads": 2,
                                           "encoder_ffn_dim": 64, "decoder_ffn_dim": 64}, "seq2seq"),
    "whisper_encoder": ("WhisperModel.encoder", "WhisperConfig", {"d_model": 32, "encoder_layers": 2,
                                                                  "decoder_layers": 1, "encoder_attention_heads": 2,
                                                                  "decoder_attention_heads": 2,
                                                                  "encoder_ffn_dim": 64, "decoder_ffn_dim": 64,
                                                                  "num_mel_bins": 8, "max_source_positions": 16},
                        "features"),
    "wav2vec2": ("Wav2Vec2Model", "Wav2Vec2Config", {"conv_dim": (16, 16), "conv_stride": (5, 2),
                                                     "conv_kernel": (10, 3), "num_conv_pos_embeddings": 16,
                                                     "num_conv_pos_embedding_groups": 2}, "audio"),
    "hubert": ("HubertModel", "HubertConfig", {"conv_dim": (16, 16), "conv_stride": (5, 2), "conv_kernel": (10, 3),
                                               "num_conv_pos_embeddings": 16, "num_conv_pos_embedding_groups": 2},
               "audio"),
    "clip_vision": ("CLIPVisionModel", "CLIPVisionConfig", dict(_VISION), "pixels"),
    "siglip_text": ("SiglipTextModel", "SiglipTextConfig", {}, "ids_only"),
    "siglip_vision": ("SiglipVisionModel", "SiglipVisionConfig", dict(_VISION), "pixels"),
    "deit": ("DeiTModel", "DeiTConfig", dict(_VISION), "pixels"),
    "beit": ("BeitModel", "BeitConfig", dict(_VISION, use_relative_position_bias=True), "pixels"),
    "dinov2": ("Dinov2Model", "Dinov2Config", dict(_VISION), "pixels"),
    "swin": ("SwinModel", "SwinConfig", {"image_size": 32, "patch_size": 4, "embed_dim": 16, "depths": [1, 1],
                                         "num_heads": [1, 2], "window_size": 4}, "pixels"),
    "swinv2": ("Swinv2Model", "Swinv2Config", {"image_size": 32, "patch_size": 4, "embed_dim": 16,
                                               "depths": [1, 1], "num_heads": [1, 2], "window_size": 4}, "pixels"),
    "convnext": ("ConvNextModel", "ConvNextConfig", {"hidden_sizes": [8, 16], "depths": [1, 1], "num_stages": 2},
                 "pixels"),
    "convnextv2": ("ConvNextV2Model", "ConvNextV2Config", {"hidden_sizes": [8, 16], "depths": [1, 1],
                                                           "num_stages": 2}, "pixels"),
    "segformer": ("SegformerModel", "SegformerConfig", {"num_encoder_blocks": 2, "depths": [1, 1],
                                                        "sr_ratios": [2, 1], "hidden_sizes": [16, 32],
                                                        "num_attention_heads": [1, 2], "patch_sizes": [7, 3],
                                                        "strides": [4, 2], "mlp_ratios": [2, 2],
                                                        "decoder_hidden_size": 32}, "pixels"),
    "resnet_hf": ("ResNetModel", "ResNetConfig", {"embedding_size": 16, "hidden_sizes": [16, 32], "depths": [1, 1]},
                  "pixels"),
    "regnet_hf": ("RegNetModel", "RegNetConfig", {"embedding_size": 16, "hidden_sizes": [16, 32], "depths": [1, 1],
                                                  "groups_width": 8}, "pixels"),
    "poolformer_hf": ("PoolFormerModel", "PoolFormerConfig", {"hidden_sizes": [16, 32], "depths": [1, 1],
                                                              "num_encoder_blocks": 2, "patch_sizes": [7, 3],
                                                              "strides": [4, 2], "padding": [2, 1]}, "pixels"),
    # initializer_range 0.2: at its default 0.02 the random model's outputs are ~1e-39 (float32 denormals, which
    # runtimes flush differently), so no comparison means anything
    "mobilevit_hf": ("MobileViTModel", "MobileViTConfig", {"image_size": 64, "initializer_range": 0.2}, "pixels"),
    "vit_mae": ("ViTMAEModel", "ViTMAEConfig", dict(_VISION, mask_ratio=0.0), "pixels"),
    "vit_hybrid_free_dpt": ("DPTModel", "DPTConfig", dict(_VISION, num_hidden_layers=4,
                                                          backbone_out_indices=[0, 1, 2, 3]), "pixels"),
    "levit_hf": ("LevitModel", "LevitConfig", {"hidden_sizes": [64, 128, 192], "num_attention_heads": [2, 4, 6],
                                               "depths": [1, 1, 1]}, "pixels224"),
    "mobilenet_v2_hf": ("MobileNetV2Model", "MobileNetV2Config", {"image_size": 32}, "pixels"),
    "efficientnet_hf": ("EfficientNetModel", "EfficientNetConfig", {"image_size": 32, "width_coefficient": 0.25,
                                                                    "depth_coefficient": 0.25, "hidden_dim": 320},
                        "pixels"),
}
_COMMON = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
           "vocab_size": 100, "max_position_embeddings": 64}


# heads called with labels= (their loss computed in the forward), named apart from _HF / _HF_MORE: name -> (the
# _HF / _HF_MORE entry whose config is used, the head's class, more config, the labels: "class" / "real" (one
# per row), "multi" (a 0/1 row of num_labels), "tokens" (one per token, -100 where padded or unmasked),
# "shifted" (the input ids as causal LM labels), "seq2seq" (target ids, the decoder's input derived from them))
_HF_HEADS = {
    "seq_cls": ("bert", "BertForSequenceClassification", {"num_labels": 3}, "class"),
    "seq_regression": ("roberta", "RobertaForSequenceClassification", {"num_labels": 1}, "real"),
    "multi_label": ("electra", "ElectraForSequenceClassification",
                    {"num_labels": 3, "problem_type": "multi_label_classification"}, "multi"),
    "masked_lm": ("bert", "BertForMaskedLM", {}, "tokens"),
    "token_cls": ("distilbert", "DistilBertForTokenClassification", {"num_labels": 5}, "tokens"),
    "causal_lm_gpt2": ("gpt2", "GPT2LMHeadModel", {}, "shifted"),
    "causal_lm_llama": ("llama", "LlamaForCausalLM", {}, "shifted"),
    "seq2seq_t5": ("t5", "T5ForConditionalGeneration", {"decoder_start_token_id": 0}, "seq2seq"),
    "seq2seq_bart": ("bart", "BartForConditionalGeneration", {"decoder_start_token_id": 2}, "seq2seq"),
}


def hf_with_labels(head, batch=2, seq=16):
    """A transformers head from a tiny config (see _HF_HEADS), called with labels=: (model, example, fresh)."""
    return hf_model(head, batch=batch, seq=seq)


@_seeded
def hf_model(name, batch=2, seq=16, with_mask=True, cache=False, attn="eager"):
    """A transformers model from a tiny config with random weights; inputs as a dict of keywords. `cache`:
    keep the config's use_cache (True for generative models: the output carries a DynamicCache); `attn`:
    the attention implementation (None: transformers' default, sdpa). A name of _HF_HEADS is that head,
    its inputs with labels."""
    tr = transformers()
    in_tables = name in _HF or name in _HF_MORE
    base, head_cls, head_extra, labels = (name, None, {}, None) if in_tables else _HF_HEADS[name]
    model_cls, config_cls, extra, kind = (*_HF[base], "ids") if base in _HF else _HF_MORE[base]
    if head_cls is not None:
        model_cls, extra, kind = head_cls, {**extra, **head_extra}, "ids"
    config_cls = getattr(tr, config_cls)
    accepted = config_cls().to_dict()
    kwargs = {k: v for k, v in _COMMON.items() if k in accepted}
    kwargs.update(extra)
    if "bos_token_id" in accepted:  # token ids inside the tiny vocabulary
        kwargs.update(bos_token_id=1, eos_token_id=2, pad_token_id=0)
    config = config_cls(**kwargs)
    # by default without a key/value cache (the sweep's configs); a returned DynamicCache is rebuilt by aiacc,
    # but passing one back in (generate()'s state) is refused (out of scope, see issue 21)
    if hasattr(config, "use_cache") and not cache:
        config.use_cache = False
    if hasattr(config, "_attn_implementation") and attn is not None:
        config._attn_implementation = attn
    cls_name, _, part = model_cls.partition(".")
    model = getattr(tr, cls_name)(config)
    if part:
        model = getattr(model, part)
    g = torch.Generator().manual_seed(0)
    if name == "vit" or kind.startswith("pixels"):
        size = 224 if kind == "pixels224" else getattr(config, "image_size", 32)
        size = size if isinstance(size, int) else size[0]
        x, fresh = _images(size, batch)
        if name == "vit_mae":  # its token shuffle is drawn from torch.rand unless `noise` is given
            patches = (size // config.patch_size) ** 2
            return model, {"pixel_values": x, "noise": torch.rand(batch, patches, generator=g)}, \
                {"pixel_values": fresh, "noise": torch.rand(batch, patches, generator=g)}
        return model, {"pixel_values": x}, {"pixel_values": fresh}
    if kind == "audio":
        return model, {"input_values": torch.randn(batch, 400, generator=g)}, \
            {"input_values": torch.randn(batch, 400, generator=g)}
    if kind == "features":
        shape = (batch, config.num_mel_bins, 2 * config.max_source_positions)
        return model, {"input_features": torch.randn(*shape, generator=g)}, \
            {"input_features": torch.randn(*shape, generator=g)}
    vocab = config.vocab_size

    def feed():
        d = {"input_ids": torch.randint(0, vocab, (batch, seq), generator=g)}
        if with_mask and kind != "ids_only":
            mask = torch.ones(batch, seq, dtype=torch.int64)
            mask[1, seq - 3:] = 0
            d["attention_mask"] = mask
        if labels is None and (name == "bart" or kind == "seq2seq"):
            d["decoder_input_ids"] = torch.randint(0, vocab, (batch, seq // 2), generator=g)
        if labels is not None:
            d["labels"] = _labels(labels, d, config, config.num_labels if "TokenClassification" in model_cls
                                  else vocab, g)
        return d
    return model, feed(), feed()


def _labels(kind, inputs, config, classes, g):
    """labels= of a _HF_HEADS kind for `inputs` (a batch of input_ids and attention_mask); `classes`: of a
    token's label."""
    ids = inputs["input_ids"]
    batch, seq = ids.shape
    if kind == "class":
        return torch.randint(0, config.num_labels, (batch,), generator=g)
    if kind == "real":
        return torch.randn(batch, generator=g)
    if kind == "multi":
        return (torch.rand(batch, config.num_labels, generator=g) > 0.5).float()
    if kind == "seq2seq":
        t = torch.randint(3, config.vocab_size, (batch, seq // 2), generator=g)
        t[0, -2:] = -100  # a shorter target, padded with the ignored index
        return t
    if kind == "shifted":
        t = ids.clone()
    else:  # "tokens": token classes (vocabulary ids for masked LM), every third ignored
        t = torch.randint(0, classes, (batch, seq), generator=g)
        t[:, ::3] = -100
    if "attention_mask" in inputs:
        t[inputs["attention_mask"] == 0] = -100
    return t


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


_GENERIC = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                intermediate_size=64, vocab_size=128, max_position_embeddings=64, head_dim=16, d_model=32,
                encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
                encoder_ffn_dim=64, decoder_ffn_dim=64, d_ff=64, num_layers=2, num_heads=2, d_kv=16, n_embd=32,
                n_layer=2, n_head=2, image_size=32, patch_size=8, moe_intermediate_size=32, num_experts=4,
                num_local_experts=4, num_experts_per_tok=2, n_routed_experts=4, shared_expert_intermediate_size=32,
                embed_dim=32, depths=[1, 1], hidden_sizes=[16, 32], num_channels=3)


def hf_generic(kind: str, batch: int = 2, seq: int = 16):
    """A transformers model of type `kind` (an AutoConfig.for_model name) from one generic tiny config: the
    fields of _GENERIC that its config has, eager attention, no cache, random weights; (model, inputs,
    fresh inputs): ids (with a padded mask row, decoder ids where the forward takes them) or pixel_values.
    For models outside the tables above, as a user brings them: nothing tuned per model."""
    import inspect

    transformers()
    from transformers import AutoConfig, AutoModel
    accepted = AutoConfig.for_model(kind).to_dict()
    kw = {k: v for k, v in _GENERIC.items() if k in accepted}
    kw.update({k: v for k, v in (("bos_token_id", 1), ("eos_token_id", 2), ("pad_token_id", 0)) if k in accepted})
    cfg = AutoConfig.for_model(kind, **kw)
    if hasattr(cfg, "use_cache"):
        cfg.use_cache = False
    cfg._attn_implementation = "eager"
    model = AutoModel.from_config(cfg).eval()
    sig = inspect.signature(model.forward).parameters
    g = torch.Generator().manual_seed(0)
    vocab = getattr(cfg, "vocab_size", 128)

    def feed():
        if "pixel_values" in sig and "input_ids" not in sig:
            size = getattr(cfg, "image_size", 32)
            size = size if isinstance(size, int) else size[0]
            return {"pixel_values": torch.randn(batch, getattr(cfg, "num_channels", 3), size, size, generator=g)}
        d = {"input_ids": torch.randint(3, vocab, (batch, seq), generator=g)}
        if "attention_mask" in sig:
            d["attention_mask"] = torch.ones(batch, seq, dtype=torch.int64)
            d["attention_mask"][-1, seq - 3:] = 0
        if "decoder_input_ids" in sig:
            d["decoder_input_ids"] = torch.randint(3, vocab, (batch, seq // 2), generator=g)
        return d
    return model, feed(), feed()
