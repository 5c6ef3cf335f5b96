"""Data-parallel training on an emulated multi-node network: aiacc's engine against DDP and Horovod-style
reduction, candidates interleaved in the same processes.

Setup: `aiacc.distributed.testbed`, 2 nodes (network namespaces) x 1 rank, each node pinned to its own
core (`cpus="auto"`), links shaped by tc tbf to 100 Mbit/s, 1 Gbit/s and 10 Gbit/s; gloo over the links.
Models (aiacc.zoo): a ResNet-style CNN (BasicBlock [1,1,1,1], base 48, 64x64 images, batch 32 per rank,
2.8 M parameters) and a BERT-style encoder (3 layers, hidden 256, seq 64, batch 8 per rank, 3.5 M
parameters); one rank's step is 100-400 ms on one core.

Candidates, every round each one step in turn (rotating who goes first), a barrier before each step:
    1 rank, no comm   the same step without communication (scaling efficiency = its step / a candidate's)
    after backward    one all-reduce per gradient after backward (no overlap)
    DDP 25 MB         torch DistributedDataParallel, defaults (25 MB buckets, 1 MB first bucket)
    DDP best          DDP with the best bucket size of a short interleaved sweep (1, 5, 50 MB; bucket_cap_mb given,
                      torch 2.x caps the first bucket at that size too, and the simulator plans it so)
    Horovod 64 MB     gradients fused into 64 MB buffers after backward (Horovod's fusion threshold)
    DDP fp16 hook     DDP with its fp16_compress_hook
    aiacc / aiacc fp16  aiacc's DistributedOptimizer (its plan, fp32 / fp16 on the wire) with forward_module
                      and overlap_forward="auto": the planner's measured choice between one synchronize
                      before step() and per-layer waits in the next forward (each layer's update waits only
                      for its own buckets: communication overlaps the next forward too); "per-layer" in the
                      buckets column where it chose those; "DDP layout" where its plan was not predicted
                      clearly faster (planning.DDP_DEFAULT_MARGIN) than DDP's default layout, which then runs
    aiacc step-sync   aiacc's plan without forward_module (what a Horovod user's code gets unchanged)
    aiacc per-layer   (--per-layer) per-layer waits whatever the prediction (overlap_forward=True)
    aiacc engine, DDP N MB plan  (--same-plan) aiacc's engine running DDP's own bucketing (N = 25 and the sweep's
                      best; gradients in the order backward makes them ready, the order DDP rebuilds its buckets
                      in), step-synchronized: against "DDP N MB", the engine's overhead apart from the plan

Each candidate runs `--block` consecutive steps per round, timed up to the end of its deferred work.
The predicted step and the lower bound are those of such a block (per step): with per-layer waits its
first forward overlaps nothing and its last update waits for every all-reduce, so a block of n steps is
n - 1 steady iterations and one of a step-synchronized one (aiacc.core.comm.lower_bound's sync="step"),
for the simulator and for the bound of any plan alike. With --block >= 3 the "steady" columns also give
the start-to-start time of a block's steps after its first (what long training runs at) against the
simulator's steady iteration and the bound of one.

Columns: buckets of the candidate's plan; median step; throughput relative to DDP 25 MB (of the medians, and
"paired": the median over rounds of the ratio of the two candidates' blocks in the same round); scaling efficiency;
the simulator's predicted step for the candidate's plan on the same measured costs (per-layer compute from
profiling, scaled to the slowest rank's step without communication in this run; all-reduce times
interpolated between `aiacc.distributed.planning.calibrate`'s medians at 8 sizes, 64 B to 16 MB, of all-reduces
started back to back asynchronously as the engine and DDP queue their buckets (fp16 rows: its float16 medians,
512 B to 8 MB; "after backward" and "Horovod 64 MB", loops of blocking calls: its mean times of blocking calls
of the sizes up to 1 MB issued in turn, `planning.loop_samples`; a bucket sent alone, the network idle before it
and nothing queued behind it, also its lone all-reduce's excess over the queued one, from 1 MB up:
ClusterSpec.allreduce_samples_alone); each candidate's compute also carries its
bucketing passes over the gradients outside the all-reduce (3 per gradient, "after backward" 1: `host_passes`, at
`planning.host_cost`'s seconds per byte); the measured contention of compute and communication: `planning.probe_contention`, the model's own forward +
backward beside a stream of 1 MB all-reduces, pooled (median) with the estimates of the aiacc candidates' own
profiled steps, GradientScheduler's profile_contention, whose plans are chosen robustly over the pooled range);
the lower bound of any plan on those costs (meas/LB: with the
measured contention, `lower_bound(contention=True)`: compute and transport share the core, so the CPU that the
in-flight all-reduces take is compute that no plan gets back; meas/LB0: the bound without contention, which
every row on a shared core stays above by that CPU); the largest
parameter difference from DDP 25 MB after the run (same data, seeds and steps: a check that each candidate
really reduced the gradients). The 2 cores of this machine are shared with whatever else runs: numbers are
noisy, hence interleaving and medians.

    python benchmarks/dp.py                 # 3 links x 2 models
    python benchmarks/dp.py --quick         # 1 Gbit/s, few steps (a smoke test)
    python benchmarks/dp.py --loopback --models tiny --steps 2 --sweep ''   # no root: 2 ranks on loopback
    python benchmarks/dp.py --rates 100mbit --models resnet --steps 3     # each run under ~5 min
    python benchmarks/dp.py --nodes 4 --rates 1gbit --models resnet --sweep ''   # 4 nodes; on a 2-core
                                            # machine the 4 ranks share the cores (oversubscribed)
    python benchmarks/dp.py --rates 100mbit --models bert --steps 3 --timeline-steps 3   # + where the wire idles
    python benchmarks/dp.py --nodes 4 --rates 1gbit --models tiny --sweep '' --f64-check # vs a float64 reference

--timeline-steps N: after the table's run, N more steps of DDP and of each aiacc row with this node's interface
byte counters sampled every 2 ms: the bytes sent per step, the wire time they take at the link's rate, and the
wire's idle time per step split by the phase of the step (forward, backward, reduce+update; with per-layer
waits the forward includes them). --f64-check: each candidate's largest difference from a float64 reference
of the same training (and the same computation in float32 on one process): with more than 2 ranks the
all-reduce's summation order depends on the bucket layout (tests/distributed/test_sum_order.py).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MB = 1 << 20
RATES = ("100mbit", "1gbit", "10gbit")
MODELS = ("resnet", "bert")  # and "tiny" (the CI smoke's)
SWEEP_MB = (1, 5, 50)
LOCAL = "1 rank, no comm"
SLOWEST = "slowest rank, no comm"  # LOCAL's steps timed to a barrier after them (not a candidate)
STEADY = "steady: "  # + label: start-to-start time of a block's steps after its first (--block >= 3)


# -- the rank's side ---------------------------------------------------------------------------------

def build(name: str, rank: int):
    """(model, inputs of this rank, loss function) of benchmark model `name`, the same weights on every rank."""
    import torch

    from aiacc.zoo.small.torch_models import BasicBlock
    from aiacc.zoo.torch_models import BertEncoder, ResNet

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1000 + rank)
    if name == "resnet":
        model = ResNet(BasicBlock, (1, 1, 1, 1), num_classes=10, base=48)
        x = torch.randn(32, 3, 64, 64, generator=g)
        y = torch.randint(0, 10, (32,), generator=g)
        # the input in the model's dtype: float32, or float64 for the --f64-check reference
        return model, x, lambda m: torch.nn.functional.cross_entropy(m(x.to(next(m.parameters()).dtype)), y)
    if name == "tiny":  # the CI smoke's model (tests/distributed/test_dp_smoke.py): no BatchNorm, so 2 ranks
        model = BertEncoder(64, 16, 2, 1, 32, max_len=8, dropout=0.0)  # equal single-process training
        x, y = tiny_batch(rank)
        return model, x, lambda m: _mse(m(x)[1], y)
    if name == "bert":
        model = BertEncoder(4000, 256, 4, 3, 1024, max_len=64, dropout=0.0)
        x = torch.randint(0, 4000, (8, 64), generator=g)
        y = torch.randn(8, 256, generator=g)
        return model, x, lambda m: _mse(m(x)[1], y)
    raise SystemExit(f"unknown model {name!r}; expected one of {MODELS}")


def _mse(out, y):
    """The mean squared error against targets `y` in the output's dtype (float64 in the --f64-check reference)."""
    import torch

    return torch.nn.functional.mse_loss(out, y.to(out.dtype))


def float64_reference(name: str, world: int, steps: int, dtype=None) -> dict:
    """{parameter name: tensor} after `steps` steps of what every candidate computes, in float64 (or `dtype`): each
    rank's gradient on its own batch (BatchNorm statistics per rank, as in data-parallel training), the
    average of the `world` gradients, SGD with momentum. Float32 candidates differ from it by their
    rounding, including the order in which their all-reduce summed the ranks' gradients."""
    import torch

    model = build(name, 0)[0].to(dtype or torch.float64)
    losses = [build(name, r)[2] for r in range(world)]
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for _ in range(steps):
        opt.zero_grad()
        for f in losses:
            f(model).backward()  # gradients add up over the ranks' batches
        for p in model.parameters():
            p.grad.div_(world)
        opt.step()
    return {n: p.detach() for n, p in model.named_parameters()}


def tiny_batch(rank: int):
    """The tiny model's (token ids, targets) of `rank`: 4 sequences of 8 tokens."""
    import torch

    g = torch.Generator().manual_seed(1000 + rank)
    return torch.randint(0, 64, (4, 8), generator=g), torch.randn(4, 16, generator=g)


def measured_spec(model, loss_fn, reps: int):
    """Per-layer compute of one rank without communication: each of `reps` rounds profiles one backward
    pass (aiacc.plugins.torch.distributed.profile_backward: when each layer's gradients are ready) and
    then times one whole step by phase (forward, backward, update). The layers' backward times are the
    profiles' medians; the split of the step between backward and the rest (forward, optimizer update:
    spread over the layers' forward in proportion to the profiles' forward split) is the median ratio
    within the timed steps, so that the machine's load changing between the profiles and the steps (2
    shared cores) does not move compute from forward into backward (a profile slower than the steps
    left BERT with a 2 ms forward and a 128 ms backward). The total is the median timed step."""
    import torch

    from aiacc.core.comm import Layer, ModelSpec
    from aiacc.plugins.torch.distributed import profile_backward

    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    specs, steps, bwd_share = [], [], []
    for _ in range(reps):
        specs.append(profile_backward(model, loss_fn))
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = loss_fn(model)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        steps.append(t3 - t0)
        bwd_share.append((t2 - t1) / (t3 - t0))
    # layers matched by name: each profile lists them in the order its backward finished them
    by_name = [{l.name: l for l in s.layers} for s in specs]
    bwd = [statistics.median(s[l.name].backward_s for s in by_name) for l in specs[0].layers]
    total = statistics.median(steps)
    share = statistics.median(bwd_share)
    bscale = share * total / (sum(bwd) or 1.0)
    bwd = [b * bscale for b in bwd]
    fwd_total = max(1e-6, total - sum(bwd))
    weights = [statistics.median(s[l.name].forward_s for s in by_name) for l in specs[0].layers]
    scale = fwd_total / (sum(weights) or 1.0)
    return ModelSpec(specs[0].name, tuple(Layer(l.name, w * scale, b, l.grads)
                                          for l, w, b in zip(specs[0].layers, weights, bwd)))


_MARKS: list | None = None  # (phase, perf_counter) of each step's phases while wire_profile records

AFTER_BACKWARD = ("after backward", "Horovod 64 MB")  # candidates that reduce only once backward has ended


def ddp_first_bucket(module) -> int:
    """The first bucket's cap (bytes) of a DistributedDataParallel `module` as its torch builds it: its bucket
    config's where it has one (torch 2.13: 1 MB with the default cap, else the cap itself), else torch's
    default first bucket (1 MB)."""
    import torch.distributed as dist

    cfg = getattr(module, "_bucket_config", None)
    return int(getattr(cfg, "first_bucket_bytes_cap", getattr(dist, "_DEFAULT_FIRST_BUCKET_BYTES", MB)))


def host_passes(label: str) -> int:
    """Passes over each gradient that candidate `label` makes on the core outside the all-reduce itself
    (planning.host_cost): "after backward" one (its division), every other candidate that communicates
    three (DDP: copy into the bucket, divide, copy out; Horovod's fusion: concatenate, divide, copy back;
    aiacc's engine: zero the bucket view, autograd's accumulation into it, the 1/world scale)."""
    return 1 if label == "after backward" else 3


def with_host_work(spec, host_s: float):
    """`spec` with each layer's backward longer by `host_s` seconds per byte of its gradients (a candidate's
    bucketing passes, done as each gradient is ready); `spec` itself for 0."""
    from aiacc.core.comm import Layer, ModelSpec

    if host_s <= 0:
        return spec
    return ModelSpec(spec.name, tuple(Layer(l.name, l.forward_s, l.backward_s + host_s * sum(g.nbytes for g in l.grads),
                                            l.grads) for l in spec.layers))


def after_backward_plan(plan, spec):
    """`plan` with no bucket starting before the backward of `spec` has ended (the candidates that reduce
    after backward; remade for the compute measured beside the candidates, which differs from the
    profile's)."""
    from aiacc.core.comm.plan import Bucket, Plan

    return Plan(plan.strategy, tuple(Bucket(b.pieces, b.priority, spec.backward_s) for b in plan.buckets),
                plan.scheduling, plan.compression)


def candidates(name: str, rank: int, world: int, sweep: tuple[int, ...], spec, ddp_best_mb: int | None,
               only_sweep: bool = False, per_layer: bool = False, same_plan: bool = False):
    """{label: (model, step function, plan for the simulator or None, compression[, finish])}; `only_sweep`:
    just DDP at each bucket size of `sweep`; `per_layer`: also aiacc with per-layer waits forced;
    `same_plan`: also aiacc's engine on DDP's bucketing (25 MB and the sweep's best), step-synchronized."""
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    import aiacc.plugins.torch.horovod as hvd
    from aiacc.core.comm import strategies
    from aiacc.core.comm.plan import Bucket, Plan

    out = {}

    def sgd(m):
        return torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)

    def plain(model, loss_fn, opt, after=None):
        def step():
            marks = _MARKS
            if marks is not None:  # --timeline: when each phase of the step began
                marks.append(("forward", time.perf_counter()))
            opt.zero_grad()
            loss = loss_fn(model)
            if marks is not None:
                marks.append(("backward", time.perf_counter()))
            loss.backward()
            if marks is not None:
                marks.append(("reduce+update", time.perf_counter()))
            if after:
                after()
            opt.step()
        return step

    def after_backward(plan: Plan) -> Plan:  # nothing starts before backward has ended
        return after_backward_plan(plan, spec)

    def ddp(cap_mb, hook=None):
        model, _, f = build(name, rank)
        # 25 MB: DDP's defaults as its users get them (no bucket_cap_mb given): since torch 2.x an explicit
        # bucket_cap_mb also caps the first bucket at that size (torch 2.13: 1 MB only for the default), so
        # DDP(bucket_cap_mb=25) sent these models' gradients in one bucket after backward
        d = DDP(model) if cap_mb == 25 else DDP(model, bucket_cap_mb=cap_mb)
        if hook:
            d.register_comm_hook(None, hook)
        return model, plain(d, f, sgd(d)), strategies.ddp(spec, bucket_cap=cap_mb * MB,
                                                          first_bucket_cap=ddp_first_bucket(d),
                                                          compression="fp16" if hook else "none")

    if only_sweep:
        for cap in sweep:
            m, st, plan = ddp(cap)
            out[f"DDP {cap} MB (sweep)"] = (m, st, plan, "none")
        return out

    m, _, f = build(name, rank)
    out["1 rank, no comm"] = (m, plain(m, f, sgd(m)), None, "none")

    m, _, f = build(name, rank)
    params = [p for p in m.parameters()]

    def per_tensor(params=params):
        for p in reversed(params):  # backward's order
            dist.all_reduce(p.grad)
            p.grad.div_(world)
    out["after backward"] = (m, plain(m, f, sgd(m), per_tensor),
                             after_backward(strategies.per_tensor(spec)), "none")

    m, st, plan = ddp(25)
    out["DDP 25 MB"] = (m, st, plan, "none")
    if ddp_best_mb is not None:
        m, st, plan = ddp(ddp_best_mb)
        out[f"DDP best ({ddp_best_mb} MB)"] = (m, st, plan, "none")

    m, _, f = build(name, rank)
    params_h = [p for p in m.parameters()]

    def fused(params=params_h, threshold=64 * MB):
        group, size = [], 0
        groups = []
        for p in reversed(params):
            if group and size + p.grad.numel() * 4 > threshold:
                groups.append(group)
                group, size = [], 0
            group.append(p)
            size += p.grad.numel() * 4
        groups.append(group)
        for group in groups:
            flat = torch.cat([p.grad.reshape(-1) for p in group])
            dist.all_reduce(flat)
            flat.div_(world)
            off = 0
            for p in group:
                n = p.grad.numel()
                p.grad.copy_(flat[off:off + n].view_as(p.grad))
                off += n
    out["Horovod 64 MB"] = (m, plain(m, f, sgd(m), fused),
                            # one fusion cycle covering all of backward: every gradient in 64 MB buffers
                            after_backward(strategies.horovod(spec, threshold=64 * MB, cycle_s=2 * spec.backward_s + 1)),
                            "none")

    m, st, plan = ddp(25, default_hooks.fp16_compress_hook)
    out["DDP fp16 hook"] = (m, st, plan, "fp16")

    # aiacc: the planner's measured choice between one synchronize before step() and per-layer waits in the
    # next forward (forward_module, overlap_forward="auto": each layer's update, and so its forward, waits
    # only for its own buckets, so communication overlaps the next forward too); "aiacc step-sync" is what
    # a Horovod user gets without the forward_module extension
    for label, compression, fwd in (("aiacc", "none", True), ("aiacc fp16", "fp16", True),
                                    ("aiacc step-sync", "none", False)):
        m, _, f = build(name, rank)
        opt = hvd.DistributedOptimizer(sgd(m), named_parameters=m.named_parameters(), compression=compression,
                                       model_spec=spec, forward_module=m if fwd else None, overlap_forward="auto")
        # the plan it runs once its first steps have profiled contention (opt.plan then): read at report time
        out[label] = (m, plain(m, f, opt), opt.plan, compression, opt.finish_step, opt)
    if same_plan:  # aiacc's engine running DDP's own bucketing (the spec lists gradients in the order backward
        # made them ready, the order DDP rebuilds its buckets in after its first step): engine against engine
        for cap in (25,) + ((ddp_best_mb,) if ddp_best_mb not in (None, 25) else ()):
            m, _, f = build(name, rank)
            # (strategies.ddp_layout: the same layout the planner's DDP-default guard falls back to), with the
            # first bucket of the DDP row it is compared with (the cap itself where bucket_cap_mb was given)
            first = out[f"DDP {cap} MB" if cap == 25 else f"DDP best ({cap} MB)"][2].params["first_bucket_cap"]
            opt = hvd.DistributedOptimizer(sgd(m), named_parameters=m.named_parameters(), model_spec=spec,
                                           plan=strategies.ddp_layout(spec, cap, first_mb=first / MB))
            out[f"aiacc engine, DDP {cap} MB plan"] = (m, plain(m, f, opt), opt.plan, "none", opt.finish_step, opt)
    if per_layer:  # per-layer waits whatever the prediction (overlap_forward=True)
        m, _, f = build(name, rank)
        opt = hvd.DistributedOptimizer(sgd(m), named_parameters=m.named_parameters(), model_spec=spec,
                                       forward_module=m)
        out["aiacc per-layer"] = (m, plain(m, f, opt), opt.plan, "none", opt.finish_step, opt)
    return out


def interleave(cands: dict, rounds: int, warmup: int, block: int) -> dict[str, list[float]]:
    """Each candidate `block` consecutive steps per round (rotating who goes first), timed together up to
    the end of the last one's deferred work (a candidate whose update waits for the next forward pays it
    inside the block); the time per step of each block. The first `warmup` rounds are not kept."""
    import torch.distributed as dist

    names = list(cands)
    times = {n: [] for n in names}
    for i in range(rounds + warmup):
        k = i % len(names)
        for n in names[k:] + names[:k]:
            step, finish = cands[n][1], (cands[n][4] if len(cands[n]) > 4 else None)
            dist.barrier()
            t0 = time.perf_counter()
            starts = []
            for _ in range(block):
                starts.append(time.perf_counter())
                step()
            if finish:
                finish()
            dt = (time.perf_counter() - t0) / block
            if block >= 3 and i >= warmup:  # the steady state: from the 2nd step's start to the last's
                times.setdefault(STEADY + n, []).append((starts[-1] - starts[1]) / (block - 2))
            if n == LOCAL:  # the same steps, up to when the slowest rank has done them (the compute that a
                dist.barrier()  # job coupled by its all-reduces runs at, whatever loads one rank's core)
                slowest = (time.perf_counter() - t0) / block
            if i >= warmup:
                times[n].append(dt)
                if n == LOCAL:
                    times.setdefault(SLOWEST, []).append(slowest)
    return times


def _net_bytes(dev: str) -> tuple[int, int]:
    """(rx, tx) bytes of network interface `dev` so far (/proc/net/dev of this network namespace)."""
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name.strip() == dev:
                v = rest.split()
                return int(v[0]), int(v[8])
    raise SystemExit(f"benchmarks/dp.py --timeline: no interface {dev} in /proc/net/dev")


def wire_profile(cands: dict, labels: list[str], steps: int, rate_bits: float | None,
                 interval: float = 0.002, bin_s: float = 0.01) -> dict:
    """Where the wire is idle: for each candidate of `labels`, `steps` steps with this rank's interface
    counters sampled every `interval` s by a thread (bytes sent by this node: what tbf let out), the start
    of each phase of each step (forward, backward, reduce+update) and the all-reduces of aiacc's buckets
    (aiacc.distributed.timeline). Per candidate: the step, the bytes sent per step, the wire time they take at
    the link's rate, and the idle wire time per step split by the phase the step was in (a `bin_s` bin is
    idle for the part of it the link did not carry; tbf's burst can carry more than the rate in a bin
    after an idle one, so the phases' idle time can add up to a little more than the step minus the
    wire time)."""
    import threading

    import torch.distributed as dist

    from aiacc.distributed import timeline

    global _MARKS
    dev = "aiacc-eth" if os.path.exists("/proc/net/dev") and any(
        l.split(":")[0].strip() == "aiacc-eth" for l in open("/proc/net/dev")) else "lo"
    out = {}
    for label in labels:
        step, finish = cands[label][1], (cands[label][4] if len(cands[label]) > 4 else None)
        samples: list[tuple[float, int, int]] = []
        stop = threading.Event()

        def sample():
            while not stop.is_set():
                rx, tx = _net_bytes(dev)
                samples.append((time.perf_counter(), rx, tx))
                time.sleep(interval)

        dist.barrier()
        marks: list = []
        timeline.start_timeline(os.devnull)
        rec = timeline._active
        th = threading.Thread(target=sample, daemon=True)
        th.start()
        time.sleep(3 * interval)
        _MARKS = marks
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        if finish:
            finish()
        t1 = time.perf_counter()
        _MARKS = None
        time.sleep(3 * interval)
        stop.set()
        th.join()
        events = list(rec.events)
        timeline._active = None  # this rank's events only (stop_timeline would gather)
        wall_off = time.time() - time.perf_counter()
        buckets = [((e["ts"] / 1e6 - wall_off) - t0, e.get("dur", 0.0) / 1e6, e["args"]["bytes"]) for e in events]
        marks.append(("end", t1))
        # the bytes sent by each bin_s bin of the steps, from the counters interpolated at the bin edges (a
        # sample's timestamp can lag its read by a scheduling delay: bins of several samples smooth that)
        ts = [t for t, _, _ in samples]
        txs = [x for _, _, x in samples]
        edges = [t0 + k * bin_s for k in range(int((t1 - t0) / bin_s) + 1)] + [t1]
        import numpy as np

        cum = np.interp(edges, ts, txs)
        sent = float(cum[-1] - cum[0])
        phase_idle: dict[str, float] = {}
        if rate_bits:
            for lo, hi, nbytes in zip(edges, edges[1:], np.diff(cum)):
                if hi <= lo:
                    continue
                idle = max(0.0, (hi - lo) - nbytes * 8 / rate_bits)
                mid = (lo + hi) / 2
                phase = next((ph for (ph, ta), (_, tb) in zip(marks, marks[1:]) if ta <= mid < tb), "after")
                phase_idle[phase] = phase_idle.get(phase, 0.0) + idle
        step_s = (t1 - t0) / steps
        out[label] = {"step_s": step_s, "sent_per_step": sent / steps,
                      "wire_s_per_step": sent * 8 / rate_bits / steps if rate_bits else None,
                      "idle_per_step": {k: v / steps for k, v in phase_idle.items()},
                      "phases": [(ph, ts - t0) for ph, ts in marks], "buckets": buckets,
                      "samples": [(t - t0, x) for t, _, x in samples], "payload_per_step":
                      sum(b for _, _, b in buckets) / steps if buckets else None}
    return out


def worker(out: str, models: list[str], steps: int, warmup: int, sweep: tuple[int, ...], profile_reps: int,
           block: int, save_params: str | None = None, timeline_steps: int = 0, rate: str | None = None,
           per_layer: bool = False, f64: bool = False, calibration_reps: int = 5, same_plan: bool = False) -> None:
    import torch
    import torch.distributed as dist

    import aiacc.plugins.torch.horovod as hvd
    from aiacc.core.comm import CostModel, Layer, ModelSpec, lower_bound, simulate
    from aiacc.distributed import planning

    torch.set_num_threads(1)
    hvd.init()
    rank, world = hvd.rank(), hvd.size()
    cluster = planning.calibrate(reps=calibration_reps)
    # seconds per gradient byte of one bucketing pass on this core (rank 0's): charged to each row's compute
    host = float(hvd.broadcast_object(planning.host_cost(), 0, "host cost"))
    costs = {c: CostModel(cluster, compression=c) for c in ("none", "fp16")}  # fp16: its own samples
    report = {"cluster": cluster.__dict__, "samples": planning.measurements(),
              "samples_fp16": planning.measurements("float16"),
              "samples_blocking": planning.measurements(what="blocking"),
              "samples_loop": planning.measurements(what="loop"), "samples_alone": planning.measurements(what="alone"),
              "host_s_per_byte": host, "models": {}}
    for name in models:
        model, _, loss_fn = build(name, rank)
        spec = measured_spec(model, loss_fn, profile_reps)
        spec = hvd.broadcast_object(spec, 0, "measured model spec")  # rank 0's costs, as the plans use
        # the contention of compute and communication with this model's own forward + backward beside a
        # stream of 1 MB all-reduces (planning.probe_contention): kept in the cluster that every aiacc plan
        # made after this, the simulator and the bound use
        # (a model's estimates are its own: the previous model's are forgotten first); the aiacc candidates'
        # first steps add their own (GradientScheduler's profile_contention), and the pooled estimate and its
        # range are what their plans are made with and the rows are predicted with
        planning.reset_contention()
        probe_model, _, probe_loss = build(name, rank)
        cluster = planning.probe_contention(lambda: probe_loss(probe_model).backward())
        del probe_model
        best = None
        if sweep:  # a short interleaved sweep of DDP's bucket size; its best is a candidate of the main run
            swept = candidates(name, rank, world, sweep, spec, None, only_sweep=True)
            tm = interleave(swept, max(2, steps // 2), 1, block)
            best = min(sweep, key=lambda cap: statistics.median(tm[f"DDP {cap} MB (sweep)"]))
            best = hvd.broadcast_object(best, 0, "best DDP bucket size")
            del swept
        cands = candidates(name, rank, world, (), spec, best, per_layer=per_layer, same_plan=same_plan)
        times = interleave(cands, steps, warmup, block)
        probed = (cluster.compute_slowdown, cluster.comm_slowdown)  # the probe's alone
        cluster = planning.current_cluster()  # pooled with the aiacc candidates' profiled steps
        ref = dict(cands["DDP 25 MB"][0].named_parameters())
        ref64 = None
        if f64 and rank == 0:  # the float64 reference, and the same computation in float32 on one process
            import torch

            n_steps = (steps + warmup) * block
            ref64 = float64_reference(name, world, n_steps)
            ref32 = float64_reference(name, world, n_steps, torch.float32)
            report.setdefault("f64", {})[name] = {
                "one process float32": max(float((ref32[n].double() - ref64[n]).abs().max()) for n in ref64),
                "steps": n_steps}
        # the compute of this run, as measured beside the candidates (the machine's load changes): the
        # profiled per-layer split, scaled to the median step without communication of the slowest rank
        # (ranks coupled by all-reduces run at the pace of the slower one; one rank's own step is faster
        # where another job loads the other rank's core)
        local_s = statistics.median(times[LOCAL])
        scale = statistics.median(times[SLOWEST]) / (spec.forward_s + spec.backward_s)
        spec = ModelSpec(spec.name, tuple(Layer(l.name, l.forward_s * scale, l.backward_s * scale, l.grads)
                                          for l in spec.layers))
        rows = {}
        # the bound of any plan with the measured contention (contention_floor) and without it
        bounds = {(c, cont): (lower_bound(spec, cluster, costs[c], c, contention=cont),
                              lower_bound(spec, cluster, costs[c], c, sync="step", contention=cont))
                  for c in ("none", "fp16") for cont in (True, False)}
        for label, (m, _, plan, compression, *rest) in cands.items():
            if len(rest) > 1:  # an aiacc optimizer: the plan it ran after its profiled steps
                plan = rest[1].plan
            steady = {}
            if plan is None:
                pred = lb = lb0 = local_s
            else:
                sync = plan.params.get("sync", "step") if label.startswith("aiacc") else "step"
                row_cluster, row_cost = cluster, costs[compression]
                # the candidate's bucketing passes over its gradients on the core (`host_passes`)
                row_spec = with_host_work(spec, host_passes(label) * host)
                if label in AFTER_BACKWARD:  # starts when this run's (scaled) backward ends
                    plan = after_backward_plan(plan, row_spec)
                    # a loop of blocking dist.all_reduce calls: charged the all-reduces measured that way, not
                    # the engine's queued ones (on one core per rank a small queued message costs 2-3x more)
                    row_cluster = planning.with_blocking_costs(cluster)
                    row_cost = CostModel(row_cluster, compression=compression)
                # what is measured is a block of `block` steps up to the end of its last update: with
                # per-layer waits the first forward overlaps nothing and the last update waits for every
                # all-reduce, so the block is (block - 1) steady iterations and one of sync "step"
                # (simulate's iteration: backward start to the next forward's end); the lower bound of any
                # plan likewise (lower_bound's docstring)
                sim = simulate(row_spec, row_cluster, plan, row_cost, validate=False, sync=sync)
                it = sim.iteration_s
                it_step = it if sync == "step" else simulate(row_spec, row_cluster, plan, row_cost,
                                                             validate=False, sync="step").iteration_s
                lb_layer, lb_step = bounds[compression, True]
                pred = ((block - 1) * it + it_step) / block
                lb = ((block - 1) * lb_layer + lb_step) / block
                lb0 = ((block - 1) * bounds[compression, False][0] + bounds[compression, False][1]) / block
                steady = {"predicted_steady": it, "lower_bound_steady": lb_layer,
                          # the simulated steady iteration's all-reduces (start, end, bytes, first tensors), for
                          # comparison with --timeline-steps' measured ones
                          "sim_network": [(e.start, e.end, e.args["bytes"], e.args["tensors"][:3])
                                          for e in sim.events if e.lane == "network"]}
                if STEADY + label in times:
                    steady["times_steady"] = times[STEADY + label]
            diff = max(float((p.detach() - ref[n].detach()).abs().max()) for n, p in m.named_parameters())
            if ref64 is not None and label != LOCAL:  # (LOCAL trains on one rank's data)
                report["f64"][name][label] = max(float((p.detach().double() - ref64[n]).abs().max())
                                                 for n, p in m.named_parameters())
            rows[label] = {"times": times[label], "predicted": pred, "lower_bound": lb,
                           # the plan as run (with the spec and cluster below: the row replays offline)
                           "plan": dataclasses.asdict(plan) if plan is not None else None,
                           "lower_bound_no_contention": lb0, "param_diff": diff, **steady,
                           "buckets": len(plan.buckets) if plan is not None else 0,
                           "sync": plan.params.get("sync") if plan is not None else None,
                           # an aiacc row that runs DDP's default layout (the planner's guard: its plan was
                           # not predicted clearly faster than that layout), and its predicted speedup over it
                           "ddp_default": bool(plan is not None and label.startswith("aiacc")
                                               and plan.params.get("ddp_default")),
                           "vs_ddp_default": plan.params.get("vs_ddp_default") if plan is not None else None,
                           "notes": plan.notes if plan is not None else ""}
        report["models"][name] = {"params": sum(p.numel() for p in model.parameters()),
                                  "tensors": len(list(model.parameters())), "compute_s": spec.forward_s + spec.backward_s,
                                  "rows": rows, "ddp_best_mb": best,
                                  "spec": dataclasses.asdict(spec), "cluster": dataclasses.asdict(cluster),
                                  "block": block,
                                  "contention": (cluster.compute_slowdown, cluster.comm_slowdown),
                                  "contention_range": cluster.compute_slowdown_range,
                                  "contention_estimates": cluster.slowdown_estimates, "contention_probe": probed,
                                  "slowest_compute_s": statistics.median(times[SLOWEST]),
                                  "steps_per_candidate": (steps + warmup) * block}
        if save_params:  # every candidate's parameters, for the CI smoke's check against one process
            import numpy as np

            np.savez(f"{save_params}.{rank}.npz", **{f"{label}/{n}": p.detach().numpy()
                                                     for label, (m, *_) in cands.items()
                                                     for n, p in m.named_parameters()})
        if timeline_steps:  # after the parameter check: these steps are not every candidate's
            from aiacc.distributed.testbed import parse_rate

            labels = [l for l in cands if l.startswith(("DDP 25", "DDP best", "aiacc"))]
            report["models"][name]["wire"] = wire_profile(cands, labels, timeline_steps,
                                                          parse_rate(rate)[1] if rate and rate != "loopback" else None)
        del cands
    if rank == 0:
        Path(out).write_text(json.dumps(report, default=str))
    dist.barrier()
    hvd.shutdown()


# -- the driver --------------------------------------------------------------------------------------

def run_link(rate: str, models: list[str], steps: int, warmup: int, sweep: tuple[int, ...], profile_reps: int,
             block: int, timeout: float, nodes: int = 2, timeline_steps: int = 0, per_layer: bool = False,
             f64: bool = False, calibration_reps: int = 5, same_plan: bool = False) -> dict:
    """One testbed of `nodes` nodes at `rate`, the worker on each node (pinned to its own core, cycling
    over the cores when there are more nodes than cores); rank 0's report."""
    from benchmarks.testbed_report import run_workers

    return run_workers(__file__, ["--models", ",".join(models), "--steps", str(steps), "--warmup", str(warmup),
                                  "--sweep", ",".join(map(str, sweep)), "--profile-reps", str(profile_reps),
                                  "--block", str(block), "--timeline-steps", str(timeline_steps), "--rates", rate,
                                  "--calibration-reps", str(calibration_reps)]
                       + (["--per-layer"] if per_layer else []) + (["--f64-check"] if f64 else [])
                       + (["--same-plan"] if same_plan else []),
                       rate=rate, nodes=nodes, timeout=timeout)


ORDER = ("1 rank, no comm", "after backward", "DDP 25 MB", "DDP best", "Horovod 64 MB", "DDP fp16 hook",
         "aiacc step-sync", "aiacc fp16", "aiacc")


def steady_cells(r: dict) -> tuple[str, str, str]:
    """(steady ms, its pred/meas, its meas/LB) of a row: the median start-to-start time of a block's steps
    after its first (--block >= 3) against the simulator's steady iteration and the bound of one."""
    if not r.get("times_steady"):
        return "", "", ""
    med = statistics.median(r["times_steady"])
    return f"{med * 1e3:.0f}", f"{r['predicted_steady'] / med:.2f}", f"{med / r['lower_bound_steady']:.2f}"


def table(reports: dict[str, dict]):
    """The rich table of every link's report."""
    from rich.table import Table

    nodes = next(iter(reports.values()))["cluster"]["nodes"] if reports else 2
    cores = len(os.sched_getaffinity(0))
    t = Table(title=f"Data-parallel step on the emulated cluster: {nodes} nodes x 1 rank (gloo, "
                    + ("each node on its own core" if nodes <= cores else f"{nodes} ranks on {cores} cores: oversubscribed")
                    + "), medians of interleaved steps")
    for col in ("link", "model", "candidate", "buckets", "median step ms", "p25-p75 ms", "vs DDP 25 MB", "paired",
                "scaling eff.",
                "sim. predicted ms", "pred/meas", "lower bound ms", "meas/LB", "meas/LB0", "steady ms", "steady pred/meas",
                "steady/LB", "max |param - DDP|"):
        t.add_column(col, justify="left" if col in ("link", "model", "candidate") else "right")
    for rate, rep in reports.items():
        for name, m in rep["models"].items():
            rows = m["rows"]
            ddp = statistics.median(rows["DDP 25 MB"]["times"])
            local = statistics.median(rows["1 rank, no comm"]["times"])
            labels = sorted(rows, key=lambda k: next((i for i, o in enumerate(ORDER) if k.startswith(o)), 99))
            for label in labels:
                r = rows[label]
                med = statistics.median(r["times"])
                q = statistics.quantiles(r["times"], n=4) if len(r["times"]) > 1 else [med, med, med]
                t.add_row(rate, f"{name} ({m['params'] / 1e6:.1f} M)", label + (" *" if r.get("notes") else ""),
                          (str(r.get("buckets", "")) + (" per-layer" if r.get("sync") == "layer" else "")
                           + (" DDP layout" if r.get("ddp_default") else ""))
                          if r.get("buckets") else "", f"{med * 1e3:.0f}",
                          f"{q[0] * 1e3:.0f}-{q[2] * 1e3:.0f}", f"{ddp / med:.2f}x",
                          # the median over rounds of DDP 25 MB's block / this candidate's block of the same
                          # round (interleaved: the load of the moment is common to both)
                          f"{statistics.median(a / b for a, b in zip(rows['DDP 25 MB']['times'], r['times'])):.2f}",
                          f"{local / med:.2f}", f"{r['predicted'] * 1e3:.0f}", f"{r['predicted'] / med:.2f}",
                          f"{r['lower_bound'] * 1e3:.0f}", f"{med / r['lower_bound']:.2f}",
                          f"{med / r.get('lower_bound_no_contention', r['lower_bound']):.2f}", *steady_cells(r),
                          "" if label.startswith("1 rank") else f"{r['param_diff']:.1e}")
            t.add_section()
    return t


def _tuples(x):
    """JSON lists back to the nested tuples the frozen specs hold."""
    return tuple(_tuples(v) for v in x) if isinstance(x, list) else x


def replay(path: str) -> list[dict]:
    """Re-predict every stored row of a --json report offline with the current simulator and bound: each
    row's plan, the model spec and the pooled cluster it was predicted with (stored by the worker), its
    measured median; [{rate, model, label, measured, predicted (stored), replayed, lower_bound}]."""
    from aiacc.core.comm import Bucket, ClusterSpec, GradientSpec, Layer, ModelSpec, Piece, Plan, lower_bound, simulate

    import dataclasses

    out = []
    for rate, rep in json.loads(Path(path).read_text()).items():
        # a loop of blocking calls: the mixed-size loop's means where the report has them (planning.with_blocking_costs)
        blocking = tuple(tuple(map(float, x)) for x in rep.get("samples_loop") or rep.get("samples_blocking") or ())
        for name, m in rep["models"].items():
            if "spec" not in m:
                raise SystemExit(f"{path}: {rate} {name} has no stored spec (a report from before dp.py stored it)")
            c = m["cluster"]
            cluster = ClusterSpec(**{k: _tuples(v) for k, v in c.items()})
            spec = ModelSpec(m["spec"]["name"], tuple(
                Layer(l["name"], l["forward_s"], l["backward_s"],
                      tuple(GradientSpec(g["name"], g["numel"], g["dtype"], _tuples(g["shape"])) for g in l["grads"]))
                for l in m["spec"]["layers"]))
            block = m.get("block", 1)
            for label, r in m["rows"].items():
                if not r.get("plan"):
                    continue
                p = r["plan"]
                plan = Plan(p["strategy"], tuple(Bucket(tuple(Piece(**x) for x in b["pieces"]), b["priority"],
                                                        b["not_before"]) for b in p["buckets"]),
                            p["scheduling"], p["compression"], p["notes"], p["params"])
                sync = (r.get("sync") or "step") if label.startswith("aiacc") else "step"
                # blocking calls one after another (the worker's rule), where the report has those samples
                row = dataclasses.replace(cluster, allreduce_samples=blocking, allreduce_samples_alone=None) \
                    if label in AFTER_BACKWARD and len(blocking) >= 2 else cluster
                row_spec = with_host_work(spec, host_passes(label) * float(rep.get("host_s_per_byte", 0.0)))
                if label in AFTER_BACKWARD:
                    plan = after_backward_plan(plan, row_spec)
                it = simulate(row_spec, row, plan, validate=False, sync=sync).iteration_s
                it_step = simulate(row_spec, row, plan, validate=False, sync="step").iteration_s
                lb = ((block - 1) * lower_bound(spec, cluster, compression=plan.compression, contention=True)
                      + lower_bound(spec, cluster, compression=plan.compression, sync="step", contention=True)) / block
                out.append({"rate": rate, "model": name, "label": label, "measured": statistics.median(r["times"]),
                            "predicted": r["predicted"], "replayed": ((block - 1) * it + it_step) / block,
                            "lower_bound": lb})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a smoke test: 1 Gbit/s, 2 steps, no sweep")
    ap.add_argument("--rates", default=",".join(RATES), help="comma-separated link rates (tc syntax)")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated: resnet, bert")
    ap.add_argument("--steps", type=int, default=5, help="measured rounds per candidate")
    ap.add_argument("--warmup", type=int, default=2, help="rounds not measured")
    ap.add_argument("--sweep", default=",".join(map(str, SWEEP_MB)), help="DDP bucket sizes (MB) swept; '' none")
    ap.add_argument("--profile-reps", type=int, default=5, help="profiled steps for the measured compute")
    ap.add_argument("--block", type=int, default=2, help="consecutive steps of a candidate per round (default 2)")
    ap.add_argument("--json", help="also write the raw reports here")
    ap.add_argument("--nodes", type=int, default=2, help="testbed nodes (1 rank each); more nodes than cores "
                    "oversubscribe them (ranks then share a core: say so when quoting the figures)")
    ap.add_argument("--loopback", action="store_true", help="2 ranks over loopback instead of the testbed "
                    "(no root needed; no link shaping: --rates is ignored)")
    ap.add_argument("--timeline-steps", type=int, default=0, help="after the table's run, this many more steps "
                    "of DDP and aiacc with the wire sampled: where the link is idle (printed per phase of the step)")
    ap.add_argument("--per-layer", action="store_true", help="also aiacc with per-layer waits forced")
    ap.add_argument("--same-plan", action="store_true", help="also aiacc's engine running DDP's bucketing (25 MB "
                    "and the sweep's best, in the order backward makes gradients ready, as DDP rebuilds them): "
                    "the engine's overhead against DDP's apart from the plan")
    ap.add_argument("--f64-check", action="store_true", help="each candidate's largest parameter difference "
                    "from a float64 reference of the same training (and that of the same computation in float32 "
                    "on one process): is a difference between candidates rounding?")
    ap.add_argument("--calibration-reps", type=int, default=5, help="timed batches per all-reduce size when "
                    "calibrating the network (aiacc.distributed.planning.calibrate)")
    ap.add_argument("--replay", metavar="JSON", help="re-predict the rows of a --json report offline with the "
                    "current simulator and bound (no testbed)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--save-params", help=argparse.SUPPRESS)
    args = ap.parse_args()
    sweep = tuple(int(x) for x in args.sweep.split(",") if x)
    models = [m for m in args.models.split(",") if m]
    if args.quick:
        args.rates, args.steps, args.warmup, sweep, args.profile_reps, args.block = "1gbit", 2, 1, (), 2, 1
    if args.replay:
        for r in replay(args.replay):
            print(f"{r['rate']} {r['model']} {r['label']}: measured {r['measured'] * 1e3:.0f} ms, predicted "
                  f"{r['predicted'] * 1e3:.0f} (run), {r['replayed'] * 1e3:.0f} (now; pred/meas "
                  f"{r['replayed'] / r['measured']:.2f}), bound {r['lower_bound'] * 1e3:.0f} (meas/LB "
                  f"{r['measured'] / r['lower_bound']:.2f})")
        return
    if args.worker:
        worker(args.worker, models, args.steps, args.warmup, sweep, args.profile_reps, args.block, args.save_params,
               args.timeline_steps, args.rates, args.per_layer, args.f64_check, args.calibration_reps,
               args.same_plan)
        return
    from rich.console import Console

    from aiacc.distributed.testbed import unavailable

    reason = None if args.loopback else unavailable()
    if reason:
        raise SystemExit(f"benchmarks/dp.py: {reason} (--loopback runs 2 ranks without it)")
    if args.loopback:
        args.rates = "loopback"
    console = Console(width=220)
    reports = {}
    for rate in args.rates.split(","):
        t0 = time.monotonic()
        reports[rate] = run_link(rate, models, args.steps, args.warmup, sweep, args.profile_reps, args.block,
                                 timeout=1800, nodes=args.nodes, timeline_steps=args.timeline_steps,
                                 per_layer=args.per_layer, f64=args.f64_check,
                                 calibration_reps=args.calibration_reps, same_plan=args.same_plan)
        c = reports[rate]["cluster"]
        console.print(f"{rate}: calibrated {c['nodes']} nodes x {c['workers_per_node']}, "
                      f"{c['inter_bandwidth'] * 8 / 1e6:.0f} Mbit/s, latency {c['inter_latency'] * 1e6:.0f} us, "
                      f"compute {c['compute_slowdown']:.2f}x / all-reduce {c['comm_slowdown']:.2f}x slower when "
                      f"both run; link banks {c.get('banked_s', 0.0) * 1e3:.1f} ms of idle time; all-reduce ms at " + ", ".join(f"{b / 1e6:g} MB {t * 1e3:.1f}" for b, t in
                                                                  reports[rate]["samples"]) +
                      "; fp16 " + ", ".join(f"{b / 1e6:g} MB {t * 1e3:.1f}" for b, t in
                                            reports[rate].get("samples_fp16", ())) +
                      f" ({time.monotonic() - t0:.0f} s)", highlight=False)
    for rate, rep in reports.items():
        for name, m in rep["models"].items():
            if m.get("contention"):
                probe = m.get("contention_probe") or m["contention"]
                rng = m.get("contention_range")
                console.print(f"{rate} {name}: beside its own forward + backward (planning.probe_contention) "
                              f"compute {probe[0]:.2f}x / all-reduce {probe[1]:.2f}x slower; pooled with the aiacc "
                              f"candidates' profiled steps: compute {m['contention'][0]:.2f}x"
                              + (f" (range {rng[0]:.2f}-{rng[1]:.2f})" if rng else "")
                              + (" from " + ", ".join(f"{e:.2f}" for e in m.get("contention_estimates", ())))
                              , highlight=False)
    console.print(table(reports))
    for rate, rep in reports.items():  # --f64-check
        for name, f in rep.get("f64", {}).items():
            console.print(f"{rate} {name}: largest |parameter - float64 reference| after {f['steps']} steps: "
                          + ", ".join(f"{k} {v:.1e}" for k, v in f.items() if k != "steps"), highlight=False)
    for rate, rep in reports.items():  # --timeline-steps: where the wire was idle
        for name, m in rep["models"].items():
            for label, w in m.get("wire", {}).items():
                idle = w["idle_per_step"]
                console.print(
                    f"wire {rate} {name} {label}: step {w['step_s'] * 1e3:.0f} ms, sent {w['sent_per_step'] / 1e6:.2f} MB"
                    + (f" (all-reduce payload {w['payload_per_step'] / 1e6:.2f} MB)" if w["payload_per_step"] else "")
                    + (f" = {w['wire_s_per_step'] * 1e3:.0f} ms of wire at the link's rate; wire idle "
                       f"{(w['step_s'] - w['wire_s_per_step']) * 1e3:.0f} ms per step, in 10 ms bins by phase: "
                       + ", ".join(f"{k} {v * 1e3:.0f}" for k, v in idle.items()) if w["wire_s_per_step"] else ""),
                    highlight=False)
    for rate, rep in reports.items():  # plans that are not aiacc's own (the planner's fallback), marked *
        for name, m in rep["models"].items():
            for label, r in m["rows"].items():
                if r.get("notes"):
                    console.print(f"* {rate} {name} {label}: {r['notes']}", highlight=False)
    if args.json:
        Path(args.json).write_text(json.dumps(reports, default=str))


if __name__ == "__main__":
    main()
