#!/usr/bin/env bash
# One run on a fresh GPU machine (the repository copied, no venv): install, run the GPU tests, benchmark.
# Everything lands under $OUT (default ./gpu_check_out); the whole run stays within ~9.5 minutes.
#
#   OUT=/somewhere bash benchmarks/gpu_check.sh
#
#   $OUT/summary.txt        what ran, what could not, and why (read this first)
#   $OUT/nvidia-smi.txt     the device
#   $OUT/pip.log            the install (PyPI may not be reachable: then whatever python3 already has is used)
#   $OUT/env.txt            torch / CUDA / cuDNN / onnxruntime providers / numba.cuda / NCCL as seen by python
#   $OUT/pytest_gpu.txt     pytest tests/gpu -rs (every skip says why), $OUT/pytest_gpu.xml (JUnit)
#   $OUT/bench_tf32.{txt,json}  benchmarks/gpu.py, light candidates, float32 with TF32 (ORT's CUDA math)
#   $OUT/bench_bf16.{txt,json}  the same in bf16 (torch candidates; onnxruntime rows stay fp32)
#   $OUT/bench_heavy.{txt,json} torch.compile(max-autotune) and TensorRT, in the time that is left
#
# Optional: AIACC_GPU_CHECK_TF_MXNET=1 also tries tensorflow[and-cuda]==2.21.0 and mxnet-cu117==1.9.1 (large
# downloads; see docs/gpu.md) and records whether they see the GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_check_out}
mkdir -p "$OUT"
START=$(date +%s)
LIMIT=${AIACC_GPU_CHECK_LIMIT_S:-560}
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
left() { echo $(( LIMIT - ($(date +%s) - START) )); }

note "gpu_check: $(date -u +%FT%TZ) on $(hostname); limit ${LIMIT}s"
{ nvidia-smi && nvidia-smi -q -d CLOCK,POWER,MEMORY | head -80; } > "$OUT/nvidia-smi.txt" 2>&1 \
  || note "nvidia-smi failed (no driver?)"
note "device: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null)"

# ---- install -----------------------------------------------------------------------------------------------
PY=python3
# --system-site-packages: where the index is unreachable, what the machine already has is still seen
if python3 -m venv --system-site-packages .venv-gpu >> "$OUT/pip.log" 2>&1; then
  PY=$PWD/.venv-gpu/bin/python
else
  note "install: python3 -m venv failed; using the system python3"
fi
PIP="$PY -m pip --disable-pip-version-check --retries 1 --timeout 20"
reach=0
if timeout 40 $PIP index versions onnxruntime-gpu >> "$OUT/pip.log" 2>&1; then reach=1; fi
if [ "$reach" = 1 ]; then
  if timeout 330 $PIP install -q -c constraints.txt -e '.[all,test,gpu]' >> "$OUT/pip.log" 2>&1; then
    note "install: pip install -c constraints.txt -e '.[all,test,gpu]': ok"
  else
    note "install: '.[all,test,gpu]' failed or ran past 330 s (tail of pip.log below); trying '.[torch,numba,test,gpu]'"
    tail -5 "$OUT/pip.log" | sed 's/^/    /' | tee -a "$SUMMARY"
    timeout $(( $(left) > 260 ? 200 : 60 )) $PIP install -q -c constraints.txt -e '.[torch,numba,test,gpu]' \
      >> "$OUT/pip.log" 2>&1 && note "install: '.[torch,numba,test,gpu]': ok" \
      || note "install: '.[torch,numba,test,gpu]' failed too (see pip.log)"
  fi
  # onnxruntime (from [all]) and onnxruntime-gpu install the same module: keep only the GPU build
  if $PY -m pip show onnxruntime > /dev/null 2>&1; then
    $PIP uninstall -y -q onnxruntime onnxruntime-gpu >> "$OUT/pip.log" 2>&1
    timeout 120 $PIP install -q --no-deps onnxruntime-gpu >> "$OUT/pip.log" 2>&1 \
      && note "install: onnxruntime replaced by onnxruntime-gpu" \
      || note "install: onnxruntime-gpu could not be (re)installed (see pip.log)"
  fi
else
  note "install: the package index is NOT reachable from here (pip index versions onnxruntime-gpu failed):"
  note "         nothing installed; running with what $PY already has"
  $PIP install -q --no-deps --no-build-isolation -e . >> "$OUT/pip.log" 2>&1 || true
fi

# ---- environment --------------------------------------------------------------------------------------------
"$PY" - > "$OUT/env.txt" 2>&1 <<'EOF'
import importlib
for mod in ("torch", "onnxruntime", "numba", "tensorflow", "mxnet", "aiacc"):
    try:
        m = importlib.import_module(mod)
        print(mod, getattr(m, "__version__", "?"))
    except Exception as e:
        print(mod, "MISSING", type(e).__name__, str(e).splitlines()[0] if str(e) else "")
try:
    import torch
    print("torch.cuda.is_available", torch.cuda.is_available(), "cuda", torch.version.cuda,
          "cudnn", torch.backends.cudnn.version(), "devices", torch.cuda.device_count(),
          torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
    print("nccl available", torch.distributed.is_nccl_available(),
          torch.cuda.nccl.version() if torch.cuda.is_available() else "")
except Exception as e:
    print("torch probe failed", e)
try:
    import onnxruntime as ort
    print("onnxruntime providers", ort.get_available_providers())
except Exception as e:
    print("onnxruntime probe failed", e)
try:
    from aiacc.core.runtime.cuda_kernels import cuda_available
    print("numba.cuda device usable", cuda_available())
except Exception as e:
    print("numba.cuda probe failed", e)
EOF
sed 's/^/env: /' "$OUT/env.txt" | tee -a "$SUMMARY"
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  note "torch has no CUDA here: the GPU tests will skip and the benchmark cannot run on cuda"
fi

# ---- tests ----------------------------------------------------------------------------------------------------
t=$(( $(left) / 4 > 150 ? 150 : $(left) / 4 ))
# addopts without --timeout: pytest-timeout may be missing where nothing could be installed
timeout "$t" "$PY" -m pytest -q -rs -p no:cacheprovider -o addopts="--import-mode=importlib" \
  --junitxml="$OUT/pytest_gpu.xml" tests/gpu \
  > "$OUT/pytest_gpu.txt" 2>&1
rc=$?
note "tests/gpu: rc=$rc ($( tail -1 "$OUT/pytest_gpu.txt" ))"
grep -E "^(FAILED|ERROR|SKIPPED)" "$OUT/pytest_gpu.txt" | head -40 | sed 's/^/    /' | tee -a "$SUMMARY"

# ---- benchmarks -----------------------------------------------------------------------------------------------
bench() {  # name, seconds, args...
  local name=$1 secs=$2; shift 2
  if [ "$secs" -lt 20 ]; then note "bench $name: skipped, ${secs}s left"; return; fi
  timeout "$secs" "$PY" benchmarks/gpu.py --device cuda --json "$OUT/bench_$name.json" \
    --budget-s $(( secs * 2 / 3 )) "$@" > "$OUT/bench_$name.txt" 2> "$OUT/bench_$name.log"
  local rc=$?
  note "bench $name: rc=$rc (table in bench_$name.txt, partial rows in bench_$name.json)"
  [ "$rc" = 0 ] || tail -2 "$OUT/bench_$name.log" | sed 's/^/    /' | tee -a "$SUMMARY"
}
LIGHT=eager,aiacc,aiacc+graph,ort-cuda,aiacc-ort
bench tf32 $(( $(left) * 45 / 100 )) --precision tf32 --candidates $LIGHT --iters 20
bench bf16 $(( $(left) * 35 / 100 )) --precision bf16 --candidates eager,aiacc,aiacc+graph --iters 20
bench heavy $(( $(left) - 15 )) --precision tf32 --candidates ort-trt,aiacc-trt,compile --batch 1,8 --iters 10 \
  --trt-cache "$OUT/trt_cache"
rm -rf "$OUT/trt_cache"

# ---- optional: TF and MXNet CUDA wheels -------------------------------------------------------------------------
if [ "${AIACC_GPU_CHECK_TF_MXNET:-0}" = 1 ] && [ "$reach" = 1 ] && [ "$(left)" -gt 60 ]; then
  timeout $(( $(left) - 10 )) bash -c "$PIP install -q 'tensorflow[and-cuda]==2.21.0' 'mxnet-cu117==1.9.1' \
    && $PY -c \"import tensorflow as tf; print('tf gpus', tf.config.list_physical_devices('GPU'))\" \
    && $PY -c \"import mxnet as mx; print('mxnet gpus', mx.context.num_gpus()); print((mx.nd.ones((2,2), ctx=mx.gpu())*2).asnumpy())\"" \
    > "$OUT/tf_mxnet.txt" 2>&1
  note "tf/mxnet CUDA wheels: rc=$? (tf_mxnet.txt)"
fi
note "gpu_check: done in $(( $(date +%s) - START ))s"
