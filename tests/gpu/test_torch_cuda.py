"""aiacc/plugins/torch/cuda.py: the CUDA-only paths (numba.cuda fused elementwise where measured faster,
CUDA graphs, channels-last where faster) leave CPU calls exactly as they were; on a CUDA device (skipped
without one) they give the eager results."""
from __future__ import annotations

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

import aiacc
from aiacc.errors import UnsupportedError
from aiacc.plugins.torch import cuda as tcuda

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA device (torch.cuda.is_available() is False)")
PROGRAM = "t0=Mul(i0,i1);t1=Add(t0,i2);t2=Relu(t1)"


def _fallback(a, b, c):
    return torch.relu(a * b + c)


def test_fused_elementwise_on_cpu_is_torch_op_by_op():
    a, b, c = torch.randn(4, 5), torch.randn(5), torch.tensor(0.5)
    torch.testing.assert_close(tcuda.fused_elementwise(PROGRAM, a, b, c), _fallback(a, b, c))


def test_torch_form_of_every_op_matches_the_reference():
    """eval_program_torch (the path the kernel is measured against) equals eval_program for every op the
    kernel generator knows."""
    import numpy as np

    from aiacc.core.ops.fused import eval_program
    from aiacc.core.runtime.numba_kernels import SCALAR_OPS

    unary = {"Neg", "Abs", "Reciprocal", "Sqrt", "Exp", "Log", "Sin", "Cos", "Tanh", "Erf", "Relu", "LeakyRelu",
             "Elu", "Sigmoid", "HardSigmoid", "HardSwish", "Softplus", "Softsign", "Gelu", "Identity"}
    rng = np.random.default_rng(0)
    x = np.abs(rng.standard_normal((3, 4))).astype(np.float32) + 0.1
    y = rng.standard_normal((4,)).astype(np.float32)
    assert set(tcuda._TORCH_OPS) >= set(SCALAR_OPS)
    for op in SCALAR_OPS:
        if op in unary:
            program, xs = f"t0={op}(i0)", [x - 0.6 if op not in ("Sqrt", "Log") else x]
        elif op == "Clip":
            program, xs = "t0=Clip(i0,i1,i2)", [x, np.float32(0.3), np.float32(0.9)]
        else:
            program, xs = f"t0={op}(i0,i1)", [x, y]
        expected = np.asarray(eval_program(program, [np.asarray(v) for v in xs]))
        got = tcuda.eval_program_torch(program, *(torch.as_tensor(np.asarray(v)) for v in xs)).numpy()
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6, err_msg=op)


def test_fused_elementwise_is_one_node_under_fx_tracing():
    class M(nn.Module):
        def forward(self, a, b, c):
            return tcuda.fused_elementwise(PROGRAM, a, b, c)

    gm = fx.symbolic_trace(M())
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert [n.target for n in calls] == [tcuda.fused_elementwise]
    a, b, c = torch.randn(3, 2), torch.randn(3, 2), torch.randn(2)
    torch.testing.assert_close(gm(a, b, c), _fallback(a, b, c))


def test_capture_refuses_cpu_inputs():
    with pytest.raises(UnsupportedError, match="CUDA"):
        tcuda.capture(nn.Linear(3, 3), torch.randn(2, 3))


def test_channels_last_leaves_cpu_modules_alone():
    m = nn.Conv2d(3, 4, 3)
    assert tcuda.channels_last_if_faster(m, torch.randn(1, 3, 8, 8)) == (m, False)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.bn = nn.BatchNorm2d(16)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        return self.fc(F.adaptive_avg_pool2d(F.relu(self.bn(self.conv(x))), 1).flatten(1))


@needs_cuda
def test_cuda_graph_replays_the_optimized_module():
    model = Net().eval().cuda()
    x = torch.randn(2, 3, 16, 16, device="cuda")
    fast = aiacc.optimize(model, (x,))
    graphed = tcuda.capture(fast, (x,))
    y = torch.randn_like(x)
    with torch.no_grad():
        torch.testing.assert_close(graphed(y), model(y), rtol=1e-4, atol=1e-4)
        assert graphed.replays == 1
        z = torch.randn(3, 3, 16, 16, device="cuda")  # another shape: eager
        torch.testing.assert_close(graphed(z), model(z), rtol=1e-4, atol=1e-4)
        assert graphed.replays == 1


@needs_cuda
def test_fused_elementwise_on_cuda_equals_torch():
    a, b, c = (torch.randn(64, 1024, device="cuda"), torch.randn(1024, device="cuda"),
               torch.tensor(0.25, device="cuda"))
    with torch.no_grad():
        torch.testing.assert_close(tcuda.fused_elementwise(PROGRAM, a, b, c), _fallback(a, b, c),
                                   rtol=1e-5, atol=1e-6)
    from aiacc.core.runtime import cuda_kernels

    if cuda_kernels.cuda_available():  # the choice was measured for these shapes (either answer is right)
        key = ("torch", PROGRAM, ((64, 1024), (1024,), ()), "float32")
        assert cuda_kernels.choices()[key] in ("torch", "numba.cuda")


@needs_cuda
def test_channels_last_choice_keeps_the_results():
    model = Net().eval().cuda()
    x = torch.randn(8, 3, 32, 32, device="cuda")
    chosen, converted = tcuda.channels_last_if_faster(model, (x,))
    xs = x.contiguous(memory_format=torch.channels_last) if converted else x
    with torch.no_grad():
        torch.testing.assert_close(chosen(xs), model(x), rtol=1e-4, atol=1e-4)


def test_verification_runs_without_tf32_and_restores_the_flags():
    """The torch plugin's run (what optimize verifies with) turns TF32 off for the call and restores it."""
    from aiacc.plugins.torch.translator import PLUGIN

    seen = []

    class Probe(nn.Module):
        def forward(self, x):
            seen.append((torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32))
            return x * 2

    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        out = PLUGIN.run(Probe(), (torch.ones(2),))
        assert seen == [(False, False)] and out[0].tolist() == [2.0, 2.0]
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (True, True)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
