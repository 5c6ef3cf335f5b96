"""aiacc's MXNet extension operator (aiacc_layer_norm, built with MXNet's lib_api): it computes what MXNet's
LayerNorm does, forward and backward, accumulates gradients under grad_req='add', is what a training
graph's LayerNorm runs as on aiacc.optimize(mode='train'), and where it cannot be built the block trains
with MXNet's LayerNorm and says so (a reported fallback; strict=True refuses)."""
import json
import shutil
import warnings

import numpy as np
import pytest

from aiacc.plugins.mxnet._import import import_mxnet

try:
    mx = import_mxnet()
except ImportError:
    pytest.skip("mxnet is not installed", allow_module_level=True)
from mxnet import autograd, gluon  # noqa: E402

import aiacc  # noqa: E402
from aiacc.errors import AiaccWarning, FallbackError  # noqa: E402
from aiacc.plugins.mxnet import extension  # noqa: E402

warnings.filterwarnings("ignore", category=DeprecationWarning)


@pytest.fixture(scope="module")
def ext():
    """The loaded library (skipped, with the reason, where it cannot be built here)."""
    reason = extension.load()
    if reason is not None:
        pytest.skip(reason)
    return extension.loaded_path()


def rel(a, b):
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


@pytest.mark.parametrize("shape", [(4, 8), (2, 3, 7), (512, 256), (3, 40000)])
def test_layer_norm_op_equals_mxnet_forward_and_backward(ext, shape):
    """(512, 256) and (3, 40000) take the kernel's multi-threaded path, the others its serial one."""
    rng = np.random.default_rng(0)
    c = shape[-1]
    x0 = (rng.standard_normal(shape) * 3 + 1).astype("f")
    g0, b0 = rng.standard_normal(c).astype("f"), rng.standard_normal(c).astype("f")
    w = mx.nd.array(rng.standard_normal(shape).astype("f"))
    results = []
    for op in ("LayerNorm", extension.LAYER_NORM_OP):
        x, g, b = mx.nd.array(x0), mx.nd.array(g0), mx.nd.array(b0)
        for a in (x, g, b):
            a.attach_grad()
        with autograd.record():
            y = mx.nd.LayerNorm(x, g, b, axis=-1, eps=1e-5) if op == "LayerNorm" else \
                getattr(mx.nd, op)(x, g, b, eps=1e-5)[0]
            loss = (y * w).sum()
        loss.backward()
        results.append([y.asnumpy(), x.grad.asnumpy(), g.grad.asnumpy(), b.grad.asnumpy()])
    for name, got, want in zip(("y", "dx", "dgamma", "dbeta"), results[1], results[0]):
        assert rel(got, want) < 1e-5, (name, rel(got, want))


def test_layer_norm_op_refuses_other_dtypes(ext):
    x = mx.nd.ones((2, 4), dtype="float16")
    with pytest.raises(mx.base.MXNetError, match="float32 inputs only"):
        getattr(mx.nd, extension.LAYER_NORM_OP)(x, mx.nd.ones(4, dtype="float16"), mx.nd.zeros(4, dtype="float16"),
                                                eps=1e-5)[0].wait_to_read()


class Encoderish(gluon.HybridBlock):
    """Dense -> LayerNorm -> GELU -> Dense -> residual LayerNorm: both kinds of LayerNorm input (a layer's
    output, a residual sum) and a LayerNorm reading the block's input directly."""

    def __init__(self, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.ln0 = gluon.nn.LayerNorm(in_channels=16)
            self.fc1 = gluon.nn.Dense(32, flatten=False, in_units=16)
            self.ln1 = gluon.nn.LayerNorm(in_channels=32)
            self.fc2 = gluon.nn.Dense(16, flatten=False, in_units=32)
            self.ln2 = gluon.nn.LayerNorm(in_channels=16)

    def hybrid_forward(self, F, x):
        h = self.ln0(x)
        y = self.fc2(F.LeakyReLU(self.ln1(self.fc1(h)), act_type="gelu"))
        return self.ln2(y + h)


def encoderish(seed=0):
    mx.random.seed(seed)
    net = Encoderish()
    net.initialize(mx.init.Xavier())
    for p in net.collect_params().values():  # non-trivial gamma/beta, so their gradients are checked
        if p.name.endswith(("gamma", "beta")):
            p.set_data(mx.nd.array(np.random.default_rng(3).standard_normal(p.shape).astype("f") * 0.5 + 1))
    return net


def batch(seed=1):
    return np.random.default_rng(seed).standard_normal((4, 6, 16)).astype("f")


def train(block, x, n, grad_req="write"):
    """n SGD steps on sum(out^2); with grad_req='add' two backward passes per step accumulate before each."""
    params = block.collect_params()
    for p in params.values():
        p.grad_req = grad_req
    trainer = gluon.Trainer(params, "sgd", {"learning_rate": 0.05})
    xs = mx.nd.array(x)
    for _ in range(n):
        for _ in range(2 if grad_req == "add" else 1):
            with autograd.record():
                loss = (block(xs) ** 2).mean()
            loss.backward()
        trainer.step(1)
        if grad_req == "add":
            for p in params.values():
                p.zero_grad()
    # keyed without the block's instance prefix ("encoderish3_"), so two instances compare
    return {k.split("_", 1)[1]: p.data().asnumpy() for k, p in block.collect_params().items()}


def symbol_ops(block):
    return [n["op"] for n in json.loads(block._cached_graph[1].tojson())["nodes"]]


@pytest.mark.parametrize("grad_req", ["write", "add"])
def test_train_mode_runs_the_extension_op_and_ends_with_the_originals_parameters(ext, grad_req):
    x = batch()
    want = train(encoderish(), x, 3, grad_req)
    original = encoderish()
    fast = aiacc.optimize(original, (x,), mode="train", framework_compile=False)
    got = train(fast, x, 3, grad_req)
    ops = symbol_ops(fast)
    assert ops.count(extension.LAYER_NORM_OP) == 3 and "LayerNorm" not in ops
    assert fast.aiacc_extension_ops and len(fast.aiacc_extension_ops) == 3
    assert any("train as aiacc_layer_norm" in line for line in fast.aiacc_report["export"].notes)
    assert sorted(got) == sorted(want)
    for k in want:
        assert rel(got[k], want[k]) < 1e-5, (k, rel(got[k], want[k]))
    # the parameters trained are the original's own
    assert all(a is b for a, b in zip(fast.collect_params().values(), original.collect_params().values())
               if a.name in dict(original.collect_params()))


def test_without_the_library_it_trains_with_mxnets_layernorm_and_says_so(monkeypatch):
    monkeypatch.setattr(extension, "_STATE", {"reason": "aiacc's MXNet extension operators are unavailable: test"})
    x = batch()
    want = train(encoderish(), x, 2)
    with pytest.warns(AiaccWarning, match=r"LayerNormalization\) trains with MXNet's own LayerNorm.*unavailable: test"):
        fast = aiacc.optimize(encoderish(), (x,), mode="train", framework_compile=False)
    assert extension.LAYER_NORM_OP not in symbol_ops(fast) and "LayerNorm" in symbol_ops(fast)
    assert any("unavailable: test" in f for f in fast.aiacc_report.fallbacks)
    got = train(fast, x, 2)
    for k in want:
        assert rel(got[k], want[k]) < 1e-5
    with pytest.raises(FallbackError, match="unavailable: test"):
        aiacc.optimize(encoderish(), (x,), mode="train", framework_compile=False, strict=True)


def test_build_failure_is_a_one_line_reason(monkeypatch, tmp_path):
    monkeypatch.setenv("AIACC_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", "no-such-compiler-aiacc")
    with pytest.raises(RuntimeError, match="no C\\+\\+ compiler \\(no-such-compiler-aiacc not on PATH"):
        extension.build(mx)
    false = shutil.which("false")
    if false is None:
        pytest.skip("no `false` program to stand in for a failing compiler")
    monkeypatch.setenv("CXX", false)
    with pytest.raises(RuntimeError, match=r"false failed \(exit 1\)"):
        extension.build(mx)
    assert list(tmp_path.glob("mxnet_ext/*.so")) == []  # nothing half-built left behind


SAVED_READER = """
import sys
import numpy as np
from aiacc.plugins.mxnet._import import import_mxnet
mx = import_mxnet()
if sys.argv[2] == "load":
    from aiacc.plugins.mxnet import extension
    assert extension.load() is None
try:
    block = mx.gluon.SymbolBlock.imports(sys.argv[1] + "-symbol.json", ["data"], sys.argv[1] + "-0000.params")
except Exception as e:  # noqa: BLE001 - the message is what the test checks
    print("ERROR", str(e).splitlines()[0][:300])
    sys.exit(0)
print("OUT", float(block(mx.nd.array(np.load(sys.argv[1] + "-x.npy"))).asnumpy().sum()))
"""


def test_a_saved_train_block_reads_back_after_load(ext, tmp_path):
    """A train-mode block saved with Gluon's export() names aiacc_layer_norm: a fresh process reads it after
    extension.load() (same outputs), and without it MXNet refuses the symbol, naming the operator."""
    import subprocess
    import sys

    x = batch()
    fast = aiacc.optimize(encoderish(), (x,), mode="train", framework_compile=False)
    want = float(fast(mx.nd.array(x)).asnumpy().sum())
    prefix = str(tmp_path / "net")
    fast.export(prefix)
    np.save(prefix + "-x.npy", x)
    script = tmp_path / "read.py"
    script.write_text(SAVED_READER)
    runs = {}
    for mode in ("load", "plain"):
        done = subprocess.run([sys.executable, str(script), prefix, mode], capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        runs[mode] = [ln for ln in done.stdout.splitlines() if ln.startswith(("OUT", "ERROR"))][-1]
    assert runs["load"].startswith("OUT") and abs(float(runs["load"].split()[1]) - want) <= 1e-4 * max(1, abs(want))
    assert runs["plain"].startswith("ERROR") and extension.LAYER_NORM_OP in runs["plain"], runs["plain"]
