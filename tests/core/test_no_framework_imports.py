"""aiacc/core imports no deep-learning framework (torch, tensorflow, mxnet, cv2); onnx only in core/onnx.py;
numba only in core/runtime. `import aiacc` stays light and fast."""
from __future__ import annotations

import ast
import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
CORE = ROOT / "aiacc" / "core"
FRAMEWORKS = {"torch", "tensorflow", "mxnet", "cv2", "keras", "jax", "caffe", "onnxruntime"}


def imported_modules(path: pathlib.Path) -> set[str]:
    """Top-level names of every module a file imports (at any depth in the file, lazily or not)."""
    tree = ast.parse(path.read_text(), str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                "import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant):
            names.add(str(node.args[0].value).split(".")[0])
    return names


def test_core_sources_import_no_framework():
    offenders = []
    for path in sorted(CORE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        mods = imported_modules(path)
        bad = mods & FRAMEWORKS
        if "onnx" in mods and rel != "aiacc/core/onnx.py":
            bad.add("onnx")
        if "numba" in mods and not rel.startswith("aiacc/core/runtime/"):
            bad.add("numba")
        if bad:
            offenders.append(f"{rel}: {', '.join(sorted(bad))}")
    assert not offenders, "forbidden imports in aiacc/core:\n" + "\n".join(offenders)


def test_the_scan_sees_lazy_imports(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def f():\n    import torch.nn\n    from tensorflow import keras\n")
    assert imported_modules(f) >= {"torch", "tensorflow"}


def test_import_aiacc_loads_no_framework_and_is_fast():
    code = ("import sys, time, json; t = time.perf_counter(); import aiacc, aiacc.core, aiacc.core.ops; "
            "dt = time.perf_counter() - t; "
            "print(json.dumps({'dt': dt, 'mods': sorted(m.split('.')[0] for m in sys.modules)}))")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    loaded = set(doc["mods"])
    assert not loaded & (FRAMEWORKS | {"onnx", "numba"}), loaded & (FRAMEWORKS | {"onnx", "numba"})
    assert doc["dt"] < 1.0, f"import aiacc took {doc['dt']:.2f} s"
