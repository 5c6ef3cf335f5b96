"""onnxruntime backend on accelerators: provider selection (available providers mocked), CPU kept last for
per-node fallback, the placement report, and io-binding (run on CPU too: it really binds, shares the
inputs' memory and returns what the plain run returns). The CUDA / TensorRT runs skip without them."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from aiacc.core import run
from aiacc.errors import UnsupportedError

ort = pytest.importorskip("onnxruntime")
from aiacc.backends.onnxruntime import OrtGraphRunner, provider_names, select_providers  # noqa: E402
from tests.backends.split_graph import split_feeds, split_graph  # noqa: E402

ALL = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
CPU_ONLY = ["AzureExecutionProvider", "CPUExecutionProvider"]
HAS_CUDA_EP = "CUDAExecutionProvider" in ort.get_available_providers()
HAS_TRT_EP = "TensorrtExecutionProvider" in ort.get_available_providers()

def graph():
    return split_graph(second_opaque=False)


def feeds(batch=2, seed=1):
    return split_feeds(batch, seed)


# ------------------------------------------------------------------------------------------------ providers
def test_default_is_cuda_then_cpu_where_cuda_exists():
    assert select_providers(None, ALL) == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert select_providers(None, CPU_ONLY) == ["CPUExecutionProvider"]


def test_explicit_order_is_kept_and_cpu_appended_last():
    chosen = select_providers(["tensorrt", "cuda"], ALL)
    assert provider_names(chosen) == ALL
    name, opts = chosen[0]  # TensorRT gets an on-disk engine cache
    assert name == "TensorrtExecutionProvider" and opts["trt_engine_cache_enable"] == "True"
    assert select_providers(["CPUExecutionProvider", "CUDAExecutionProvider"], ALL) == \
        ["CPUExecutionProvider", "CUDAExecutionProvider"]  # CPU first when asked: kept
    assert select_providers("cuda", ALL) == ["CUDAExecutionProvider", "CPUExecutionProvider"]


def test_options_pairs_pass_through():
    chosen = select_providers([("CUDAExecutionProvider", {"device_id": 1}), "cpu"], ALL)
    assert chosen == [("CUDAExecutionProvider", {"device_id": 1}), "CPUExecutionProvider"]


def test_missing_provider_is_dropped_with_a_warning():
    with pytest.warns(Warning, match="no TensorrtExecutionProvider, CUDAExecutionProvider here.*onnxruntime-gpu"):
        assert select_providers(["tensorrt", "cuda"], CPU_ONLY) == ["CPUExecutionProvider"]


def test_nothing_usable_is_an_error():
    with pytest.raises(UnsupportedError, match="none of the requested"):
        select_providers(["cuda"], ["AzureExecutionProvider"])
    with pytest.raises(UnsupportedError, match="neither a provider name"):
        select_providers([("cuda", "not a dict")], ALL)


def test_runner_on_cpu_only_onnxruntime_asked_for_cuda():
    """What a CPU machine does with providers=['cuda']: warns, runs on CPU, equal to the reference."""
    if HAS_CUDA_EP:
        pytest.skip("this onnxruntime has the CUDA provider")
    g = graph()
    with pytest.warns(Warning, match="no CUDAExecutionProvider"):
        runner = OrtGraphRunner(g, providers=["cuda"])
    assert runner.providers == ["CPUExecutionProvider"] and runner.device == ("cpu", 0)
    x = feeds()
    for o, name in zip(runner.run(x), ("o", "r")):
        np.testing.assert_allclose(o, run(g, x)[name], rtol=1e-5, atol=1e-6)


def test_placement_report_reads_onnxruntime_assignment(monkeypatch):
    """cpu_nodes lists what onnxruntime's assignment record puts on the CPU provider (memcpy nodes left out)."""
    class Node:
        def __init__(self, name, op):
            self.name, self.op_type, self.domain = name, op, ""

    class Sub:
        def __init__(self, ep, nodes):
            self.ep_name, self._nodes = ep, nodes

        def get_nodes(self):
            return self._nodes

    class Sess:
        def get_provider_graph_assignment_info(self):
            return [Sub("CUDAExecutionProvider", [Node("conv", "Conv")]),
                    Sub("CPUExecutionProvider", [Node("cum", "CumSum"), Node("m0", "MemcpyToHost")])]

    runner = OrtGraphRunner(graph(), providers=["cpu"])
    runner.device = ("cuda", 0)  # as if CUDA had been chosen
    runner._record_placement(Sess())
    assert runner.cpu_nodes == ["cum (CumSum)"]


# ------------------------------------------------------------------------------------------------ io-binding
def test_io_binding_on_cpu_equals_plain_run_and_shares_inputs():
    g = graph()
    runner = OrtGraphRunner(g, providers=["CPUExecutionProvider"])
    x = feeds(3)
    plain = runner.run(x)
    bound_inputs = []
    real = ort.OrtValue.ortvalue_from_numpy

    def spy(array, *args):
        value = real(array, *args)
        bound_inputs.append((array, value))
        return value

    ort.OrtValue.ortvalue_from_numpy = spy
    try:
        outs = runner.run_bound(x)
    finally:
        ort.OrtValue.ortvalue_from_numpy = real
    assert all(isinstance(o, ort.OrtValue) for o in outs)
    assert [o.device_name().lower() for o in outs] == ["cpu", "cpu"]
    for a, b in zip(plain, outs):
        np.testing.assert_allclose(b.numpy(), a, rtol=1e-6, atol=1e-7)
    # the feeds were bound without a copy (same memory)
    fed = {id(a): v for a, v in bound_inputs}
    assert fed[id(x["x"])].data_ptr() == x["x"].ctypes.data


def test_io_binding_takes_dlpack_tensors():
    torch = pytest.importorskip("torch")
    from aiacc.plugins.torch.ort import _from_ortvalue
    g = graph()
    runner = OrtGraphRunner(g, providers=["CPUExecutionProvider"])
    x = feeds(2)
    t = {k: torch.from_numpy(v.copy()) for k, v in x.items()}
    assert runner.to_ortvalue(t["x"]).data_ptr() == t["x"].data_ptr()
    outs = runner.run_bound(t)
    for a, b in zip(runner.run(x), outs):
        np.testing.assert_allclose(_from_ortvalue(b).numpy(), a, rtol=1e-6, atol=1e-7)


def test_io_binding_without_the_wrappers_from_dlpack(monkeypatch):
    """An onnxruntime whose OrtValue class has no from_dlpack (the pip builds before it): the binding's own
    entry point is used, still without a copy."""
    torch = pytest.importorskip("torch")
    monkeypatch.delattr(ort.OrtValue, "from_dlpack")
    runner = OrtGraphRunner(graph(), providers=["CPUExecutionProvider"])
    t = torch.randn(2, 8)
    assert runner.to_ortvalue(t).data_ptr() == t.data_ptr()


def test_torch_ort_module_io_binding_on_cpu():
    torch = pytest.importorskip("torch")
    from torch import nn

    import aiacc

    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 8 * 8, 5)).eval()
    x = torch.randn(2, 3, 8, 8)
    fast = aiacc.optimize(model, (x,), backend="onnxruntime")
    plain = fast(x)
    fast.io_binding = True
    calls = []
    real = fast.runner.run_bound
    fast.runner.run_bound = lambda feeds: calls.append(feeds) or real(feeds)
    bound = fast(x)
    assert calls, "the io-binding path did not run"
    torch.testing.assert_close(bound, plain, rtol=1e-6, atol=1e-6)
    with torch.no_grad():
        torch.testing.assert_close(bound, model(x), rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------------------------ CUDA
@pytest.mark.skipif(not HAS_CUDA_EP, reason="onnxruntime has no CUDAExecutionProvider (install aiacc[gpu] on a GPU)")
def test_cuda_ep_io_binding_keeps_tensors_on_the_device():
    torch = pytest.importorskip("torch")
    from aiacc.plugins.torch.ort import _from_ortvalue
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    g = graph()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runner = OrtGraphRunner(g, providers=["cuda"])
    assert runner.providers[0] == "CUDAExecutionProvider" and runner.device == ("cuda", 0)
    x = feeds(4)
    t = {k: torch.from_numpy(v).cuda() for k, v in x.items()}
    outs = runner.run_bound(t)
    assert all(o.device_name().lower() == "cuda" for o in outs)
    got = [_from_ortvalue(o) for o in outs]
    assert all(o.is_cuda for o in got)
    expected = run(g, x)
    for o, name in zip(got, ("o", "r")):
        np.testing.assert_allclose(o.cpu().numpy(), expected[name], rtol=1e-4, atol=1e-5)
    assert "cum" not in " ".join(runner.cpu_nodes)  # the opaque node is aiacc's, not onnxruntime's


@pytest.mark.skipif(not HAS_CUDA_EP, reason="onnxruntime has no CUDAExecutionProvider (install aiacc[gpu] on a GPU)")
def test_torch_module_on_cuda_ep():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    from torch import nn

    import aiacc

    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 8 * 8, 5)).eval()
    x = torch.randn(2, 3, 8, 8)
    fast = aiacc.optimize(model, (x,), backend="onnxruntime", providers=["cuda"])
    y = fast(x.cuda())
    assert y.is_cuda
    with torch.no_grad():
        torch.testing.assert_close(y.cpu(), model(x), rtol=1e-3, atol=1e-4)


@pytest.mark.skipif(not HAS_TRT_EP, reason="onnxruntime has no TensorrtExecutionProvider (TensorRT libraries absent)")
def test_tensorrt_ep_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("AIACC_TRT_CACHE", str(tmp_path))
    g = graph()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runner = OrtGraphRunner(g, providers=["tensorrt", "cuda"])
    x = feeds(2)
    expected = run(g, x)
    for o, name in zip(runner.run(x), ("o", "r")):
        np.testing.assert_allclose(o, expected[name], rtol=1e-3, atol=1e-4)
