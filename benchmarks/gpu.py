"""GPU inference: ResNet-50 and a BERT-base-shaped encoder at batch 1/8/64, absolute latency and throughput
next to the physical bound of the device, for torch's own paths, onnxruntime's CUDA and TensorRT providers
used directly, and aiacc's backends.

    .venv/bin/python benchmarks/gpu.py --device cuda                       # the full table (H200: minutes)
    .venv/bin/python benchmarks/gpu.py --device cuda --precision bf16 --json $OUT/gpu.json
    .venv/bin/python benchmarks/gpu.py --device cpu --quick                # tiny models: checks it runs

Candidates (each built, checked against eager on the same inputs, then all timed interleaved, one call of
each per round, the device synchronized after every call):

    eager         the model as torch runs it (torch.inference_mode), in --precision (tf32: float32 with
                  TensorFloat-32 matmuls and convolutions allowed; fp32: not allowed)
    compile       torch.compile(model, mode="max-autotune") (Inductor with Triton autotuning, CUDA graphs)
    ort-cuda      onnxruntime's CUDAExecutionProvider directly: the model as traced by aiacc with no pass run
                  (level 0), exported to ONNX, one session, io-binding on device tensors; fp32 graph
    ort-trt       the same session on TensorrtExecutionProvider (engine cache under --trt-cache)
    aiacc         aiacc.optimize(model, inputs, precision=--precision): the torch native backend
    aiacc+graph   the same module captured as a CUDA graph (aiacc.plugins.torch.cuda.capture)
    aiacc-ort     aiacc.optimize(..., backend="onnxruntime", providers=["cuda"]): io-binding on device tensors
    aiacc-trt     aiacc.optimize(..., backend="onnxruntime", providers=["tensorrt", "cuda"])

The bound: FLOPs of one batch from aiacc's own counter (aiacc.core.stats.graph_stats on the traced graph, a
multiply-add counting 2) over the device's dense peak at the candidate's precision (H200 SXM: FP32 67,
TF32 495, BF16/FP16 989 TFLOP/s; onnxruntime's CUDA provider may use TF32, so its fp32 rows use the TF32
peak); "% peak" is achieved FLOP/s over that peak. On CPU there is no peak table: give --peak-tflops.
--budget-s stops building further candidates once spent (they are listed as skipped), so a run on a
machine with little time left still prints what it measured; --json writes the rows after every model.
"""
from __future__ import annotations

import argparse
import copy
import functools
import json
import os
import sys
import time
import traceback
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import aiacc  # noqa: E402
from aiacc.core.stats import graph_stats  # noqa: E402
from aiacc.plugins.torch.ort import _from_ortvalue as from_ortvalue  # noqa: E402  (DLPack, older ORT too)
from aiacc.zoo import torch_models  # noqa: E402

# dense peak TFLOP/s of an H200 SXM by precision (NVIDIA's datasheet, without sparsity)
H200_PEAK_TFLOPS = {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4}
CANDIDATES = ("eager", "compile", "ort-cuda", "ort-trt", "aiacc", "aiacc+graph", "aiacc-ort", "aiacc-trt")
DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class Row:
    model: str
    batch: int
    candidate: str
    precision: str
    ms: float | None = None
    samples_per_s: float | None = None
    tflops: float | None = None
    bound_ms: float | None = None
    pct_peak: float | None = None
    max_rel_err: float | None = None
    setup_s: float | None = None
    status: str = "ok"
    detail: str = ""


@dataclass
class Result:
    device: str
    device_name: str
    precision: str
    quick: bool
    peak_tflops: dict = field(default_factory=dict)
    flops: dict = field(default_factory=dict)
    rows: list = field(default_factory=list)
    environment: dict = field(default_factory=dict)


# ------------------------------------------------------------------------------------------------ models
def build(name: str, batch: int, quick: bool):
    """(model in eval mode, example inputs on CPU)."""
    if name == "resnet50":
        if quick:  # the ResNet layout, one bottleneck per stage, narrow, small images
            m = torch_models._init(torch_models.ResNet(layers=(1, 1, 1, 1), num_classes=10, base=8), 2)
            return m.eval(), torch_models._images(batch, 32, 10)
        m, xs = torch_models.resnet50(batch=batch, size=224)
        return m.eval(), xs
    if name == "bert_base":
        if quick:
            m, xs = torch_models.bert_encoder(batch=batch, seq=16, vocab=100, hidden=32, heads=2, layers=1, ffn=64)
        else:  # BERT-base's shape: 12 layers, hidden 768, 12 heads, FFN 3072, vocab 30522, sequence 128
            m, xs = torch_models.bert_encoder(batch=batch, seq=128, vocab=30522, hidden=768, heads=12, layers=12,
                                              ffn=3072)
        return m.eval(), xs
    raise SystemExit(f"unknown model {name!r} (resnet50, bert_base)")


def batch_flops(model, inputs) -> int | None:
    """FLOPs of one forward on `inputs`, from aiacc's counter on the traced (unoptimized) graph."""
    graph = aiacc.trace(model, inputs)
    stats = graph_stats(graph, {})
    return int(stats.flops) if stats.flops else None


# ------------------------------------------------------------------------------------------------ helpers
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _leaves(out) -> list[torch.Tensor]:
    from torch.utils import _pytree as pytree

    return [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


def _rel_err(expected, got) -> float:
    e, g = _leaves(expected), _leaves(got)
    if len(e) != len(g):
        return float("inf")
    worst = 0.0
    for a, b in zip(e, g):
        a, b = a.detach().float().cpu(), b.detach().float().cpu()
        if a.shape != b.shape:
            return float("inf")
        scale = float(a.abs().max()) or 1.0
        worst = max(worst, float((a - b).abs().max()) / scale)
    return worst


def _cast_inputs(xs, dtype, device):
    return tuple(x.to(device=device, dtype=dtype) if x.is_floating_point() else x.to(device) for x in xs)


def ort_session_runner(model, xs_cpu, device, providers, trt_cache: str | None):
    """onnxruntime used directly: aiacc's level-0 trace of the model as ONNX, one session on `providers`,
    io-binding on torch tensors (device memory in and out)."""
    import onnxruntime as ort

    from aiacc.core.onnx import to_onnx

    graph = aiacc.trace(model, xs_cpu)
    proto = to_onnx(graph)
    opts = []
    for p in providers:
        if p == "TensorrtExecutionProvider":
            cache = trt_cache or os.path.join(os.path.expanduser("~"), ".cache", "aiacc", "tensorrt")
            os.makedirs(cache, exist_ok=True)
            opts.append((p, {"trt_engine_cache_enable": "True", "trt_engine_cache_path": cache}))
        else:
            opts.append(p)
    missing = [p for p in providers if p not in ort.get_available_providers()]
    if missing:
        raise RuntimeError(f"onnxruntime has no {', '.join(missing)}")
    sess = ort.InferenceSession(proto.SerializeToString(), providers=opts + ["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    outs = [o.name for o in sess.get_outputs()]
    feeds = [x.to(device).contiguous() for x in xs_cpu]
    kind = "cuda" if device.type == "cuda" else "cpu"
    index = device.index or 0 if device.type == "cuda" else 0

    def run():
        binding = sess.io_binding()
        for name, x in zip(names, feeds):
            binding.bind_input(name, kind, index, _np_dtype(x.dtype), list(x.shape), x.data_ptr())
        for name in outs:
            binding.bind_output(name, kind, index)
        sess.run_with_iobinding(binding)
        return [from_ortvalue(v) for v in binding.get_outputs()]
    return run


def _np_dtype(dtype: torch.dtype):
    return {torch.float32: np.float32, torch.float16: np.float16, torch.int64: np.int64, torch.int32: np.int32,
            torch.bool: np.bool_}[dtype]


# ------------------------------------------------------------------------------------------------ one model
def makers(name: str, model, xs_cpu, device, args) -> dict[str, tuple[str, Callable[[], Callable]]]:
    """candidate -> (precision, a function that builds and returns the no-argument runner)."""
    prec = args.precision
    dtype = DTYPES[prec]
    xs = _cast_inputs(xs_cpu, dtype, device)
    # every candidate gets its own copy (.to() changes a module in place)
    on_dev = copy.deepcopy(model).to(device=device, dtype=dtype)

    @functools.lru_cache(maxsize=1)  # aiacc and aiacc+graph share one optimize
    def optimized():
        fast = aiacc.optimize(copy.deepcopy(model).to(device), _cast_inputs(xs_cpu, torch.float32, device),
                              precision=_aiacc_precision(prec), verify=False)
        fxs = xs if dtype == torch.float32 else _cast_inputs(xs_cpu, _fast_dtype(fast, dtype), device)
        return fast, fxs
    cuda_fp32 = "tf32" if device.type == "cuda" else "fp32"  # what onnxruntime's CUDA provider may use

    def eager():
        return lambda: on_dev(*xs)

    def compiled():
        fn = torch.compile(on_dev, mode="max-autotune" if device.type == "cuda" else "default")
        return lambda: fn(*xs)

    def aiacc_native():
        fast, fxs = optimized()
        return lambda: fast(*fxs)

    def aiacc_graph():
        from aiacc.plugins.torch.cuda import capture

        fast, fxs = optimized()
        graphed = capture(fast, fxs)
        return lambda: graphed(*fxs)

    def aiacc_ort(providers):
        def make():
            fast = aiacc.optimize(copy.deepcopy(model), xs_cpu, backend="onnxruntime", providers=providers,
                                  verify=False)
            fxs = tuple(x.to(device) for x in xs_cpu)
            return lambda: fast(*fxs)
        return make

    def ort_direct(providers):
        return lambda: ort_session_runner(model, xs_cpu, device, providers, args.trt_cache)

    table = {"eager": (prec, eager), "compile": (prec, compiled), "aiacc": (prec, aiacc_native)}
    if device.type == "cuda":
        table.update({"ort-cuda": (cuda_fp32, ort_direct(["CUDAExecutionProvider"])),
                      "ort-trt": (cuda_fp32, ort_direct(["TensorrtExecutionProvider", "CUDAExecutionProvider"])),
                      "aiacc+graph": (prec, aiacc_graph),
                      "aiacc-ort": (cuda_fp32, aiacc_ort(["cuda"])),
                      "aiacc-trt": (cuda_fp32, aiacc_ort(["tensorrt", "cuda"]))})
    else:
        # the same code paths on the CPU provider (ort-cuda selects ort-cpu here)
        table.update({"ort-cpu": ("fp32", ort_direct(["CPUExecutionProvider"])),
                      "aiacc-ort": ("fp32", aiacc_ort(["cpu"]))})
    order = [("ort-cpu" if c == "ort-cuda" and device.type != "cuda" else c) for c in args.candidates]
    return {k: table[k] for k in order if k in table}  # built in the order asked for


def _aiacc_precision(prec: str) -> str:
    return "fp32" if prec == "tf32" else prec


def _fast_dtype(module, default):
    for t in list(module.parameters()) + list(module.buffers()):
        if t.is_floating_point():
            return t.dtype
    return default


def bench_model(name: str, batch: int, device, args, result: Result, t_start: float, log) -> None:
    model, xs_cpu = build(name, batch, args.quick)
    key = f"{name}/b{batch}"
    try:
        result.flops[key] = batch_flops(model, xs_cpu)
    except Exception as e:  # noqa: BLE001  (the table still prints without a bound)
        result.flops[key] = None
        log(f"  {key}: FLOP count failed: {type(e).__name__}: {e}")
    flops = result.flops[key]
    with torch.inference_mode():
        expected = model(*xs_cpu)
    fns: dict[str, Callable] = {}
    rows: dict[str, Row] = {}
    for cand, (prec, make) in makers(name, model, xs_cpu, device, args).items():
        row = rows[cand] = Row(name, batch, cand, prec)
        if time.perf_counter() - t_start > args.budget_s:
            row.status, row.detail = "skipped", "time budget spent"
            continue
        log(f"  {key}: building {cand}")
        t = time.perf_counter()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with torch.inference_mode() if cand not in ("aiacc", "aiacc+graph", "aiacc-ort", "aiacc-trt") \
                        else torch.no_grad():
                    fn = make()
                    out = fn()
                    _sync(device)
            row.max_rel_err = _rel_err(expected, out)
            fns[cand] = fn
        except Exception as e:  # noqa: BLE001  (one failing candidate must not sink the table)
            row.status = "failed"
            row.detail = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
            if args.verbose:
                traceback.print_exc()
        row.setup_s = round(time.perf_counter() - t, 2)
    if fns:
        log(f"  {key}: timing {len(fns)} candidates x {args.iters}")
        times = time_interleaved(fns, device, args.iters, args.warmup)
        for cand, ts in times.items():
            row = rows[cand]
            row.ms = float(np.median(ts) * 1e3)
            row.samples_per_s = batch / (row.ms / 1e3)
            if flops:
                row.tflops = flops / (row.ms / 1e3) / 1e12
                peak = result.peak_tflops.get(row.precision)
                if peak:
                    row.bound_ms = flops / (peak * 1e12) * 1e3
                    row.pct_peak = 100.0 * row.tflops / peak
    result.rows += [asdict(r) for r in rows.values()]


def time_interleaved(fns: dict[str, Callable], device, iters: int, warmup: int) -> dict[str, list[float]]:
    """Seconds per call, round-robin, the device synchronized after every call."""
    with torch.inference_mode():
        for _ in range(warmup):
            for fn in fns.values():
                fn()
                _sync(device)
        times: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(iters):
            for k, fn in fns.items():
                t = time.perf_counter()
                fn()
                _sync(device)
                times[k].append(time.perf_counter() - t)
    return times


# ------------------------------------------------------------------------------------------------ table
def _fmt(x, spec):
    width = int(spec.split(".")[0]) if spec[0].isdigit() else 0
    return ("-" if x is None else format(x, spec)).rjust(width)


def table(result: Result) -> str:
    head = (f"{'model':10} {'batch':>5} {'candidate':12} {'prec':5} {'ms':>9} {'samples/s':>10} {'TFLOP/s':>8} "
            f"{'bound ms':>9} {'% peak':>7} {'max err':>8}  status")
    lines = [f"device: {result.device_name} ({result.device}); peaks TFLOP/s: "
             f"{result.peak_tflops or 'none given'}", head, "-" * len(head)]
    for r in result.rows:
        lines.append(f"{r['model']:10} {r['batch']:>5} {r['candidate']:12} {r['precision']:5} {_fmt(r['ms'], '9.3f')} "
                     f"{_fmt(r['samples_per_s'], '10.1f')} {_fmt(r['tflops'], '8.4f')} {_fmt(r['bound_ms'], '9.4f')} "
                     f"{_fmt(r['pct_peak'], '7.1f')} {_fmt(r['max_rel_err'], '8.1e')}  {r['status']}"
                     + (f" ({r['detail']})" if r["detail"] else ""))
    for key, f in result.flops.items():
        lines.append(f"FLOPs {key}: {'unknown' if f is None else f'{f / 1e9:.4g} G'}")
    return "\n".join(lines)


def environment() -> dict:
    env = {"torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version()}
    for mod in ("onnxruntime", "numba"):
        try:
            m = __import__(mod)
            env[mod] = m.__version__
            if mod == "onnxruntime":
                env["onnxruntime_providers"] = m.get_available_providers()
        except Exception as e:  # noqa: BLE001
            env[mod] = f"missing ({type(e).__name__})"
    return env


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", help="cuda or cpu (default: %(default)s)")
    p.add_argument("--quick", action="store_true", help="tiny models of the same layout (a smoke run)")
    p.add_argument("--models", default="resnet50,bert_base")
    p.add_argument("--batch", default="1,8,64")
    p.add_argument("--precision", default="fp32", choices=sorted(DTYPES))
    p.add_argument("--candidates", default=",".join(CANDIDATES))
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--budget-s", type=float, default=float("inf"),
                   help="stop building candidates after this many seconds (they are listed as skipped)")
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="the device's peak TFLOP/s at --precision (default: the H200 table on CUDA, none on CPU)")
    p.add_argument("--trt-cache", default=None, help="TensorRT engine cache folder")
    p.add_argument("--json", default=None, help="write the result here (after every model)")
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)
    args.candidates = [c for c in args.candidates.split(",") if c]
    unknown = set(args.candidates) - set(CANDIDATES)
    if unknown:
        p.error(f"unknown candidates {sorted(unknown)} (known: {', '.join(CANDIDATES)})")
    if args.device == "cpu" and args.quick and "compile" in args.candidates and args.candidates == list(CANDIDATES):
        args.candidates.remove("compile")  # Inductor's CPU compile alone takes longer than the whole smoke run
    device = torch.device(args.device)
    # tf32: float32 tensors, TensorFloat-32 tensor-core math for matmuls and convolutions (as onnxruntime's
    # CUDA provider uses); fp32: none, so the fp32 peak is the bound
    torch.backends.cuda.matmul.allow_tf32 = args.precision == "tf32"
    torch.backends.cudnn.allow_tf32 = args.precision == "tf32"
    if device.type == "cuda" and not torch.cuda.is_available():
        print("benchmarks/gpu.py: --device cuda but torch sees no CUDA device", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    peaks = {}
    if args.peak_tflops:
        peaks = {args.precision: args.peak_tflops, "tf32": args.peak_tflops}
    elif device.type == "cuda" and "H200" in name:
        peaks = dict(H200_PEAK_TFLOPS)
    result = Result(args.device, name, args.precision, args.quick, peaks, environment=environment())

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    # batch-major: with a budget, every model gets its first batch size before any gets its second
    for batch in [int(b) for b in args.batch.split(",") if b]:
        for model_name in [m for m in args.models.split(",") if m]:
            bench_model(model_name, batch, device, args, result, t0, log)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(asdict(result), f, indent=1)
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
