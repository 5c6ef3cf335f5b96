"""aiacc's MXNet extension operators: C++ kernels compiled against MXNet's extension library API.

MXNet 1.9 loads operators from a shared library at run time (`mx.library.load`, the `lib_api.h` header and
`lib_api.cc` its wheel ships); they then run as native operators inside CachedOp and autograd, without the
Python round trip of `mx.operator.CustomOp` (measured: a Python CustomOp LayerNorm, even one doing nothing,
cost ~0.5 ms a call in a training step; the library's runs at kernel speed).

The one operator today is `aiacc_layer_norm` (ext/layer_norm.cc), which the MXNet exporter emits for
LayerNorm in training graphs: MXNet's own CPU `_backward_LayerNorm` is the slowest op of an encoder's step.

The library is built once per (source, MXNet, compiler) into `cache_dir()` ($AIACC_CACHE_DIR/mxnet_ext, else
$XDG_CACHE_HOME/aiacc/mxnet_ext, else ~/.cache/aiacc/mxnet_ext) with the C++ compiler in $CXX, else g++
(about 5 s), then loaded once per process. Where it cannot be built (no compiler, no lib_api files in the
MXNet install) `load()` returns the reason and the exporter uses MXNet's own LayerNorm, which is reported
as a fallback. A symbol saved from a block that uses the operator needs `load()` before MXNet reads it.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from aiacc.errors import first_line

SOURCES = (Path(__file__).with_name("ext") / "layer_norm.cc",)
LAYER_NORM_OP = "aiacc_layer_norm"
FLAGS = ("-shared", "-fPIC", "-std=c++17", "-O3", "-fopenmp")

_LOCK = threading.Lock()
_STATE: dict[str, str | None] = {}  # "path" once loaded, or "reason" it cannot be


def cache_dir() -> str:
    """Where built libraries live (one file per source/MXNet/compiler hash)."""
    from aiacc.core.runtime.cache import cache_dir as folder

    return folder("mxnet_ext")


def _compiler() -> str | None:
    cxx = os.environ.get("CXX") or "g++"
    return shutil.which(cxx)


def _mxnet_api_files(mx) -> tuple[Path, Path]:
    root = Path(mx.__file__).parent
    return root / "include" / "mxnet" / "lib_api.h", root / "src" / "lib_api.cc"


def build(mx) -> str:
    """The path of the built library, compiling it first when the cache has none; raises RuntimeError with
    the reason when it cannot be built."""
    cxx = _compiler()
    if cxx is None:
        raise RuntimeError(f"no C++ compiler ({os.environ.get('CXX') or 'g++'} not on PATH; Debian: apt-get "
                           f"install g++)")
    header, api_source = _mxnet_api_files(mx)
    if not header.is_file() or not api_source.is_file():
        raise RuntimeError(f"this MXNet install has no extension API files ({header}, {api_source})")
    try:
        version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise RuntimeError(f"{cxx} --version failed: {first_line(e)}") from e
    digest = hashlib.sha256()
    for part in [*(p.read_bytes() for p in SOURCES), header.read_bytes(), api_source.read_bytes(),
                 mx.__version__.encode(), version.encode(), " ".join(FLAGS).encode()]:
        digest.update(part)
    folder = cache_dir()
    target = os.path.join(folder, f"libaiacc_mxnet_ops_{digest.hexdigest()[:20]}.so")
    if os.path.isfile(target):
        return target
    os.makedirs(folder, exist_ok=True)
    fd, partial = tempfile.mkstemp(suffix=".so", dir=folder)  # built aside, renamed into place atomically
    os.close(fd)
    cmd = [cxx, *FLAGS, *map(str, SOURCES), str(api_source), f"-I{header.parent}", f"-I{header.parent.parent}",
           "-o", partial]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            errors = [ln for ln in done.stderr.splitlines() if "error" in ln] or done.stderr.splitlines() or [""]
            raise RuntimeError(f"{os.path.basename(cxx)} failed (exit {done.returncode}): {errors[0].strip()}")
        os.replace(partial, target)
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"{os.path.basename(cxx)} did not finish in 300 s") from e
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return target


def load() -> str | None:
    """Build (if needed) and load the library into this process' MXNet once: None when its operators are
    registered, else the one-line reason they cannot be (the same reason on every later call)."""
    with _LOCK:
        if "path" in _STATE:
            return None
        if "reason" in _STATE:
            return _STATE["reason"]
        from aiacc.plugins.mxnet._import import import_mxnet

        mx = import_mxnet()
        try:
            path = build(mx)
            mx.library.load(path, verbose=False)
        except Exception as e:  # noqa: BLE001 - any build or load failure leaves MXNet's own operators in use
            _STATE["reason"] = f"aiacc's MXNet extension operators are unavailable: {first_line(e, 300)}"
            return _STATE["reason"]
        _STATE["path"] = path
        return None


def loaded_path() -> str | None:
    """The library this process loaded, or None."""
    return _STATE.get("path")
