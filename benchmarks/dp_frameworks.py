"""What the TensorFlow and MXNet data-parallel paths overlap, measured on the emulated cluster: each
framework's aiacc trainer with `overlap` on and off, interleaved in the same processes.

Setup: `aiacc.distributed.testbed`, 2 nodes x 1 rank, each node pinned to its own core, links shaped by
tc tbf (default 1 Gbit/s); gloo over the links. Model: an MLP of 4 hidden layers of 1024 units on 512
inputs (3.7 M parameters, 15 MB of fp32 gradients), batch 64 per rank, the same weights on every rank.

    MXNet (Gluon, hybridized)   overlap: DistributedTrainer takes each gradient as soon as MXNet's
                                asynchronous engine has computed it (last layer first) and starts each
                                bucket's all-reduce while the engine computes earlier layers' gradients;
                                each bucket's update is pushed to the engine while later buckets are on
                                the wire. sync: every gradient, then the reduction, then one update.
    Keras (tf.function step)    overlap: every bucket starts at once after backward; each bucket's update
                                runs while later buckets are on the wire. sync: reduction, then update.

Candidates per framework: "1 rank, no comm" (the framework's own optimizer, no communication), "sync",
"overlap" (both on aiacc's plan for this model's sizes, and on one bucket per layer, where overlap has
most to hide). Columns: median step, interquartile range, throughput relative to sync.

    python benchmarks/dp_frameworks.py                         # 1 Gbit/s, mxnet and tf
    python benchmarks/dp_frameworks.py --rate 100mbit --frameworks mxnet --steps 4
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HIDDEN, INPUTS, LAYERS, BATCH = 1024, 512, 4, 64


def mxnet_candidates(rank: int):
    """{label: step function} for MXNet."""
    import numpy as np

    import aiacc.plugins.mxnet.horovod as hvd
    from aiacc.plugins.mxnet._import import import_mxnet

    mx = import_mxnet()
    rng = np.random.default_rng(1000 + rank)
    x = mx.nd.array(rng.standard_normal((BATCH, INPUTS)).astype("float32"))
    y = mx.nd.array(rng.standard_normal((BATCH, 10)).astype("float32"))
    loss_fn = mx.gluon.loss.L2Loss()

    def make(trainer_of):
        mx.random.seed(0)
        net = mx.gluon.nn.HybridSequential()
        for i in range(LAYERS):
            net.add(mx.gluon.nn.Dense(HIDDEN, in_units=INPUTS if i == 0 else HIDDEN, activation="relu"))
        net.add(mx.gluon.nn.Dense(10, in_units=HIDDEN))
        net.initialize(mx.init.Xavier())
        net.hybridize(static_alloc=True, static_shape=True)
        trainer = trainer_of(net.collect_params())

        def step():
            with mx.autograd.record():
                loss = loss_fn(net(x), y)
            loss.backward()
            trainer.step(BATCH)
            mx.nd.waitall()  # the step ends when its updates have run
        return step

    sgd = ("sgd", {"learning_rate": 0.01, "momentum": 0.9})
    out = {"1 rank, no comm": make(lambda p: mx.gluon.Trainer(p, *sgd, kvstore=None))}
    for plan in ("aiacc", "per-tensor"):
        for overlap in (False, True):
            out[f"{'overlap' if overlap else 'sync'} ({plan})"] = make(
                lambda p, o=overlap, pl=plan: hvd.DistributedTrainer(p, *sgd, plan=pl, overlap=o))
    return out


def tf_candidates(rank: int):
    """{label: step function} for Keras (each step one tf.function call)."""
    import keras
    import numpy as np
    import tensorflow as tf

    import aiacc.plugins.tf.horovod as hvd

    rng = np.random.default_rng(1000 + rank)
    x = tf.constant(rng.standard_normal((BATCH, INPUTS)).astype("float32"))
    y = tf.constant(rng.standard_normal((BATCH, 10)).astype("float32"))

    def make(opt):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((INPUTS,))] + [keras.layers.Dense(HIDDEN, activation="relu")
                                                             for _ in range(LAYERS)] + [keras.layers.Dense(10)])

        @tf.function
        def step_fn():
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(x) - y) ** 2)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply(grads, model.trainable_variables)
            return loss

        return lambda: step_fn().numpy()

    sgd = lambda: keras.optimizers.SGD(0.01, momentum=0.9)
    out = {"1 rank, no comm": make(sgd())}
    for plan in ("aiacc", "per-tensor"):
        for overlap in (False, True):
            out[f"{'overlap' if overlap else 'sync'} ({plan})"] = make(
                hvd.DistributedOptimizer(sgd(), plan=plan, overlap=overlap))
    return out


def worker(out: str, frameworks: list[str], steps: int, warmup: int) -> None:
    import torch
    import torch.distributed as dist

    from aiacc.distributed import process

    torch.set_num_threads(1)
    process.init()
    report = {}
    for fw in frameworks:
        cands = (mxnet_candidates if fw == "mxnet" else tf_candidates)(dist.get_rank())
        names = list(cands)
        times = {n: [] for n in names}
        for i in range(steps + warmup):
            k = i % len(names)
            for n in names[k:] + names[:k]:
                dist.barrier()
                t0 = time.perf_counter()
                cands[n]()
                dt = time.perf_counter() - t0
                if i >= warmup:
                    times[n].append(dt)
        report[fw] = times
        del cands
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps(report))
    dist.barrier()
    process.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", default="1gbit", help="link rate (tc syntax)")
    ap.add_argument("--frameworks", default="mxnet,tf")
    ap.add_argument("--steps", type=int, default=6, help="measured rounds")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    frameworks = [f for f in args.frameworks.split(",") if f]
    if args.worker:
        worker(args.worker, frameworks, args.steps, args.warmup)
        return
    from rich.console import Console
    from rich.table import Table

    from aiacc.distributed.testbed import unavailable
    from benchmarks.testbed_report import run_workers

    reason = unavailable()
    if reason:
        raise SystemExit(f"benchmarks/dp_frameworks.py: {reason}")
    report = run_workers(__file__, ["--frameworks", ",".join(frameworks), "--steps", str(args.steps),
                                    "--warmup", str(args.warmup)], rate=args.rate, timeout=1200,
                         env={"TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""})
    t = Table(title=f"TF / MXNet data-parallel step, 2 nodes x 1 rank at {args.rate} (MLP 3.7 M parameters, "
                    f"batch {BATCH} per rank), medians of interleaved steps")
    for col in ("framework", "candidate", "median step ms", "p25-p75 ms", "vs sync (same plan)"):
        t.add_column(col, justify="left" if col in ("framework", "candidate") else "right")
    for fw, times in report.items():
        for label, ts in times.items():
            med = statistics.median(ts)
            q = statistics.quantiles(ts, n=4) if len(ts) > 1 else [med, med, med]
            plan = label[label.find("("):] if "(" in label else None
            sync = statistics.median(times[f"sync {plan}"]) if plan else None
            t.add_row(fw, label, f"{med * 1e3:.0f}", f"{q[0] * 1e3:.0f}-{q[2] * 1e3:.0f}",
                      f"{sync / med:.2f}x" if sync else "")
        t.add_section()
    Console(width=200).print(t)


if __name__ == "__main__":
    main()
