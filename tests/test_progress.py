"""aiacc.progress: a rich bar naming the current pass / model on a terminal, nothing in pipes or CI."""
from __future__ import annotations

import io
import os
import subprocess
import sys

from rich.console import Console

from aiacc import progress
from aiacc.core import memory, plan_memory
from aiacc.core.passes.manager import run_passes
from aiacc.demo import run_demo
from aiacc.zoo import ir_models as zoo

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def terminal() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(force_terminal=True, file=buf, width=160), buf


def test_quiet_when_not_a_terminal(monkeypatch):
    monkeypatch.delenv("AIACC_PROGRESS", raising=False)
    buf = io.StringIO()
    console = Console(file=buf, width=160)  # a StringIO is no terminal
    assert not console.is_terminal
    with progress.use_console(console):
        assert not progress.enabled()
        report = run_passes(zoo.resnet50(size=32, width=8), level=2)
        for _ in progress.track(["a", "b"], "models"):
            pass
    assert report.records and buf.getvalue() == ""


def test_the_bar_names_every_pass_on_a_terminal(monkeypatch):
    monkeypatch.delenv("AIACC_PROGRESS", raising=False)
    console, buf = terminal()
    with progress.use_console(console):
        assert progress.enabled()
        report = run_passes(zoo.resnet50(size=32, width=8), level=2)
    out = buf.getvalue()
    assert "\x1b[" in out  # drawn with terminal control codes
    names = [r.name for r in report.records]
    assert len(names) > 5 and all(f"passes: {n}" in out for n in names), out[-2000:]


def test_nested_tasks_share_one_display_and_memory_planning_shows_its_steps(monkeypatch):
    monkeypatch.delenv("AIACC_PROGRESS", raising=False)
    monkeypatch.setattr(memory, "PROGRESS_NODES", 10)
    console, buf = terminal()
    g = zoo.resnet50(size=32, width=8)
    with progress.use_console(console):
        for name in progress.track(["resnet50"], "benchmark"):
            plan = plan_memory(g, dims={"N": 1})
    out = buf.getvalue()
    assert plan.arena_bytes > 0
    assert "benchmark: resnet50" in out and "schedule search" in out and "offsets" in out
    assert progress._live is None  # the display is closed when the outer task ends


def test_aiacc_progress_0_turns_it_off_even_on_a_terminal(monkeypatch):
    monkeypatch.setenv("AIACC_PROGRESS", "0")
    console, buf = terminal()
    with progress.use_console(console):
        run_passes(zoo.resnet50(size=32, width=8), level=1)
    assert buf.getvalue() == ""


def test_demo_shows_the_model_on_a_terminal_and_prints_results_either_way(monkeypatch):
    monkeypatch.delenv("AIACC_PROGRESS", raising=False)
    console, buf = terminal()
    run_demo(["caffe"], ["resnet50"], size=32, iters=1, warmup=0, backends=("native",), console=console)
    out = buf.getvalue()
    assert "demo: caffe resnet50: building" in out and "passes: " in out
    assert "caffe resnet50:" in out


def test_cli_optimize_in_a_pipe_writes_no_progress(tmp_path):
    src, out = tmp_path / "r.onnx", tmp_path / "o.onnx"
    env = {k: v for k, v in os.environ.items() if k not in ("AIACC_PROGRESS", "FORCE_COLOR")}
    env["PYTHONPATH"] = ROOT
    run = [sys.executable, "-m", "aiacc.cli"]
    subprocess.run(run + ["example", "resnet50", "--image-size", "32", "-o", str(src)], check=True, env=env,
                   capture_output=True, timeout=300)
    r = subprocess.run(run + ["optimize", str(src), "-o", str(out), "-q"], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert out.exists() and "\x1b[" not in r.stdout + r.stderr and "passes" not in r.stderr


def test_optimize_progress_option_overrides_the_terminal_choice(monkeypatch):
    """aiacc.optimize(progress=False) draws nothing on a terminal; progress=True draws the passes even where
    AIACC_PROGRESS=0 turned it off."""
    import onnx
    import aiacc
    from aiacc.core.onnx import to_onnx

    monkeypatch.delenv("AIACC_PROGRESS", raising=False)
    model = to_onnx(zoo.resnet50(size=32, width=8))
    assert isinstance(model, onnx.ModelProto)
    console, buf = terminal()
    with progress.use_console(console):
        aiacc.optimize(model, verify=False, progress=False)
    assert buf.getvalue() == ""
    monkeypatch.setenv("AIACC_PROGRESS", "0")
    console, buf = terminal()
    with progress.use_console(console):
        aiacc.optimize(model, verify=False, progress=True)
    assert "passes:" in buf.getvalue()
    assert progress._choice is None  # the choice ends with the call
