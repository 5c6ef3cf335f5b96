"""Training-step benchmark: one step (forward, backward, optimizer update) of a ResNet-style CNN and a
BERT-style encoder (aiacc.zoo), per framework, for the original, the framework's best path and aiacc's
mode="train" model, interleaved in one process; medians and ratios to the original are printed.

    torch   eager | torch.compile | aiacc.optimize(mode="train")
    tf      Keras eager step | tf.function step | tf.function(jit_compile=True) | aiacc (+ tf.function, XLA)
    mxnet   Gluon imperative | hybridize(static_alloc, static_shape) | aiacc (SymbolBlock, static_alloc)

The loss is the mean square of the outputs (no labels needed) and the optimizer plain SGD, so every path
does the same work. Peak memory is not measured here yet.

    python benchmarks/training.py [--frameworks tf,mxnet,torch] [--models resnet50,bert_encoder]
                                  [--batches 8,32] [--size 64] [--seq 64] [--iters 10]
"""
from __future__ import annotations

import argparse
import os
import sys
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import numpy as np  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

import aiacc  # noqa: E402
from aiacc import zoo  # noqa: E402
from aiacc.demo import median_ms, time_interleaved  # noqa: E402


def build(framework: str, model: str, batch: int, args):
    kw = {"size": args.size} if model != "bert_encoder" else {"seq": args.seq}
    return zoo.build(framework, model, batch=batch, **kw)


def tf_steps(framework, model_name, batch, args) -> dict:
    """Step callables for TF: each builds its own model from the same seed (the steps update weights)."""
    import tensorflow as tf

    def step_of(model, call, compile_=None):
        import keras

        opt = keras.optimizers.SGD(1e-3)

        def step(x):
            with tf.GradientTape() as tape:
                out = call(x)
                loss = tf.add_n([tf.reduce_mean(tf.square(tf.cast(o, tf.float32))) for o in tf.nest.flatten(out)])
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients([(g, v) for g, v in zip(grads, model.trainable_variables) if g is not None])
            return loss
        return step if compile_ is None else tf.function(step, jit_compile=compile_)

    out = {}
    m, x = build(framework, model_name, batch, args)
    xt = tf.constant(x)
    out["original (eager)"] = (lambda s: lambda: s(xt))(step_of(m, lambda a: m(a, training=True)))
    m2, _ = build(framework, model_name, batch, args)
    out["tf.function"] = (lambda s: lambda: s(xt))(step_of(m2, lambda a: m2(a, training=True), False))
    m3, _ = build(framework, model_name, batch, args)
    out["tf.function XLA"] = (lambda s: lambda: s(xt))(step_of(m3, lambda a: m3(a, training=True), True))
    m4, _ = build(framework, model_name, batch, args)
    fast = aiacc.optimize(m4, x, mode="train")
    out["aiacc"] = (lambda s: lambda: s(xt))(step_of(fast, lambda a: fast(a, training=True), False))
    m5, _ = build(framework, model_name, batch, args)
    fast5 = aiacc.optimize(m5, x, mode="train")
    out["aiacc XLA"] = (lambda s: lambda: s(xt))(step_of(fast5, lambda a: fast5(a, training=True), True))
    return out


def mxnet_steps(framework, model_name, batch, args) -> dict:
    from aiacc.plugins.mxnet._import import import_mxnet

    mx = import_mxnet()

    def step_of(block, xs):
        trainer = mx.gluon.Trainer(block.collect_params(), "sgd", {"learning_rate": 1e-3})
        nd = [mx.nd.array(a, dtype=a.dtype) for a in xs]

        def step():
            with mx.autograd.record():
                out = block(*nd)
                outs = out if isinstance(out, (list, tuple)) else [out]
                loss = mx.nd.add_n(*[(o.astype("float32") ** 2).mean() for o in outs])
            loss.backward()
            trainer.step(batch, ignore_stale_grad=True)
            mx.nd.waitall()
        return step

    out = {}
    m, xs = build(framework, model_name, batch, args)
    out["original (imperative)"] = step_of(m, xs)
    m2, _ = build(framework, model_name, batch, args)
    m2.hybridize(static_alloc=True, static_shape=True)
    out["hybridize static"] = step_of(m2, xs)
    m3, _ = build(framework, model_name, batch, args)
    out["aiacc"] = step_of(aiacc.optimize(m3, xs, mode="train"), xs)
    return out


def torch_steps(framework, model_name, batch, args) -> dict:
    import torch

    def step_of(model, params, xs):
        opt = torch.optim.SGD(params, lr=1e-3)

        def step():
            opt.zero_grad(set_to_none=True)
            out = model(*xs)
            outs = out if isinstance(out, (list, tuple)) else [out]
            sum((o.float() ** 2).mean() for o in outs).backward()
            opt.step()
        return step

    out = {}
    m, xs = build(framework, model_name, batch, args)
    m.train()
    out["original (eager)"] = step_of(m, m.parameters(), xs)
    m2, _ = build(framework, model_name, batch, args)
    m2.train()
    out["torch.compile"] = step_of(torch.compile(m2), m2.parameters(), xs)
    m3, _ = build(framework, model_name, batch, args)
    m3.train()
    fast = aiacc.optimize(m3, xs, mode="train")
    out["aiacc"] = step_of(fast, m3.parameters(), xs)
    return out


STEPS = {"tf": tf_steps, "mxnet": mxnet_steps, "torch": torch_steps}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frameworks", default="tf,mxnet,torch")
    ap.add_argument("--models", default="resnet50,bert_encoder")
    ap.add_argument("--batches", default="8,32")
    ap.add_argument("--size", type=int, default=64, help="image size of the CNN")
    ap.add_argument("--seq", type=int, default=64, help="sequence length of the encoder")
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args(argv)
    console = Console()
    table = Table(title="One training step (forward + backward + SGD update), median ms; ratio = original / path")
    for col in ("framework", "model", "batch", "path", "ms", "vs original"):
        table.add_column(col, justify="left" if col in ("framework", "model", "path") else "right")
    for fw in args.frameworks.split(","):
        for model in args.models.split(","):
            for batch in (int(b) for b in args.batches.split(",")):
                try:
                    fns = STEPS[fw](fw, model, batch, args)
                    times = time_interleaved(fns, args.iters, warmup=2)
                except Exception as e:  # noqa: BLE001 - one failing row must not end the table
                    table.add_row(fw, model, str(batch), "error", "-", f"{type(e).__name__}: {str(e)[:60]}")
                    traceback.print_exc(file=sys.stderr)
                    continue
                base = median_ms(next(iter(times.values())))
                for path, ts in times.items():
                    ms = median_ms(ts)
                    table.add_row(fw, model, str(batch), path, f"{ms:.1f}", f"{base / ms:.2f}x")
    console.print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
