"""Starting ranks on this machine, for tests and benchmarks: `launch_local` runs a script as N ranks over
loopback with the environment torchrun would set. Users launch with `torchrun` (one machine:
`torchrun --nproc_per_node N train.py`); an emulated multi-node cluster is `aiacc.distributed.testbed`.
Torch-free.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Sequence


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _kill(p: subprocess.Popen) -> None:
    """Kill a process started with start_new_session=True and everything it started."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        p.kill()


def wait_all(procs: Sequence[subprocess.Popen], timeout: float,
             fail_grace: float | None = None) -> list[subprocess.CompletedProcess]:
    """Wait for every process (each started with start_new_session=True; output piped as text, or not
    piped) until `timeout` seconds from now; those still running then are killed with their children and
    reported with returncode None (and `.killed` True). `fail_grace`: once one process has failed (exited
    non-zero), the others get that many seconds more, then are killed alike. On any exception (Ctrl-C
    included) every process is killed before it propagates."""
    outputs: list[tuple[str | None, str | None]] = [(None, None)] * len(procs)

    def drain(k: int, p: subprocess.Popen) -> None:
        outputs[k] = p.communicate()

    readers = [threading.Thread(target=drain, args=(k, p), daemon=True) for k, p in enumerate(procs)]
    killed = [False] * len(procs)
    try:
        for t in readers:
            t.start()
        deadline = time.monotonic() + timeout
        grace_set = False
        while any(p.poll() is None for p in procs):
            now = time.monotonic()
            if fail_grace is not None and not grace_set and any(p.returncode not in (None, 0) for p in procs):
                deadline, grace_set = min(deadline, now + fail_grace), True
            if now >= deadline:
                for k, p in enumerate(procs):
                    if p.poll() is None:
                        _kill(p)
                        killed[k] = True
                break
            time.sleep(0.05)
        for p in procs:
            p.wait()
        for t in readers:
            t.join()
    except BaseException:
        for p in procs:
            if p.poll() is None:
                _kill(p)
        raise
    results = []
    for k, p in enumerate(procs):
        r = subprocess.CompletedProcess(p.args, None if killed[k] else p.returncode, *outputs[k])
        r.killed = killed[k]
        results.append(r)
    return results


def launch_local(argv: Sequence[str], nprocs: int = 2, *, timeout: float = 120.0,
                 env: dict[str, str] | None = None) -> list[subprocess.CompletedProcess]:
    """Run `python argv...` as `nprocs` ranks on loopback (the environment torchrun would set) and wait.

    Ranks still running after `timeout` seconds are killed and reported with returncode None."""
    port = free_port()
    procs = []
    try:
        for r in range(nprocs):
            e = dict(os.environ)
            e.update(env or {})
            e.update(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(nprocs), LOCAL_WORLD_SIZE=str(nprocs),
                     MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                     OMP_NUM_THREADS=e.get("OMP_NUM_THREADS", "1"))
            procs.append(subprocess.Popen([sys.executable, *argv], env=e, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True, start_new_session=True))
    except BaseException:
        for p in procs:
            _kill(p)
        raise
    return wait_all(procs, timeout)
