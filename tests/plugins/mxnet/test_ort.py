"""backend="onnxruntime": a Gluon block running the optimized graph in onnxruntime, opaque MXNet ops in
between through MXNet."""
import pytest

import aiacc
from aiacc.plugins.mxnet._import import import_mxnet
from aiacc.plugins.mxnet.translator import MXNetTranslator

from tests.plugins.mxnet.conftest import rel_err

pytest.importorskip("onnxruntime")
mx = import_mxnet()


@pytest.mark.parametrize("name", ["resnet50_v1", "bert_encoder", "with_opaque", "mlp"])
def test_onnxruntime_backend(zoo, name):
    model, ex = zoo(name)
    fast = aiacc.optimize(model, ex, level=2, backend="onnxruntime")
    assert isinstance(fast, mx.gluon.Block)
    out = MXNetTranslator().run(fast, ex)
    expected = MXNetTranslator().run(model, ex)
    for a, e in zip(out, expected):
        assert a.shape == e.shape and rel_err(a, e) < 1e-4


def test_opaque_node_runs_in_mxnet_between_sessions(zoo):
    model, ex = zoo("with_opaque")
    fast = aiacc.optimize(model, ex, level=2, backend="onnxruntime")
    assert fast._runner.num_opaque == 1
