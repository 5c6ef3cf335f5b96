"""The memory arena on the user's path: latency and peak RSS of ResNet-50 inference, each configuration in a
fresh process (peak RSS from resource.getrusage, so one configuration's memory never counts for another).

Configurations (the model is aiacc.zoo's torch ResNet-50, random weights, eval mode, CPU):
    eager         the torch module itself, under torch.no_grad()
    native        aiacc.optimize(model, x) (level 2, backend="native": an fx.GraphModule; torch's allocator)
    aiacc         aiacc.optimize(model, x, backend="aiacc"): aiacc's runtime, intermediates in one planned
                  arena allocated once and reused by every call
    aiacc-noarena the same optimized IR graph on aiacc's reference executor (a fresh array per value, freed
                  after its last use): what the arena replaces

Rows: batch sizes (default 1, 8, 32); columns: median latency of `--iters` calls after one warm-up, peak RSS
of the process, then ratios to eager (latency) and of aiacc to aiacc-noarena (the arena's own effect).
The torch native backend has no arena of its own (see the note printed at the end).

    python benchmarks/arena.py [--batches 1,8,32] [--size 224] [--iters 3] [--configs eager,native,aiacc,aiacc-noarena]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
CONFIGS = ("eager", "native", "aiacc", "aiacc-noarena")


def measure(config: str, batch: int, size: int, iters: int) -> dict:
    """Run in this (fresh) process: build, optimize, time `iters` calls, report peak RSS."""
    import resource
    import statistics
    import time
    import warnings

    import numpy as np
    import torch

    sys.path.insert(0, ROOT)
    import aiacc
    from aiacc import zoo

    warnings.filterwarnings("ignore")
    torch.set_grad_enabled(False)
    model, inputs = zoo.build("torch", "resnet50", batch=batch, size=size)
    x = inputs[0] if isinstance(inputs, (tuple, list)) else inputs
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if config == "eager":
        def call():
            return model(x)
    elif config == "native":
        fast = aiacc.optimize(model, (x,), verify=False)

        def call():
            return fast(x)
    elif config == "aiacc":
        fast = aiacc.optimize(model, (x,), backend="aiacc", verify=False)

        def call():
            return fast(x)
    elif config == "aiacc-noarena":
        from aiacc.core.passes import run_passes
        from aiacc.core.runtime.executor import Interpreter
        from aiacc.plugins import get_plugin

        plugin = get_plugin("torch")
        graph = plugin.trace(model, (x,))
        run_passes(graph, level=2)
        feeds = plugin.feeds(graph, (x,))
        interp = Interpreter(graph)

        def call():
            return interp.run(feeds)
    else:
        raise SystemExit(f"unknown config {config!r} (known: {', '.join(CONFIGS)})")
    call()  # warm-up: plans, compiles, first-touch of the arena
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    out = {"config": config, "batch": batch, "latency_s": statistics.median(times), "peak_rss_mib": rss / 1024,
           "rss_before_model_run_mib": rss0 / 1024}
    if config == "aiacc":
        out["arena_mib"] = fast.aiacc_runtime.arena_bytes / (1 << 20)
    del np
    return out


def main(argv=None) -> int:
    """Every configuration at every batch size, each in its own process; prints the table and ratios."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: CONFIG,BATCH in a fresh process
    args = ap.parse_args(argv)
    if args.one:
        config, batch = args.one.split(",")
        print(json.dumps(measure(config, int(batch), args.size, args.iters)))
        return 0
    from rich.console import Console
    from rich.table import Table

    configs = args.configs.split(",")
    results: dict[tuple[str, int], dict] = {}
    for batch in (int(b) for b in args.batches.split(",")):
        for config in configs:
            proc = subprocess.run([sys.executable, __file__, "--one", f"{config},{batch}", "--size", str(args.size),
                                   "--iters", str(args.iters)], capture_output=True, text=True, cwd=ROOT)
            if proc.returncode:
                print(f"{config} batch {batch} failed: {proc.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
                continue
            results[(config, batch)] = json.loads(proc.stdout.strip().splitlines()[-1])
    table = Table(title=f"ResNet-50 {args.size}x{args.size}, CPU: median latency (s) and peak RSS (MiB), "
                        f"one fresh process each")
    table.add_column("batch", justify="right")
    for c in configs:
        table.add_column(f"{c} s", justify="right")
        table.add_column(f"{c} RSS", justify="right")
    for c in configs:
        if c != "eager":
            table.add_column(f"{c} / eager (lat)", justify="right")
    if "aiacc" in configs and "aiacc-noarena" in configs:
        table.add_column("arena / no arena (lat)", justify="right")
        table.add_column("arena / no arena (RSS)", justify="right")
    for batch in sorted({b for _, b in results}):
        row = [str(batch)]
        for c in configs:
            r = results.get((c, batch))
            row += [f"{r['latency_s']:.3f}", f"{r['peak_rss_mib']:.0f}"] if r else ["-", "-"]
        eager = results.get(("eager", batch))
        for c in configs:
            if c == "eager":
                continue
            r = results.get((c, batch))
            row.append(f"{r['latency_s'] / eager['latency_s']:.2f}x" if r and eager else "-")
        a, n = results.get(("aiacc", batch)), results.get(("aiacc-noarena", batch))
        if "aiacc" in configs and "aiacc-noarena" in configs:
            row += [f"{a['latency_s'] / n['latency_s']:.2f}x", f"{a['peak_rss_mib'] / n['peak_rss_mib']:.2f}x"] \
                if a and n else ["-", "-"]
        table.add_row(*row)
    console = Console(width=200)
    console.print(table)
    for (c, b), r in sorted(results.items()):
        if "arena_mib" in r:
            console.print(f"aiacc arena at batch {b}: {r['arena_mib']:.1f} MiB")
    console.print("torch native backend: no arena (intermediates come from torch's CPU allocator); "
                  "not built this round, see the README note.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
