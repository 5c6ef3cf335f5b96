"""Launching a horovod test file as 2 ranks and reading back what each rank saved: on loopback (gloo over
127.0.0.1, `launch_local`), or on 2 nodes of the emulated cluster (aiacc.distributed.testbed), each rank
started by torchrun on its own node over a shaped link."""
import os

import numpy as np
import pytest

# the testbed runs: 2 nodes, 1 rank each, links of 100 Mbit/s, torchrun on each node; 3 s after a node
# failed the job is ended (the survivors' workers report their error at once)
TESTBED = {"nodes": 2, "rate": "100mbit", "launcher": "torchrun", "fail_grace": 3.0}
# the link speed assumed instead of measuring it at start-up (aiacc.distributed.planning.calibrate: ~20 s
# of all-reduces of up to 16 MB on a 100 Mbit/s link), for runs whose point is not the measured plan (the
# failure runs, TF's and MXNet's testbed runs); the training runs of torch (loopback and testbed) and of
# TF and MXNet on loopback keep it
NO_CALIBRATION = {"AIACC_NETWORK_GBPS": "0.1"}


def need_testbed():
    """Skip (with the testbed's one-line reason) where the emulated cluster cannot run."""
    from aiacc.distributed import testbed

    reason = testbed.unavailable()
    if reason:
        pytest.skip(reason)


def launch(script, args, timeout, env=None, testbed=None):
    """Run `script args...` as 2 ranks with the repository on PYTHONPATH (plus `env`); their CompletedProcess-likes
    in rank order. testbed: None (loopback) or the testbed's settings (e.g. TESTBED)."""
    env = {"PYTHONPATH": os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {})}
    if testbed is None:
        from aiacc.distributed.launch import launch_local

        return launch_local([script, *args], 2, timeout=timeout, env=env)
    from aiacc.distributed.testbed import Testbed

    settings = {**TESTBED, **testbed}
    with Testbed(settings["nodes"], settings["rate"]) as tb:
        return tb.run([script, *args], timeout=timeout, env=env, launcher=settings["launcher"],
                      fail_grace=settings["fail_grace"])


def run_two_ranks(script, args, out, timeout=240, env=None, testbed=None):
    """Launch the 2 ranks, require both to exit 0 (showing their output otherwise) and load `{out}.{rank}.npz`."""
    res = launch(script, args, timeout, env, testbed)
    for p in res:
        assert p.returncode == 0, f"returncode {p.returncode} (None: killed at the timeout)\n{p.stdout[-1000:]}\n{p.stderr[-3000:]}"
    return [np.load(f"{out}.{r}.npz") for r in range(2)]
