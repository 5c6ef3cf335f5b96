"""Communication scheduling benchmark.

1. Simulated: ResNet-50 and BERT-large data-parallel iterations at 8, 32, 128 and 256 workers
   (8 per node) on 25 and 100 Gb/s networks. Iteration time of every strategy and the lower bound
   (perfect overlap); targets: aiacc within 5% of the bound and no slower than the best other strategy.
2. Real: 2 processes on this machine over gloo/loopback, one step of aiacc's DistributedOptimizer
   against one step of torch DistributedDataParallel (default, and with gradient_as_bucket_view),
   interleaved in the same processes.

    python benchmarks/comm.py [--no-real | --real-only] [--trace out.json]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console
from rich.table import Table

from aiacc.core.comm import STRATEGIES, ClusterSpec, CostModel, lower_bound, make_plan, models, simulate
from aiacc.core.comm import write_chrome_trace

OTHERS = [s for s in STRATEGIES if s != "aiacc"]


def simulated(console: Console, trace: str | None) -> bool:
    table = Table(title="Simulated iteration time (ms), V100-class workers (30 TFLOP/s), fp32 gradients")
    for col in ["model", "workers", "Gb/s", *OTHERS, "aiacc", "lower bound", "aiacc/LB", "best other/aiacc", "targets"]:
        table.add_column(col, justify="right" if col not in ("model", "targets") else "left")
    all_ok = True
    for spec in (models.resnet50(), models.bert_large()):
        for workers in (8, 32, 128, 256):
            for gbps in (25, 100):
                c = ClusterSpec.from_workers(workers, 8, gbps)
                cost = CostModel(c)
                res = {n: simulate(spec, c, make_plan(n, spec, c), cost) for n in STRATEGIES}
                lb = lower_bound(spec, c, cost)
                a = res["aiacc"].iteration_s
                best_other = min(res[n].iteration_s for n in OTHERS)
                ok_lb, ok_best = a <= 1.05 * lb, a <= best_other + 1e-12
                all_ok &= ok_lb and ok_best
                table.add_row(spec.name.split("(")[0].replace("resnet50", "ResNet-50").replace("bert-large", "BERT-large"), str(workers), str(gbps),
                              *[f"{res[n].iteration_s * 1e3:.1f}" for n in OTHERS],
                              f"{a * 1e3:.1f}", f"{lb * 1e3:.1f}", f"{a / lb:.3f}", f"{best_other / a:.2f}x",
                              ("ok" if ok_lb else "LB>5%") + (" ok" if ok_best else " SLOWER"))
                if trace and spec.name.startswith("resnet50") and workers == 128 and gbps == 25:
                    write_chrome_trace(res["aiacc"], trace)
    console.print(table)
    console.print(f"compute only: ResNet-50 {models.resnet50().forward_s * 1e3 + models.resnet50().backward_s * 1e3:.1f} ms,"
                  f" BERT-large {(models.bert_large().forward_s + models.bert_large().backward_s) * 1e3:.1f} ms per iteration")
    return all_ok


# -- real 2-process run -----------------------------------------------------------------------------

STEPS = 60
WARMUP = 4


def _model(torch):
    torch.manual_seed(0)
    layers = []
    for _ in range(6):
        layers += [torch.nn.Linear(512, 512), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(512, 10))


def worker(out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import aiacc.plugins.torch.horovod as hvd

    torch.set_num_threads(1)
    hvd.init()
    contestants = {}
    for name, plan in (("aiacc", os.environ.get("AIACC_BENCH_PLAN", "aiacc")), ("aiacc engine, ddp buckets", "ddp")):
        m = _model(torch)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.01), named_parameters=m.named_parameters(),
                                       plan=plan)
        hvd.broadcast_parameters(m.state_dict(), 0)
        contestants[name] = (m, opt)
    a, opt_a = contestants["aiacc"]
    for name, view in (("ddp", False), ("ddp-view", True)):
        m = DDP(_model(torch), gradient_as_bucket_view=view)
        contestants[name] = (m, torch.optim.SGD(m.parameters(), lr=0.01))
    x, y = torch.randn(64, 512), torch.randint(0, 10, (64,))
    times = {name: [] for name in contestants}

    def step(model, opt):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    names = list(contestants)
    for i in range(STEPS + WARMUP):  # interleaved, rotating who goes first; the first rounds warm up
        for name in names[i % len(names):] + names[:i % len(names)]:
            model, opt = contestants[name]
            dist.barrier()
            t0 = time.perf_counter()
            step(model, opt)
            dt = time.perf_counter() - t0
            if i >= WARMUP:
                times[name].append(dt)
    ref = list(contestants["ddp"][0].parameters())
    same = all(torch.equal(p, q) for p, q in zip(a.parameters(), ref))
    flats = {f.untyped_storage().data_ptr() for f in opt_a._aiacc_scheduler.executor.flats if f is not None}
    views = sum(p.grad.untyped_storage().data_ptr() in flats for p in a.parameters())
    if dist.get_rank() == 0:
        import json

        Path(out).write_text(json.dumps({"times": times, "same_params": same, "views": views,
                                         "buckets": len(opt_a.plan.buckets),
                                         "params": sum(p.numel() for p in a.parameters()),
                                         "tensors": len(list(a.parameters()))}))
    hvd.shutdown()


def real(console: Console) -> None:
    import json
    import tempfile

    from aiacc.distributed.launch import launch_local

    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.json")
        env = {"PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        res = launch_local([__file__, "--worker", out], 2, timeout=600, env=env)
        for p in res:
            if p.returncode != 0:
                console.print(f"[red]real run failed[/red]: {p.stderr[-2000:]}")
                return
        r = json.loads(Path(out).read_text())
    t = Table(title=f"Real 2-process gloo run on this machine: {r['params'] / 1e6:.1f} M-parameter MLP, batch 64 per "
                    f"rank, {STEPS} interleaved rounds; aiacc plan: {r['buckets']} buckets, "
                    f"{r['views']}/{r['tensors']} gradients are bucket views; same parameters as DDP: {r['same_params']}")
    for col in ("", "step median (ms)", "step p25-p75 (ms)", "fastest step (ms)", "aiacc speed-up (ratio of medians)",
                "aiacc speed-up (median of per-round ratios)"):
        t.add_column(col, justify="right")
    tm = r["times"]
    q = lambda v: statistics.quantiles(v, n=4)
    for name in tm:
        ratios = [o / a for o, a in zip(tm[name], tm["aiacc"])]
        t.add_row(name, f"{statistics.median(tm[name]) * 1e3:.1f}",
                  f"{q(tm[name])[0] * 1e3:.1f}-{q(tm[name])[2] * 1e3:.1f}", f"{min(tm[name]) * 1e3:.1f}",
                  f"{statistics.median(tm[name]) / statistics.median(tm['aiacc']):.2f}x" if name != "aiacc" else "",
                  f"{statistics.median(ratios):.2f}x" if name != "aiacc" else "")
    console.print(t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-real", action="store_true", help="skip the 2-process gloo run")
    ap.add_argument("--real-only", action="store_true", help="only the 2-process gloo run")
    ap.add_argument("--trace", help="write the Chrome trace of aiacc's plan (ResNet-50, 128 workers, 25 Gb/s)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker)
        return
    console = Console(width=200)
    if args.real_only:
        real(console)
        return
    ok = simulated(console, args.trace)
    console.print("all simulated targets met" if ok else "[yellow]some simulated targets missed (see 'targets')[/yellow]")
    if not args.no_real:
        real(console)


if __name__ == "__main__":
    main()
