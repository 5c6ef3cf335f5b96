"""aiacc.optimize(model, x, precision="bf16" | "fp16" | "int8", ...) for every plugin: the reduced-precision
path with its accuracy guard.

    fast = aiacc.optimize(model, x, precision="int8", calibration=[x1, x2, ...], tolerance={"top1": 0.99})

int8: the graph is traced and optimized as usual, then planned in the IR (aiacc.core.quant: calibration on
the calibration inputs, per-channel int8 weights, Q/DQ placement, per-layer sensitivity). The same plan runs
on: backend="onnxruntime" (every plugin), whose integer kernels (QLinearConv, QGemm, QLinearMatMul, ...)
execute it; torch with backend="torch", PyTorch's own x86 quantized kernels (aiacc/plugins/torch/int8.py:
quantized conv2d / linear / add / cat in the exported fx module; the report's `backend` says "torch");
torch with backend="native" (the default): the faster of those two, timed at optimize time on the first
calibration sample (the report's `choice` has both times, `backend` the one kept; onnxruntime chosen is said
with an AiaccNotice), since which is faster depends on the CPU and the model (on AVX2 without VNNI
onnxruntime's kernels won on ResNet-50, MobileNetV2 and BERT, benchmarks/precision.py);
torch with backend="openvino" where the optional openvino package is installed
(aiacc/backends/openvino.py: OpenVINO's CPU plugin compiles the QDQ graph to its int8 layers). TF, MXNet
and Caffe native exports have no int8 kernel to lower to, so backend="native" with int8 runs on
onnxruntime there, with an AiaccWarning saying so (the report's `backend` says "onnxruntime").

bf16 / fp16: torch native runs aiacc's float32 export under torch.autocast (bf16, measured faster than
casting the weights: aiacc/plugins/torch/precision.py) or with its weights cast (fp16), inputs and outputs
float32 at the boundary; bf16 pays off only where the CPU has AVX-512 BF16 / AMX. onnxruntime: fp16 (the
graph in float16, casts at the boundary); bf16 has no CPU kernels in onnxruntime (an UnsupportedError
says so). TF, MXNet and Caffe native exports have no reduced-float path here (an UnsupportedError names
what works instead).

The guard: with verify=True (the default) the result is measured against the original model on the
held-out inputs (holdout=) or else the calibration inputs, with `tolerance` (a max relative L2 error, or
{"top1": agreement}; default per precision in aiacc.core.quant.DEFAULT_TOLERANCE). A miss raises
VerificationError naming the worst layers of the sensitivity report and the keep_float=[...] to try.
"""
from __future__ import annotations

import warnings
from typing import Any, Iterable

import numpy as np

from aiacc.core.quant import PRECISIONS, parse_tolerance, score, suggestion
from aiacc.errors import AiaccError, ShapeError, UnsupportedError, VerificationError
from aiacc.plugins.timing import interleaved_medians

PRECISION_OPTIONS = ("calibration", "tolerance", "keep_float", "holdout")
CHOICE_ROUNDS = 5  # timed rounds when backend='native' chooses torch's int8 kernels or onnxruntime's


class PrecisionWarning(UserWarning):
    """A reduced-precision request carried out differently than asked (another backend), said plainly."""


def _aiacc_warning():
    try:
        from aiacc.errors import AiaccWarning  # engineer 4's warning class, when it exists

        return AiaccWarning
    except ImportError:
        return PrecisionWarning


def check_precision(precision: Any) -> str:
    """The precision's one spelling; an UnsupportedError listing the known ones otherwise."""
    aliases = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16"}
    p = aliases.get(precision, precision) if isinstance(precision, str) else precision
    if p not in PRECISIONS:
        raise UnsupportedError(f"unknown precision {precision!r} (use {', '.join(repr(x) for x in PRECISIONS)})")
    return p


def check_options(precision: str, calibration: Any, tolerance: Any, keep_float: Any, holdout: Any) -> None:
    """Options that only reduced precision takes are refused with fp32 (they would do nothing)."""
    given = [n for n, v in (("calibration", calibration), ("keep_float", keep_float), ("tolerance", tolerance),
                            ("holdout", holdout)) if v is not None]
    if precision == "fp32" and given:
        raise UnsupportedError(f"{', '.join(given)} apply to reduced precision (precision='int8', 'bf16' or "
                               f"'fp16'); precision='fp32' takes none")
    if precision != "int8" and (calibration is not None or keep_float is not None):
        raise UnsupportedError(f"calibration and keep_float apply to precision='int8' (got precision={precision!r})")
    if keep_float is not None and (isinstance(keep_float, str) or not all(isinstance(x, str) for x in keep_float)):
        raise UnsupportedError(f"keep_float takes a list of layer names, not {keep_float!r}")


def _samples(calibration: Any, what: str) -> list:
    if calibration is None:
        return []
    if isinstance(calibration, (str, bytes)) or not isinstance(calibration, Iterable) or hasattr(calibration, "shape"):
        raise ShapeError(f"{what}= takes an iterable of inputs (each like the example inputs: a tensor or a "
                         f"tuple of tensors), not a {type(calibration).__name__}")
    return list(calibration)


def _feeds(plugin, graph, samples: list, what: str) -> list[dict]:
    from aiacc.core.quant import check_calibration

    feeds = []
    for i, s in enumerate(samples):
        try:
            f = plugin.feeds(graph, s)
        except AiaccError as e:
            raise ShapeError(f"{what} sample {i}: {e}") from e
        except Exception as e:  # a sample the framework cannot even read as the model's inputs
            raise ShapeError(f"{what} sample {i} does not fit the model's inputs "
                             f"({', '.join(f'{v.name}: {v.type}' for v in graph.inputs)}): "
                             f"{type(e).__name__}: {e}") from e
        if f is None:
            raise UnsupportedError(f"the {plugin.title} plugin cannot turn inputs into graph feeds for calibration")
        feeds.append(f)
    return check_calibration(graph, feeds, what)


def optimize_precision(plugin, model: Any, example_inputs: Any, *, precision: str, calibration: Any = None,
                       tolerance: Any = None, keep_float: Any = None, holdout: Any = None, level: int = 2,
                       passes: Any = None, disable: Any = None, backend: str = "native", verify: bool = True,
                       debug: bool = False, **options: Any) -> Any:
    """aiacc.optimize with precision= other than fp32 (see the module docstring); the result carries the
    pass report as `aiacc_report` and the precision report (aiacc.core.quant.QuantReport for int8) as
    `aiacc_precision`."""
    precision = check_precision(precision)
    check_options(precision, calibration, tolerance, keep_float, holdout)
    plugin.check_options(options)  # a misspelt option is refused here as on the float path
    if options.get("mode") not in (None, "inference", "eval"):
        raise UnsupportedError(f"precision={precision!r} is for inference; mode={options['mode']!r} trains")
    options.pop("mode", None)
    options.pop("progress", None)
    tol = parse_tolerance(tolerance, precision)
    samples = _samples(calibration, "calibration")
    held = _samples(holdout, "holdout")
    if calibration is not None and not samples:
        raise ShapeError("the calibration data is empty: int8 needs at least one input sample to measure "
                         "activation ranges (calibration=[inputs, ...], each like the example inputs)")
    if holdout is not None and not held:
        raise ShapeError("the holdout data is empty: give at least one input sample to verify on")
    if precision == "int8" and not samples:
        if example_inputs is None:
            raise ShapeError("precision='int8' needs calibration=[inputs, ...] (or example inputs) to measure "
                             "activation ranges")
        warnings.warn("precision='int8' without calibration=: the activation ranges come from the example "
                      "inputs alone; give calibration=[inputs, ...] drawn from real data", _aiacc_warning(),
                      stacklevel=3)
        samples = [example_inputs]
    # torch follows model.training unless told: reduced precision is for inference
    graph = plugin.trace(model, example_inputs, **({"mode": "inference"} if plugin.name == "torch" else {}))
    report = None
    if level > 0 or passes:
        from aiacc.core.passes import run_passes

        feeds = plugin.feeds(graph, example_inputs) if debug else None
        report = run_passes(graph, level=level, passes=passes, disable=disable, debug=debug, feeds=feeds)
    if precision == "int8":
        out, prec = _int8(plugin, model, graph, samples, tol, keep_float, backend, options)
    else:
        out, prec = _low_float(plugin, model, graph, precision, backend, options)
    if verify:
        check = held or samples or ([example_inputs] if example_inputs is not None else [])
        _guard(plugin, model, out, check, tol, prec, precision, "holdout" if held else "calibration")
    for attr, value in (("aiacc_report", report), ("aiacc_precision", prec)):
        try:
            setattr(out, attr, value)
        except (AttributeError, TypeError):
            pass
    return out


def _int8(plugin, model, graph, samples, tol, keep_float, backend, options):
    from aiacc.backends.quant import ort_run, weight_qmax
    from aiacc.core.quant import quantize

    if backend not in ("native", "onnxruntime", "openvino", "torch"):
        raise UnsupportedError(f"the {plugin.title} plugin has no int8 backend {backend!r} (use 'native', "
                               f"'onnxruntime' or, for torch, 'torch' (PyTorch's int8 kernels) or, with the "
                               f"openvino package, 'openvino')")
    if backend in ("openvino", "torch") and plugin.name != "torch":
        raise UnsupportedError(f"precision='int8' with backend={backend!r} is there for torch models; the "
                               f"{plugin.title} plugin runs int8 with backend='onnxruntime'")
    feeds = _feeds(plugin, graph, samples, "calibration")
    qgraph, rep = quantize(graph, feeds, keep_float=keep_float, tolerance=tol, run=ort_run(),
                           weight_qmax=weight_qmax())
    if backend in ("native", "torch") and plugin.name == "torch":
        # PyTorch's own x86 integer kernels (quantized::conv2d / linear / add / cat) run the same plan
        from aiacc.plugins.torch.int8 import export_int8

        out, kernels, engine = export_int8(plugin, qgraph, model, options)
        rep.backend = "torch"
        rep.steps.append("torch native: " + (", ".join(f"{n} {k}" for k, n in sorted(kernels.items()))
                                             or "no integer kernel") + f" (quantized kernels, {engine})")
        if backend == "native":  # the faster of PyTorch's int8 kernels and onnxruntime's, measured here
            ort_out = plugin.export(qgraph, original=model, backend="onnxruntime", **options)
            out = _choose_int8(plugin, {"torch": out, "onnxruntime": ort_out}, samples[0], rep)
        return out, rep
    if backend == "openvino":
        from aiacc.backends import onnxruntime as aort
        from aiacc.backends.openvino import OpenVinoRunner
        from aiacc.plugins.torch.ort import RunnerModule

        runner = OpenVinoRunner(qgraph, threads=aort.DEFAULT_THREADS or 0)
        rep.backend = "openvino"
        layers = runner.runtime_precisions()
        int8 = sum(n for k, n in layers.items() if k.endswith(("/u8", "/i8")))
        rep.steps.append(f"openvino: {int8} of {sum(layers.values())} executed layers in int8")
        return RunnerModule(qgraph, runner), rep
    rep.backend = "onnxruntime"
    if backend == "native":
        warnings.warn(f"precision='int8' with backend='native': aiacc's {plugin.title} export has no int8 kernels "
                      f"to lower to, so the int8 plan runs on the onnxruntime backend (QLinearConv/QGemm/"
                      f"QLinearMatMul kernels) inside a {plugin.title} model; pass backend='onnxruntime' to say so",
                      _aiacc_warning(), stacklevel=4)
        rep.steps.append("backend='native' asked: runs on onnxruntime (no native int8 kernels)")
    out = plugin.export(qgraph, original=model, backend="onnxruntime", **options)
    return out, rep


def _choose_int8(plugin, candidates: dict[str, Any], sample: Any, rep) -> Any:
    """The candidate (same int8 plan, different kernels) that runs `sample` fastest; the times go to the
    report (`choice`, a step) and a choice of onnxruntime is said with an AiaccNotice (a measured choice,
    not a fallback: backend='torch' keeps PyTorch's kernels)."""
    from aiacc.errors import AiaccNotice

    ms = interleaved_medians({k: (lambda m=m: plugin.run(m, sample)) for k, m in candidates.items()},
                             CHOICE_ROUNDS, warmup=1)
    best = min(ms, key=lambda k: (ms[k], k != "torch"))  # a tie keeps PyTorch's kernels (no session inside)
    rep.choice = ms
    rep.backend = best
    said = ", ".join(f"{k} {v:.3g} ms" for k, v in ms.items())
    rep.steps.append(f"backend='native': {best} chosen, measured on the first calibration sample ({said}; "
                     f"median of {CHOICE_ROUNDS} rounds)")
    if best != "torch":
        warnings.warn(f"precision='int8' (torch, backend='native'): the int8 plan runs on {best}'s integer "
                      f"kernels, measured faster here than PyTorch's ({said}); backend='torch' keeps PyTorch's "
                      f"(a module torch.save can write: onnxruntime sessions do not pickle)",
                      AiaccNotice, stacklevel=5)
    return candidates[best]


def _low_float(plugin, model, graph, precision, backend, options):
    from aiacc.core.quant.lowfloat import LowFloatReport, to_float16

    rep = LowFloatReport(precision=precision, backend=backend)
    if backend == "native":
        if plugin.name != "torch":
            raise UnsupportedError(f"precision={precision!r}: aiacc's {plugin.title} native export has no "
                                   f"reduced-float path (it emits float32 ops only); use backend='onnxruntime' "
                                   f"with precision='fp16', or precision='int8'{_bf16_note(precision)}")
        from aiacc.plugins.torch.precision import cast_module

        fp32 = plugin.export(graph, original=model, backend="native", **options)
        return cast_module(fp32, precision), rep
    if backend != "onnxruntime":
        raise UnsupportedError(f"the {plugin.title} plugin has no backend {backend!r} (use 'native' or 'onnxruntime')")
    if precision == "bf16":
        raise UnsupportedError("precision='bf16' with backend='onnxruntime': onnxruntime's CPU provider has no "
                               "bfloat16 kernels for Conv, MatMul, Gemm, Add, Relu, Softmax (checked with "
                               "onnxruntime 1.32); use precision='fp16' there, or backend='native' for torch")
    g16 = to_float16(graph)
    rep.cast = g16.meta.get("aiacc.float16_cast", 0)
    return plugin.export(g16, original=model, backend="onnxruntime", **options), rep


def _bf16_note(precision: str) -> str:
    """Why bf16 would not pay off here anyway, where the CPU has no bf16 units."""
    from aiacc.backends.quant import cpu_flags

    flags = cpu_flags()
    if precision != "bf16" or not flags or flags & {"avx512_bf16", "amx_bf16"}:
        return ""
    return " (this CPU has no AVX-512 BF16 or AMX: bf16 would be emulated and slower than float32)"


def _guard(plugin, model, out, samples, tol, rep, precision, what) -> None:
    """Measure `out` against `model` on the samples; VerificationError naming the worst layers on a miss."""
    want = [plugin.run(model, s) for s in samples]
    got = [plugin.run(out, s) for s in samples]
    got = [[np.asarray(a, dtype=np.float32) if np.asarray(a).dtype.kind == "f" else a for a in g] for g in got]
    measured = score(tol, got, want)
    rep.verified = f"{tol.describe(measured)} on {len(samples)} {what} samples"
    if tol.ok(measured):
        return
    msg = f"aiacc.optimize (precision={precision!r}, {plugin.name}): {tol.describe(measured)} on {len(samples)} " \
          f"{what} samples"
    if precision == "int8":
        rep.measure_sensitivity()
        worst = rep.worst(3)
        if worst:
            msg += "; worst layers alone in int8: " + ", ".join(f"{e.label} ({e.op}, {e.score:.3g})" for e in worst)
        keep = sorted(set(rep.kept_float) | set(suggestion(rep)))
        msg += f"; try keep_float={keep!r}"
    else:
        msg += "; try precision='int8' with a sensitivity plan, or fp32"
    raise VerificationError(msg)
