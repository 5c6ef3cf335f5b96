"""Why data-parallel candidates on 4 ranks end with parameters ~1e-4 apart while on 2 ranks they agree to
the bit: gloo's ring all-reduce sums each element in an order set by where the element falls in the
buffer, so two bucket layouts of the same gradients sum some elements in different orders. With 2
ranks a + b = b + a (float addition is commutative), so the layout cannot matter; with 4 it can, by a
rounding step of the sum, and training amplifies such differences step by step. Both layouts stay
within float32 rounding of the float64 sum: summation order, not a wrong reduction.
(benchmarks/dp.py --f64-check measures the same on whole trainings against a float64 reference.)"""
import os
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("_sum_order_worker.py")
EPS32 = float(np.finfo(np.float32).eps)


def test_four_rank_sums_depend_on_the_bucket_layout_only_by_rounding_two_rank_sums_not_at_all(tmp_path):
    from aiacc.distributed.launch import launch_local

    out = tmp_path / "sums.npz"
    env = {"PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    res = launch_local([str(WORKER), str(out)], 4, timeout=180, env=env)
    for r in res:
        assert r.returncode == 0, f"returncode {r.returncode}\n{r.stdout[-1000:]}\n{r.stderr[-3000:]}"
    d = np.load(out)
    # 4 ranks: the two layouts disagree on some elements ...
    differ = d["whole"] != d["cut"]
    assert differ.any(), "the two bucket layouts summed every element in the same order"
    # ... by rounding only: each is within the float32 error bound of 3 additions of the float64 sum
    for k in ("whole", "cut"):
        err = np.abs(d[k].astype(np.float64) - d["sum64"])
        assert (err <= 3 * EPS32 * d["abs64"] + 1e-30).all(), k
    # 2 ranks: bit-for-bit the same whatever the layout
    np.testing.assert_array_equal(d["pair_whole"], d["pair_cut"])
    err = np.abs(d["pair_whole"].astype(np.float64) - d["pair64"])
    assert (err <= EPS32 * np.abs(d["pair64"]) + 1e-30).all()
