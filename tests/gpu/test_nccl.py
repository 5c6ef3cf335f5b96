"""Data parallel on CUDA through aiacc's engine: the default torch.distributed backend is NCCL for CUDA
tensors and gloo for CPU ones; one rank on a GPU trains like plain SGD; two ranks sharing one GPU run if
NCCL allows it (NCCL refuses two ranks on one device: then the test skips and says so)."""
from __future__ import annotations

import json
import os
import sys

import pytest

torch = pytest.importorskip("torch")

from aiacc.distributed.process import default_backend  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
needs_nccl = pytest.mark.skipif(not (torch.cuda.is_available() and torch.distributed.is_nccl_available()),
                                reason="no CUDA device or no NCCL in this torch build")


def test_backend_is_nccl_for_cuda_tensors_gloo_for_cpu():
    assert default_backend(cuda=True) == "cpu:gloo,cuda:nccl"
    assert default_backend(cuda=False) == "gloo"


def _plain_sgd():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    for x, y in [(torch.randn(8, 8, generator=g), torch.randn(8, 2, generator=g)) for _ in range(3)]:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return [p.detach().reshape(-1).tolist() for p in model.parameters()]


def _ranks(n):
    from aiacc.distributed.launch import launch_local

    env = {"PYTHONPATH": ROOT}
    env.pop("AIACC_BACKEND", None)
    return launch_local([os.path.join(HERE, "_nccl_rank.py")], nprocs=n, timeout=240, env=env)


def _check(results, n):
    outs = [json.loads(r.stdout.strip().splitlines()[-1]) for r in results]
    expected = _plain_sgd()
    for out in outs:
        assert "nccl" in out["backend"] and out["device"].startswith("cuda")
        assert out["cpu_sum"] == sum(range(1, n + 1))
        for got, want in zip(out["params"], expected):
            assert max(abs(a - b) for a, b in zip(got, want)) < 1e-5


@needs_nccl
def test_one_rank_on_nccl_trains_like_plain_sgd():
    results = _ranks(1)
    assert results[0].returncode == 0, results[0].stderr[-3000:]
    _check(results, 1)


@needs_nccl
def test_two_ranks_on_nccl():
    results = _ranks(2)
    if any(r.returncode != 0 for r in results):
        err = " | ".join(r.stderr.strip().splitlines()[-1] for r in results if r.stderr.strip())
        if torch.cuda.device_count() < 2:
            pytest.skip(f"two ranks on one GPU: NCCL refused ({err[-400:]})")
        pytest.fail(err)
    _check(results, 2)
