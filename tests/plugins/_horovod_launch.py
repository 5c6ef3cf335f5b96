"""Launching a horovod test file as 2 local ranks (gloo over loopback) and reading back what each rank saved."""
import os

import numpy as np


def launch(script, args, timeout, env=None):
    """Run `script args...` as 2 ranks with the repository on PYTHONPATH (plus `env`); their CompletedProcess-likes."""
    from aiacc.distributed.launch import launch_local

    env = {"PYTHONPATH": os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {})}
    return launch_local([script, *args], 2, timeout=timeout, env=env)


def run_two_ranks(script, args, out, timeout=240, env=None):
    """Launch the 2 ranks, require both to exit 0 (showing their output otherwise) and load `{out}.{rank}.npz`."""
    res = launch(script, args, timeout, env)
    for p in res:
        assert p.returncode == 0, f"returncode {p.returncode} (None: killed at the timeout)\n{p.stdout[-1000:]}\n{p.stderr[-3000:]}"
    return [np.load(f"{out}.{r}.npz") for r in range(2)]
