"""Training-step benchmark: one step (forward, backward, optimizer update) of a ResNet-style CNN and a
BERT-style encoder (aiacc.zoo), per framework, for the original, the framework's best paths and aiacc's
mode="train" model. Times are interleaved in one process (medians, ratio = original / path, the original
being the issue's: eager torch, Keras' fit step, imperative Gluon); the peak
memory of each path is measured in a fresh subprocess per path (Linux: the process's peak resident set,
VmHWM, reset through /proc/self/clear_refs after building and two warm-up steps, so it is the step's own
peak: activations, gradients, optimizer state and the framework's workspace, native allocations included).
An aiacc path's subprocess builds aiacc's model with the step and fit choices the timing run made pinned by
name (framework_compile=<step>, training.set_fit_path(<fit path>)), so none of the candidates that the
choice measures at optimize time is built or resident there.

    torch   eager | torch.compile | aiacc.optimize(mode="train")
    tf      Keras eager step | tf.function step | tf.function(jit_compile=True) | aiacc in each of the three
            | Keras fit step (train_on_batch, compile's jit_compile='auto': no XLA on a CPU) | the same with
            jit_compile=True | aiacc's fit step (jit_compile='auto': aiacc's measured fit choice, XLA or not)
    mxnet   Gluon imperative | hybridize(static_alloc, static_shape) | aiacc (SymbolBlock)

aiacc's train mode measures at optimize time whether the framework's own compiler (torch.compile, XLA,
hybridize flags) runs the step faster and then uses it underneath; the "aiacc path" column says what it
chose. The loss is the mean square of the outputs (no labels needed) and the optimizer plain SGD, so every
path does the same work.

    python benchmarks/training.py [--frameworks tf,mxnet,torch] [--models resnet_small,bert_encoder]
                                  [--batches 8,32] [--size 64] [--seq 64] [--iters 10] [--no-memory]
                                  [--no-xla]
    resnet_small: torchvision's ResNet-18 layout at widths 16-128, 10 classes, written alike in each
    framework (RESNET_WIDTHS); bert_encoder: aiacc.zoo's (4 layers, hidden 256; --quick: 2 layers, 128).
    python benchmarks/training.py --quick     # a BERT-style encoder (2 layers, hidden 128, seq 32),
                                              # batch 8, every framework, 3 rounds, no memory: minutes
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

import aiacc  # noqa: E402
from aiacc import zoo  # noqa: E402
from aiacc.demo import median_ms, time_interleaved  # noqa: E402


# the ResNet-style CNN of the table: torchvision's ResNet-18 layout (7x7/2 stem, max pool, four stages of two
# BasicBlocks, projection shortcuts where the shape changes, global pooling, classifier) at widths 16, 32, 64,
# 128 and 10 classes, written alike in each framework, so every framework trains the same network
RESNET_WIDTHS = (16, 32, 64, 128)


def resnet_small(framework: str, batch: int, size: int):
    """(model, example inputs) of the small ResNet-18-layout CNN in `framework`, random weights, train mode."""
    x = np.random.default_rng(0).standard_normal((batch, 3, size, size)).astype("float32")
    if framework == "torch":
        import torch

        from aiacc.zoo.small.torch_models import BasicBlock
        from aiacc.zoo.torch_models import ResNet

        torch.manual_seed(0)
        return ResNet(BasicBlock, (2, 2, 2, 2), num_classes=10, base=RESNET_WIDTHS[0]), (torch.from_numpy(x),)
    if framework == "mxnet":
        from aiacc.plugins.mxnet._import import import_mxnet

        mx = import_mxnet()
        from mxnet.gluon.model_zoo.vision.resnet import BasicBlockV1, ResNetV1

        mx.random.seed(0)
        net = ResNetV1(BasicBlockV1, [2, 2, 2, 2], [RESNET_WIDTHS[0], *RESNET_WIDTHS], classes=10)
        net.initialize(mx.init.Xavier())
        net(mx.nd.array(x))  # deferred shapes
        return net, (x,)
    import keras

    keras.utils.set_random_seed(0)
    L = keras.layers

    def conv_bn(t, width, kernel, stride):
        t = L.Conv2D(width, kernel, stride, padding="same", use_bias=False)(t)
        return L.BatchNormalization(epsilon=1e-5)(t)

    inp = keras.Input((size, size, 3))
    t = L.ReLU()(conv_bn(inp, RESNET_WIDTHS[0], 7, 2))
    t = L.MaxPooling2D(3, 2, padding="same")(t)
    cin = RESNET_WIDTHS[0]
    for i, width in enumerate(RESNET_WIDTHS):
        for j in range(2):
            stride = 2 if j == 0 and i > 0 else 1
            short = conv_bn(t, width, 1, stride) if stride != 1 or cin != width else t
            y = L.ReLU()(conv_bn(t, width, 3, stride))
            t = L.ReLU()(L.Add()([conv_bn(y, width, 3, 1), short]))
            cin = width
    out = L.Dense(10)(L.GlobalAveragePooling2D()(t))
    return keras.Model(inp, out), np.ascontiguousarray(x.transpose(0, 2, 3, 1))


def build(framework: str, model: str, batch: int, args):
    if model == "resnet_small":
        return resnet_small(framework, batch, args.size)
    if model == "bert_encoder":
        kw = {"seq": args.seq, **({"layers": 2, "hidden": 128, "ffn": 512} if args.quick else {})}
    else:
        kw = {"size": args.size}
    return zoo.build(framework, model, batch=batch, **kw)


def compile_option(args):
    """framework_compile for aiacc.optimize: measured ('auto') in the timing run; in a memory subprocess
    the candidate the timing run chose (by name), so the child does not measure again."""
    return "auto" if args.child_compile is None else args.child_compile


def pin_fit(fast, args) -> None:
    """In a memory subprocess, the fit path the timing run chose (--child-fit), pinned without measuring
    (training.set_fit_path), so the child builds no fit candidate: its peak is the chosen step's own."""
    if args.child_fit:
        from aiacc.plugins.tf.training import set_fit_path

        set_fit_path(fast, args.child_fit)


def chosen(fast) -> str:
    """What aiacc's train mode runs underneath (its measured choice), for the table."""
    return getattr(fast, "aiacc_train_path", None) or "aiacc graph"


# Each builder returns {path name: () -> (step callable, note)}; a path is built only when asked for, so a
# memory subprocess builds one model only.
def tf_paths(framework, model_name, batch, args) -> dict:
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

    def original(compile_):
        def make():
            m, x = build(framework, model_name, batch, args)
            xt = tf.constant(x)
            s = step_of(m, lambda a: m(a, training=True), compile_)
            return (lambda: s(xt)), ""
        return make

    built = {}  # one aiacc.optimize (one measured choice) serves the three aiacc paths of a timing run

    def optimized(compile_):
        def make():
            if "fast" not in built:
                m, x = build(framework, model_name, batch, args)
                fast = aiacc.optimize(m, x, mode="train", framework_compile=compile_option(args))
                pin_fit(fast, args)
                built["fast"] = fast, x
            fast, x = built["fast"]
            xt = tf.constant(x)
            s = step_of(fast, lambda a: fast(a, training=True), compile_)
            return (lambda: s(xt)), chosen(fast)
        return make

    def fit_step(model, x, jit_compile):
        # Keras' own train step (model.fit's, one batch): the mean-square loss as "mse" against zeros
        import keras

        model.compile(keras.optimizers.SGD(1e-3), loss="mse", jit_compile=jit_compile)
        outs = tf.nest.flatten(model(tf.constant(x), training=False))
        y = [np.zeros(o.shape, o.dtype.as_numpy_dtype) for o in outs]
        y = y[0] if len(y) == 1 else y
        return lambda: model.train_on_batch(x, y)

    def original_fit(jit_compile):
        def make():
            m, x = build(framework, model_name, batch, args)
            return fit_step(m, x, jit_compile), ""
        return make

    def optimized_fit():
        optimized(None)()  # builds the shared aiacc model
        fast, x = built["fast"]
        step = fit_step(fast, x, "auto")  # aiacc's measured fit choice resolves "auto"
        fit = getattr(fast, "aiacc_fit_choice", None)
        if fit is not None:
            print(f"{framework} {model_name} b{batch} aiacc fit choice: {fit.summary()}", flush=True)
        if fit is not None and "drawn outside" in fit.path:
            how = "dropout drawn outside one XLA program"
        else:
            how = "XLA" if fast.jit_compile else "tf.function"
        return step, chosen(fast) + f"; fit {how}" + FIT_NOTE + (fit.path if fit is not None else "")

    paths = {"original (eager)": original(None), "tf.function": original(False), "tf.function XLA": original(True),
             "aiacc (eager loop)": optimized(None), "aiacc in tf.function": optimized(False),
             "aiacc in XLA": optimized(True), FIT: original_fit("auto"), "Keras fit step XLA": original_fit(True),
             "aiacc fit step": optimized_fit}
    if args.no_xla:  # the table says they were left out
        paths = {k: (SKIPPED if "XLA" in k else v) for k, v in paths.items()}
    return paths


# TF's original in the issue's sense: Keras' fit step (compile's jit_compile='auto': no XLA on a CPU)
FIT = "Keras fit step"
# the aiacc fit row's note carries the fit path it ran (after this marker) for its memory subprocess
FIT_NOTE = " | fit path: "
# a path left out by an option: the table prints it as skipped, with the reason
SKIPPED = "skipped: --no-xla (XLA's compile of this model is minutes on this machine)"


def mxnet_paths(framework, model_name, batch, args) -> dict:
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

    def original(hybrid):
        def make():
            m, xs = build(framework, model_name, batch, args)
            if hybrid:
                m.hybridize(static_alloc=True, static_shape=True)
            return step_of(m, xs), ""
        return make

    def optimized():
        m, xs = build(framework, model_name, batch, args)
        fast = aiacc.optimize(m, xs, mode="train", framework_compile=compile_option(args))
        return step_of(fast, xs), chosen(fast)

    return {"original (imperative)": original(False), "hybridize static": original(True), "aiacc": optimized}


def torch_paths(framework, model_name, batch, args) -> dict:
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

    def original(compiled):
        def make():
            m, xs = build(framework, model_name, batch, args)
            m.train()
            return step_of(torch.compile(m) if compiled else m, list(m.parameters()), xs), ""
        return make

    def optimized():
        m, xs = build(framework, model_name, batch, args)
        m.train()
        fast = aiacc.optimize(m, xs, mode="train", framework_compile=compile_option(args))
        return step_of(fast, list(fast.parameters()), xs), chosen(fast)  # the export's own parameters

    return {"original (eager)": original(False), "torch.compile": original(True), "aiacc": optimized}


PATHS = {"tf": tf_paths, "mxnet": mxnet_paths, "torch": torch_paths}


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def child(spec: str, args) -> int:
    """Build one path in this (fresh) process, warm it up, reset the peak RSS and run two steps: print
    {"peak": VmHWM bytes during the steps, "base": RSS before them} as JSON."""
    fw, model, batch, path = spec.split(":", 3)
    step, _ = PATHS[fw](fw, model, int(batch), args)[path]()
    step()
    step()  # warm-up: compiled code, gradients and optimizer state exist now
    gc.collect()
    base = _status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS
    for _ in range(2):
        step()
    print(json.dumps({"peak": _status_kib("VmHWM") * 1024, "base": base * 1024}))
    return 0


def peak_memory(fw: str, model: str, batch: int, path: str, argv: list[str], note: str) -> dict | None:
    """The child's figures for one path, or None (printed to stderr) when it failed."""
    cmd = [sys.executable, os.path.abspath(__file__), *argv, "--child", f"{fw}:{model}:{batch}:{path}"]
    if note:  # an aiacc path: the child uses the timing run's choices (the step's, the fit step's) by name
        # instead of measuring again, so no candidate of the choice is built there
        step_note, _, fit_path = note.partition(FIT_NOTE)
        cmd += ["--child-compile", step_note.split("; fit ")[0]]
        if fit_path:
            cmd += ["--child-fit", fit_path]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    for line in reversed(r.stdout.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    print(f"memory of {fw} {model} {batch} {path} failed:\n{r.stderr[-2000:]}", file=sys.stderr)
    return None


def reference(names: list) -> str:
    """The original the issue's ratios are taken against: Keras' fit step for TF (where the row exists),
    else the first path (eager torch, imperative Gluon)."""
    return FIT if FIT in names else names[0]


def summary(fw: str, model: str, batch: int, ms: dict) -> str:
    """One line per row of the issue's table: each aiacc path against the original (the first path) and
    against the fastest of the framework's own paths (the others not named aiacc)."""
    names = list(ms)
    first = reference(names)
    peers = [k for k in names if k != first and not k.startswith("aiacc") and k != names[0]]
    best = min(peers, key=ms.get) if peers else first
    parts = [f"{k} {ms[k]:.1f} ms: {ms[k] / ms[first]:.2f} of {first}, {ms[k] / ms[best]:.2f} of {best}"
             for k in names if k.startswith("aiacc")]
    return f"summary {fw} {model} b{batch}: " + "; ".join(parts)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frameworks", default="tf,mxnet,torch")
    ap.add_argument("--models", default="resnet_small,bert_encoder",
                    help="resnet_small (ResNet-18 layout, widths 16-128), bert_encoder, or a zoo model (resnet50)")
    ap.add_argument("--batches", default="8,32")
    ap.add_argument("--size", type=int, default=64, help="image size of the CNN")
    ap.add_argument("--no-xla", action="store_true", help="leave out the XLA paths (their compile is minutes "
                    "on a large CNN)")
    ap.add_argument("--seq", type=int, default=64, help="sequence length of the encoder")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--no-memory", action="store_true", help="skip the per-path memory subprocesses")
    ap.add_argument("--quick", action="store_true", help="small BERT-style encoder, batch 8, 3 rounds")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--child-compile", help=argparse.SUPPRESS)
    ap.add_argument("--child-fit", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.quick:  # minutes, not tens of minutes: the memory subprocesses are left out
        args.models, args.batches, args.seq, args.iters, args.no_memory = "bert_encoder", "8", 32, 3, True
    if args.child:
        return child(args.child, args)
    shared = [a for a in argv if a != "--no-memory"]
    console = Console(width=160)
    table = Table(title="One training step (forward + backward + SGD update): median ms, ratio = original / path, "
                        "peak RSS of the step in a fresh process")
    for col in ("framework", "model", "batch", "path", "ms", "vs original", "peak MiB", "aiacc path"):
        table.add_column(col, justify="left" if col in ("framework", "model", "path", "aiacc path") else "right")
    mib = 1 << 20
    for fw in args.frameworks.split(","):
        for model in args.models.split(","):
            for batch in (int(b) for b in args.batches.split(",")):
                try:
                    makers = PATHS[fw](fw, model, batch, args)
                    skipped = {name: why for name, why in makers.items() if isinstance(why, str)}
                    built = {name: make() for name, make in makers.items() if name not in skipped}
                    times = time_interleaved({k: v[0] for k, v in built.items()}, args.iters, warmup=2)
                except Exception as e:  # noqa: BLE001 - one failing row must not end the table
                    table.add_row(fw, model, str(batch), "error", "-", f"{type(e).__name__}: {str(e)[:60]}")
                    traceback.print_exc(file=sys.stderr)
                    continue
                notes = {k: v[1] for k, v in built.items()}
                shown = {k: v.split(FIT_NOTE)[0] for k, v in notes.items()}
                del built
                gc.collect()
                base = median_ms(times[reference(list(times))])
                for path, ts in times.items():
                    ms = median_ms(ts)
                    mem = None if args.no_memory else peak_memory(fw, model, batch, path, shared, notes[path])
                    table.add_row(fw, model, str(batch), path, f"{ms:.1f}", f"{base / ms:.2f}x",
                                  "-" if mem is None else f"{mem['peak'] / mib:.0f}", shown[path])
                    console.print(f"{fw} {model} b{batch} {path}: {ms:.1f} ms ({base / ms:.2f}x)"
                                  + ("" if mem is None else f", peak {mem['peak'] / mib:.0f} MiB") +
                                  (f" [{shown[path]}]" if shown[path] else ""), markup=False)
                for path, why in skipped.items():
                    table.add_row(fw, model, str(batch), path, "-", "-", "-", why)
                console.print(summary(fw, model, batch, {k: median_ms(v) for k, v in times.items()}), markup=False)
    console.print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
