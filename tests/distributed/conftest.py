"""One 2-rank job shared by the tests of this directory that need real ranks on the emulated cluster: each
launch costs two interpreters importing torch (most of such a test's time), so the fp16 wire test and the
calibration test read their parts from the same run (tests/distributed/test_fp16_wire.py is its worker)."""
import json
import os
from pathlib import Path

import pytest

WIRE_WORKER = Path(__file__).with_name("test_fp16_wire.py")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def two_node_job(tmp_path_factory):
    """{"on_testbed": bool, "ranks": [rank 0's arrays, rank 1's], "calibration": rank 0's calibrate() result
    (cluster fields and samples)}: test_fp16_wire.py's worker, then a calibration (2 timed batches per size),
    on 2 testbed nodes linked at 1 Gbit/s (started without torchrun, each rank on its own core) where the
    testbed can run, else on 2 loopback ranks."""
    pytest.importorskip("torch")
    import numpy as np

    from aiacc.distributed import testbed
    from aiacc.distributed.launch import launch_local

    out = tmp_path_factory.mktemp("two-node-job") / "out"
    on_testbed = testbed.unavailable() is None
    argv = [str(WIRE_WORKER), str(out), "--calibrate"]
    env = {"PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    if on_testbed:
        with testbed.Testbed(2, "1gbit") as tb:
            res = tb.run(argv, launcher="env", cpus="auto", timeout=180, fail_grace=3.0, env=env)
    else:
        res = launch_local(argv, 2, timeout=180, env=env)
    for p in res:
        assert p.returncode == 0, f"returncode {p.returncode} (None: killed at the timeout)\n{p.stdout[-1000:]}\n{p.stderr[-3000:]}"
    return {"on_testbed": on_testbed, "ranks": [np.load(f"{out}.{r}.npz") for r in range(2)],
            "calibration": json.loads(Path(f"{out}.cal.json").read_text())}
