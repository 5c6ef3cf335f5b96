"""An emulated multi-node cluster on one machine: the project's stand-in for a cluster of machines.

    with Testbed(nodes=2, rate="100mbit") as tb:
        results = tb.run(["train.py", "--epochs", "1"])          # torchrun on every node
    aiacc cluster run --nodes 2 --rate 100mbit -- train.py --epochs 1

Each *node* is a Linux network namespace with one interface, `aiacc-eth`, the end of a veth pair whose other
end is a port of a bridge. The bridge lives in a namespace of its own (the *switch*), so nothing of the
testbed is in the machine's own network: no address, no route, no uplink. Node i has the address
10.213.0.<i+1> of the private network 10.213.0.0/24 (`SUBNET`); node 0 is the rendezvous endpoint.
The testbed uses only those addresses, inside the namespaces it created, and a packet cannot leave them.

Links: `tc qdisc ... tbf rate R` on both ends of every veth (what a node sends and what it receives are
each limited to R), so a node's link is a full-duplex link of bandwidth R. Latency cannot be added on this
kernel: it has no `netem` qdisc (`Specified qdisc kind is unknown`); `delay_ms` tries netem and says so
where it is missing. (tbf's own `latency` bounds the queueing delay; it adds none.)

A command runs on every node with the environment of a torchrun job: by default
`python -m torch.distributed.run --nnodes N --node-rank i --nproc-per-node P --rdzv-endpoint 10.213.0.1:29500`
(torchrun's static rendezvous), or with `launcher="env"` the RANK / WORLD_SIZE / LOCAL_RANK /
LOCAL_WORLD_SIZE / MASTER_ADDR / MASTER_PORT that torchrun would give each process, set directly (one
process per rank, no agent). GLOO_SOCKET_IFNAME (and NCCL_SOCKET_IFNAME) name the node's interface.

On real machines the same script runs unchanged: on machine i, with node 0 reachable at HOST,

    torchrun --nnodes N --node-rank i --nproc-per-node P --rdzv-endpoint HOST:29500 train.py ...

(set GLOO_SOCKET_IFNAME to the interface that reaches the other machines if it is not the default one).

The nodes share this machine's cores. `run(..., cpus="auto")` (`aiacc cluster run --cpus auto`) pins each
node's processes to a core of its own (sched_setaffinity in the child before exec; inherited by what it
starts), so that two "machines" do not steal each other's CPU; with more nodes than cores they share.

Everything the testbed creates is named with the prefix `aiacc-<pid of its owner>-`, and is torn down on
exit of the `with` block, on Ctrl-C, on SIGTERM (while the block runs in the main thread) and at interpreter
exit; what a crash (SIGKILL) left behind is removed the next time a testbed starts (`cleanup_leftovers`:
namespaces of this prefix whose owner process is gone, and the processes still inside them) or by
`aiacc cluster cleanup`. Needs Linux, root and `ip`/`tc` (iproute2): `unavailable()` says in one line why
the testbed cannot run here, or returns None. Torch-free.
"""
from __future__ import annotations

import argparse
import atexit
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from typing import Sequence

from aiacc.errors import AiaccError

SUBNET = "10.213.0.0/24"
_NET = "10.213.0."
PREFIX = "aiacc-"
NODE_IF = "aiacc-eth"
BRIDGE = "aiacc-br"
MASTER_PORT = 29500
ETC_NETNS = "/etc/netns"  # `ip netns exec NS` shows /etc/netns/NS/{hosts,resolv.conf} as /etc/{hosts,resolv.conf}
MAX_NODES = 250
_OWNED = re.compile(r"^aiacc-(\d+)-")
_RATE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|tbit)$", re.IGNORECASE)
_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}
_counter = 0
_lock = threading.Lock()
_reason: list[str | None] = []  # cached result of unavailable()
_netem: list[bool] = []  # whether the kernel has netem (found by unavailable()'s probe)


class TestbedError(AiaccError):
    """The emulated cluster cannot be set up here, or one of its commands failed."""

    __test__ = False  # not a pytest test class


def _cmd(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    res = subprocess.run(list(argv), capture_output=True, text=True)
    if check and res.returncode != 0:
        raise TestbedError(f"`{' '.join(argv)}` failed: {(res.stderr or res.stdout).strip()}")
    return res


def unavailable() -> str | None:
    """Why the testbed cannot run on this machine, in one line; None if it can (checked once)."""
    if _reason:
        return _reason[0]
    reason = None
    if not sys.platform.startswith("linux"):
        reason = f"the cluster testbed needs Linux network namespaces (this is {sys.platform})"
    elif os.geteuid() != 0:
        reason = "the cluster testbed needs root (it creates network namespaces and sets tc qdiscs)"
    elif not (shutil.which("ip") and shutil.which("tc")):
        reason = "the cluster testbed needs `ip` and `tc` (iproute2; apt-get install iproute2)"
    else:
        probe = f"{PREFIX}{os.getpid()}-probe"
        res = _cmd("ip", "netns", "add", probe, check=False)
        if res.returncode != 0:
            reason = f"the cluster testbed cannot create network namespaces here: {res.stderr.strip()}"
        else:
            try:
                netem = _cmd("tc", "-n", probe, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms",
                             check=False)
                _netem.append(netem.returncode == 0)
                tbf = _cmd("tc", "-n", probe, "qdisc", "replace", "dev", "lo", "root", "tbf", "rate", "1mbit",
                           "burst", "32kb", "latency", "50ms", check=False)
                if tbf.returncode != 0:
                    reason = f"the cluster testbed needs the tbf qdisc (sch_tbf): {tbf.stderr.strip()}"
            finally:
                _cmd("ip", "netns", "del", probe, check=False)
    _reason.append(reason)
    return reason


def has_netem() -> bool:
    """Whether links can be given latency here (the kernel has the netem qdisc)."""
    return unavailable() is None and bool(_netem and _netem[0])


def parse_rate(rate: str | int | float) -> tuple[str, float]:
    """(tc's spelling, bits per second) of a link rate: "100mbit", "1gbit", or a number of Mbit/s."""
    if isinstance(rate, (int, float)):
        rate = f"{rate:g}mbit"
    m = _RATE.match(str(rate).strip())
    if not m:
        raise TestbedError(f"link rate {rate!r}: expected a number and one of bit/kbit/mbit/gbit/tbit, "
                           f"e.g. 100mbit or 10gbit")
    bits = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if bits <= 0:
        raise TestbedError(f"link rate {rate!r} must be positive")
    return f"{m.group(1)}{m.group(2).lower()}", bits


def _namespaces() -> list[str]:
    res = _cmd("ip", "netns", "list", check=False)
    return [line.split()[0] for line in res.stdout.splitlines() if line.strip()]


def _kill_inside(ns: str) -> None:
    """SIGKILL every process in namespace `ns` (only the testbed's own commands ever enter it)."""
    res = _cmd("ip", "netns", "pids", ns, check=False)
    for pid in res.stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, PermissionError, ValueError):
            pass


def _remove(ns: str) -> None:
    _kill_inside(ns)
    _cmd("ip", "netns", "del", ns, check=False)  # its veth ends (and their peers), bridge and qdiscs go too
    shutil.rmtree(os.path.join(ETC_NETNS, ns), ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cleanup_leftovers(force: bool = False) -> list[str]:
    """Remove the namespaces (and the processes in them) of testbeds whose owner process is gone: what a
    crash left behind. `force` removes every testbed namespace, running ones included. Returns the names."""
    removed = []
    for ns in _namespaces():
        m = _OWNED.match(ns)
        if m and (force or (int(m.group(1)) != os.getpid() and not _alive(int(m.group(1))))):
            _remove(ns)
            removed.append(ns)
    return removed


class Testbed:
    """N nodes (network namespaces) joined by a switch, each link shaped to `rate`; a context manager.

    rate: per link and direction, tc's syntax ("100mbit", "1gbit", "10gbit") or a number of Mbit/s; None
    leaves the links unshaped. delay_ms: one-way delay added per link; needs netem, which this kernel lacks
    (TestbedError then). burst: tbf's bucket in bytes (default: 10 ms at the rate, at least 64 KiB).
    """

    __test__ = False  # not a pytest test class

    def __init__(self, nodes: int = 2, rate: str | int | float | None = "1gbit", *, delay_ms: float = 0.0,
                 burst: int | None = None):
        global _counter
        if not 1 <= nodes <= MAX_NODES:
            raise TestbedError(f"nodes must be between 1 and {MAX_NODES}, got {nodes}")
        self.n = nodes
        self.rate = None if rate is None else parse_rate(rate)
        self.delay_ms = float(delay_ms)
        self.burst = burst
        with _lock:
            _counter += 1
            seq = _counter
        base = f"{PREFIX}{os.getpid()}-{seq}"
        self.switch = f"{base}-sw"
        self.nodes = [f"{base}-n{i}" for i in range(nodes)]
        self.created: list[str] = []
        self._procs: list[subprocess.Popen] = []
        self._old_sigterm = None
        self._registered = False

    # -- life cycle --------------------------------------------------------------------------------

    def __enter__(self) -> "Testbed":
        self.up()
        if threading.current_thread() is threading.main_thread() \
                and signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            self._old_sigterm = signal.signal(signal.SIGTERM, _sigterm_to_exit)
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.down()
        finally:
            if self._old_sigterm is not None:
                signal.signal(signal.SIGTERM, self._old_sigterm)
                self._old_sigterm = None

    def up(self) -> "Testbed":
        """Create the switch, the nodes and their shaped links (leftovers of crashed testbeds go first)."""
        reason = unavailable()
        if reason:
            raise TestbedError(reason)
        cleanup_leftovers()
        atexit.register(self.down)
        self._registered = True
        try:
            self._add_ns(self.switch)
            _cmd("ip", "-n", self.switch, "link", "add", BRIDGE, "type", "bridge")
            _cmd("ip", "-n", self.switch, "link", "set", BRIDGE, "up")
            for i, ns in enumerate(self.nodes):
                self._add_ns(ns)
                port = f"aiacc-p{i}"
                # both ends are created straight in their namespaces: nothing appears in the host's network
                _cmd("ip", "-n", self.switch, "link", "add", port, "type", "veth", "peer", "name", NODE_IF,
                     "netns", ns)
                _cmd("ip", "-n", self.switch, "link", "set", port, "master", BRIDGE, "up")
                _cmd("ip", "-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", NODE_IF)
                _cmd("ip", "-n", ns, "link", "set", NODE_IF, "up")
                _cmd("ip", "-n", ns, "link", "set", "lo", "up")
                self._shape(ns, NODE_IF)  # what the node sends
                self._shape(self.switch, port)  # what it receives
            self._write_etc()
        except BaseException:
            self.down()
            raise
        return self

    def _write_etc(self) -> None:
        """Each node resolves the node names (aiacc-node<i>) and its peers' addresses from its own hosts
        file, and has no DNS server: a name lookup (torch's c10d does reverse ones) never leaves the node."""
        hosts = "127.0.0.1 localhost\n::1 localhost\n" + "".join(
            f"{self.address(i)} aiacc-node{i}\n::ffff:{self.address(i)} aiacc-node{i}\n" for i in range(self.n))
        for ns in self.nodes:
            d = os.path.join(ETC_NETNS, ns)
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, "hosts"), "w") as f:
                f.write(hosts)
            with open(os.path.join(d, "resolv.conf"), "w") as f:
                f.write("# aiacc testbed node: no DNS\n")

    def _add_ns(self, ns: str) -> None:
        _cmd("ip", "netns", "add", ns)
        self.created.append(ns)

    def _shape(self, ns: str, dev: str) -> None:
        if self.delay_ms:
            res = _cmd("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "handle", "1:", "netem", "delay",
                       f"{self.delay_ms:g}ms", check=False)
            if res.returncode != 0:
                raise TestbedError(f"cannot add {self.delay_ms:g} ms of latency: this kernel has no netem qdisc "
                                   f"({res.stderr.strip()}); use delay_ms=0 (bandwidth only)")
        if self.rate is None:
            return
        spelled, bits = self.rate
        burst = self.burst or max(64 * 1024, int(bits / 8 / 100))
        where = ["parent", "1:"] if self.delay_ms else ["root"]
        _cmd("tc", "-n", ns, "qdisc", "add", "dev", dev, *where, "tbf", "rate", spelled, "burst", str(burst),
             "latency", "100ms")

    def down(self) -> None:
        """Kill every process in the nodes and delete the namespaces (links, bridge and qdiscs with them).
        Safe to call more than once."""
        for p in self._procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        self._procs = []
        for ns in reversed(self.created):
            _remove(ns)
        if self.created:
            try:
                os.rmdir(ETC_NETNS)  # only when empty: other users' entries stay
            except OSError:
                pass
        self.created = []
        if self._registered:
            self._registered = False
            atexit.unregister(self.down)

    # -- nodes -------------------------------------------------------------------------------------

    def address(self, i: int) -> str:
        """Node i's address (10.213.0.<i+1>)."""
        if not 0 <= i < self.n:
            raise TestbedError(f"no node {i} in a testbed of {self.n}")
        return f"{_NET}{i + 1}"

    def cpu_sets(self, cpus: str | Sequence[int | Sequence[int]] | None) -> list[set[int] | None]:
        """The cores each node's processes are pinned to: None (not pinned), "auto" (node i gets the i-th
        core this process may use, cycling when there are more nodes than cores), or one entry per node
        (a core or a list of cores; a shorter list is cycled)."""
        if cpus is None:
            return [None] * self.n
        allowed = sorted(os.sched_getaffinity(0))
        if isinstance(cpus, str):
            if cpus != "auto":
                raise TestbedError(f"cpus={cpus!r}: expected 'auto', or one core (or list of cores) per node")
            return [{allowed[i % len(allowed)]} for i in range(self.n)]
        entries = list(cpus)
        if not entries:
            raise TestbedError("cpus=[]: give at least one core")
        out = []
        for i in range(self.n):
            e = entries[i % len(entries)]
            cores = {int(e)} if isinstance(e, int) else {int(c) for c in e}
            bad = sorted(cores - set(allowed))
            if not cores or bad:
                raise TestbedError(f"node {i}: cores {sorted(cores)} are not all usable here "
                                   f"(this process may run on {allowed})")
            out.append(cores)
        return out

    def popen(self, i: int, argv: Sequence[str], *, env: dict[str, str] | None = None,
              capture: bool = True, cpus: set[int] | None = None) -> subprocess.Popen:
        """Start `argv` in node i (its own session, so that it can be killed with its children); `cpus`:
        pin it, and what it starts (the affinity is inherited), to these cores."""
        if not self.created:
            raise TestbedError("the testbed is not up (use it as a context manager, or call up())")
        pipe = subprocess.PIPE if capture else None
        # pinned in the child before exec: no window in which it (or a worker it forks) runs elsewhere
        pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
        p = subprocess.Popen(["ip", "netns", "exec", self.nodes[i], *argv], env=env, stdout=pipe, stderr=pipe,
                             text=True, start_new_session=True, preexec_fn=pin)
        self._procs.append(p)
        return p

    def exec(self, i: int, argv: Sequence[str], timeout: float = 60.0) -> subprocess.CompletedProcess:
        """Run `argv` in node i and wait for it (output captured)."""
        from aiacc.distributed.launch import wait_all

        return wait_all([self.popen(i, argv)], timeout)[0]

    def counters(self, i: int) -> dict[str, int]:
        """Bytes and packets node i's interface has sent and received so far (the kernel's counters)."""
        res = _cmd("ip", "-n", self.nodes[i], "-s", "-j", "link", "show", NODE_IF)
        stats = json.loads(res.stdout)[0]["stats64"]
        return {"tx_bytes": stats["tx"]["bytes"], "rx_bytes": stats["rx"]["bytes"],
                "tx_packets": stats["tx"]["packets"], "rx_packets": stats["rx"]["packets"]}

    def node_env(self, i: int, local_rank: int | None = None, nproc_per_node: int = 1,
                 env: dict[str, str] | None = None) -> dict[str, str]:
        """The environment of a process on node i: ours plus `env`, the node's interface for gloo/NCCL,
        and, given `local_rank`, the variables torchrun sets for that rank."""
        e = dict(os.environ)
        e.update(env or {})
        e.update(GLOO_SOCKET_IFNAME=NODE_IF, NCCL_SOCKET_IFNAME=NODE_IF, AIACC_TESTBED_NODE=str(i),
                 OMP_NUM_THREADS=e.get("OMP_NUM_THREADS", "1"))
        if local_rank is not None:
            e.update(RANK=str(i * nproc_per_node + local_rank), LOCAL_RANK=str(local_rank),
                     WORLD_SIZE=str(self.n * nproc_per_node), LOCAL_WORLD_SIZE=str(nproc_per_node),
                     GROUP_RANK=str(i), NODE_RANK=str(i), MASTER_ADDR=self.address(0), MASTER_PORT=str(MASTER_PORT))
        return e

    def torchrun_argv(self, i: int, argv: Sequence[str], nproc_per_node: int = 1, python: bool = True) -> list[str]:
        """The torchrun command line of node i (static rendezvous at node 0, no restarts)."""
        return [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(self.n), "--node-rank", str(i),
                "--nproc-per-node", str(nproc_per_node), "--rdzv-endpoint", f"{self.address(0)}:{MASTER_PORT}",
                "--max-restarts", "0", *([] if python else ["--no-python"]), *argv]

    def run(self, argv: Sequence[str], *, nproc_per_node: int = 1, launcher: str = "torchrun",
            timeout: float = 120.0, env: dict[str, str] | None = None, capture: bool = True,
            python: bool = True, fail_grace: float | None = 10.0,
            cpus: str | Sequence[int | Sequence[int]] | None = None) -> list[subprocess.CompletedProcess]:
        """Run `python argv...` (the script and its arguments; `python=False`: argv is the command) on every
        node as one job and wait. launcher "torchrun": one torchrun agent per node, results one per node;
        "env": the ranks themselves, results one per rank (rank order). Processes still running after
        `timeout` seconds are killed and reported with returncode None (`.killed`); each result has `.node`.

        Once a node's command failed, the others get `fail_grace` seconds to finish, then are killed (as a
        cluster scheduler would end the job): a torchrun agent whose workers succeeded otherwise waits
        300 s at its exit barrier for the agent that failed. None: wait for all, up to `timeout`.

        cpus: pin each node's processes (torchrun's agent and its workers, or the ranks) to cores of their
        own, as on separate machines: "auto" (node i on the i-th usable core) or one core (list) per node;
        see `cpu_sets`. None: not pinned."""
        from aiacc.distributed.launch import wait_all

        sets = self.cpu_sets(cpus)
        if launcher not in ("torchrun", "env"):
            raise TestbedError(f"launcher {launcher!r}: expected 'torchrun' or 'env'")
        procs, nodes = [], []
        try:
            for i in range(self.n):
                if launcher == "torchrun":
                    procs.append(self.popen(i, self.torchrun_argv(i, argv, nproc_per_node, python),
                                            env=self.node_env(i, env=env), capture=capture, cpus=sets[i]))
                    nodes.append(i)
                    continue
                for lr in range(nproc_per_node):
                    cmd = [sys.executable, *argv] if python else list(argv)
                    procs.append(self.popen(i, cmd, env=self.node_env(i, lr, nproc_per_node, env), capture=capture,
                                            cpus=sets[i]))
                    nodes.append(i)
            results = wait_all(procs, timeout, fail_grace)
        finally:
            for p in procs:  # whatever happened, nothing of this job outlives run()
                if p.poll() is None:
                    try:
                        os.killpg(p.pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
                    p.wait()
            for ns in self.nodes:  # workers torchrun started in sessions of their own
                _kill_inside(ns)
        for r, i in zip(results, nodes):
            r.node = i
        return results


def _sigterm_to_exit(signum, frame):
    raise SystemExit(128 + signum)


# -- command line: aiacc cluster ... ----------------------------------------------------------------

def add_cli(subparsers) -> None:
    """Add `aiacc cluster {run,check,cleanup}` to the `aiacc` command line's subparsers."""
    p = subparsers.add_parser("cluster", help="an emulated multi-node cluster on this machine (network namespaces "
                                              "and tc): run a torchrun job on N nodes over shaped links",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cluster_command", required=True)
    r = sub.add_parser("run", help="run `python SCRIPT ARGS...` on every node as one job (torchrun per node)")
    r.add_argument("--nodes", type=int, default=2)
    r.add_argument("--rate", default="1gbit", help="link bandwidth per direction, e.g. 100mbit, 1gbit, 10gbit; "
                                                   "'none': unshaped (default 1gbit)")
    r.add_argument("--nproc-per-node", type=int, default=1)
    r.add_argument("--launcher", choices=("torchrun", "env"), default="torchrun",
                   help="torchrun agents (default) or the ranks started directly with torchrun's environment")
    r.add_argument("--timeout", type=float, default=3600.0, help="seconds before the job is killed")
    r.add_argument("--fail-grace", type=float, default=10.0,
                   help="once a node failed, seconds the others get before they are killed (default 10)")
    r.add_argument("--delay-ms", type=float, default=0.0, help="one-way link latency (needs netem, absent here)")
    r.add_argument("--no-python", action="store_true", help="SCRIPT is a command, not a python script")
    r.add_argument("--cpus", default=None, help="pin each node's processes to cores: 'auto' (node i on the i-th "
                                                "core) or a comma-separated core per node, e.g. 0,1 (default: "
                                                "not pinned)")
    r.add_argument("script")
    r.add_argument("args", nargs=argparse.REMAINDER)
    sub.add_parser("check", help="say whether the testbed can run here (and why not)")
    c = sub.add_parser("cleanup", help="remove what crashed testbeds left (namespaces and their processes)")
    c.add_argument("--force", action="store_true", help="also remove testbeds that are still running")
    p.set_defaults(fn=main)


def _cli_cpus(text: str | None):
    """--cpus: None, "auto", or "0,1" (one core per node)."""
    if text is None or text == "auto":
        return text
    try:
        return [int(c) for c in text.split(",")]
    except ValueError:
        raise TestbedError(f"--cpus {text!r}: expected 'auto' or comma-separated core numbers, e.g. 0,1") from None


def main(args) -> int:
    """`aiacc cluster ...`: returns the exit status."""
    if args.cluster_command == "check":
        reason = unavailable()
        latency = "netem latency" if has_netem() else "no netem here, so no latency"
        print(f"aiacc cluster: {reason}" if reason else
              f"aiacc cluster: the testbed can run here (nodes on {SUBNET}, tbf bandwidth, {latency})")
        return 2 if reason else 0
    if args.cluster_command == "cleanup":
        reason = unavailable()
        if reason:
            print(f"aiacc cluster: {reason}")
            return 2
        removed = cleanup_leftovers(force=args.force)
        print(f"aiacc cluster: removed {len(removed)} namespace(s){': ' + ', '.join(removed) if removed else ''}")
        return 0
    reason = unavailable()
    if reason:
        print(f"aiacc cluster: {reason}")
        return 2
    rate = None if str(args.rate).lower() == "none" else args.rate
    try:
        cpus = _cli_cpus(args.cpus)
    except TestbedError as e:
        print(f"aiacc cluster: {e}")
        return 2
    try:
        with Testbed(args.nodes, rate, delay_ms=args.delay_ms) as tb:
            print(f"aiacc cluster: {tb.n} nodes {', '.join(tb.address(i) for i in range(tb.n))} "
                  f"(endpoint {tb.address(0)}:{MASTER_PORT}), links {rate or 'unshaped'}", flush=True)
            res = tb.run([args.script, *args.args], nproc_per_node=args.nproc_per_node, launcher=args.launcher,
                         timeout=args.timeout, capture=False, python=not args.no_python,
                         fail_grace=args.fail_grace, cpus=cpus)
    except KeyboardInterrupt:
        print("aiacc cluster: interrupted; the job was killed and the testbed torn down", file=sys.stderr)
        return 130
    codes = [r.returncode for r in res]
    bad = [c for c in codes if c not in (0, None)]
    if bad:
        return bad[0]
    if any(c is None for c in codes):
        print(f"aiacc cluster: killed after {args.timeout:g} s", file=sys.stderr)
        return 124
    return 0
