"""benchmarks/gpu.py is not broken: its CPU smoke run (--device cpu --quick) builds, checks and times
every CPU candidate on both tiny models, counts their FLOPs and writes the JSON; a spent budget skips."""
from __future__ import annotations

import importlib.util
import json
import os
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _bench():
    spec = importlib.util.spec_from_file_location("aiacc_bench_gpu", os.path.join(ROOT, "benchmarks", "gpu.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_cpu_quick_run(tmp_path, capsys):
    out = tmp_path / "gpu.json"
    assert _bench().main(["--device", "cpu", "--quick", "--batch", "1", "--iters", "2", "--warmup", "1",
                          "--peak-tflops", "1.0", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert {(r["model"], r["candidate"]) for r in rows} == {
        (m, c) for m in ("resnet50", "bert_base") for c in ("eager", "aiacc", "ort-cpu", "aiacc-ort")}
    for r in rows:
        assert r["status"] == "ok", r
        assert r["ms"] > 0 and r["samples_per_s"] > 0
        assert r["max_rel_err"] < 1e-4, r
        assert r["bound_ms"] > 0 and r["pct_peak"] > 0  # the FLOP count and the given peak were used
    assert all(f and f > 0 for f in result["flops"].values())
    printed = capsys.readouterr().out
    assert "% peak" in printed and "bert_base" in printed


def test_spent_budget_skips_candidates(tmp_path):
    out = tmp_path / "gpu.json"
    assert _bench().main(["--device", "cpu", "--quick", "--models", "resnet50", "--batch", "1", "--iters", "1",
                          "--budget-s", "0", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert rows and all(r["status"] == "skipped" for r in rows)
