"""Inference latency: aiacc against each framework's own best path, on the bundled models (aiacc.zoo).

    .venv/bin/python benchmarks/inference.py                       # everything (long on 2 cores)
    .venv/bin/python benchmarks/inference.py --frameworks torch --models resnet50 --batch 1 --iters 10

For each framework, model (ResNet-50, MobileNetV2, the BERT-style encoder) and batch size, every candidate
is built first, then all of them are timed interleaved in this one process (one call of each per round,
so drift hits all alike), and the table gives median latencies and ratios against the best peer
(peer ms / aiacc ms: above 1 means aiacc is faster). The candidates:

    original     the model as the framework runs it by default (torch eager, Keras eager call, Gluon
                 imperative, and for Caffe, which has no runtime here, aiacc's reference executor)
    peers        torch: torch.jit.optimize_for_inference(torch.jit.trace(model)) and torch.compile(model)
                 tf:    tf.function(model) and tf.function(model, jit_compile=True) (XLA)
                 mxnet: hybridize(static_alloc=True, static_shape=True), and optimize_for(backend="MKLDNN")
                        (the MKLDNN subgraph backend: Conv+BN+ReLU fusion). The pip wheel of mxnet 1.9.1 is
                        built with MKLDNN on (mx.runtime.Features().is_enabled("MKLDNN") is printed), so the
                        hybridized block already runs MKLDNN kernels; the subgraph backend adds its fusions.
                 caffe: OpenCV dnn (cv2.dnn.readNetFromCaffe) on the original .prototxt/.caffemodel
    aiacc native aiacc.optimize(model, backend="native"): the framework's own model again (for Caffe the
                 optimized .prototxt/.caffemodel, run by OpenCV dnn, the Caffe runtime present here)
    aiacc ort    aiacc.optimize(model, backend="onnxruntime")

Every candidate's outputs are also compared with the original's (max relative error, printed).

    .venv/bin/python benchmarks/inference.py elementwise [--models ...]   # level 3 vs level 2 vs torch.compile
                                                                          # on elementwise-heavy nets
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import aiacc  # noqa: E402
from aiacc import progress, zoo  # noqa: E402
from aiacc.demo import max_rel_error, median_ms, opencv_runner, runner, set_threads, time_interleaved  # noqa: E402

FRAMEWORKS = ("torch", "tf", "mxnet", "caffe")
PEERS = {"torch": ("jit", "compile"), "tf": ("tf.function", "xla"), "mxnet": ("hybridize", "mkldnn"),
         "caffe": ("opencv",)}


@dataclass
class Row:
    framework: str
    model: str
    batch: int
    ms: dict[str, float] = field(default_factory=dict)
    err: dict[str, float] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    setup_s: dict[str, float] = field(default_factory=dict)

    def best_peer(self) -> tuple[str, float] | None:
        peers = [(k, v) for k, v in self.ms.items() if k in PEERS[self.framework]]
        return min(peers, key=lambda kv: kv[1]) if peers else None


# ------------------------------------------------------------------------------------------------ peers
def torch_peers(model, inputs, which) -> dict[str, Callable]:
    import torch

    xs = tuple(inputs)
    out = {}
    if "jit" in which:
        def jit():
            with torch.no_grad():
                return torch.jit.optimize_for_inference(torch.jit.trace(model, xs, strict=False))
        out["jit"] = jit
    if "compile" in which:
        out["compile"] = lambda: torch.compile(model)
    return out


def tf_peers(model, inputs, which) -> dict[str, Callable]:
    import tensorflow as tf

    out = {}
    if "tf.function" in which:
        out["tf.function"] = lambda: tf.function(model)
    if "xla" in which:
        out["xla"] = lambda: tf.function(model, jit_compile=True)
    return out


def mxnet_peers(build, inputs, which) -> dict[str, Callable]:
    from aiacc.plugins.mxnet._import import import_mxnet

    mx = import_mxnet()
    out = {}
    if "hybridize" in which:
        def hyb():
            block, _ = build()
            block.hybridize(static_alloc=True, static_shape=True)
            return block
        out["hybridize"] = hyb
    if "mkldnn" in which:
        def mkl():
            block, _ = build()
            block.optimize_for(*[mx.nd.array(a, dtype=a.dtype) for a in inputs], backend="MKLDNN",
                               static_alloc=True, static_shape=True)
            return block
        out["mkldnn"] = mkl
    return out


# ------------------------------------------------------------------------------------------------ one row
def bench_row(framework: str, model_name: str, batch: int, args, log) -> Row:
    row = Row(framework, model_name, batch)
    kw = {"seq": args.seq} if model_name == "bert_encoder" else {"size": args.size}

    def build():
        return zoo.build(framework, model_name, batch=batch, **kw)

    model, inputs = build()
    # Caffe's original: aiacc's reference executor (no Caffe runtime); OpenCV dnn is its peer
    fns: dict[str, Callable] = {"original": (lambda: list(model.forward(**inputs).values())) if framework == "caffe"
                                else runner(framework, model, inputs)}
    expected = fns["original"]()
    makers: dict[str, Callable[[], Callable]] = {}
    peers = [p for p in PEERS[framework] if p in args.peers_for(framework)]
    if framework == "torch":
        makers.update({k: (lambda mk=mk: runner("torch", mk(), inputs)) for k, mk in
                       torch_peers(model, inputs, peers).items()})
    elif framework == "tf":
        makers.update({k: (lambda mk=mk: runner("tf", mk(), inputs)) for k, mk in
                       tf_peers(model, inputs, peers).items()})
    elif framework == "mxnet":
        makers.update({k: (lambda mk=mk: runner("mxnet", mk(), inputs)) for k, mk in
                       mxnet_peers(build, inputs, peers).items()})
    elif framework == "caffe" and "opencv" in peers:
        makers["opencv"] = lambda: opencv_runner(model, inputs)

    def aiacc_maker(backend):
        def make():
            fast = aiacc.optimize(model, inputs, backend=backend, level=args.level, verify=False)
            return runner(framework, fast, inputs)  # a native CaffeModel runs in OpenCV dnn
        return make

    for backend in args.backends:
        makers[f"aiacc {backend}"] = aiacc_maker(backend)
    for name, make in makers.items():
        log(f"  {framework} {model_name} b{batch}: preparing {name}")
        t = time.perf_counter()
        try:
            fn = make()
            row.err[name] = max_rel_error(expected, fn())  # first call: compiles where the peer compiles
            fns[name] = fn
        except Exception as e:  # one failing candidate must not sink the row
            row.failed[name] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            if args.verbose:
                traceback.print_exc()
        row.setup_s[name] = time.perf_counter() - t
    log(f"  {framework} {model_name} b{batch}: timing {len(fns)} candidates x {args.iters}")
    times = time_interleaved(fns, args.iters, args.warmup)
    row.ms = {k: median_ms(v) for k, v in times.items()}
    return row


# ------------------------------------------------------------------------------------------------ table
def ratio(peer_ms: float | None, ms: float | None) -> str:
    if peer_ms is None or ms is None:
        return "-"
    r = peer_ms / ms
    color = "green" if r >= 1.0 else ("yellow" if r >= 0.9 else "red")
    return f"[{color}]{r:.2f}x[/{color}]"


def table(rows: list[Row], backends):
    from rich.table import Table

    t = Table(title="Inference latency (median ms) and speed ratios: peer ms / aiacc ms (>1: aiacc faster; "
                    "target >= 0.9 against the best peer, native >= 1.0 against the original)")
    for col in ("framework", "model", "batch", "original", "peers (ms)", "best peer"):
        t.add_column(col, justify="right" if col in ("batch", "original") else "left")
    for b in backends:
        t.add_column(f"aiacc {b} ms" if b == "native" else "aiacc ort ms", justify="right")
    for b in backends:
        t.add_column(f"{'ort' if b == 'onnxruntime' else b} vs best", justify="right")
    if "native" in backends:
        t.add_column("native vs orig", justify="right")
    t.add_column("max rel err (all)", justify="right")
    for r in rows:
        peers = ", ".join(f"{k} {r.ms[k]:.1f}" if k in r.ms else f"{k} [red]failed[/red]"
                          for k in PEERS[r.framework] if k in r.ms or k in r.failed)
        best = r.best_peer()
        cells = [r.framework, r.model, str(r.batch), f"{r.ms['original']:.1f}", peers,
                 f"{best[0]} {best[1]:.1f}" if best else "-"]
        for b in backends:
            k = f"aiacc {b}"
            cells.append(f"{r.ms[k]:.1f}" if k in r.ms else "[red]failed[/red]")
        for b in backends:
            cells.append(ratio(best[1] if best else None, r.ms.get(f"aiacc {b}")))
        if "native" in backends:
            cells.append(ratio(r.ms["original"], r.ms.get("aiacc native")))
        errs = [e for e in r.err.values()]
        worst = max(errs) if errs else None
        cells.append("-" if worst is None else
                     (f"[green]{worst:.1e}[/green]" if worst <= 1e-4 else f"[red]{worst:.1e}[/red]"))
        t.add_row(*cells)
    return t


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["elementwise"]:  # the level-3 elementwise rows (benchmarks/elementwise.py, its options)
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import elementwise

        sys.argv = ["elementwise.py", *argv[1:]]
        return elementwise.main()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--frameworks", default=",".join(FRAMEWORKS))
    p.add_argument("--models", default=",".join(zoo.MODELS))
    p.add_argument("--batch", default="1,8", help="comma-separated batch sizes (default: %(default)s)")
    p.add_argument("--iters", type=int, default=20, help="timed rounds (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--level", type=int, default=2)
    p.add_argument("--backends", default="native,onnxruntime")
    p.add_argument("--peers", default="", help="comma-separated peers to run (default: all), e.g. jit,xla")
    p.add_argument("--skip-peers", default="", help="comma-separated peers to skip, e.g. compile")
    p.add_argument("--threads", type=int, default=0,
                   help="intra-op threads of every runtime (torch, TF, MXNet/OpenMP, onnxruntime, OpenCV); "
                        "default: all CPUs. On a shared machine 1 keeps spinning thread pools from "
                        "measuring contention instead of the models")
    p.add_argument("-v", "--verbose", action="store_true", help="print tracebacks of failing candidates")
    args = p.parse_args(argv)
    if args.threads:
        set_threads(args.threads)
    split = lambda s: [x.strip() for x in s.split(",") if x.strip()]  # noqa: E731
    frameworks, models = split(args.frameworks), [zoo.canonical_name(m) for m in split(args.models)]
    batches = [int(b) for b in split(args.batch)]
    args.backends = split(args.backends)
    only, skip = set(split(args.peers)), set(split(args.skip_peers))
    args.peers_for = lambda fw: [q for q in PEERS[fw] if (not only or q in only) and q not in skip]

    from rich.console import Console

    console = Console(width=None if sys.stdout.isatty() else 200)
    import platform

    console.print(f"aiacc {aiacc.__version__}; {platform.processor() or platform.machine()}, "
                  f"{os.cpu_count()} CPUs; iters {args.iters}, warmup {args.warmup}")
    rows = []
    for fw in frameworks:
        if not zoo.installed(fw):
            console.print(f"[yellow]skipped {fw}: not installed[/yellow]")
            continue
        if fw == "mxnet":
            from aiacc.plugins.mxnet._import import import_mxnet

            feats = import_mxnet().runtime.Features()
            console.print(f"mxnet {import_mxnet().__version__}: MKLDNN "
                          f"{'on' if feats.is_enabled('MKLDNN') else 'off'} in this build")
        for name in progress.track(models, f"benchmark {fw}"):
            if not zoo.has(fw, name):
                console.print(f"[yellow]skipped {name} for {fw}: {zoo.UNAVAILABLE[fw, name]}[/yellow]")
                continue
            for batch in batches:
                t = time.perf_counter()
                try:
                    row = bench_row(fw, name, batch, args, lambda s: console.print(s, style="dim"))
                except Exception as e:
                    console.print(f"[red]{fw} {name} b{batch}: {type(e).__name__}: {e}[/red]")
                    continue
                rows.append(row)
                for k, msg in row.failed.items():
                    console.print(f"[red]  {fw} {name} b{batch} {k}: {msg}[/red]")
                console.print(f"  {fw} {name} b{batch}: " + ", ".join(f"{k} {v:.1f}ms" for k, v in row.ms.items())
                              + f"  ({time.perf_counter() - t:.0f}s)")
    console.print(table(rows, args.backends))
    return 0


if __name__ == "__main__":
    sys.exit(main())
