"""The public Caffe deploy nets (tests/reach/caffe_nets: BVLC AlexNet/CaffeNet/GoogLeNet, VGG-16/19,
ResNet-50/101/152, SqueezeNet, MobileNet v1/v2, DenseNet-121, MobileNet-SSD), one line per net:

    .venv/bin/python benchmarks/caffe_reach.py                      # all of them (minutes on 2 cores)
    .venv/bin/python benchmarks/caffe_reach.py --nets resnet50,vgg16 --iters 5 --batch 1
    .venv/bin/python benchmarks/caffe_reach.py --nets forms         # the reduced public forms (caffe_nets.FORMS)

`--nets` takes names of caffe_nets.NETS and caffe_nets.FORMS (the nets written from the public definitions of
OpenCV's face SSD, FCN, HED, OpenPose, SE-ResNeXt, ShuffleNet, YOLO, Faster R-CNN...; "forms" for all of them:
the ones OpenCV cannot run, SegNet's Upsample and py-faster-rcnn's Python layer, print their error).

Each net gets the check of tests/reach/test_caffe_public.py (random weights written as a caffemodel, load,
optimize, save back; on an input optimize never saw, aiacc's forward of the optimized net and OpenCV dnn on
the saved-back files against OpenCV dnn on the original files, outputs and the blobs before them), then
latencies, median of --iters rounds interleaved (one call of each per round, so drift hits all alike), every
runtime on --threads threads (OpenCV's and numba's pools, BLAS through OMP/OPENBLAS_NUM_THREADS; onnxruntime's
sessions take the CPUs this process may use, as aiacc makes them: run under `taskset` to match):

    opencv      OpenCV dnn (Winograd off) on the original .prototxt/.caffemodel: Caffe's best path here
    cv-opt      OpenCV dnn on aiacc's saved-back .prototxt/.caffemodel (backend="native")
    rt          CaffeModel.forward of the optimized net on aiacc's runtime (runtime="aiacc": planned arena,
                numpy/BLAS convolutions, numba pooling/LRN/fused elementwise)
    ort         the same on onnxruntime (runtime="onnxruntime")
    forward     the same as a user gets it (runtime="auto": the faster of rt and ort, measured on first use;
                `chosen` is CaffeModel.runtime_choice)

Columns: loaded (ok or the error), layers before -> after, opaque layer types (OpenCV runs them), IR ops the
optimization removed, max relative error over the compared blobs (the worst of the three comparisons), the
latencies in ms and forward / opencv (below 1: aiacc's forward faster than OpenCV on the original net).
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
# BLAS pools take their size from the environment when numpy loads: --threads, before that import
_THREADS = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--threads=")),
                sys.argv[sys.argv.index("--threads") + 1] if "--threads" in sys.argv[:-1] else "2")
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, _THREADS)

from tests.reach import caffe_nets as C  # noqa: E402


def _ops(removed: dict) -> str:
    return ", ".join(f"-{k}x{v}" for k, v in sorted(removed.items(), key=lambda kv: -kv[1])) or "-"


def _opaque(types: list) -> str:
    if not types:
        return "0"
    counts = {t: types.count(t) for t in dict.fromkeys(types)}
    return f"{len(types)} (" + ", ".join(f"{t}x{n}" for t, n in counts.items()) + ")"


def time_net(r, iters: int) -> dict[str, float]:
    """Median ms of OpenCV on the original, OpenCV on the saved-back net and the optimized net's forward on
    each runtime; "chosen": the runtime forward (runtime="auto") measured faster and runs."""
    feeds = r.inputs
    fast = r.models["aiacc"]
    on = {}
    for rt in ("aiacc", "onnxruntime"):
        on[rt] = copy.copy(fast)  # the same net and graph, its own runner
        on[rt].runtime = rt

    def cv(net, model):
        # OpenCV's names of the layers writing the outputs (a repeated layer name gets _1...: HED)
        names = C.opencv_names(net, model.net, [(b, C._writer(model.net, b).name) for b in model.outputs])

        def run():
            for k, v in feeds.items():
                net.setInput(v, k)
            net.forward(names)
        return run
    back = C.saved_back(r)
    runs = {"opencv": cv(r.models["opencv"], r.models["original"]), "opencv-opt": cv(r.models["opencv saved-back"], back),
            "rt": lambda: on["aiacc"].forward(**feeds), "ort": lambda: on["onnxruntime"].forward(**feeds),
            "forward": lambda: fast.forward(**feeds)}
    for run in runs.values():  # warm-up (OpenCV allocates and fuses on the first call; forward measures)
        run()
    times = {k: [] for k in runs}
    for _ in range(iters):
        for k, run in runs.items():
            t = time.perf_counter()
            run()
            times[k].append((time.perf_counter() - t) * 1e3)
    res: dict = {k: statistics.median(v) for k, v in times.items()}
    res["chosen"] = fast.runtime_choice["runtime"]
    return res


def main(argv=None) -> int:
    """Run the sweep; print one line per net (and a header)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nets", default=",".join(C.NETS),
                    help="comma-separated names of tests/reach/caffe_nets.NETS or .FORMS ('forms': all of FORMS)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2, help="threads of every runtime (default 2)")
    args = ap.parse_args(argv)
    names = [m for n in args.nets.split(",") if n for m in (C.FORMS if n == "forms" else [n])]
    unknown = [n for n in names if n not in C.NETS and n not in C.FORMS]
    if unknown:
        ap.error(f"unknown net {unknown[0]!r}; known: {', '.join(list(C.NETS) + list(C.FORMS))}")
    import cv2
    import numba
    import onnxruntime

    cv2.setNumThreads(args.threads)
    numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
    print(f"# batch {args.batch}, {args.iters} timed rounds interleaved, {args.threads} threads, OpenCV {cv2.__version__}, "
          f"onnxruntime {onnxruntime.__version__} ({len(os.sched_getaffinity(0))} CPUs), tolerance {C.RTOL:g} relative")
    print(f"{'net':28s} {'loaded':6s} {'layers':>11s} {'opaque':34s} {'max err':>8s} {'opencv':>7s} "
          f"{'cv-opt':>7s} {'rt':>7s} {'ort':>7s} {'forward':>7s} {'chosen':11s} {'fwd/cv':>6s}  ops removed")
    failed = 0
    for name in names:
        with tempfile.TemporaryDirectory(prefix="aiacc-caffe-reach-") as tmp, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                r = C.check(name, tmp, batch=args.batch, seed=args.seed)
                t = time_net(r, args.iters)
            except Exception as e:  # noqa: BLE001 - a sweep reports each net's failure and goes on
                failed += 1
                print(f"{name:28s} FAIL   {type(e).__name__}: {str(e).splitlines()[0][:160]}", flush=True)
                continue
        err = max(r.errors.values())
        ok = "ok" if err <= C.RTOL and r.outputs_after == r.outputs else "WRONG"
        failed += ok != "ok"
        print(f"{name:28s} {ok:6s} {r.layers:4d} -> {r.layers_after:3d} {_opaque(r.opaque):34s} {err:8.1e} "
              f"{t['opencv']:7.1f} {t['opencv-opt']:7.1f} {t['rt']:7.1f} {t['ort']:7.1f} {t['forward']:7.1f} "
              f"{t['chosen']:11s} {t['forward'] / t['opencv']:6.2f}  "
              f"{_ops(r.ops_removed)}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
