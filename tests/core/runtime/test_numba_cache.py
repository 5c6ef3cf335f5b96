"""Compiled kernels are cached on disk: a second process compiling the same program loads numba's cached
machine code (cache hits, no misses) instead of compiling it again."""
import json
import os
import subprocess
import sys

import pytest

from aiacc.core.runtime import numba_kernels as nk

pytestmark = pytest.mark.skipif(not nk.numba_available(), reason="numba is not installed")

SCRIPT = r"""
import json, numpy as np
from aiacc.core.runtime import numba_kernels as nk
fn = nk.fused_elementwise_kernel("t0=Mul(i0,i1);t1=Add(t0,i0);t2=Relu(t1)", 2, "float32")
y = fn(np.ones((4, 5), np.float32), np.full((5,), -2.0, np.float32))
assert float(y.sum()) == 0.0
par, ser = fn.functions((1, 1))
print(json.dumps({"hits": sum(ser.stats.cache_hits.values()), "misses": sum(ser.stats.cache_misses.values()),
                  "dir": nk.cache_dir()}))
"""


def _run(env):
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_second_process_loads_from_the_disk_cache(tmp_path):
    env = dict(os.environ, AIACC_CACHE_DIR=str(tmp_path))
    first = _run(env)
    assert first["dir"] == str(tmp_path / "numba")
    assert first["misses"] >= 1 and first["hits"] == 0  # compiled
    files = sorted(os.listdir(tmp_path / "numba" / "__pycache__"))
    assert any(f.endswith(".nbi") for f in files) and any(f.endswith(".nbc") for f in files)  # numba's index + code
    second = _run(env)
    assert second["hits"] >= 1 and second["misses"] == 0  # loaded, not compiled
