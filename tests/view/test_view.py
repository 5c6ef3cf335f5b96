"""aiacc.view without a browser: the page's content, provenance, the memory curve, the Chrome trace
(validated against the trace-event schema), hvd.start_timeline in a real 2-rank run, dump --format svg."""
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from aiacc.cli import main
from aiacc.core.memory import plan_memory
from aiacc.core.passes import run_passes
from aiacc.core.text import parse

needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz `dot` is not installed "
                                                                   "(apt-get install graphviz)")
SCHEMA = json.loads((Path(__file__).parent / "trace_event_schema.json").read_text())

CONV_BN_RELU = """graph g(%x: float32[1,3,8,8]) {
  %w: float32[4,3,3,3] = const
  %s: float32[4] = const
  %bb: float32[4] = const
  %m: float32[4] = const
  %v: float32[4] = const
  %c: float32[1,4,8,8] = Conv<conv>(%x, %w) {kernel_shape=[3,3], pads=[1,1,1,1]}
  %b: float32[1,4,8,8] = BatchNormalization<bn>(%c, %s, %bb, %m, %v) {epsilon=1e-05}
  %y: float32[1,4,8,8] = Relu<relu>(%b)
  return %y
}"""


def _graph():
    rng = np.random.default_rng(0)
    w = {"w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
         "s": rng.uniform(0.5, 1, 4).astype(np.float32), "bb": rng.standard_normal(4).astype(np.float32),
         "m": rng.standard_normal(4).astype(np.float32), "v": rng.uniform(0.5, 1, 4).astype(np.float32)}
    return parse(CONV_BN_RELU, w)


def _data(page: str) -> dict:
    m = re.search(r'<script id="aiacc-data" type="application/json">(.*?)</script>', page, re.S)
    return json.loads(m.group(1).replace("<\\/", "</"))


def _validate(doc):
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(doc, SCHEMA)


def test_rewrite_records_what_a_fused_node_replaced():
    g = _graph()
    names = {n.name for n in g}
    run_passes(g, level=2)
    (fused,) = list(g)
    assert fused.qualified_op == "aiacc::FusedConv"
    # BatchNorm folded into the Conv first, then the Relu fused: the chain reaches the three originals
    assert set(fused.meta["replaced"]) == names
    assert fused.meta["rule"] == "conv_activation"


@needs_dot
def test_page_is_self_contained_and_has_every_node(tmp_path):
    import aiacc

    g = _graph()
    before = [n.name for n in g]
    out = aiacc.view(g, optimize=True, output=tmp_path / "r.html", data_parallel=4)
    page = out.read_text()
    data = _data(page)
    # nothing is fetched: no script/link/img with a source, no url() in styles
    assert not re.search(r'<(script|link|img|iframe)[^>]+(src|href)=', page)
    assert "url(" not in page and "@import" not in page
    assert sorted(f["name"] for f in data["graphs"]["before"]["nodes"].values()) == sorted(before)
    for key in ("before", "after"):
        for sid in data["graphs"][key]["nodes"]:
            assert f'id="{sid}"' in page  # drawn
    (fused,) = data["graphs"]["after"]["nodes"].values()
    assert sorted(fused["fused_from"]) == sorted(before) and fused["flops"] > 0
    assert all(data["replaced_by"][n] == [fused["name"]] for n in before)
    assert [r["name"] for r in data["passes"]["passes"]][0] == "identity_removal"
    assert 'id="mem-peak"' in page and 'id="bucket-table"' in page and 'id="timeline"' in page
    assert "svgPanZoom" in page


def test_memory_curve_is_the_plans_figures():
    from aiacc.core.onnx import from_onnx
    from aiacc.examples import EXAMPLES
    from aiacc.view.memory import live_bytes, memory_facts, memory_svg

    g = from_onnx(EXAMPLES["resnet50"](None, image_size=64))
    run_passes(g, level=2)
    plan = plan_memory(g, dims={"N": 1})
    prof = live_bytes(plan)
    assert len(prof) == len(plan.schedule)
    assert int(prof.max()) == plan.lower_bound_bytes and int(np.argmax(prof)) == plan.peak_step
    facts = memory_facts(plan)
    assert {v["value"] for v in facts["peak_live"]} == set(plan.peak_values)
    svg = memory_svg(facts)
    assert f'data-step="{plan.peak_step}"' in svg and f'data-bytes="{plan.lower_bound_bytes}"' in svg


@needs_dot
def test_cli_view_and_trace_validate(tmp_path, capsys):
    html, trace = tmp_path / "r.html", tmp_path / "t.json"
    assert main(["view", "--example", "resnet50", "--optimize", "-o", str(html), "--trace", str(trace)]) == 0
    doc = json.loads(trace.read_text())
    _validate(doc)
    page = html.read_text()
    data = _data(page)
    nets = [e for e in doc["traceEvents"] if e.get("cat") == "network" and e["pid"] == 0]
    assert len(nets) == len(data["comm"]["buckets"]) > 0
    assert {e["pid"] for e in doc["traceEvents"]} == set(range(4))  # 4 of the 8 simulated ranks


def test_trace_schema_rejects_a_broken_trace():
    jsonschema = pytest.importorskip("jsonschema")
    bad = {"traceEvents": [{"name": "x", "ph": "X", "pid": 0, "tid": 1, "ts": 5.0}]}  # no dur
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, SCHEMA)


@needs_dot
def test_large_graph_falls_back_to_fast_layout(monkeypatch):
    from aiacc.view import graph as vg

    monkeypatch.setattr(vg, "FULL_LAYOUT_NODES", 1)
    drawn = vg.draw(_graph(), "b")
    assert "fast settings" in drawn.layout and drawn.notes
    assert drawn.svg.count('class="node irnode') == 3


@needs_dot
def test_dump_svg_and_dot(tmp_path):
    svg, dot = tmp_path / "g.svg", tmp_path / "g.dot"
    assert main(["dump", "--example", "bert", "--format", "svg", "-o", str(svg)]) == 0
    assert main(["dump", "--example", "bert", "--format", "dot", "-o", str(dot)]) == 0
    from aiacc.core.onnx import from_onnx
    from aiacc.examples import EXAMPLES

    n = len(from_onnx(EXAMPLES["bert"](None)))
    text = svg.read_text()
    assert text.startswith("<?xml") and text.count('class="node irnode') == n
    assert dot.read_text().startswith("digraph")


def test_hvd_timeline_records_each_bucket_on_each_rank(tmp_path):
    pytest.importorskip("torch")
    from aiacc.distributed.launch import launch_local

    path = tmp_path / "timeline.json"
    runs = launch_local([str(Path(__file__).parent / "timeline_worker.py"), str(path)], nprocs=2, timeout=120)
    for r in runs:
        assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(path.read_text())
    _validate(doc)
    events = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    # per-tensor plan: 4 parameters -> 4 buckets, 2 steps, 2 ranks
    assert sorted({(e["pid"], e["args"]["step"], e["args"]["bucket"]) for e in events}) == \
        [(r, s, b) for r in range(2) for s in range(2) for b in range(4)]
    assert all(e["dur"] >= 0 and e["args"]["bytes"] > 0 for e in events)
    for r in range(2):  # issue order on each rank: bucket k+1 starts no earlier than bucket k
        starts = [e["ts"] for e in sorted(events, key=lambda e: (e["args"]["step"], e["args"]["bucket"]))
                  if e["pid"] == r]
        assert starts == sorted(starts)


def test_horovod_modules_expose_the_timeline():
    from aiacc.distributed import timeline

    for mod in ("aiacc.plugins.tf.horovod", "aiacc.plugins.mxnet.horovod", "aiacc.plugins.torch.horovod"):
        try:
            hvd = __import__(mod, fromlist=["x"])
        except ImportError:
            continue
        assert hvd.start_timeline is timeline.start_timeline and hvd.stop_timeline is timeline.stop_timeline


def test_dump_onnx_keeps_and_documents_fused_ops(tmp_path):
    import onnx

    out = tmp_path / "fused.onnx"
    assert main(["dump", "--example", "resnet50", "--optimize", "--format", "onnx", "--keep-fused", "-o", str(out)]) == 0
    model = onnx.load(str(out))
    fused = [p for p in model.graph.node if p.domain == "aiacc"]
    assert fused and {"aiacc", ""} <= {i.domain for i in model.opset_import}
    for p in fused:
        assert p.doc_string.startswith(f"aiacc::{p.op_type}: ") and "attributes: " in p.doc_string
        assert "fused by aiacc rule" in p.doc_string
        for a in p.attribute:
            assert a.name in p.doc_string  # every attribute written is documented
    meta = {e.key: e.value for e in model.metadata_props}
    assert meta["aiacc.domain"].startswith("aiacc: ") and f"aiacc.op.{fused[0].op_type}" in meta
    plain = tmp_path / "plain.onnx"  # without --keep-fused: the decomposition, as before
    assert main(["dump", "--example", "resnet50", "--optimize", "--format", "onnx", "-o", str(plain)]) == 0
    assert not [p for p in onnx.load(str(plain)).graph.node if p.domain == "aiacc"]
