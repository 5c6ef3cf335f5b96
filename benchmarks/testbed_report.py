"""Run a benchmark's worker on every node of an emulated cluster and read back rank 0's JSON report: the one
launch the data-parallel benchmarks (dp.py, dp_frameworks.py, time_to_accuracy.py) share."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_workers(script: str, worker_args: list[str], *, rate: str, nodes: int = 2, timeout: float,
                env: dict[str, str] | None = None) -> dict:
    """`python script --worker REPORT *worker_args` on each of `nodes` testbed nodes linked at `rate` (each
    pinned to its own core), or on 2 unshaped loopback ranks when `rate` is "loopback"; a rank that fails ends
    the run with its output; returns the JSON that rank 0 wrote to REPORT."""
    from aiacc.distributed.launch import launch_local
    from aiacc.distributed.testbed import Testbed

    env = {"PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {})}
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "report.json")
        argv = [script, "--worker", out, *worker_args]
        if rate == "loopback":
            res = launch_local(argv, 2, timeout=timeout, env=env)
            for k, r in enumerate(res):
                r.node = k
        else:
            with Testbed(nodes, rate) as tb:
                res = tb.run(argv, launcher="env", cpus="auto", timeout=timeout, fail_grace=5.0, env=env)
        for r in res:
            if r.returncode != 0:
                raise SystemExit(f"{Path(script).name}: rank on node {r.node} failed (returncode {r.returncode}):\n"
                                 f"{(r.stdout or '')[-1500:]}\n{(r.stderr or '')[-3000:]}")
        return json.loads(Path(out).read_text())
