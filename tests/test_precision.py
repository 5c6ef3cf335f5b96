"""aiacc.optimize(..., precision=...) through the plugins: int8 for torch and Keras (run by onnxruntime),
bf16/fp16 for torch, the accuracy guard, and the errors for bad calibration data or options."""
from __future__ import annotations

import io
import warnings

import numpy as np
import pytest

import aiacc
from aiacc.errors import ShapeError, UnsupportedError, VerificationError

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")
nn = torch.nn


class Net(nn.Module):
    def __init__(self, outlier: bool = False):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 8 * 8, 16)
        self.head = nn.Linear(16, 10)
        if outlier:  # one fc output ~3000x the others, which the head ignores: per-tensor int8 loses the rest
            with torch.no_grad():
                self.fc.weight[0] *= 3000
                self.head.weight[:, 0] = 0

    def forward(self, x):
        y = torch.relu(self.bn(self.conv1(x)))
        y = torch.relu(self.conv2(y)) + y
        return self.head(torch.relu(self.fc(torch.flatten(y, 1))))


def _data(n=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(4, 1, 8, 8, generator=g) for _ in range(n)]


def _rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_torch_int8_runs_on_onnxruntime_and_matches():
    torch.manual_seed(0)
    m = Net().eval()
    cal = _data()
    q = aiacc.optimize(m, cal[0], precision="int8", calibration=cal, backend="onnxruntime")
    rep = q.aiacc_precision
    assert {"conv1", "conv2", "fc", "head"} <= set(rep.quantized)
    assert rep.backend == "onnxruntime" and "calibration samples" in rep.verified
    x = _data(1, seed=5)[0]  # a fresh input
    with torch.no_grad():
        assert _rel(q(x).numpy(), m(x).numpy()) < 0.05
    # the graph onnxruntime runs is the QDQ plan: int8 weights behind DequantizeLinear
    ops = q.runner.graph.op_histogram()
    assert ops["QuantizeLinear"] >= 4 and "Conv" in ops
    assert any(v.const.dtype == np.int8 for v in q.runner.graph.initializers.values())


def test_torch_native_int8_runs_pytorch_integer_kernels_and_matches_onnxruntime():
    from aiacc.plugins.torch.int8 import int8_kernels

    torch.manual_seed(0)
    m = Net().eval()
    cal = _data()
    q = aiacc.optimize(m, cal[0], precision="int8", calibration=cal, backend="torch")
    assert q.aiacc_precision.backend == "torch" and "quantized kernels" in q.aiacc_precision.steps[-1]
    # conv1(+bn)+relu, conv2+relu, the residual add, fc+relu and the head (float output): integer kernels
    assert int8_kernels(q) == {"conv": 2, "add": 1, "linear": 2}
    assert not hasattr(q, "runner")  # no onnxruntime session inside
    qo = aiacc.optimize(m, cal[0], precision="int8", calibration=cal, backend="onnxruntime")
    x = _data(1, seed=5)[0]
    with torch.no_grad():
        got, ort, want = q(x).numpy(), qo(x).numpy(), m(x).numpy()
    assert _rel(got, want) < 0.05
    assert _rel(got, ort) < 1e-4  # the same plan in the same integer arithmetic
    buf = io.BytesIO()  # saved and loaded whole: the kernels pack their weights again
    torch.save(q, buf)
    buf.seek(0)
    back = torch.load(buf, weights_only=False)
    with torch.no_grad():
        assert torch.equal(back(x), q(x))
    assert back.aiacc_precision.backend == "torch"


def test_torch_int8_default_backend_keeps_the_faster_of_torch_and_onnxruntime_kernels():
    from aiacc.errors import AiaccNotice

    torch.manual_seed(0)
    m = Net().eval()
    cal = _data(3)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        q = aiacc.optimize(m, cal[0], precision="int8", calibration=cal)  # backend="native"
    rep = q.aiacc_precision
    assert set(rep.choice) == {"torch", "onnxruntime"} and all(v > 0 for v in rep.choice.values())
    assert rep.backend == min(rep.choice, key=rep.choice.get)  # the one measured faster is kept
    assert "chosen, measured" in rep.steps[-1]
    said = [x for x in w if issubclass(x.category, AiaccNotice)]
    assert (rep.backend == "onnxruntime") == bool(said)  # a choice of onnxruntime is said, not a fallback
    assert hasattr(q, "runner") == (rep.backend == "onnxruntime")
    other = aiacc.optimize(m, cal[0], precision="int8", calibration=cal,
                           backend="onnxruntime" if rep.backend == "torch" else "torch")
    x = _data(1, seed=5)[0]
    with torch.no_grad():
        assert _rel(q(x).numpy(), other(x).numpy()) < 1e-3  # the same plan either way


class Blocks(nn.Module):
    """The other integer groups: ReLU6 (a Clip the range saturates), MaxPool and Flatten on int8, a
    concat, a product of two activations, and a Softmax that stays float."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.b = nn.Conv2d(3, 8, 1)
        self.c = nn.Conv2d(16, 8, 3, padding=1, groups=2)
        self.fc = nn.Linear(8 * 4 * 4, 10)

    def forward(self, x):
        a, b = torch.relu(self.a(x)), nn.functional.relu6(self.b(x))
        y = nn.functional.max_pool2d(torch.cat([a, b], 1), 2)
        y = torch.relu(self.c(y))
        y = y * torch.sigmoid(y.mean((2, 3), keepdim=True)).expand_as(y).contiguous()
        return torch.softmax(self.fc(torch.flatten(y, 1)), -1)


def test_torch_native_int8_groups_concat_pool_clip_and_keeps_float_ops_float():
    from aiacc.plugins.torch.int8 import int8_kernels

    torch.manual_seed(0)
    m = Blocks().eval()
    g = torch.Generator().manual_seed(1)
    cal = [torch.randn(2, 3, 8, 8, generator=g) for _ in range(4)]
    q = aiacc.optimize(m, cal[0], precision="int8", calibration=cal, backend="torch")
    k = int8_kernels(q)
    assert k == {"conv": 3, "cat": 1, "mul": 1, "linear": 1}, k
    code = q.code
    assert "max_pool2d(cat," in code  # the pool reads the int8 concat's quantized tensor
    assert "softmax" in code and "sigmoid" in code  # float ops stay float, between dequantize and quantize
    qo = aiacc.optimize(m, cal[0], precision="int8", calibration=cal, backend="onnxruntime")
    x = torch.randn(2, 3, 8, 8, generator=g)
    with torch.no_grad():
        got, ort, want = q(x).numpy(), qo(x).numpy(), m(x).numpy()
    assert _rel(got, want) < 0.05
    assert _rel(got, ort) < 1e-3


def test_int8_through_onnxruntime_is_said_for_the_plugins_without_int8_kernels():
    tf = pytest.importorskip("tensorflow")
    tf.keras.utils.set_random_seed(0)
    m = tf.keras.Sequential([tf.keras.Input((8, 8, 1)), tf.keras.layers.Conv2D(4, 3, activation="relu"),
                             tf.keras.layers.Flatten(), tf.keras.layers.Dense(3)])
    r = np.random.default_rng(0)
    cal = [r.standard_normal((2, 8, 8, 1)).astype(np.float32) for _ in range(2)]
    with pytest.warns(Warning, match="no int8 kernels.*onnxruntime"):
        q = aiacc.optimize(m, cal[0], precision="int8", calibration=cal)
    assert q.aiacc_precision.backend == "onnxruntime"


def test_guard_refuses_an_over_aggressive_plan_and_names_the_layer():
    torch.manual_seed(0)
    m = Net(outlier=True).eval()
    cal = _data()
    with pytest.raises(VerificationError) as e:
        aiacc.optimize(m, cal[0], precision="int8", calibration=cal, keep_float=[], tolerance=0.05,
                       backend="onnxruntime")
    msg = str(e.value)
    assert "worst layers" in msg and "keep_float=" in msg
    assert "fc" in msg.split("worst layers")[1].split(";")[0]  # the layer with the outlier output
    # following the suggestion passes; the automatic plan finds it by itself
    keep = eval(msg.split("keep_float=")[1])  # noqa: S307  (the list the message suggests)
    q = aiacc.optimize(m, cal[0], precision="int8", calibration=cal, keep_float=keep, tolerance=0.05,
                       backend="onnxruntime")
    assert set(keep) <= set(q.aiacc_precision.kept_float)
    # fc's outlier is in its output, which only the head reads: with the head float, fc's QGemm outputs
    # float (no requantization), so the automatic plan keeps fc in int8 and returns the head to float
    auto = aiacc.optimize(m, cal[0], precision="int8", calibration=cal, tolerance=0.05, backend="onnxruntime")
    rep = auto.aiacc_precision
    assert rep.ok and "head" in rep.kept_float and "fc" in rep.quantized


def test_top1_tolerance_and_holdout():
    torch.manual_seed(0)
    m = Net().eval()
    cal = _data()
    q = aiacc.optimize(m, cal[0], precision="int8", calibration=cal, tolerance={"top1": 0.9},
                       holdout=_data(3, seed=9), backend="onnxruntime")
    assert "top-1 agreement" in q.aiacc_precision.verified and "3 holdout samples" in q.aiacc_precision.verified


def test_calibration_errors():
    m = Net().eval()
    x = _data(1)[0]
    with pytest.raises(ShapeError, match="calibration data is empty"):
        aiacc.optimize(m, x, precision="int8", calibration=[])
    with pytest.raises(ShapeError, match="calibration data is empty"):
        aiacc.optimize(m, x, precision="int8", calibration=iter(()))
    with pytest.raises(ShapeError, match=r"calibration sample 1: graph input 'x': dimension 2 should be 8.*"
                                         r"expected \[4, 1, 8, 8\]"):
        aiacc.optimize(m, x, precision="int8", calibration=[x, torch.randn(4, 1, 9, 8)])
    with pytest.raises(ShapeError, match="calibration sample 0: graph input 'x': expected dtype float32"):
        aiacc.optimize(m, x, precision="int8", calibration=[x.double()])
    with pytest.raises(ShapeError, match="iterable of inputs"):
        aiacc.optimize(m, x, precision="int8", calibration=x)
    with pytest.raises(UnsupportedError, match="unknown precision 'int4'"):
        aiacc.optimize(m, x, precision="int4")
    with pytest.raises(UnsupportedError, match="apply to precision='int8'"):
        aiacc.optimize(m, x, precision="bf16", calibration=[x])
    with pytest.raises(UnsupportedError, match="not layers of this model"):
        aiacc.optimize(m, x, precision="int8", calibration=[x], keep_float=["conv7"])


def test_opaque_torch_module_is_quantized_around():
    class Odd(nn.Module):  # a module the importer keeps opaque (its forward calls numpy)
        def forward(self, x):
            return torch.from_numpy(np.tanh(x.detach().numpy()))

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
            self.odd = Odd()
            self.conv2 = nn.Conv2d(8, 4, 3, padding=1)

        def forward(self, x):
            return self.conv2(self.odd(torch.relu(self.conv1(x))))

    torch.manual_seed(0)
    m = M().eval()
    cal = _data(4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = aiacc.optimize(m, cal[0], precision="int8", calibration=cal, backend="onnxruntime")
    graph = q.runner.graph
    opaque = [n for n in graph if n.is_opaque]
    assert opaque, "the test needs an opaque node"
    assert {"conv1", "conv2"} <= set(q.aiacc_precision.quantized)
    assert q.runner.num_opaque == len(opaque)
    with torch.no_grad():
        assert _rel(q(cal[1]).numpy(), m(cal[1]).numpy()) < 0.05


def test_torch_bf16_and_fp16():
    torch.manual_seed(0)
    m = Net().eval()
    x = _data(1)[0]
    b = aiacc.optimize(m, x, precision="bf16")
    with torch.no_grad():
        out = b(x)
        assert out.dtype == torch.float32  # float32 at the boundary
        assert _rel(out.numpy(), m(x).numpy()) < 0.05
    from aiacc.plugins.torch.precision import AutocastModule, CastModule

    assert isinstance(b, AutocastModule) and b.dtype == torch.bfloat16
    h = aiacc.optimize(m, x, precision="fp16")  # torch native fp16: the weights cast
    assert isinstance(h, CastModule) and any(p.dtype == torch.float16 for p in h.parameters())
    h = aiacc.optimize(m, x, precision="fp16", backend="onnxruntime")
    with torch.no_grad():
        assert _rel(h(x).numpy(), m(x).numpy()) < 0.01
    with pytest.raises(UnsupportedError, match="no bfloat16 kernels"):
        aiacc.optimize(m, x, precision="bf16", backend="onnxruntime")


def test_keras_int8():
    tf = pytest.importorskip("tensorflow")
    tf.keras.utils.set_random_seed(0)
    m = tf.keras.Sequential([tf.keras.Input((8, 8, 1)),
                             tf.keras.layers.Conv2D(8, 3, padding="same", activation="relu"),
                             tf.keras.layers.Conv2D(8, 3, padding="same", activation="relu"),
                             tf.keras.layers.Flatten(), tf.keras.layers.Dense(10)])
    r = np.random.default_rng(0)
    cal = [r.standard_normal((4, 8, 8, 1)).astype(np.float32) for _ in range(4)]
    q = aiacc.optimize(m, cal[0], precision="int8", calibration=cal, backend="onnxruntime")
    assert len(q.aiacc_precision.quantized) >= 3
    x = r.standard_normal((4, 8, 8, 1)).astype(np.float32)
    assert _rel(np.asarray(q(x)), np.asarray(m(x))) < 0.05
    with pytest.raises(UnsupportedError, match="no reduced-float path"):
        aiacc.optimize(m, cal[0], precision="bf16")


def test_a_misspelt_option_is_refused_on_the_precision_path_too():
    from aiacc.errors import OptionError

    m = Net().eval()
    with pytest.raises(OptionError, match="unknown option 'verfy'"):
        aiacc.optimize(m, _data(1)[0], precision="int8", calibration=_data(2), verfy=False)


def _int8_on_onnxruntime(q) -> None:
    """The model runs the QDQ plan on onnxruntime: int8 weights, Q/DQ pairs, the report says where."""
    assert q.aiacc_precision.backend == "onnxruntime"
    runner = getattr(q, "runner", None) or q._runner  # the MXNet block keeps its runner private
    g = runner.graph
    assert runner.sessions and g.op_histogram().get("QuantizeLinear", 0) >= 2
    assert any(v.const.dtype == np.int8 for v in g.initializers.values())


def test_mxnet_gluon_int8_runs_through_onnxruntime():
    from aiacc.plugins.mxnet._import import import_mxnet

    try:  # mxnet needs numpy's removed aliases restored first: import it the plugin's way
        mx = import_mxnet()
    except ImportError:
        pytest.skip("mxnet is not installed")
    from mxnet.gluon import nn as gnn

    mx.random.seed(0)
    net = gnn.HybridSequential()
    net.add(gnn.Conv2D(8, 3, padding=1, activation="relu"), gnn.Conv2D(8, 3, padding=1, activation="relu"),
            gnn.Flatten(), gnn.Dense(10))
    net.initialize(mx.init.Xavier())
    net.hybridize()
    r = np.random.default_rng(0)
    cal = [mx.nd.array(r.standard_normal((4, 3, 8, 8)).astype(np.float32)) for _ in range(4)]
    net(cal[0])
    with pytest.warns(Warning, match="MXNet export has no int8 kernels.*onnxruntime"):
        q = aiacc.optimize(net, cal[0], precision="int8", calibration=cal)
    _int8_on_onnxruntime(q)
    assert len(q.aiacc_precision.quantized) == 3
    x = mx.nd.array(r.standard_normal((4, 3, 8, 8)).astype(np.float32))
    assert _rel(q(x).asnumpy(), net(x).asnumpy()) < 0.05
    with pytest.raises(UnsupportedError, match="MXNet native export has no reduced-float path.*backend='onnxruntime'"):
        aiacc.optimize(net, cal[0], precision="bf16")


def test_caffe_int8_runs_through_onnxruntime():
    from tests.zoo import caffe_models

    model = caffe_models.build("resnet")
    r = np.random.default_rng(0)
    cal = [{"data": r.standard_normal((1, 3, 16, 16)).astype(np.float32)} for _ in range(4)]
    with pytest.warns(Warning, match="Caffe export has no int8 kernels.*onnxruntime"):
        q = aiacc.optimize(model, cal[0], precision="int8", calibration=cal)
    _int8_on_onnxruntime(q)
    rep = q.aiacc_precision
    assert {"conv1", "res2a_branch2a", "res3a_branch1", "res3a_branch2a", "pool5", "fc"} <= set(rep.quantized)
    # the Eltwise sum and product read float (scaled branches, PReLU) and feed float ops (Max, ELU)
    assert set(rep.kept_float) == {"res3a", "res3a_prod"}
    x = {"data": r.standard_normal((1, 3, 16, 16)).astype(np.float32)}
    assert _rel(q.forward(**x)["prob"], model.forward(**x)["prob"]) < 0.05


def test_torch_int8_on_openvino_runs_int8_layers_and_matches_onnxruntime():
    from aiacc.backends.openvino import available

    if not available():
        pytest.skip("openvino is not installed (optional: pip install -c constraints.txt 'aiacc[openvino]')")
    torch.manual_seed(0)
    m = Net().eval()
    cal = _data()
    q = aiacc.optimize(m, cal[0], precision="int8", calibration=cal, backend="openvino")
    assert q.aiacc_precision.backend == "openvino"
    layers = q.runner.runtime_precisions()
    assert layers.get("Convolution/u8") == 2 and layers.get("FullyConnected/u8") == 2, layers
    qo = aiacc.optimize(m, cal[0], precision="int8", calibration=cal, backend="onnxruntime")
    x = _data(1, seed=5)[0]
    with torch.no_grad():
        got, ort, want = q(x).numpy(), qo(x).numpy(), m(x).numpy()
    assert _rel(got, want) < 0.05 and _rel(got, ort) < 1e-4


def test_openvino_int8_is_refused_outside_torch_with_what_works():
    tf = pytest.importorskip("tensorflow")
    m = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3)])
    x = np.ones((2, 4), np.float32)
    with pytest.raises(UnsupportedError, match="backend='openvino' is there for torch.*backend='onnxruntime'"):
        aiacc.optimize(m, x, precision="int8", calibration=[x], backend="openvino")
