"""A Caffe net keeps its output blob names through optimize (issue 16): tops that fusion folds into the
layer before them (ReLU, BatchNorm, Scale in place after InnerProduct/Convolution, or a ReLU with a top of
its own) come back under the original names, and verify refuses a result whose names differ."""
import numpy as np
import pytest

import aiacc
from aiacc.errors import VerificationError
from aiacc.plugins.caffe import CaffeModel

HEAD = 'name: "n"\nlayer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 dim: 6 dim: 6 } } }\n'
NETS = {
    "relu in place after InnerProduct": HEAD + '''
layer { name: "fc" type: "InnerProduct" bottom: "data" top: "fc" inner_product_param { num_output: 4 } }
layer { name: "fc_relu" type: "ReLU" bottom: "fc" top: "fc" }''',
    "relu with its own top after InnerProduct": HEAD + '''
layer { name: "fc" type: "InnerProduct" bottom: "data" top: "fc" inner_product_param { num_output: 4 } }
layer { name: "act" type: "ReLU" bottom: "fc" top: "prob" }''',
    "BatchNorm + Scale + ReLU in place after Convolution": HEAD + '''
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv" convolution_param { num_output: 4 kernel_size: 3 } }
layer { name: "bn" type: "BatchNorm" bottom: "conv" top: "conv" batch_norm_param { use_global_stats: true } }
layer { name: "sc" type: "Scale" bottom: "conv" top: "conv" scale_param { bias_term: true } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }''',
    "two outputs, one folded": HEAD + '''
layer { name: "conv" type: "Convolution" bottom: "data" top: "c1" convolution_param { num_output: 4 kernel_size: 1 } }
layer { name: "relu" type: "ReLU" bottom: "c1" top: "r1" }
layer { name: "fc" type: "InnerProduct" bottom: "data" top: "logits" inner_product_param { num_output: 2 } }''',
}


@pytest.mark.parametrize("backend", ["native", "onnxruntime"])
@pytest.mark.parametrize("name", list(NETS))
def test_output_blob_names_survive_fusion(name, backend):
    model = CaffeModel.from_text(NETS[name]).fill_random(0)
    x = {"data": np.random.default_rng(0).standard_normal((2, 3, 6, 6)).astype(np.float32)}
    want = model.forward(**x)
    fast = aiacc.optimize(model, x, backend=backend)
    got = fast.forward(**x)
    assert list(got) == list(want)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5)
    # the fusion really happened (the test is about names after folding)
    assert fast.aiacc_report.fused > 0 or any(r.removed for r in fast.aiacc_report.records)


def test_verify_refuses_renamed_outputs(monkeypatch):
    from aiacc.plugins.caffe import translator

    model = CaffeModel.from_text(NETS["relu in place after InnerProduct"]).fill_random(0)
    x = {"data": np.zeros((2, 3, 6, 6), np.float32)}
    real = translator.CaffePlugin.output_names
    monkeypatch.setattr(translator.CaffePlugin, "output_names",
                        lambda self, m: ["renamed"] if m is not model else real(self, m))
    with pytest.raises(VerificationError, match=r"the outputs are named \['renamed'\], the original's \['fc'\]"):
        aiacc.optimize(model, x)
