"""`aiacc optimize FILE -o OUT` checks numerics on random inputs as the Python API does (--no-verify skips it,
--strict refuses a model it cannot check), and a debug replay that cannot run the input graph says so
instead of blaming the export."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from aiacc import cli
from aiacc.core import parse
from aiacc.core.ir import Graph
from aiacc.errors import AiaccWarning, VerificationError
from aiacc.plugins.base import Plugin

SMALL = """graph small(%x: float32[N,4]) {
  %w: float32[4,3] = const [0.5, -1, 2, 0.25, 1, 0, -0.5, 3, 1.5, 2, -2, 1]
  %t: float32[4,N] = Transpose<t1>(%x) {perm=[1, 0]}
  %u: float32[N,4] = Transpose<t2>(%t) {perm=[1, 0]}
  %m: float32[N,3] = MatMul<mm>(%u, %w)
  %y: float32[N,3] = Relu<relu>(%m)
  return %y
}
"""

OPAQUE = """graph opaque(%x: float32[4]) {
  %y: float32[4] = custom::Foo<foo>(%x)
  %z: float32[4] = Relu<relu>(%y)
  return %z
}
"""


def _write(tmp_path, text: str, name: str) -> str:
    path = str(tmp_path / name)
    cli.save_graph(parse(text), path)
    return path


def test_optimize_verifies_on_random_inputs_and_says_so(tmp_path, capsys):
    path = _write(tmp_path, SMALL, "small.onnx")
    assert cli.main(["optimize", path, "-o", str(tmp_path / "fast.onnx")]) == 0
    out = capsys.readouterr().out
    assert "verified: same outputs on random inputs (seed 0, aiacc's reference executor" in out
    report = cli.optimize_file(path, str(tmp_path / "fast2.onnx"))
    assert report.verified.startswith("verified")
    assert cli.main(["optimize", path, "-o", str(tmp_path / "fast3.onnx"), "--no-verify"]) == 0
    assert "not verified (verify=False)" in capsys.readouterr().out


def test_a_pass_that_changes_the_numbers_is_refused_by_the_command(tmp_path, monkeypatch, capsys):
    import aiacc.core.passes as passes

    real = passes.run_passes

    def wrong(graph: Graph, **kw):  # a broken pipeline: every constant doubled
        report = real(graph, **kw)
        for v in graph.initializers.values():
            v.const = v.const * 2
        return report
    monkeypatch.setattr(passes, "run_passes", wrong)
    path = _write(tmp_path, SMALL, "small.onnx")
    out = str(tmp_path / "fast.onnx")
    assert cli.main(["optimize", path, "-o", out]) == 1
    err = capsys.readouterr().err
    assert "differs from the original" in err and "small.onnx" in err
    with pytest.raises(VerificationError, match="output 0 differs"):
        cli.optimize_file(path, out)
    assert cli.main(["optimize", path, "-o", out, "--no-verify"]) == 0  # asked not to check: written


def test_a_graph_nothing_can_run_is_written_with_a_warning_or_refused_with_strict(tmp_path, capsys):
    path = _write(tmp_path, OPAQUE, "opaque.json")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cli.main(["optimize", path, "-o", str(tmp_path / "out.json")]) == 0
    said = [str(w.message) for w in caught if issubclass(w.category, AiaccWarning)]
    assert len(said) == 1 and "was not verified" in said[0] and "custom::Foo" in said[0], said
    assert "not verified" in capsys.readouterr().out
    assert cli.main(["optimize", path, "-o", str(tmp_path / "out2.json"), "--strict"]) == 1
    assert "strict=True" in capsys.readouterr().err


class _Unrunnable(Plugin):
    """A plugin whose graph the reference executor cannot run and whose export differs from the original."""

    name = title = "unrunnable"

    def trace(self, model, example_inputs=None, **options):
        return parse(OPAQUE)

    def export_native(self, graph, *, original=None, **options):
        return "optimized"

    def run(self, model, example_inputs):
        return [np.zeros(4, np.float32) if model == "optimized" else np.ones(4, np.float32)]

    def feeds(self, graph, example_inputs):
        return {"x": np.ones(4, np.float32)}


@pytest.mark.parametrize("debug", [False, True])
def test_a_difference_is_not_blamed_on_the_export_when_the_graph_could_not_be_checked(debug):
    with pytest.raises(VerificationError) as info:
        _Unrunnable().optimize("original", [np.ones(4, np.float32)], debug=debug)
    msg = str(info.value)
    assert "output 0 differs" in msg
    assert "could not check which pass or the export is responsible" in msg and "custom::Foo" in msg
    assert "the export (lowering) differs" not in msg
