"""The emulated cluster (aiacc.distributed.testbed): it starts, shapes its links, stays inside its own
namespaces and leaves nothing behind, on a normal exit, Ctrl-C, SIGTERM and a crash (SIGKILL).

Needs root and iproute2; elsewhere every test but the first skips with the testbed's one-line reason.
"""
import os
import signal
import subprocess
import sys
import time

import pytest

from aiacc.distributed import testbed

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def need_testbed():
    reason = testbed.unavailable()
    if reason:
        pytest.skip(reason)


def _ours(pid):
    return [ns for ns in testbed._namespaces() if ns.startswith(f"aiacc-{pid}-")]


def test_unavailable_says_why_in_one_line(monkeypatch):
    reason = testbed.unavailable()
    assert reason is None or (reason and "\n" not in reason), reason
    monkeypatch.setattr(testbed, "_reason", [])
    monkeypatch.setattr(testbed.sys, "platform", "linux")
    monkeypatch.setattr(testbed.os, "geteuid", lambda: 1000)
    assert testbed.unavailable() == "the cluster testbed needs root (it creates network namespaces and sets tc qdiscs)"
    monkeypatch.setattr(testbed, "_reason", [])
    monkeypatch.setattr(testbed.os, "geteuid", lambda: 0)
    monkeypatch.setattr(testbed.shutil, "which", lambda name: None)
    assert testbed.unavailable() == "the cluster testbed needs `ip` and `tc` (iproute2; apt-get install iproute2)"
    with pytest.raises(testbed.TestbedError, match="needs `ip` and `tc`"):
        testbed.Testbed(2).up()


def test_starts_shapes_and_tears_down(need_testbed):
    before = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    with testbed.Testbed(3, "100mbit") as tb:
        assert sorted(_ours(os.getpid())) == sorted([tb.switch, *tb.nodes])
        for i, ns in enumerate(tb.nodes):
            addr = subprocess.run(["ip", "-n", ns, "-o", "-4", "addr", "show", testbed.NODE_IF],
                                  capture_output=True, text=True).stdout
            assert f"inet {tb.address(i)}/24" in addr and tb.address(i).startswith("10.213.0.")
            routes = subprocess.run(["ip", "-n", ns, "route"], capture_output=True, text=True).stdout
            assert "default" not in routes and routes.strip() == \
                f"10.213.0.0/24 dev {testbed.NODE_IF} proto kernel scope link src {tb.address(i)}"
            for where, dev in ((ns, testbed.NODE_IF), (tb.switch, f"aiacc-p{i}")):  # both directions shaped
                q = subprocess.run(["tc", "-n", where, "qdisc", "show", "dev", dev], capture_output=True, text=True)
                assert "tbf" in q.stdout and "rate 100Mbit" in q.stdout, q.stdout
        # node 2 reaches node 0 over the bridge; nothing else is reachable
        probe = ("import socket, sys\n"
                 "s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5); print('CONNECTED')")
        server = tb.popen(0, [sys.executable, "-c", "import socket; s = socket.socket(); s.bind(('10.213.0.1', 29611));"
                                                    " s.listen(1); c, a = s.accept(); print(a[0])"])
        time.sleep(0.5)
        res = tb.exec(2, [sys.executable, "-c", probe, tb.address(0), "29611"])
        assert "CONNECTED" in res.stdout, res.stderr
        assert server.communicate(timeout=10)[0].strip() == tb.address(2)
        # an address outside the testbed (TEST-NET-1): no route, refused before any packet is sent
        out = tb.exec(1, [sys.executable, "-c", probe, "192.0.2.1", "53"])
        assert out.returncode != 0 and "Network is unreachable" in out.stderr, out
        c = tb.counters(2)
        assert c["tx_bytes"] > 0 and c["rx_bytes"] > 0
    assert _ours(os.getpid()) == []
    assert not any(os.path.exists(os.path.join(testbed.ETC_NETNS, ns)) for ns in [tb.switch, *tb.nodes])
    after = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert "aiacc" not in after and len(after.splitlines()) == len(before.splitlines())


def test_latency_is_refused_where_the_kernel_has_no_netem(need_testbed):
    if testbed.has_netem():
        pytest.skip("this kernel has netem: latency can be added")
    with pytest.raises(testbed.TestbedError, match="no netem"):
        with testbed.Testbed(2, "100mbit", delay_ms=5):
            pass
    assert _ours(os.getpid()) == []


OWNER = """
import sys, time
from aiacc.distributed.testbed import Testbed
with Testbed(2, "100mbit") as tb:
    print("UP", flush=True)
    tb.run(["-c", "import time; time.sleep(120)"], launcher="env", timeout=300)
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_torn_down_on_ctrl_c_sigterm_and_crash(need_testbed, sig):
    p = subprocess.Popen([sys.executable, "-c", OWNER], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": ROOT})
    try:
        assert p.stdout.readline().strip() == "UP"
        deadline = time.monotonic() + 30
        while len([ns for ns in _ours(p.pid)]) < 3 or not any(
                subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.strip()
                for ns in _ours(p.pid)):
            assert time.monotonic() < deadline, "the sleepers never started"
            time.sleep(0.1)
        sleepers = [int(x) for ns in _ours(p.pid) for x in
                    subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()]
        p.send_signal(sig)
        try:
            # generous: after a suite's many namespaces the kernel's netns cleanup (a kworker) can hold the
            # killed owner in an uninterruptible wait for tens of seconds (seen twice in full-suite runs)
            p.wait(timeout=150)
        except subprocess.TimeoutExpired:
            status = open(f"/proc/{p.pid}/status").read().split("\n")[2]
            wchan = open(f"/proc/{p.pid}/wchan").read()
            raise AssertionError(f"the testbed owner did not end after {sig!r}: {status}, waiting in {wchan}")
    finally:
        if p.poll() is None:
            p.kill()
    if sig == signal.SIGKILL:  # a crash leaves the namespaces; the next testbed (or `aiacc cluster cleanup`) goes
        assert len(_ours(p.pid)) == 3
        removed = testbed.cleanup_leftovers()
        assert sorted(removed) == sorted(_ours(p.pid)) or _ours(p.pid) == []
    assert _ours(p.pid) == []
    time.sleep(0.2)
    for pid in sleepers:  # the commands that ran in the nodes are gone too
        assert not os.path.exists(f"/proc/{pid}") or "zombie" in open(f"/proc/{pid}/status").read().lower()


def test_cli_runs_a_command_on_every_node_with_the_torchrun_environment(need_testbed):
    cmd = [sys.executable, "-m", "aiacc.cli", "cluster", "run", "--nodes", "3", "--rate", "1gbit", "--launcher", "env",
           "--nproc-per-node", "2", "--no-python", "--", "sh", "-c",
           "echo RANK=$RANK WORLD=$WORLD_SIZE LOCAL=$LOCAL_RANK NODE=$GROUP_RANK MASTER=$MASTER_ADDR:$MASTER_PORT"]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": ROOT})
    assert res.returncode == 0, res.stderr
    lines = sorted(line for line in res.stdout.splitlines() if line.startswith("RANK="))
    assert lines == sorted(f"RANK={n * 2 + l} WORLD=6 LOCAL={l} NODE={n} MASTER=10.213.0.1:29500"
                           for n in range(3) for l in range(2)), res.stdout
    res = subprocess.run([sys.executable, "-m", "aiacc.cli", "cluster", "check"], cwd=ROOT, capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": ROOT})
    assert res.returncode == 0 and len(res.stdout.strip().splitlines()) == 1


def test_cli_says_why_it_cannot_run():
    reason = testbed.unavailable()
    if reason is None:
        pytest.skip("the testbed can run here")
    res = subprocess.run([sys.executable, "-m", "aiacc.cli", "cluster", "run", "--", "x.py"], cwd=ROOT,
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ROOT})
    assert res.returncode == 2 and res.stdout.strip() == f"aiacc cluster: {reason}"


AFFINITY = "import os; print('CPUS', os.environ['RANK'], sorted(os.sched_getaffinity(0)))"


def test_cpus_pin_each_node_to_its_own_core(need_testbed, tmp_path):
    script = tmp_path / "affinity.py"
    script.write_text(AFFINITY)
    allowed = sorted(os.sched_getaffinity(0))
    with testbed.Testbed(2, "1gbit") as tb:
        assert tb.cpu_sets(None) == [None, None]
        assert tb.cpu_sets("auto") == [{allowed[0]}, {allowed[1 % len(allowed)]}]
        assert tb.cpu_sets([allowed[-1]]) == [{allowed[-1]}, {allowed[-1]}]  # a shorter list is cycled
        with pytest.raises(testbed.TestbedError, match="node 0: cores \\[4096\\] are not all usable"):
            tb.cpu_sets([4096])
        with pytest.raises(testbed.TestbedError, match="expected 'auto'"):
            tb.cpu_sets("all")
        for launcher in ("env", "torchrun"):  # torchrun's workers inherit the agent's affinity
            res = tb.run([str(script)], launcher=launcher, cpus="auto", timeout=90)
            lines = sorted(line for r in res for line in r.stdout.splitlines() if line.startswith("CPUS"))
            assert lines == [f"CPUS {i} {[allowed[i % len(allowed)]]}" for i in range(2)], (launcher, res)
        res = tb.run(["-c", AFFINITY], launcher="env", timeout=60)  # not pinned: every core
        assert sorted(line for r in res for line in r.stdout.splitlines() if line.startswith("CPUS")) == \
            [f"CPUS {i} {allowed}" for i in range(2)]


def test_cli_cpus_option(need_testbed):
    cmd = [sys.executable, "-m", "aiacc.cli", "cluster", "run", "--nodes", "2", "--launcher", "env", "--no-python",
           "--cpus", "0,0", "--", sys.executable, "-c", AFFINITY]
    if 0 not in os.sched_getaffinity(0):
        pytest.skip("core 0 is not usable by this process")
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": ROOT})
    assert res.returncode == 0, res.stderr
    assert sorted(line for line in res.stdout.splitlines() if line.startswith("CPUS")) == ["CPUS 0 [0]", "CPUS 1 [0]"]
    res = subprocess.run([*cmd[:-4], "--cpus", "x", "--", "true"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTHONPATH": ROOT})
    assert res.returncode == 2 and "--cpus 'x': expected 'auto'" in res.stdout, res.stdout + res.stderr
