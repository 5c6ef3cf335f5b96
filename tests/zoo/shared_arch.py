"""One architecture, every framework: builders that produce the *same* network in torch, TensorFlow/Keras,
MXNet Gluon, Caffe and ONNX, with identical weights.

The weights of an architecture are generated once, from one seed, as numpy arrays in the canonical
(ONNX / torch) layout: Conv weights OIHW, Linear weights (out, in), BatchNorm as (gamma, beta, mean, var).
Each builder then converts them honestly into its framework's own layout:

    torch   as is (nn.Linear (out, in), nn.Conv2d OIHW)
    tf      Dense kernels (in, out), Conv2D kernels HWIO, activations NHWC: a Dense after Flatten reads the
            features in H, W, C order, so its rows are permuted from torch's C, H, W order
    mxnet   FullyConnected (out, in), Convolution OIHW (the same as torch; the conversion is the identity
            but goes through Gluon's parameter dictionary)
    caffe   blobs: Convolution OIHW + bias, InnerProduct (out, in) + bias, BatchNorm (mean, var, factor=1)
            followed by Scale (gamma, beta)
    onnx    onnx.helper graphs: the reference form

`build(arch, framework)` returns (model, example_inputs) in that framework's natural form; `canonical_input(arch)`
is the input in the IR's layout (NCHW) and `to_framework_input` converts it (NHWC for TF images).
Sizes are small so every forward takes milliseconds on 2 cores. Caffe has no BERT-style encoder layer
(no LayerNorm, no product of two activations), so `FRAMEWORKS[arch]` lists who can express what.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

BATCH = 2
SEED = 1234


@dataclass(frozen=True)
class Arch:
    name: str
    input_shape: tuple  # canonical (NCHW / [N, features] / [N, seq, hidden]) with the batch first
    frameworks: tuple
    image: bool  # a 4-D image input (NHWC in TF)


ARCHS = {
    "mlp": Arch("mlp", (BATCH, 16), ("torch", "tf", "mxnet", "caffe", "onnx"), False),
    "lenet": Arch("lenet", (BATCH, 1, 20, 20), ("torch", "tf", "mxnet", "caffe", "onnx"), True),
    "resnet": Arch("resnet", (BATCH, 3, 16, 16), ("torch", "tf", "mxnet", "caffe", "onnx"), True),
    "bert_layer": Arch("bert_layer", (BATCH, 8, 16), ("torch", "tf", "mxnet", "onnx"), False),
}
FRAMEWORKS = {name: a.frameworks for name, a in ARCHS.items()}

# BERT-style layer sizes: hidden 16, 2 heads of 8, feed-forward 32, LayerNorm eps 1e-5 (post-LN, as BERT)
HIDDEN, HEADS, FFN, LN_EPS = 16, 2, 32, 1e-5
BN_EPS = 1e-5
OUTPUT_SHAPES = {"mlp": (10,), "lenet": (10,), "resnet": (10,), "bert_layer": (8, 16)}  # without the batch
# ResNet-style: stem 3->8, one identity block at 8, one projection block 8->16 with stride 2, 10 classes
RESNET_BLOCKS = [("b1", 8, 8, 1), ("b2", 8, 16, 2)]


# ----------------------------------------------------------------------------------------- weights
class _Gen:
    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.w: dict[str, np.ndarray] = {}

    def dense(self, name, out, inp, bias=True):
        self.w[name + ".weight"] = self._f(self.rng.normal(0, 1 / math.sqrt(inp), (out, inp)))
        if bias:
            self.w[name + ".bias"] = self._f(self.rng.normal(0, 0.1, (out,)))

    def conv(self, name, out, inp, k, bias=True):
        self.w[name + ".weight"] = self._f(self.rng.normal(0, 1 / math.sqrt(inp * k * k), (out, inp, k, k)))
        if bias:
            self.w[name + ".bias"] = self._f(self.rng.normal(0, 0.1, (out,)))

    def bn(self, name, c):
        # non-trivial statistics so that a mix-up of gamma/beta/mean/var changes the numbers
        self.w[name + ".weight"] = self._f(self.rng.uniform(0.5, 1.5, c))
        self.w[name + ".bias"] = self._f(self.rng.normal(0, 0.1, c))
        self.w[name + ".running_mean"] = self._f(self.rng.normal(0, 0.1, c))
        self.w[name + ".running_var"] = self._f(self.rng.uniform(0.5, 1.5, c))

    def ln(self, name, c):
        self.w[name + ".weight"] = self._f(self.rng.uniform(0.5, 1.5, c))
        self.w[name + ".bias"] = self._f(self.rng.normal(0, 0.1, c))

    @staticmethod
    def _f(a):
        return np.asarray(a, dtype=np.float32)


@functools.lru_cache(maxsize=None)
def _weights(arch: str) -> tuple:
    g = _Gen(SEED + sorted(ARCHS).index(arch))
    if arch == "mlp":
        g.dense("fc1", 32, 16)
        g.dense("fc2", 32, 32)
        g.dense("fc3", 10, 32)
    elif arch == "lenet":
        g.conv("conv1", 6, 1, 5)
        g.conv("conv2", 16, 6, 5)
        g.dense("fc1", 32, 16 * 2 * 2)
        g.dense("fc2", 10, 32)
    elif arch == "resnet":
        g.conv("stem", 8, 3, 3, bias=False)
        g.bn("stem_bn", 8)
        for name, cin, cout, stride in RESNET_BLOCKS:
            g.conv(f"{name}.conv1", cout, cin, 3, bias=False)
            g.bn(f"{name}.bn1", cout)
            g.conv(f"{name}.conv2", cout, cout, 3, bias=False)
            g.bn(f"{name}.bn2", cout)
            if stride != 1 or cin != cout:
                g.conv(f"{name}.proj", cout, cin, 1, bias=False)
                g.bn(f"{name}.proj_bn", cout)
        g.dense("fc", 10, 16)
    elif arch == "bert_layer":
        for n in ("q", "k", "v", "o"):
            g.dense(n, HIDDEN, HIDDEN)
        g.ln("ln1", HIDDEN)
        g.dense("ffn1", FFN, HIDDEN)
        g.dense("ffn2", HIDDEN, FFN)
        g.ln("ln2", HIDDEN)
    else:
        raise KeyError(arch)
    return tuple(sorted(g.w.items()))


def weights(arch: str) -> dict[str, np.ndarray]:
    """The architecture's weights in canonical layout (a fresh dict; the arrays are shared, do not mutate)."""
    return dict(_weights(arch))


def canonical_input(arch: str, seed: int = 7) -> np.ndarray:
    """The example input in the IR's layout (NCHW for images)."""
    return np.random.default_rng(seed).standard_normal(ARCHS[arch].input_shape).astype(np.float32)


def to_framework_input(arch: str, framework: str, x: np.ndarray):
    """`x` (canonical layout) as the framework's example inputs."""
    if framework == "tf" and ARCHS[arch].image:
        x = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    if framework == "torch":
        import torch

        return (torch.from_numpy(x.copy()),)
    if framework == "mxnet":
        return (x,)
    if framework == "caffe":
        return {"data": x}
    if framework == "onnx":
        return {"x": x}
    return x  # tf


def build(arch: str, framework: str):
    """(model, example_inputs) of `arch` in `framework`, weights from `weights(arch)`."""
    if framework not in ARCHS[arch].frameworks:
        raise KeyError(f"{framework} cannot express {arch}")
    model = _BUILDERS[framework](arch, weights(arch))
    return model, to_framework_input(arch, framework, canonical_input(arch))


def run_model(framework: str, model, example_inputs) -> np.ndarray:
    """The model's (single) output as a numpy array, in the framework's own layout."""
    if framework == "torch":
        import torch

        with torch.no_grad():
            return model(*example_inputs).detach().numpy()
    if framework == "tf":
        return np.asarray(model(example_inputs, training=False) if hasattr(model, "layers") else model(example_inputs))
    if framework == "mxnet":
        import mxnet as mx

        return model(*[mx.nd.array(a) for a in example_inputs]).asnumpy()
    if framework == "caffe":
        out = model.forward(**example_inputs)
        return next(iter(out.values()))
    if framework == "onnx":
        import onnxruntime as ort

        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return sess.run(None, example_inputs)[0]
    raise KeyError(framework)


# ------------------------------------------------------------------------------------------- torch
def _torch(arch, w):
    import torch
    from torch import nn
    import torch.nn.functional as F

    if arch == "mlp":
        model = nn.Sequential()
        model.add_module("fc1", nn.Linear(16, 32))
        model.add_module("relu1", nn.ReLU())
        model.add_module("fc2", nn.Linear(32, 32))
        model.add_module("relu2", nn.ReLU())
        model.add_module("fc3", nn.Linear(32, 10))
    elif arch == "lenet":
        class LeNet(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv1 = nn.Conv2d(1, 6, 5)
                self.conv2 = nn.Conv2d(6, 16, 5)
                self.fc1 = nn.Linear(64, 32)
                self.fc2 = nn.Linear(32, 10)

            def forward(self, x):
                x = F.max_pool2d(F.relu(self.conv1(x)), 2)
                x = F.max_pool2d(F.relu(self.conv2(x)), 2)
                x = torch.flatten(x, 1)
                return self.fc2(F.relu(self.fc1(x)))

        model = LeNet()
    elif arch == "resnet":
        class Block(nn.Module):
            def __init__(self, cin, cout, stride):
                super().__init__()
                self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
                self.bn1 = nn.BatchNorm2d(cout, eps=BN_EPS)
                self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
                self.bn2 = nn.BatchNorm2d(cout, eps=BN_EPS)
                self.proj = self.proj_bn = None
                if stride != 1 or cin != cout:
                    self.proj = nn.Conv2d(cin, cout, 1, stride, bias=False)
                    self.proj_bn = nn.BatchNorm2d(cout, eps=BN_EPS)

            def forward(self, x):
                y = F.relu(self.bn1(self.conv1(x)))
                y = self.bn2(self.conv2(y))
                skip = x if self.proj is None else self.proj_bn(self.proj(x))
                return F.relu(y + skip)

        class ResNet(nn.Module):
            def __init__(self):
                super().__init__()
                self.stem = nn.Conv2d(3, 8, 3, 1, 1, bias=False)
                self.stem_bn = nn.BatchNorm2d(8, eps=BN_EPS)
                for name, cin, cout, stride in RESNET_BLOCKS:
                    self.add_module(name, Block(cin, cout, stride))
                self.pool = nn.AdaptiveAvgPool2d(1)
                self.fc = nn.Linear(16, 10)

            def forward(self, x):
                x = F.relu(self.stem_bn(self.stem(x)))
                x = self.b2(self.b1(x))
                return self.fc(torch.flatten(self.pool(x), 1))

        model = ResNet()
    elif arch == "bert_layer":
        class EncoderLayer(nn.Module):
            """Post-LN BERT layer written out (no nn.MultiheadAttention fast path)."""

            def __init__(self):
                super().__init__()
                self.q, self.k, self.v, self.o = (nn.Linear(HIDDEN, HIDDEN) for _ in range(4))
                self.ln1 = nn.LayerNorm(HIDDEN, eps=LN_EPS)
                self.ffn1 = nn.Linear(HIDDEN, FFN)
                self.ffn2 = nn.Linear(FFN, HIDDEN)
                self.ln2 = nn.LayerNorm(HIDDEN, eps=LN_EPS)

            def heads(self, t):
                n, s, _ = t.shape
                return t.reshape(n, s, HEADS, HIDDEN // HEADS).permute(0, 2, 1, 3)

            def forward(self, x):
                n, s, _ = x.shape
                q, k, v = self.heads(self.q(x)), self.heads(self.k(x)), self.heads(self.v(x))
                scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(HIDDEN // HEADS)
                ctx = torch.matmul(torch.softmax(scores, dim=-1), v)
                ctx = ctx.permute(0, 2, 1, 3).reshape(n, s, HIDDEN)
                x = self.ln1(x + self.o(ctx))
                return self.ln2(x + self.ffn2(F.gelu(self.ffn1(x))))

        model = EncoderLayer()
    else:
        raise KeyError(arch)
    state = model.state_dict()
    missing = set(state) - set(w) - {k for k in state if k.endswith("num_batches_tracked")}
    assert not missing and not set(w) - set(state), (missing, set(w) - set(state))
    model.load_state_dict({k: torch.from_numpy(w[k].copy()) if k in w else v for k, v in state.items()})
    return model.eval()


# ---------------------------------------------------------------------------------------------- tf
def _tf(arch, w):
    import keras
    from keras import layers, ops

    def dense(name, units, x, activation=None, after_flatten_of=None):
        kernel = w[name + ".weight"]
        if after_flatten_of is not None:
            # torch flattens C, H, W; Keras flattens the NHWC tensor as H, W, C: permute the input rows
            c, h, ww = after_flatten_of
            kernel = kernel.reshape(units, c, h, ww).transpose(0, 2, 3, 1).reshape(units, -1)
        layer = layers.Dense(units, activation=activation, name=name)
        y = layer(x)
        layer.set_weights([kernel.T, w[name + ".bias"]])
        return y

    def conv(name, filters, k, x, stride=1, padding="valid", bias=True, activation=None):
        layer = layers.Conv2D(filters, k, strides=stride, padding=padding, use_bias=bias, activation=activation,
                              name=name)
        y = layer(x)
        hwio = w[name + ".weight"].transpose(2, 3, 1, 0)
        layer.set_weights([hwio, w[name + ".bias"]] if bias else [hwio])
        return y

    def bn(name, x):
        layer = layers.BatchNormalization(epsilon=BN_EPS, name=name)
        y = layer(x, training=False)
        layer.set_weights([w[name + ".weight"], w[name + ".bias"], w[name + ".running_mean"],
                           w[name + ".running_var"]])
        return y

    shape = ARCHS[arch].input_shape[1:]
    if ARCHS[arch].image:
        shape = shape[1:] + shape[:1]
    inp = keras.Input(shape, batch_size=None, name="x")
    if arch == "mlp":
        x = dense("fc1", 32, inp, "relu")
        x = dense("fc2", 32, x, "relu")
        out = dense("fc3", 10, x)
    elif arch == "lenet":
        x = conv("conv1", 6, 5, inp, activation="relu")
        x = layers.MaxPooling2D(2)(x)
        x = conv("conv2", 16, 5, x, activation="relu")
        x = layers.MaxPooling2D(2)(x)
        x = layers.Flatten()(x)
        x = dense("fc1", 32, x, "relu", after_flatten_of=(16, 2, 2))
        out = dense("fc2", 10, x)
    elif arch == "resnet":
        def conv3(name, x, stride):
            if stride == 1:
                return conv(name, w[name + ".weight"].shape[0], 3, x, padding="same", bias=False)
            # TF's "same" pads stride-2 convolutions asymmetrically; torch pads 1 on every side
            x = layers.ZeroPadding2D(1)(x)
            return conv(name, w[name + ".weight"].shape[0], 3, x, stride=stride, bias=False)

        x = layers.ReLU()(bn("stem_bn", conv3("stem", inp, 1)))
        for name, cin, cout, stride in RESNET_BLOCKS:
            y = layers.ReLU()(bn(f"{name}.bn1", conv3(f"{name}.conv1", x, stride)))
            y = bn(f"{name}.bn2", conv3(f"{name}.conv2", y, 1))
            if stride != 1 or cin != cout:
                x = bn(f"{name}.proj_bn", conv(f"{name}.proj", cout, 1, x, stride=stride, bias=False))
            x = layers.ReLU()(layers.Add()([y, x]))
        x = layers.GlobalAveragePooling2D()(x)
        out = dense("fc", 10, x)
    elif arch == "bert_layer":
        d = HIDDEN // HEADS

        def ln(name, x):
            layer = layers.LayerNormalization(epsilon=LN_EPS, name=name)
            y = layer(x)
            layer.set_weights([w[name + ".weight"], w[name + ".bias"]])
            return y

        def heads(t):
            return layers.Permute((2, 1, 3))(layers.Reshape((-1, HEADS, d))(t))

        q, k, v = (heads(dense(n, HIDDEN, inp)) for n in ("q", "k", "v"))
        scores = ops.matmul(q, ops.transpose(k, (0, 1, 3, 2))) / math.sqrt(d)
        ctx = ops.matmul(ops.softmax(scores, axis=-1), v)
        ctx = layers.Reshape((-1, HIDDEN))(layers.Permute((2, 1, 3))(ctx))
        x = ln("ln1", layers.Add()([inp, dense("o", HIDDEN, ctx)]))
        f = dense("ffn2", HIDDEN, dense("ffn1", FFN, x, activation=lambda t: keras.activations.gelu(
            t, approximate=False)))
        out = ln("ln2", layers.Add()([x, f]))
    else:
        raise KeyError(arch)
    return keras.Model(inp, out, name=arch)


# ------------------------------------------------------------------------------------------- mxnet
def _mxnet(arch, w):
    from aiacc.plugins.mxnet._import import import_mxnet

    mx = import_mxnet()
    nn = mx.gluon.nn
    params = {}  # gluon parameter -> canonical weight name

    class Net(mx.gluon.HybridBlock):
        def __init__(self):
            super().__init__(prefix=arch + "_")
            with self.name_scope():
                self.setup()

        def add(self, key, block, canon):
            setattr(self, key, block)
            params[key] = canon
            return block

    if arch == "mlp":
        class MLP(Net):
            def setup(self):
                for i, (units, inp) in enumerate([(32, 16), (32, 32), (10, 32)], 1):
                    self.add(f"fc{i}", nn.Dense(units, in_units=inp), f"fc{i}")

            def hybrid_forward(self, F, x):
                x = F.relu(self.fc1(x))
                x = F.relu(self.fc2(x))
                return self.fc3(x)

        net = MLP()
    elif arch == "lenet":
        class LeNet(Net):
            def setup(self):
                self.add("conv1", nn.Conv2D(6, 5, in_channels=1), "conv1")
                self.add("conv2", nn.Conv2D(16, 5, in_channels=6), "conv2")
                self.add("fc1", nn.Dense(32, in_units=64), "fc1")
                self.add("fc2", nn.Dense(10, in_units=32), "fc2")

            def hybrid_forward(self, F, x):
                x = F.Pooling(F.relu(self.conv1(x)), kernel=(2, 2), stride=(2, 2), pool_type="max")
                x = F.Pooling(F.relu(self.conv2(x)), kernel=(2, 2), stride=(2, 2), pool_type="max")
                return self.fc2(F.relu(self.fc1(F.flatten(x))))  # Dense flattens too; Flatten made explicit

        net = LeNet()
    elif arch == "resnet":
        class ResNet(Net):
            def setup(self):
                self.add("stem", nn.Conv2D(8, 3, padding=1, use_bias=False, in_channels=3), "stem")
                self.add("stem_bn", nn.BatchNorm(epsilon=BN_EPS, in_channels=8), "stem_bn")
                for name, cin, cout, stride in RESNET_BLOCKS:
                    self.add(f"{name}_conv1", nn.Conv2D(cout, 3, stride, 1, use_bias=False, in_channels=cin),
                             f"{name}.conv1")
                    self.add(f"{name}_bn1", nn.BatchNorm(epsilon=BN_EPS, in_channels=cout), f"{name}.bn1")
                    self.add(f"{name}_conv2", nn.Conv2D(cout, 3, 1, 1, use_bias=False, in_channels=cout),
                             f"{name}.conv2")
                    self.add(f"{name}_bn2", nn.BatchNorm(epsilon=BN_EPS, in_channels=cout), f"{name}.bn2")
                    if stride != 1 or cin != cout:
                        self.add(f"{name}_proj", nn.Conv2D(cout, 1, stride, use_bias=False, in_channels=cin),
                                 f"{name}.proj")
                        self.add(f"{name}_proj_bn", nn.BatchNorm(epsilon=BN_EPS, in_channels=cout),
                                 f"{name}.proj_bn")
                self.add("pool", nn.GlobalAvgPool2D(), None)
                self.add("fc", nn.Dense(10, in_units=16), "fc")

            def hybrid_forward(self, F, x):
                x = F.relu(self.stem_bn(self.stem(x)))
                for name, cin, cout, stride in RESNET_BLOCKS:
                    b = lambda k: getattr(self, f"{name}_{k}")  # noqa: E731
                    y = F.relu(b("bn1")(b("conv1")(x)))
                    y = b("bn2")(b("conv2")(y))
                    if stride != 1 or cin != cout:
                        x = b("proj_bn")(b("proj")(x))
                    x = F.relu(y + x)
                return self.fc(self.pool(x))

        net = ResNet()
    elif arch == "bert_layer":
        d = HIDDEN // HEADS

        class EncoderLayer(Net):
            def setup(self):
                for n in ("q", "k", "v", "o"):
                    self.add(n, nn.Dense(HIDDEN, flatten=False, in_units=HIDDEN), n)
                self.add("ln1", nn.LayerNorm(epsilon=LN_EPS, in_channels=HIDDEN), "ln1")
                self.add("ffn1", nn.Dense(FFN, flatten=False, in_units=HIDDEN), "ffn1")
                self.add("ffn2", nn.Dense(HIDDEN, flatten=False, in_units=FFN), "ffn2")
                self.add("ln2", nn.LayerNorm(epsilon=LN_EPS, in_channels=HIDDEN), "ln2")

            def hybrid_forward(self, F, x):
                def heads(t):  # N, S, H -> N, heads, S, d
                    return F.transpose(F.reshape(t, shape=(0, 0, HEADS, d)), axes=(0, 2, 1, 3))

                q, k, v = heads(self.q(x)), heads(self.k(x)), heads(self.v(x))
                scores = F.batch_dot(q, k, transpose_b=True) / math.sqrt(d)  # batch_dot over (N, heads)
                ctx = F.transpose(F.batch_dot(F.softmax(scores, axis=-1), v), axes=(0, 2, 1, 3))
                ctx = F.reshape(ctx, shape=(0, 0, -1))
                x = self.ln1(x + self.o(ctx))
                return self.ln2(x + self.ffn2(F.LeakyReLU(self.ffn1(x), act_type="gelu")))

        net = EncoderLayer()
    else:
        raise KeyError(arch)
    net.initialize()
    # Gluon parameter suffix -> canonical suffix (Gluon's gamma/beta are torch's weight/bias)
    suffixes = {"running_mean": "running_mean", "running_var": "running_var", "gamma": "weight", "beta": "bias",
                "weight": "weight", "bias": "bias"}
    used = set()
    for key, canon in params.items():
        if canon is None:
            continue
        for pname, p in getattr(net, key).collect_params().items():
            suffix = next(s for s in suffixes if pname.endswith("_" + s))
            canon_name = f"{canon}.{suffixes[suffix]}"
            p.set_data(mx.nd.array(w[canon_name]))
            used.add(canon_name)
    assert used == set(w), set(w) ^ used
    net.hybridize()
    return net


# ------------------------------------------------------------------------------------------- caffe
def _caffe_prototxt(arch):
    from aiacc.zoo.caffe_models import PrototxtWriter

    net = PrototxtWriter(arch, ARCHS[arch].input_shape)
    layer, ip = net.layer, net.inner_product

    def conv(name, bottom, top, out, k, stride=1, pad=0, bias=True):
        net.conv(name, bottom, top, out, k, stride, pad, bias=bias)

    def bn(name, blob):  # Caffe's BN is normalization only; the affine part is a Scale layer
        net.batchnorm_scale(blob, name, name + "_scale", eps=BN_EPS)

    if arch == "mlp":
        ip("fc1", "data", "fc1", 32)
        layer("relu1", "ReLU", "fc1", "fc1")
        ip("fc2", "fc1", "fc2", 32)
        layer("relu2", "ReLU", "fc2", "fc2")
        ip("fc3", "fc2", "fc3", 10)
    elif arch == "lenet":
        conv("conv1", "data", "conv1", 6, 5)
        layer("relu1", "ReLU", "conv1", "conv1")
        layer("pool1", "Pooling", "conv1", "pool1", "pooling_param { pool: MAX kernel_size: 2 stride: 2 }")
        conv("conv2", "pool1", "conv2", 16, 5)
        layer("relu2", "ReLU", "conv2", "conv2")
        layer("pool2", "Pooling", "conv2", "pool2", "pooling_param { pool: MAX kernel_size: 2 stride: 2 }")
        ip("fc1", "pool2", "fc1", 32)  # InnerProduct flattens its input
        layer("relu3", "ReLU", "fc1", "fc1")
        ip("fc2", "fc1", "fc2", 10)
    elif arch == "resnet":
        conv("stem", "data", "stem", 8, 3, pad=1, bias=False)
        bn("stem_bn", "stem")
        layer("stem_relu", "ReLU", "stem", "stem")
        x = "stem"
        for name, cin, cout, stride in RESNET_BLOCKS:
            conv(f"{name}.conv1", x, f"{name}.conv1", cout, 3, stride, 1, bias=False)
            bn(f"{name}.bn1", f"{name}.conv1")
            layer(f"{name}.relu1", "ReLU", f"{name}.conv1", f"{name}.conv1")
            conv(f"{name}.conv2", f"{name}.conv1", f"{name}.conv2", cout, 3, 1, 1, bias=False)
            bn(f"{name}.bn2", f"{name}.conv2")
            skip = x
            if stride != 1 or cin != cout:
                conv(f"{name}.proj", x, f"{name}.proj", cout, 1, stride, bias=False)
                bn(f"{name}.proj_bn", f"{name}.proj")
                skip = f"{name}.proj"
            net.add(f'name: "{name}.add" type: "Eltwise" bottom: "{name}.conv2" bottom: "{skip}" top: "{name}"')
            layer(f"{name}.relu", "ReLU", name, name)
            x = name
        layer("pool", "Pooling", x, "pool", "pooling_param { pool: AVE global_pooling: true }")
        ip("fc", "pool", "fc", 10)
    else:
        raise KeyError(arch)
    return net.text()


def _caffe(arch, w):
    from aiacc.plugins.caffe import CaffeModel
    from aiacc.plugins.caffe.proto import array_to_blob

    model = CaffeModel.from_text(_caffe_prototxt(arch), name=f"<shared {arch}>")
    used = set()
    for layer in model.net.layer:
        base = layer.name[:-len("_scale")] if layer.type == "Scale" else layer.name
        if layer.type in ("Convolution", "InnerProduct"):
            blobs = [w[base + ".weight"]] + ([w[base + ".bias"]] if base + ".bias" in w else [])
            used.update([base + ".weight", base + ".bias"] if base + ".bias" in w else [base + ".weight"])
        elif layer.type == "BatchNorm":
            # Caffe stores mean * f, var * f and the moving-average factor f; f = 1
            blobs = [w[base + ".running_mean"], w[base + ".running_var"], np.ones(1, np.float32)]
            used.update([base + ".running_mean", base + ".running_var"])
        elif layer.type == "Scale":
            blobs = [w[base + ".weight"], w[base + ".bias"]]
            used.update([base + ".weight", base + ".bias"])
        else:
            continue
        for b in blobs:
            array_to_blob(b, layer.blobs.add())
    assert used == set(w), set(w) ^ used
    model._has_weights = True
    model.invalidate()
    return model


# -------------------------------------------------------------------------------------------- onnx
def _onnx(arch, w):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes, inits = [], []
    counter = [0]

    def init(name, array):
        inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def node(op, inputs, **attrs):
        counter[0] += 1
        out = f"{op.lower()}{counter[0]}"
        nodes.append(helper.make_node(op, list(inputs), [out], name=out, **attrs))
        return out

    def gemm(name, x):
        return node("Gemm", [x, init(name + ".weight", w[name + ".weight"]), init(name + ".bias", w[name + ".bias"])],
                    transB=1)

    def conv(name, x, stride=1, pad=0):
        ins = [x, init(name + ".weight", w[name + ".weight"])]
        if name + ".bias" in w:
            ins.append(init(name + ".bias", w[name + ".bias"]))
        k = w[name + ".weight"].shape[-1]
        return node("Conv", ins, kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4)

    def bn(name, x):
        return node("BatchNormalization", [x] + [init(f"{name}.{s}", w[f"{name}.{s}"]) for s in
                                                  ("weight", "bias", "running_mean", "running_var")], epsilon=BN_EPS)

    if arch == "mlp":
        y = node("Relu", [gemm("fc1", "x")])
        y = node("Relu", [gemm("fc2", y)])
        y = gemm("fc3", y)
    elif arch == "lenet":
        y = node("MaxPool", [node("Relu", [conv("conv1", "x")])], kernel_shape=[2, 2], strides=[2, 2])
        y = node("MaxPool", [node("Relu", [conv("conv2", y)])], kernel_shape=[2, 2], strides=[2, 2])
        y = node("Flatten", [y], axis=1)
        y = gemm("fc2", node("Relu", [gemm("fc1", y)]))
    elif arch == "resnet":
        y = node("Relu", [bn("stem_bn", conv("stem", "x", 1, 1))])
        for name, cin, cout, stride in RESNET_BLOCKS:
            z = node("Relu", [bn(f"{name}.bn1", conv(f"{name}.conv1", y, stride, 1))])
            z = bn(f"{name}.bn2", conv(f"{name}.conv2", z, 1, 1))
            if stride != 1 or cin != cout:
                y = bn(f"{name}.proj_bn", conv(f"{name}.proj", y, stride, 0))
            y = node("Relu", [node("Add", [z, y])])
        y = gemm("fc", node("Flatten", [node("GlobalAveragePool", [y])], axis=1))
    elif arch == "bert_layer":
        d = HIDDEN // HEADS

        def linear(name, x):  # 3-D input: MatMul by W^T then Add, as exporters write nn.Linear
            return node("Add", [node("MatMul", [x, init(name + ".wT", w[name + ".weight"].T.copy())]),
                                init(name + ".bias", w[name + ".bias"])])

        def heads(t):
            r = node("Reshape", [t, init(f"shape{counter[0]}", np.array([0, 0, HEADS, d], np.int64))])
            return node("Transpose", [r], perm=[0, 2, 1, 3])

        def ln(name, x):
            return node("LayerNormalization", [x, init(name + ".weight", w[name + ".weight"]),
                                               init(name + ".bias", w[name + ".bias"])], axis=-1, epsilon=LN_EPS)

        q, k, v = (heads(linear(n, "x")) for n in ("q", "k", "v"))
        kt = node("Transpose", [k], perm=[0, 1, 3, 2])
        scores = node("Div", [node("MatMul", [q, kt]), init("sqrt_d", np.array(math.sqrt(d), np.float32))])
        ctx = node("MatMul", [node("Softmax", [scores], axis=-1), v])
        ctx = node("Transpose", [ctx], perm=[0, 2, 1, 3])
        ctx = node("Reshape", [ctx, init("shape_out", np.array([0, 0, HIDDEN], np.int64))])
        x1 = ln("ln1", node("Add", ["x", linear("o", ctx)]))
        h = linear("ffn1", x1)
        # exact GELU written out (Gelu is ONNX opset 20): 0.5 * h * (1 + erf(h / sqrt 2))
        erf = node("Erf", [node("Div", [h, init("sqrt2", np.array(math.sqrt(2.0), np.float32))])])
        g = node("Mul", [node("Mul", [h, node("Add", [erf, init("one", np.array(1.0, np.float32))])]),
                         init("half", np.array(0.5, np.float32))])
        y = ln("ln2", node("Add", [x1, linear("ffn2", g)]))
    else:
        raise KeyError(arch)
    shape = ["N"] + list(ARCHS[arch].input_shape[1:])
    graph = helper.make_graph(nodes, arch, [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info(y, TensorProto.FLOAT, ["N"] + list(OUTPUT_SHAPES[arch]))], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


_BUILDERS = {"torch": _torch, "tf": _tf, "mxnet": _mxnet, "caffe": _caffe, "onnx": _onnx}
