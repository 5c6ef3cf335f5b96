"""A CI smoke of benchmarks/dp.py: its smallest real comparison (every candidate: DDP, Horovod-style
fusion, per-tensor after backward, DDP's fp16 hook, aiacc fp32 / fp16 with the planner's choice of
per-layer waits, aiacc step-sync, aiacc with per-layer waits forced) on 2 ranks over
loopback, one tiny BERT-style model, a couple of steps. Only correctness is asserted: each candidate's
parameters equal single-process training on the full batch (fp16 ones within fp16 rounding); no timing."""
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
DP = ROOT / "benchmarks" / "dp.py"
sys.path.insert(0, str(ROOT / "benchmarks"))


def single_process(steps: int, world: int = 2) -> dict[str, np.ndarray]:
    """The tiny model trained by plain SGD (momentum, as dp.py) on all `world` ranks' inputs at once."""
    import dp

    model, _, _ = dp.build("tiny", 0)
    xs, ys = zip(*(dp.tiny_batch(r) for r in range(world)))
    x, y = torch.cat(xs), torch.cat(ys)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x)[1], y).backward()
        opt.step()
    return {n: p.detach().numpy().copy() for n, p in model.named_parameters()}


def test_every_dp_candidate_on_two_loopback_ranks_equals_single_process_training(tmp_path):
    from aiacc.distributed.launch import launch_local

    out, params = tmp_path / "report.json", tmp_path / "params"
    argv = [str(DP), "--worker", str(out), "--models", "tiny", "--steps", "2", "--warmup", "1", "--sweep", "",
            "--profile-reps", "1", "--block", "1", "--save-params", str(params), "--per-layer",
            "--calibration-reps", "2"]  # (the check is each candidate's parameters, not the costs' precision)
    env = {"PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    res = launch_local(argv, 2, timeout=120, env=env)
    for r in res:
        assert r.returncode == 0, f"returncode {r.returncode}\n{r.stdout[-1000:]}\n{r.stderr[-3000:]}"
    report = json.loads(out.read_text())["models"]["tiny"]
    steps = report["steps_per_candidate"]
    ref = single_process(steps)
    checked = 0
    for label, row in report["rows"].items():
        if label.startswith("1 rank"):  # trains on one rank's data only
            continue
        for rank in range(2):
            got = np.load(f"{params}.{rank}.npz")
            # fp16 on the wire rounds each reduced gradient to ~1e-3 relative
            rtol, atol = (2e-3, 1e-4) if "fp16" in label else (1e-5, 1e-6)
            for name, want in ref.items():
                np.testing.assert_allclose(got[f"{label}/{name}"], want, rtol=rtol, atol=atol,
                                           err_msg=f"{label}, rank {rank}, parameter {name}")
        assert np.isfinite(row["predicted"]) and row["predicted"] > 0, label
        checked += 1
    assert sorted(report["rows"]) == ["1 rank, no comm", "DDP 25 MB", "DDP fp16 hook", "Horovod 64 MB",
                                      "after backward", "aiacc", "aiacc fp16", "aiacc per-layer", "aiacc step-sync"]
    assert checked == 8
    assert report["rows"]["aiacc per-layer"]["sync"] == "layer"  # deferred updates forced: that path is checked
    assert report["rows"]["aiacc"]["sync"] in ("step", "layer")  # the planner's choice (either is checked above)


def test_every_dp_candidate_on_three_testbed_nodes_at_500mbit_equals_single_process_training(tmp_path):
    """Another cluster shape and link rate than the benchmark's: 3 emulated nodes (1 rank each, sharing the
    cores) linked at 500 Mbit/s, the plans made from that network as measured; each candidate's parameters
    equal single-process training on the 3 ranks' batches (the sum of 3 ranks depends on the bucket
    layout: 1e-5 covers it, tests/distributed/test_sum_order.py)."""
    from aiacc.distributed import testbed

    reason = testbed.unavailable()
    if reason:
        pytest.skip(reason)
    out, params = tmp_path / "report.json", tmp_path / "params"
    argv = [str(DP), "--worker", str(out), "--models", "tiny", "--steps", "2", "--warmup", "1", "--sweep", "",
            "--profile-reps", "1", "--block", "1", "--save-params", str(params), "--calibration-reps", "2"]
    env = {"PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with testbed.Testbed(3, "500mbit") as tb:
        res = tb.run(argv, launcher="env", cpus="auto", timeout=240, fail_grace=5.0, env=env)
    for r in res:
        assert r.returncode == 0, f"returncode {r.returncode}\n{r.stdout[-1000:]}\n{r.stderr[-3000:]}"
    report = json.loads(out.read_text())
    assert report["cluster"]["nodes"] == 3 and report["cluster"]["allreduce_cpu_samples"]
    rows = report["models"]["tiny"]["rows"]
    ref = single_process(report["models"]["tiny"]["steps_per_candidate"], world=3)
    checked = 0
    for label in rows:
        if label.startswith("1 rank"):
            continue
        rtol, atol = (2e-3, 1e-4) if "fp16" in label else (1e-5, 1e-6)
        for rank in range(3):
            got = np.load(f"{params}.{rank}.npz")
            for name, want in ref.items():
                np.testing.assert_allclose(got[f"{label}/{name}"], want, rtol=rtol, atol=atol,
                                           err_msg=f"{label}, rank {rank}, parameter {name}")
        checked += 1
    assert checked == 7 and "aiacc" in rows and "aiacc fp16" in rows
