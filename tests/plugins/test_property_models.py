"""Property-based tests through each plugin (issue 16): random torch, Keras, Gluon and Caffe models go through
`aiacc.optimize(..., verify=True)` with both backends, and the result computes the original's outputs on a
fresh input it never saw (names and order of outputs included where the framework has them).

Models are drawn from layers every framework has (convolutions with random kernel/padding/groups, batch
norm, activations, pooling, residual adds, dense heads), small enough that one example takes a second or
two; CI runs a few examples per framework (EXAMPLES; AIACC_PROPERTY_EXAMPLES=N for more), `--hypothesis-profile=long`
thousands.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import aiacc  # noqa: E402

EXAMPLES = 8  # per framework in the "ci" profile (framework tracing costs seconds, not milliseconds)
RTOL, ATOL = 1e-4, 1e-5
BACKENDS = ("native", "onnxruntime")


def _ci_examples(n: int = EXAMPLES):
    """`n` examples under the default "ci" profile (AIACC_PROPERTY_EXAMPLES overrides it); the long
    profile's count under --hypothesis-profile=long."""
    profile = settings._current_profile  # noqa: SLF001  (hypothesis exposes no public getter)
    if profile != "ci":
        return settings()
    return settings(max_examples=int(os.environ.get("AIACC_PROPERTY_EXAMPLES", n)))


def _close(expected, actual, what):
    assert len(expected) == len(actual), what
    for i, (e, a) in enumerate(zip(expected, actual)):
        e, a = np.asarray(e), np.asarray(a)
        assert e.shape == a.shape, f"{what}: output {i}"
        scale = float(np.max(np.abs(e))) if e.size else 0.0
        np.testing.assert_allclose(a, e, rtol=RTOL, atol=ATOL + RTOL * scale, err_msg=f"{what}: output {i}")


# -- architecture, shared by the frameworks -----------------------------------------------------------------

@st.composite
def architectures(draw):
    """A list of layer specs on an NCHW image, ending in a dense head: (kind, params). The image size is
    drawn separately (`cases`); `_valid` rejects the sizes the layers would shrink below one pixel."""
    c = draw(st.integers(1, 4))
    layers = []
    for _ in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["conv", "conv", "bn", "act", "pool", "residual"]))
        if kind == "conv":
            k = draw(st.sampled_from([1, 3]))
            groups = draw(st.sampled_from([1, c])) if c > 1 else 1
            out = groups * draw(st.integers(1, 3))
            layers.append(("conv", dict(cin=c, cout=out, k=k, pad=k // 2 if draw(st.booleans()) else 0,
                                        groups=groups, bias=draw(st.booleans()))))
            c = out
        elif kind == "bn":
            layers.append(("bn", dict(c=c)))
        elif kind == "act":
            layers.append(("act", dict(fn=draw(st.sampled_from(["relu", "sigmoid", "tanh"])))))
        elif kind == "pool":
            layers.append(("pool", dict(fn=draw(st.sampled_from(["max", "avg"])))))
        elif kind == "residual":  # x + act(conv3x3(x)), channels kept
            layers.append(("residual", dict(c=c)))
    units = draw(st.integers(1, 5))
    return dict(layers=layers, c_out=c, units=units, seed=draw(st.integers(0, 2 ** 16)))


def _input_channels(arch) -> int:
    for kind, p in arch["layers"]:
        if kind == "conv":
            return p["cin"]
        if kind in ("bn", "residual"):
            return p["c"]
    return arch["c_out"]


# -- torch ----------------------------------------------------------------------------------------------------

def _torch_model(arch):
    torch = pytest.importorskip("torch")
    nn = torch.nn
    torch.manual_seed(arch["seed"])

    class Residual(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.conv = nn.Conv2d(c, c, 3, padding=1)

        def forward(self, x):
            return x + torch.relu(self.conv(x))

    mods = []
    for kind, p in arch["layers"]:
        if kind == "conv":
            mods.append(nn.Conv2d(p["cin"], p["cout"], p["k"], padding=p["pad"], groups=p["groups"], bias=p["bias"]))
        elif kind == "bn":
            bn = nn.BatchNorm2d(p["c"])
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.data.uniform_(0.5, 1.5)
            bn.bias.data.uniform_(-0.5, 0.5)
            mods.append(bn)
        elif kind == "act":
            mods.append({"relu": nn.ReLU(), "sigmoid": nn.Sigmoid(), "tanh": nn.Tanh()}[p["fn"]])
        elif kind == "pool":
            mods.append(nn.MaxPool2d(2) if p["fn"] == "max" else nn.AvgPool2d(2))
        elif kind == "residual":
            mods.append(Residual(p["c"]))
    mods += [nn.Flatten(), nn.LazyLinear(arch["units"])]
    return nn.Sequential(*mods)


@st.composite
def cases(draw):
    """(architecture, image size)."""
    arch = draw(architectures())
    return arch, draw(st.integers(4, 9))


def _valid(arch, size) -> bool:
    for kind, p in arch["layers"]:
        if kind == "conv" and not p["pad"] and p["k"] > 1:
            size -= p["k"] - 1
        elif kind == "pool":
            size //= 2
        if size < 1:
            return False
    return True


@_ci_examples()
@given(cases())
def test_random_torch_models(case):
    torch = pytest.importorskip("torch")
    arch, size = case
    hypothesis.assume(_valid(arch, size))
    model = _torch_model(arch)
    c = _input_channels(arch)
    x = torch.randn(2, c, size, size, generator=torch.Generator().manual_seed(1))
    model(x)  # materializes the lazy head
    model.eval()
    fresh = torch.randn(2, c, size, size, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = [model(fresh).numpy()]
    for backend in BACKENDS:
        fast = aiacc.optimize(model, (x,), backend=backend, verify=True)
        with torch.no_grad():
            got = [fast(fresh).detach().numpy()]
        _close(want, got, f"torch {backend}")


# -- Keras -----------------------------------------------------------------------------------------------------

@_ci_examples(4)
@given(cases())
def test_random_keras_models(case):
    tf = pytest.importorskip("tensorflow")
    keras = tf.keras
    L = keras.layers
    arch, size = case
    hypothesis.assume(_valid(arch, size) and all(p.get("groups", 1) == 1 for _, p in arch["layers"]))
    keras.utils.set_random_seed(arch["seed"])
    c = _input_channels(arch)
    inp = keras.Input((size, size, c))
    y = inp
    for kind, p in arch["layers"]:
        if kind == "conv":
            y = L.Conv2D(p["cout"], p["k"], padding="same" if p["pad"] or p["k"] == 1 else "valid",
                         use_bias=p["bias"])(y)
        elif kind == "bn":
            bn = L.BatchNormalization()
            y = bn(y)
            rng = np.random.default_rng(arch["seed"])
            bn.set_weights([rng.uniform(0.5, 1.5, p["c"]), rng.uniform(-0.5, 0.5, p["c"]),
                            rng.uniform(-0.5, 0.5, p["c"]), rng.uniform(0.5, 2.0, p["c"])])
        elif kind == "act":
            y = L.Activation(p["fn"])(y)
        elif kind == "pool":
            y = (L.MaxPooling2D(2) if p["fn"] == "max" else L.AveragePooling2D(2))(y)
        elif kind == "residual":
            y = L.Add()([y, L.Conv2D(p["c"], 3, padding="same", activation="relu")(y)])
    out = L.Dense(arch["units"])(L.Flatten()(y))
    model = keras.Model(inp, out)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, size, size, c)).astype(np.float32)
    fresh = rng.standard_normal((2, size, size, c)).astype(np.float32)
    want = [model(fresh).numpy()]
    for backend in BACKENDS:
        fast = aiacc.optimize(model, [x], backend=backend, verify=True)
        got = fast(fresh)
        got = got[0] if isinstance(got, (list, tuple)) else got
        _close(want, [np.asarray(got)], f"keras {backend}")


# -- Gluon -----------------------------------------------------------------------------------------------------

@_ci_examples(4)
@given(cases())
def test_random_gluon_models(case):
    from aiacc.plugins.mxnet._import import import_mxnet

    try:
        mx = import_mxnet()
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"mxnet unavailable: {e}")
    nn = mx.gluon.nn
    arch, size = case
    hypothesis.assume(_valid(arch, size))
    mx.random.seed(arch["seed"])

    class Residual(mx.gluon.HybridBlock):
        def __init__(self, c):
            super().__init__()
            self.conv = nn.Conv2D(c, 3, padding=1, in_channels=c)

        def hybrid_forward(self, F, x):
            return x + F.relu(self.conv(x))

    net = nn.HybridSequential()
    for kind, p in arch["layers"]:
        if kind == "conv":
            net.add(nn.Conv2D(p["cout"], p["k"], padding=p["pad"], groups=p["groups"], use_bias=p["bias"],
                              in_channels=p["cin"]))
        elif kind == "bn":
            net.add(nn.BatchNorm(in_channels=p["c"]))
        elif kind == "act":
            net.add(nn.Activation(p["fn"]))
        elif kind == "pool":
            net.add(nn.MaxPool2D(2) if p["fn"] == "max" else nn.AvgPool2D(2))
        elif kind == "residual":
            net.add(Residual(p["c"]))
    net.add(nn.Flatten(), nn.Dense(arch["units"]))
    net.initialize(mx.init.Uniform(0.5))
    c = _input_channels(arch)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, c, size, size)).astype(np.float32)
    fresh = rng.standard_normal((2, c, size, size)).astype(np.float32)
    net(mx.nd.array(x))
    for name, param in net.collect_params().items():  # non-trivial BatchNorm statistics
        if name.endswith(("running_mean", "running_var", "gamma", "beta")):
            lo, hi = (0.5, 2.0) if name.endswith(("running_var", "gamma")) else (-0.5, 0.5)
            param.set_data(mx.nd.array(rng.uniform(lo, hi, param.shape)))
    want = [net(mx.nd.array(fresh)).asnumpy()]
    for backend in BACKENDS:
        fast = aiacc.optimize(net, [mx.nd.array(x)], backend=backend, verify=True)
        got = fast(mx.nd.array(fresh))
        got = got[0] if isinstance(got, (list, tuple)) else got
        _close(want, [got.asnumpy()], f"gluon {backend}")


# -- Caffe -----------------------------------------------------------------------------------------------------

def _prototxt(arch, size) -> tuple[str, list[str]]:
    c = _input_channels(arch)
    lines = [f'name: "random"\nlayer {{ name: "data" type: "Input" top: "data" '
             f'input_param {{ shape {{ dim: 2 dim: {c} dim: {size} dim: {size} }} }} }}']
    top, n = "data", 0

    def layer(body):
        nonlocal n
        n += 1
        lines.append(body)

    for kind, p in arch["layers"]:
        name = f"l{n}"
        if kind == "conv":
            layer(f'layer {{ name: "{name}" type: "Convolution" bottom: "{top}" top: "{name}" convolution_param '
                  f'{{ num_output: {p["cout"]} kernel_size: {p["k"]} pad: {p["pad"]} group: {p["groups"]} '
                  f'bias_term: {"true" if p["bias"] else "false"} }} }}')
            top = name
        elif kind == "bn":  # Caffe's BatchNorm + Scale, in place (the usual deploy form)
            layer(f'layer {{ name: "{name}" type: "BatchNorm" bottom: "{top}" top: "{top}" '
                  f'batch_norm_param {{ use_global_stats: true }} }}')
            layer(f'layer {{ name: "{name}s" type: "Scale" bottom: "{top}" top: "{top}" '
                  f'scale_param {{ bias_term: true }} }}')
        elif kind == "act":
            t = {"relu": "ReLU", "sigmoid": "Sigmoid", "tanh": "TanH"}[p["fn"]]
            layer(f'layer {{ name: "{name}" type: "{t}" bottom: "{top}" top: "{top}" }}')
        elif kind == "pool":
            layer(f'layer {{ name: "{name}" type: "Pooling" bottom: "{top}" top: "{name}" pooling_param '
                  f'{{ pool: {"MAX" if p["fn"] == "max" else "AVE"} kernel_size: 2 stride: 2 }} }}')
            top = name
        elif kind == "residual":
            layer(f'layer {{ name: "{name}c" type: "Convolution" bottom: "{top}" top: "{name}c" '
                  f'convolution_param {{ num_output: {p["c"]} kernel_size: 3 pad: 1 }} }}')
            layer(f'layer {{ name: "{name}r" type: "ReLU" bottom: "{name}c" top: "{name}c" }}')
            layer(f'layer {{ name: "{name}" type: "Eltwise" bottom: "{top}" bottom: "{name}c" top: "{name}" }}')
            top = name
    layer(f'layer {{ name: "fc" type: "InnerProduct" bottom: "{top}" top: "fc" '
          f'inner_product_param {{ num_output: {arch["units"]} }} }}')
    head = arch["seed"] % 3  # the output blob: the InnerProduct's, an in-place ReLU's, or a ReLU's own top
    if head == 1:
        layer('layer { name: "fc_relu" type: "ReLU" bottom: "fc" top: "fc" }')
    elif head == 2:
        layer('layer { name: "out_relu" type: "ReLU" bottom: "fc" top: "out" }')
        return "\n".join(lines), ["out"]
    return "\n".join(lines), ["fc"]


@_ci_examples()
@given(cases())
def test_random_caffe_nets(case):
    from aiacc.plugins.caffe import CaffeModel

    arch, size = case
    hypothesis.assume(_valid(arch, size))
    text, outputs = _prototxt(arch, size)
    model = CaffeModel.from_text(text).fill_random(arch["seed"])
    rng = np.random.default_rng(1)
    feeds = {k: rng.standard_normal(s).astype(np.float32) for k, s in model.inputs.items()}
    fresh = {k: rng.standard_normal(s).astype(np.float32) for k, s in model.inputs.items()}
    want = model.forward(**fresh)
    for backend in BACKENDS:
        fast = aiacc.optimize(model, feeds, backend=backend, verify=True)
        got = fast.forward(**fresh)
        assert list(want) == outputs  # (the net's own output blobs, as written)
        assert list(got) == list(want), f"caffe {backend}: output names {list(got)}, original {list(want)}"
        _close([want[k] for k in want], [got[k] for k in want], f"caffe {backend}")
