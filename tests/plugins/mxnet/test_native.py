"""backend="native": the exported SymbolBlock runs MXNet's MKLDNN fused ops where the build has MKLDNN,
while export() still writes the plain lowered symbol that SymbolBlock.imports loads anywhere."""
import json

import numpy as np
import pytest

import aiacc
from aiacc.plugins.mxnet._import import import_mxnet
from aiacc.plugins.mxnet.native import NativeBlock, default_subgraph_backend
from aiacc.plugins.mxnet.translator import MXNetTranslator

from tests.plugins.mxnet.conftest import rel_err

mx = import_mxnet()
HAS_MKLDNN = mx.runtime.Features().is_enabled("MKLDNN")
needs_mkldnn = pytest.mark.skipif(not HAS_MKLDNN, reason="this MXNet build has no MKLDNN")


def _ops(sym) -> list[str]:
    return [n["op"] for n in json.loads(sym.tojson())["nodes"] if n["op"] != "null"]


def _running_ops(block) -> list[str]:
    """The ops of the graph the block's CachedOp runs (partitioned at the first call)."""
    return _ops(block._cached_graph[1])


def _reimport(block, path):
    block.export(str(path / "m"))
    names = [v.name for v in block.aiacc_graph.inputs]
    with open(path / "m-symbol.json") as f:
        written = [n["op"] for n in json.load(f)["nodes"] if n["op"] != "null"]
    return written, mx.gluon.SymbolBlock.imports(str(path / "m-symbol.json"), names, str(path / "m-0000.params"))


def test_default_backend_follows_the_build():
    assert default_subgraph_backend() == ("MKLDNN" if HAS_MKLDNN else None)


@needs_mkldnn
@pytest.mark.parametrize("name", ["mobilenet_v2", "bert_encoder"])
def test_native_runs_mkldnn_fused_ops_and_exports_the_plain_symbol(zoo, name, tmp_path):
    model, ex = zoo(name)
    t = MXNetTranslator()
    expected = t.run(model, ex)
    fast = aiacc.optimize(model, ex, level=2)  # verify runs it once: the block is partitioned now
    assert isinstance(fast, NativeBlock)
    running = _running_ops(fast)
    fused = {"mobilenet_v2": "_sg_mkldnn_conv", "bert_encoder": "_sg_mkldnn_fully_connected"}[name]
    assert fused in running
    assert "Convolution" not in running  # every convolution went into a fused MKLDNN op
    out = t.run(fast, ex)
    for a, e in zip(out, expected):
        assert rel_err(a, e) < 1e-4
    written, again = _reimport(fast, tmp_path)
    assert not any(op.startswith("_sg_") for op in written)
    assert written == _ops(fast.plain_symbol)
    again_out = t.run(again, ex)
    for a, b in zip(again_out, out):
        assert a.shape == b.shape and rel_err(a, b) < 1e-5


@needs_mkldnn
def test_partitioned_block_takes_another_batch_size(zoo):
    model, ex = zoo("mobilenet_v2")
    t = MXNetTranslator()
    fast = aiacc.optimize(model, ex, level=2)
    x2 = np.concatenate([ex[0], ex[0][:, :, ::-1]])  # batch 2 after partitioning at batch 1
    for a, e in zip(t.run(fast, (x2,)), t.run(model, (x2,))):
        assert a.shape == e.shape and rel_err(a, e) < 1e-4


def test_without_subgraph_backend_runs_the_plain_symbol(zoo, tmp_path):
    model, ex = zoo("mobilenet_v2")
    t = MXNetTranslator()
    fast = aiacc.optimize(model, ex, level=2, subgraph_backend=None)
    assert _running_ops(fast) == _ops(fast.plain_symbol)
    written, again = _reimport(fast, tmp_path)
    assert "Convolution" in written
    for a, b in zip(t.run(again, ex), t.run(fast, ex)):
        np.testing.assert_array_equal(a, b)  # the same kernels on both sides


@needs_mkldnn
def test_rehybridize_starts_from_the_plain_symbol(zoo):
    model, ex = zoo("with_opaque")
    t = MXNetTranslator()
    fast = aiacc.optimize(model, ex, level=2)
    assert "_sg_mkldnn_conv" in _running_ops(fast)
    fast.hybridize(static_alloc=True)  # no backend now: the next call builds the plain graph again
    out = t.run(fast, ex)
    assert _running_ops(fast) == _ops(fast.plain_symbol)
    for a, e in zip(out, t.run(model, ex)):
        assert rel_err(a, e) < 1e-4


def test_export_before_the_first_call_writes_every_parameter(zoo, tmp_path):
    model, ex = zoo("with_opaque")
    graph = aiacc.optimize(model, ex, level=2).aiacc_graph
    block = aiacc.export(graph, "mxnet")  # never called: nothing partitioned, no CachedOp built
    written, again = _reimport(block, tmp_path)
    assert "smooth_l1" in written
    n_params = len(mx.nd.load(str(tmp_path / "m-0000.params")))
    assert n_params == len(block.collect_params().keys()) > 0
    t = MXNetTranslator()
    for a, e in zip(t.run(again, ex), t.run(model, ex)):
        assert rel_err(a, e) < 1e-4
