"""Communication scheduling benchmark.

1. Simulated: ResNet-50 and BERT-large data-parallel iterations at 8, 32, 128 and 256 workers
   (8 per node) on 25 and 100 Gb/s networks. Iteration time of every strategy and the lower bound
   (perfect overlap); targets: aiacc within 5% of the bound and no slower than the best other strategy.
2. Real: 2 processes on this machine over gloo/loopback, one step of aiacc's DistributedOptimizer
   against one step of torch DistributedDataParallel, interleaved in the same processes.

    python benchmarks/comm.py [--no-real] [--trace out.json]
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

STEPS = 12


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
    a, b = _model(torch), _model(torch)
    ddp = DDP(b)
    opt_a = hvd.DistributedOptimizer(torch.optim.SGD(a.parameters(), lr=0.01), named_parameters=a.named_parameters(),
                                     plan=os.environ.get("AIACC_BENCH_PLAN", "aiacc"))
    hvd.broadcast_parameters(a.state_dict(), 0)
    opt_b = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x, y = torch.randn(64, 512), torch.randint(0, 10, (64,))
    times = {"aiacc": [], "ddp": []}

    def step(model, opt):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    for i in range(STEPS + 2):  # interleaved; the first 2 rounds warm up
        for name, model, opt in (("aiacc", a, opt_a), ("ddp", ddp, opt_b))[:: 1 if i % 2 else -1]:
            dist.barrier()
            t0 = time.perf_counter()
            step(model, opt)
            dt = time.perf_counter() - t0
            if i >= 2:
                times[name].append(dt)
    same = all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    if dist.get_rank() == 0:
        import json

        Path(out).write_text(json.dumps({"times": times, "same_params": same,
                                         "buckets": len(opt_a.plan.buckets),
                                         "params": sum(p.numel() for p in a.parameters())}))
    hvd.shutdown()


def real(console: Console) -> None:
    import json
    import tempfile

    from aiacc.plugins._dist_transport import launch_local

    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.json")
        env = {"PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        res = launch_local([__file__, "--worker", out], 2, timeout=300, env=env)
        for p in res:
            if p.returncode != 0:
                console.print(f"[red]real run failed[/red]: {p.stderr[-2000:]}")
                return
        r = json.loads(Path(out).read_text())
    t = Table(title=f"Real 2-process gloo run on this machine: {r['params'] / 1e6:.1f} M-parameter MLP, "
                    f"batch 64 per rank, {STEPS} interleaved steps (median)")
    for col in ("aiacc step (ms)", "torch DDP step (ms)", "DDP / aiacc", "aiacc buckets", "same parameters"):
        t.add_column(col, justify="right")
    ma, md = statistics.median(r["times"]["aiacc"]), statistics.median(r["times"]["ddp"])
    t.add_row(f"{ma * 1e3:.1f}", f"{md * 1e3:.1f}", f"{md / ma:.2f}x", str(r["buckets"]), str(r["same_params"]))
    console.print(t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-real", action="store_true", help="skip the 2-process gloo run")
    ap.add_argument("--trace", help="write the Chrome trace of aiacc's plan (ResNet-50, 128 workers, 25 Gb/s)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker)
        return
    console = Console(width=200)
    ok = simulated(console, args.trace)
    console.print("all simulated targets met" if ok else "[yellow]some simulated targets missed (see 'targets')[/yellow]")
    if not args.no_real:
        real(console)


if __name__ == "__main__":
    main()
