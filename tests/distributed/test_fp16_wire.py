"""fp16 compression really halves what goes on the wire, and the reduced gradient stays within fp16 rounding.

Bytes are counted three ways: what the executor hands to dist.all_reduce (intercepted here on one process,
and its own count `bytes_last_step`), and, on the emulated cluster, the bytes the kernel sent on the node's
interface during the all-reduce. A compression that silently did nothing (full precision on the wire, or
no rounding in the result) fails every one of these tests.

The file is also the worker: `python test_fp16_wire.py OUT` is run once per rank.
"""
import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch") if __name__ != "__main__" else __import__("torch")

N = 1 << 20  # one bucket of 4 MB in fp32


def _grad(rank):
    return torch.randn(N, generator=torch.Generator().manual_seed(10 + rank))


def _one_bucket(compression, n=N):
    from aiacc.core.comm.plan import Bucket, Piece, Plan

    return Plan("one-bucket", (Bucket((Piece("g", 0, n),)),), compression=compression)


# -- one process: what is handed to dist.all_reduce --------------------------------------------------

@pytest.fixture
def group():
    dist = torch.distributed
    if dist.is_initialized():
        pytest.skip("a process group is already open in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.fixture
def handed(monkeypatch):
    """(dtype, bytes) of every tensor handed to dist.all_reduce while the test runs."""
    seen = []
    real = torch.distributed.all_reduce

    def recording(tensor, *a, **kw):
        seen.append((tensor.dtype, tensor.element_size() * tensor.numel()))
        return real(tensor, *a, **kw)

    monkeypatch.setattr(torch.distributed, "all_reduce", recording)
    return seen


def _reduce(handed, plan, named, compression):
    from aiacc.distributed.executor import PlanExecutor

    handed.clear()
    ex = PlanExecutor(plan, list(range(len(plan.buckets))), {n: g.numel() for n, g in named.items()},
                      compression=compression)
    for name, g in reversed(list(named.items())):
        ex.ready(name, g.clone())
    out = {n: t.clone() for n, t in ex.wait().items()}
    return list(handed), ex.bytes_last_step, out


@pytest.mark.parametrize("shape", ["one-bucket", "cut-in-bucket"])
def test_fp16_hands_half_the_bytes_to_all_reduce(group, handed, shape):
    from tests.distributed._plans import cut_in_bucket_plan

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Tanh(), torch.nn.Linear(32, 8))
    params = list(model.named_parameters())
    if shape == "one-bucket":
        named = {"g": torch.randn(4096)}
        plans = {c: _one_bucket(c, 4096) for c in ("none", "fp16")}
    else:
        named = {n: torch.randn(p.shape) for n, p in params}
        plans = {c: cut_in_bucket_plan(params, piece=97, per_bucket=3, compression=c) for c in ("none", "fp16")}
    handed32, count32, out32 = _reduce(handed, plans["none"], named, "none")
    handed16, count16, out16 = _reduce(handed, plans["fp16"], named, "fp16")
    assert {d for d, _ in handed32} == {torch.float32} and {d for d, _ in handed16} == {torch.float16}
    total = sum(g.numel() for g in named.values())
    assert sum(b for _, b in handed32) == count32 == 4 * total
    assert sum(b for _, b in handed16) == count16 == 2 * total  # half the bytes
    for name, g in named.items():
        torch.testing.assert_close(out32[name], g, rtol=0, atol=0)  # a world of one: the mean is the gradient
        rel = float((out16[name] - g).norm() / g.norm())
        assert 0 < rel < 1e-3, (name, rel)  # rounded to fp16 (so it went through fp16), and only that much
        torch.testing.assert_close(out16[name], g.half().float(), rtol=0, atol=0)


# -- two ranks: the real reduction, and the bytes the kernel sent ------------------------------------

def _tx_bytes():
    """Bytes sent so far on this process's network interface (the testbed node's, else loopback)."""
    dev = os.environ.get("GLOO_SOCKET_IFNAME", "lo")
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name.strip() == dev:
                return int(rest.split()[8])
    raise RuntimeError(f"no interface {dev} in /proc/net/dev")


def worker(out, calibrate=False):
    """One rank: fp32 and fp16 one-bucket all-reduces (the result, the bytes handed over and sent) and the
    numpy path's; with `calibrate`, then aiacc's calibration of the transport (tests/distributed/conftest.py
    shares this job with test_calibration.py), its result written by rank 0 to OUT.cal.json."""
    from aiacc.distributed import process
    from aiacc.distributed.executor import PlanExecutor, allreduce_arrays

    torch.set_num_threads(1)
    process.init()
    r = process.rank()
    grad = _grad(r)
    res = {}
    for comp in ("none", "fp16"):
        ex = PlanExecutor(_one_bucket(comp), [0], {"g": N}, compression=comp)
        for step in range(2):  # the second step is measured (buffers exist; nothing else on the wire)
            process.barrier()
            before = _tx_bytes()
            ex.ready("g", grad.clone())
            result = ex.wait()["g"].clone()
            process.barrier()  # the peer has everything we sent: it was transmitted
            sent = _tx_bytes() - before
        res[f"{comp}/result"], res[f"{comp}/handed"], res[f"{comp}/tx"] = result.numpy(), ex.bytes_last_step, sent
    cache = {}  # the numpy path of the TF and MXNet Horovod modules
    res["numpy-fp16/result"] = allreduce_arrays([("g", grad.numpy())], plan="per-tensor", compression="fp16",
                                                cache=cache)[0]
    res["numpy-fp16/handed"] = cache["executor"].bytes_last_step
    print(f"rank {r}: bytes sent on {os.environ.get('GLOO_SOCKET_IFNAME', 'lo')}: fp32 {res['none/tx']}, "
          f"fp16 {res['fp16/tx']}", flush=True)
    np.savez(f"{out}.{r}.npz", **res)
    if calibrate:  # after the byte counts: its traffic is not in them
        import json

        from aiacc.distributed import planning

        c = planning.calibrate(reps=2)  # the shape of a real calibration is checked, not its precision
        if r == 0:
            with open(f"{out}.cal.json", "w") as f:
                json.dump({"cluster": c.__dict__, "samples": planning.measurements()}, f)
    process.shutdown()


def _check_two_ranks(r0, r1, on_testbed):
    g0, g1 = _grad(0).numpy(), _grad(1).numpy()
    exact = g0 * np.float32(0.5) + g1 * np.float32(0.5)
    for r in (r0, r1):
        np.testing.assert_array_equal(r["none/result"], exact)  # fp32: the mean, exactly
        for label in ("fp16", "numpy-fp16"):
            np.testing.assert_array_equal(r[f"{label}/result"], r0["fp16/result"])  # same on both ranks/paths
        assert int(r["none/handed"]) == 4 * N and int(r["fp16/handed"]) == int(r["numpy-fp16/handed"]) == 2 * N
    fp16, fp32 = r0["fp16/result"].astype(np.float64), r0["none/result"].astype(np.float64)
    rel = np.linalg.norm(fp16 - fp32) / np.linalg.norm(fp32)
    assert 1e-5 < rel < 1e-3, rel  # within fp16 rounding of the fp32 result, and really rounded
    # elementwise: at most fp16's rounding of each rank's half and of their sum
    bound = 2.0 ** -11 * (np.abs(g0 * 0.5) + np.abs(g1 * 0.5) + np.abs(fp32)) + 1e-7
    assert (np.abs(fp16 - fp32) <= bound).all()
    if on_testbed:  # the kernel's count of bytes this node sent during the all-reduce
        for r in (r0, r1):
            tx32, tx16 = int(r["none/tx"]), int(r["fp16/tx"])
            assert tx32 >= 4 * N, tx32  # a ring of 2 sends the whole bucket once, plus headers
            assert 0.45 < tx16 / tx32 < 0.55, (tx16, tx32)


def test_fp16_on_two_ranks_halves_the_bytes_and_stays_within_rounding(two_node_job):
    """On 2 testbed nodes where the testbed can run (everything the loopback run checks, and the bytes the
    kernel sent), else on 2 loopback ranks (the job of tests/distributed/conftest.py). On the testbed the
    ranks start without torchrun (its agent is one more torch import per node; what is checked here is the
    bytes on the wire, and the Horovod API tests launch with torchrun), on 1 Gbit/s links (the kernel counts
    the bytes a node sent whatever the rate)."""
    _check_two_ranks(*two_node_job["ranks"], on_testbed=two_node_job["on_testbed"])


if __name__ == "__main__":
    worker(sys.argv[1], calibrate="--calibrate" in sys.argv[2:])
