"""aiacc.optimize of a torch module leaves nothing of its trace alive: once the optimized and the original
module are deleted, no AiaccTracer, fx.Graph or GraphModule is reachable (and while the optimized module
lives, it holds no tracer either). torch.overrides' process-wide caches keep torch's own functions, never
the trace's patches of them.

Each case runs in a fresh interpreter: torch.overrides fills its caches once per process, on first use, so
only a process whose first trace is aiacc's shows whether that trace leaves its patches there (the first
trace of a pytest run is whichever test happens to come first). The CNN is traced with the fx frontend
(the tracer this checks); BERT goes the default way, which fx translates whole."""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]

_SCRIPT = r'''
import gc, json, sys, types
sys.path[:0] = [ROOT, ROOT + "/tests/reach"]
import torch, torch.fx as fx
from torch import nn
import aiacc
from aiacc.plugins.torch._fx import AiaccTracer


class Scale(torch.autograd.Function):  # a custom Function: capture_autograd_functions' patch is taken
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x))).mean((2, 3))
        y = y + torch.zeros(y.size(0), 8)  # a factory given a traced size: proxy_patches' torch.zeros is taken
        return self.fc(Scale.apply(y))


def build(kind):
    torch.manual_seed(0)
    if kind == "cnn":
        return CNN().eval(), (torch.randn(2, 3, 16, 16),)
    import _models
    model, x, _ = _models.hf_model("bert")
    return model, x


def live(cls):
    gc.collect()
    return sum(isinstance(o, cls) for o in gc.get_objects())


def from_patches(fns):
    """names of the functions among `fns` that aiacc's trace patches made"""
    return sorted({f.__qualname__ for f in fns if isinstance(f, types.FunctionType)
                   and f.__module__ in ("aiacc.plugins.torch._fx", "aiacc.plugins.torch.dispatch_fix")})


out = {}
for i in range(3):
    model, x = build(KIND)
    # the fx frontend: "auto" would also run torch.export on the custom Function's opaque node, whose own
    # module-level map (proxy_tensor._FAKE_TENSOR_ID_TO_PROXY_MAP_FOR_EXPORT) keeps the last export's graph
    opt = aiacc.optimize(model, x, frontend="fx") if KIND == "cnn" else aiacc.optimize(model, x)
    if i == 0:
        out["tracers_while_optimized_alive"] = live(AiaccTracer)
    del opt, model, x
    out.setdefault("tracers", []).append(live(AiaccTracer))
    out.setdefault("graphs", []).append(live(fx.Graph))
    out.setdefault("graph_modules", []).append(live(fx.GraphModule))
ov = torch.overrides
out["ignored_from_patches"] = from_patches(ov.get_ignored_functions())
out["overridable_from_patches"] = from_patches(f for fs in ov.get_overridable_functions().values() for f in fs)
out["zeros_ignored"] = torch.zeros in ov.get_ignored_functions()
print("RESULT" + json.dumps(out))
'''


def _run(kind: str) -> dict:
    script = f"ROOT = {str(ROOT)!r}\nKIND = {kind!r}\n" + _SCRIPT
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", script], capture_output=True, text=True,
                          timeout=600, cwd=ROOT)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")]
    assert proc.returncode == 0 and lines, f"rc {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return json.loads(lines[-1][len("RESULT"):])


def _check(out: dict) -> None:
    assert out["tracers_while_optimized_alive"] == 0, "the optimized module keeps an AiaccTracer alive"
    assert out["tracers"] == [0, 0, 0], f"live AiaccTracer objects after optimize + del: {out['tracers']}"
    assert out["graphs"] == [0, 0, 0], f"live fx.Graph objects after optimize + del: {out['graphs']}"
    assert out["graph_modules"] == [0, 0, 0], f"live GraphModules after optimize + del: {out['graph_modules']}"
    assert out["ignored_from_patches"] == [], f"torch.overrides.get_ignored_functions() holds {out['ignored_from_patches']}"
    assert out["overridable_from_patches"] == [], \
        f"torch.overrides.get_overridable_functions() holds {out['overridable_from_patches']}"
    assert out["zeros_ignored"], "torch.zeros is no longer in torch.overrides.get_ignored_functions()"


def test_cnn_trace_leaves_nothing_alive():
    _check(_run("cnn"))


def test_bert_trace_leaves_nothing_alive():
    pytest.importorskip("transformers")
    _check(_run("bert"))
