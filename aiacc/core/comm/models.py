"""Gradient profiles of reference models (ResNet-50, BERT-large) built from their layer shapes.

Parameter names and shapes follow torchvision's resnet50 and Hugging Face's bert-large-uncased
BertModel; compute times come from each layer's FLOPs and memory traffic on a `DeviceModel`.
"""
from __future__ import annotations

from aiacc.core.comm.spec import DeviceModel, GradientSpec, Layer, ModelSpec


def _grads(prefix: str, shapes: dict[str, tuple[int, ...]]) -> tuple[GradientSpec, ...]:
    out = []
    for name, shape in shapes.items():
        n = 1
        for d in shape:
            n *= d
        out.append(GradientSpec(f"{prefix}.{name}" if prefix else name, n, "float32", shape))
    return tuple(out)


def resnet50(batch: int = 64, device: DeviceModel | None = None, image: int = 224) -> ModelSpec:
    """ResNet-50 v1.5 (25,557,032 parameters): one layer per conv+bn (and the fc)."""
    dev = device or DeviceModel()
    layers: list[Layer] = []
    act_bytes = 2  # mixed precision activations

    def conv(name: str, cin: int, cout: int, k: int, hw_out: int, bn: str):
        macs = cin * cout * k * k * hw_out * hw_out * batch
        io = (cin * (hw_out * hw_out) + 3 * cout * hw_out * hw_out) * batch * act_bytes  # conv + bn + relu
        fwd = dev.seconds(2 * macs, io)
        grads = _grads(name, {"weight": (cout, cin, k, k)}) + _grads(bn, {"weight": (cout,), "bias": (cout,)})
        layers.append(Layer(name, fwd, fwd * dev.backward_factor, grads))

    hw = image // 2
    conv("conv1", 3, 64, 7, hw, "bn1")
    hw //= 2
    cin = 64
    for stage, (width, blocks, stride) in enumerate([(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)], 1):
        for b in range(blocks):
            p = f"layer{stage}.{b}"
            s = stride if b == 0 else 1
            out_hw = hw // s
            conv(f"{p}.conv1", cin, width, 1, hw, f"{p}.bn1")
            conv(f"{p}.conv2", width, width, 3, out_hw, f"{p}.bn2")
            conv(f"{p}.conv3", width, width * 4, 1, out_hw, f"{p}.bn3")
            if b == 0:
                conv(f"{p}.downsample.0", cin, width * 4, 1, out_hw, f"{p}.downsample.1")
            cin, hw = width * 4, out_hw
    fwd = dev.seconds(2 * 2048 * 1000 * batch, 2048 * 1000 * 4)
    layers.append(Layer("fc", fwd, fwd * dev.backward_factor, _grads("fc", {"weight": (1000, 2048), "bias": (1000,)})))
    return ModelSpec(f"resnet50(batch={batch})", tuple(layers))


def bert_large(batch: int = 32, seq: int = 128, device: DeviceModel | None = None, vocab: int = 30522,
               hidden: int = 1024, layers_n: int = 24, ffn: int = 4096) -> ModelSpec:
    """BERT-large BertModel with pooler (335,141,888 parameters): one layer per linear/embedding."""
    dev = device or DeviceModel()
    tokens = batch * seq
    act = 2
    layers: list[Layer] = []

    def add(name: str, shapes: dict, flops: float, io: float):
        fwd = dev.seconds(flops, io)
        layers.append(Layer(name, fwd, fwd * dev.backward_factor, _grads(name, shapes)))

    add("embeddings", {"word_embeddings.weight": (vocab, hidden), "position_embeddings.weight": (512, hidden),
                       "token_type_embeddings.weight": (2, hidden), "LayerNorm.weight": (hidden,),
                       "LayerNorm.bias": (hidden,)}, 8 * tokens * hidden, 4 * tokens * hidden * act)
    for i in range(layers_n):
        p = f"encoder.layer.{i}"
        for m in ("query", "key", "value"):
            add(f"{p}.attention.self.{m}", {"weight": (hidden, hidden), "bias": (hidden,)},
                2 * tokens * hidden * hidden, 2 * tokens * hidden * act)
        # attention scores and context: 2 batched matmuls of seq x seq x hidden, plus softmax traffic
        attn_flops = 4 * batch * seq * seq * hidden
        add(f"{p}.attention.output.dense", {"weight": (hidden, hidden), "bias": (hidden,)},
            2 * tokens * hidden * hidden + attn_flops, 2 * tokens * hidden * act + 3 * batch * 16 * seq * seq * act)
        add(f"{p}.attention.output.LayerNorm", {"weight": (hidden,), "bias": (hidden,)},
            8 * tokens * hidden, 3 * tokens * hidden * act)
        add(f"{p}.intermediate.dense", {"weight": (ffn, hidden), "bias": (ffn,)},
            2 * tokens * hidden * ffn, (tokens * hidden + 2 * tokens * ffn) * act)
        add(f"{p}.output.dense", {"weight": (hidden, ffn), "bias": (hidden,)},
            2 * tokens * hidden * ffn, (tokens * hidden + tokens * ffn) * act)
        add(f"{p}.output.LayerNorm", {"weight": (hidden,), "bias": (hidden,)},
            8 * tokens * hidden, 3 * tokens * hidden * act)
    add("pooler.dense", {"weight": (hidden, hidden), "bias": (hidden,)}, 2 * batch * hidden * hidden,
        batch * hidden * 4)
    return ModelSpec(f"bert-large(batch={batch}, seq={seq})", tuple(layers))
