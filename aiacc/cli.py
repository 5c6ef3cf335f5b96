"""The `aiacc` command.

    aiacc example resnet50 -o model.onnx          write a bundled example model (resnet50, bert)
    aiacc inspect model.onnx [--optimize]         inputs/outputs, op histogram, parameters, FLOPs, memory plan
    aiacc dump model.onnx --format text|json|dot|svg|onnx -o FILE
    aiacc view model.onnx [--optimize] [-o report.html] [--trace out.json]   the HTML view (aiacc.view)
    aiacc optimize model.onnx -o fast.onnx [--level 2] [--passes a,b] [--disable c] [--no-verify] [--strict]
    aiacc demo [--frameworks torch,tf] [--models resnet50,bert_encoder]   the bundled models, optimized and timed

Model files are recognised by their name and go to their plugin's `load_file` / `optimize_file` (the plugin
protocol, aiacc.plugins.base): onnx (.onnx), torch (.pt2 or `pkg.module:factory`), tf (SavedModel directory
or .keras), mxnet (-symbol.json), caffe (.prototxt). aiacc's own graph files (.json + .npz, or text .aiacc +
.npz) are read and written here and optimized like ONNX graphs.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Sequence

from aiacc.errors import AiaccError, UnsupportedError
from aiacc.plugins import get_plugin


# ------------------------------------------------------------------------------------------------ formats
# file name ending -> format; the first match wins (-symbol.json before .json)
_SUFFIXES = ((".onnx", "onnx"), ("-symbol.json", "mxnet"), (".json", "aiacc-json"), (".aiacc", "aiacc-text"),
             (".pt2", "torch"), (".keras", "tf"), (".prototxt", "caffe"))


def detect_format(path: str) -> str:
    """One of onnx, aiacc-json, aiacc-text, torch, tf, mxnet, caffe; UnsupportedError otherwise."""
    p = os.fspath(path)
    low = p.lower()
    if os.path.isdir(p):
        if os.path.exists(os.path.join(p, "saved_model.pb")):
            return "tf"
        raise UnsupportedError(f"{p}: a directory that is not a TensorFlow SavedModel (no saved_model.pb)")
    for suffix, fmt in _SUFFIXES:
        if low.endswith(suffix):
            return fmt
    if ":" in p and not os.path.exists(p) and all(part.isidentifier() for part in p.split(":", 1)[0].split(".")):
        return "torch"  # pkg.module:factory
    raise UnsupportedError(f"{p}: unknown model format (expected .onnx, .json/.aiacc (aiacc graph), .pt2 or "
                           f"pkg.module:factory (torch), SavedModel dir or .keras (tf), -symbol.json (mxnet), "
                           f".prototxt (caffe))")


def load_graph(path: str, **kw: Any):
    """Read any supported model file into an aiacc Graph."""
    fmt = detect_format(path)
    if fmt == "aiacc-json":
        from aiacc.core.serialize import load

        return load(path)
    if fmt == "aiacc-text":
        return load_text(path)
    return get_plugin(fmt).load_file(path, **kw)


def load_text(path: str):
    """Text form + weights side file (.npz next to it)."""
    import numpy as np

    from aiacc.core.serialize import weights_path
    from aiacc.core.text import parse

    with open(path) as f:
        text = f.read()
    weights = {}
    if os.path.exists(weights_path(path)):
        with np.load(weights_path(path), allow_pickle=False) as z:
            weights = {k: z[k] for k in z.files}
    return parse(text, weights)


def save_graph(graph, out: str) -> list[str]:
    """Write a Graph as .onnx, aiacc .json (+ .npz) or text .aiacc (+ .npz); returns the paths written."""
    low = out.lower()
    if low.endswith(".onnx"):
        from aiacc.core.onnx import save

        save(graph, out)
        return [out]
    if low.endswith(".json"):
        from aiacc.core.serialize import save

        return [out, save(graph, out)]
    if low.endswith(".aiacc") or low.endswith(".txt"):
        return [out, write_text(graph, out)]
    raise UnsupportedError(f"{out}: write .onnx, .json or .aiacc")


def write_text(graph, out: str) -> str:
    """Write the graph's text form at `out` and its large constants beside it (.npz); returns the .npz path."""
    import numpy as np

    from aiacc.core.serialize import weights_path
    from aiacc.core.text import INLINE_CONST_LIMIT

    with open(out, "w") as f:
        f.write(str(graph))
    big = {name: v.const for name, v in graph.initializers.items() if v.const.size > INLINE_CONST_LIMIT}
    np.savez(weights_path(out), **big)
    return weights_path(out)


def _passes():
    try:
        from aiacc.core import passes
    except ImportError as e:
        raise UnsupportedError(f"optimizing needs aiacc.core.passes ({e})") from e
    return passes


def optimize_graph(graph, *, level: int = 2, passes=None, disable=None, debug: bool = False, mode: str = "inference"):
    """Run the pass pipeline in place; returns the pass report."""
    return _passes().run_passes(graph, level=level, passes=passes, disable=disable, debug=debug, mode=mode)


def optimize_file(path: str, out: str, **opts: Any):
    """Optimize a model file into `out` through its plugin; a FileReport (aiacc.plugins.base). ONNX and
    aiacc graph files are graphs in and out: any of the graph forms may be written (by `out`'s name)."""
    fmt = detect_format(path)
    if fmt in ("onnx", "aiacc-json", "aiacc-text"):
        return get_plugin("onnx").optimize_file(path, out, load=load_graph, save=save_graph, **opts)
    return get_plugin(fmt).optimize_file(path, out, **opts)


# ------------------------------------------------------------------------------------------------ printing
def _console():
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 132)


def _shape(t) -> str:
    from aiacc.core.text import format_type

    return format_type(t)


def _summary_tables(graph, stats, title: str):
    from rich.table import Table

    from aiacc.core.stats import format_bytes, format_count

    io = Table(title=f"{title}: inputs and outputs")
    for col in ("", "name", "type"):
        io.add_column(col)
    for v in graph.inputs:
        io.add_row("input", v.name, _shape(v.type))
    for v in graph.outputs:
        io.add_row("output", v.name, _shape(v.type))
    summary = Table(title=f"{title}: summary")
    summary.add_column("metric")
    summary.add_column("value", justify="right")
    bind = ", ".join(f"{k}={v}" for k, v in stats.bind.items())
    summary.add_row("nodes", str(stats.nodes))
    summary.add_row("parameters", f"{stats.parameters:,} ({format_count(stats.parameters)})")
    summary.add_row("constant bytes", format_bytes(stats.constant_bytes))
    summary.add_row("FLOPs" + (f" ({bind})" if bind else ""), f"{stats.flops:,} ({format_count(stats.flops)})")
    if stats.unknown_flops_nodes:
        summary.add_row("nodes without a FLOP estimate", str(len(stats.unknown_flops_nodes)))
    hist = Table(title=f"{title}: operators")
    hist.add_column("op")
    hist.add_column("count", justify="right")
    hist.add_column("FLOPs", justify="right")
    for op, n in stats.op_histogram.items():
        f = stats.flops_by_op.get(op)
        hist.add_row(op, str(n), format_count(f) if f else "-")
    return io, summary, hist


def _parse_bind(items: Sequence[str] | None) -> dict[str, int]:
    out = {}
    for item in items or ():
        key, sep, val = item.partition("=")
        if not sep or not val.strip().lstrip("-").isdigit():
            raise UnsupportedError(f"--bind expects SYMBOL=INT, got {item!r}")
        out[key.strip()] = int(val)
    return out


# ------------------------------------------------------------------------------------------------ commands
def _graph_for(args):
    if getattr(args, "example", None):
        from aiacc.core.onnx import from_onnx
        from aiacc.examples import EXAMPLES

        if args.example not in EXAMPLES:
            raise UnsupportedError(f"unknown example {args.example!r} (known: {', '.join(sorted(EXAMPLES))})")
        return from_onnx(EXAMPLES[args.example](None)), f"example {args.example}"
    if not args.model:
        raise UnsupportedError("give a MODEL file or --example NAME")
    if detect_format(args.model) not in ("torch",) and not os.path.exists(args.model):
        raise UnsupportedError(f"{args.model}: no such file or directory")
    return load_graph(args.model), args.model


def cmd_inspect(args) -> int:
    from aiacc.core.stats import graph_stats

    graph, title = _graph_for(args)
    bind = _parse_bind(args.bind)
    stats = graph_stats(graph, bind)
    if args.optimize:
        after = graph.copy()
        report = optimize_graph(after, level=args.level)
        measured = _measured_fusions(after)
        if measured:
            report.note("elementwise_fusion", measured)
        stats_after = graph_stats(after, bind)
    if args.json:
        doc = {"model": title, "inputs": [{"name": v.name, "type": _shape(v.type)} for v in graph.inputs],
               "outputs": [{"name": v.name, "type": _shape(v.type)} for v in graph.outputs], **stats.as_dict()}
        if args.optimize:
            doc["optimized"] = stats_after.as_dict()
            doc["passes"] = report.as_dict()
        doc["unknown_ops"] = _unknown_ops(graph)
        memory = _memory_plan_doc(after if args.optimize else graph, bind)
        memory.pop("plan", None)
        doc["memory"] = memory
        if args.optimize:  # "memory" is the optimized graph's plan; this one is the graph as read
            doc["memory_before"] = _memory_plan_doc(graph, bind)
            doc["memory_before"].pop("plan", None)
        print(json.dumps(doc, indent=1, default=str))
        return _unknown_ops_status(graph)
    console = _console()
    for t in _summary_tables(graph, stats, title):
        console.print(t)
    unknown = _unknown_ops(graph)
    if unknown:  # optimize() keeps them opaque; a reader of inspect must not mistake them for known ops
        console.print(f"unknown ops (kept opaque, not checked): {', '.join(unknown)}")
    if args.optimize:
        from rich.table import Table

        from aiacc.core.stats import format_bytes, format_count

        console.print(report.table())
        cmp = Table(title=f"{title}: before and after optimization (level {args.level})")
        for col in ("", "before", "after"):
            cmp.add_column(col, justify="right" if col else "left")
        cmp.add_row("nodes", str(stats.nodes), str(stats_after.nodes))
        cmp.add_row("parameters", format_count(stats.parameters), format_count(stats_after.parameters))
        cmp.add_row("constant bytes", format_bytes(stats.constant_bytes), format_bytes(stats_after.constant_bytes))
        cmp.add_row("FLOPs", format_count(stats.flops), format_count(stats_after.flops))
        ops = sorted(set(stats.op_histogram) | set(stats_after.op_histogram))
        for op in ops:
            a, b = stats.op_histogram.get(op, 0), stats_after.op_histogram.get(op, 0)
            if a != b:
                cmp.add_row(op, str(a), str(b))
        console.print(cmp)
    if args.optimize:
        _print_memory_plan(console, graph, bind, f"memory plan before optimization: {graph.name}")
        _print_memory_plan(console, after, bind, f"memory plan after optimization (level {args.level}): "
                                                 f"{after.name}")
    else:
        _print_memory_plan(console, graph, bind)
    return _unknown_ops_status(graph)


def _measured_fusions(graph) -> list[str]:
    """The per-node choice the torch native export makes for the graph's FusedElementwise nodes (numba op,
    convolution post-op or level 2's torch ops, timed here on random inputs of the node's shapes), or the
    one line saying why it is not shown: the choice is measured by the backend at export, not by the core."""
    if not graph.find_nodes("FusedElementwise", "aiacc"):
        return []
    try:
        from aiacc.plugins.torch import export_ops  # noqa: F401  (the lowerings the choice times)
        from aiacc.plugins.torch.numba_op import choose_fusions
    except ImportError as e:
        return [f"kept/dropped not measured: the choice is made by the torch native export, and torch or numba "
                f"cannot be imported here ({e})"]
    from aiacc.plugins.torch.level3_guard import NOTE_KEY, graph_note

    notes = choose_fusions(graph)
    lines = [f"{k}: {v} (as the torch native export would choose, measured now)" for k, v in notes.items()]
    whole = graph_note(graph)  # the whole-network guard: level 3 kept only where the whole module is faster
    if whole is not None:  # keyed as optimize's pass report keys it
        lines.append(f"{NOTE_KEY}: {whole}")
    return lines


def _unknown_ops_status(graph) -> int:
    """inspect's exit status: 1, with the unknown default-domain ops named on stderr (a default-domain op
    that is not an ONNX operator means a broken or mislabelled file), else 0."""
    unknown = _unknown_ops(graph)
    if not unknown:
        return 0
    nodes = {op: next(n.name for n in graph if n.domain == "" and n.op == op) for op in unknown}
    print(f"aiacc: error: {len(unknown)} op(s) of the default (ONNX) domain are unknown: "
          f"{', '.join(f'{op} (node {nodes[op]})' for op in unknown)}; they are not ONNX operators aiacc knows "
          f"(aiacc optimize keeps them opaque)", file=sys.stderr)
    return 1


def _unknown_ops(graph) -> list[str]:
    """Ops of the default (ONNX) domain that the registry does not know: they stay opaque."""
    from aiacc.core.ops import get_schema

    return sorted({n.op for n in graph if n.domain == "" and get_schema(n.op) is None})


def _memory_plan_doc(graph, bind) -> dict:
    """The memory plan's figures, or why there is none (symbolic dims without --bind, unknown shapes)."""
    from aiacc.core.memory import plan_memory

    dims = dict(bind or {})
    assumed = sorted({d for v in graph.inputs if v.shape for d in v.shape if isinstance(d, str)} - set(dims))
    dims.update({d: 1 for d in assumed})  # a plan needs sizes: unbound symbols count as 1, and we say so
    try:
        plan = plan_memory(graph, dims=dims or None)
    except AiaccError as e:
        return {"error": str(e)}
    return {"plan": plan, "assumed": {d: 1 for d in assumed}, "arena_bytes": plan.arena_bytes, "lower_bound_bytes": plan.lower_bound_bytes,
            "import_order_bound_bytes": plan.import_order_bound_bytes, "naive_bytes": plan.naive_bytes,
            "peak_step": plan.peak_step, "peak_node": plan.peak_node.name if plan.peak_node else None,
            "peak_values": list(plan.peak_values)}


def _print_memory_plan(console, graph, bind, title=None) -> None:
    from aiacc.core.memory import format_memory_plan

    doc = _memory_plan_doc(graph, bind)
    if "error" in doc:
        console.print(f"{title or 'memory plan'}: not made ({doc['error']})")
    else:
        console.print(format_memory_plan(doc["plan"], title))
        if doc["assumed"]:
            console.print("memory plan for " + ", ".join(f"{d}=1" for d in doc["assumed"]) +
                          " (give --bind SYM=INT for other sizes)")


def cmd_dump(args) -> int:
    graph, _ = _graph_for(args)
    if args.optimize:
        optimize_graph(graph)
    fmt = args.format
    out = args.output
    if fmt == "text":
        if out in (None, "-"):
            sys.stdout.write(str(graph))
        else:
            write_text(graph, out)
    elif fmt == "json":
        from aiacc.core.serialize import save, to_dict

        if out in (None, "-"):
            print(json.dumps(to_dict(graph)[0], indent=1))
        else:
            save(graph, out)
    elif fmt == "dot":
        from aiacc.core.dot import to_dot

        text = to_dot(graph)
        if out in (None, "-"):
            sys.stdout.write(text)
        else:
            with open(out, "w") as f:
                f.write(text)
    elif fmt == "svg":
        if out in (None, "-"):
            raise UnsupportedError("--format svg needs -o FILE")
        from aiacc.view import write_svg

        write_svg(graph, out)
    elif fmt == "onnx":
        if out in (None, "-"):
            raise UnsupportedError("--format onnx needs -o FILE")
        if args.keep_fused:  # aiacc's fused ops kept and documented for Netron (aiacc.view.onnx_docs)
            from aiacc.view.onnx_docs import write_documented

            write_documented(graph, out)
            return 0
        from aiacc.core.onnx import save

        save(graph, out)
    return 0


def cmd_optimize(args) -> int:
    opts: dict[str, Any] = {"level": args.level}
    if args.passes:
        opts["passes"] = args.passes
    if args.disable:
        opts["disable"] = args.disable
    if args.debug:
        opts["debug"] = True
    if args.no_verify:
        opts["verify"] = False
    from aiacc import progress
    from aiacc.errors import collecting_fallbacks

    # --strict: every fallback (not verified, kept opaque...) is an error; otherwise each is warned once
    with collecting_fallbacks(args.strict), progress.task(f"optimize {os.path.basename(args.model)}"):
        report = optimize_file(args.model, args.output, **opts)
    if not args.quiet:
        if report.passes is not None:
            _console().print(report.passes.table())
        if report.verified:
            _console().print(report.verified)
    return 0


def cmd_example(args) -> int:
    from aiacc.examples import write_example

    kw = {}
    if args.image_size and args.name == "resnet50":
        kw["image_size"] = args.image_size
    write_example(args.name, args.output, **kw)
    print(f"wrote example {args.name} to {args.output}")
    return 0


def cmd_demo(args) -> int:
    from aiacc.demo import main as demo_main

    return demo_main(args)


def build_parser() -> argparse.ArgumentParser:
    from aiacc import __version__

    p = argparse.ArgumentParser(prog="aiacc", description="aiacc: one graph optimizer for PyTorch, TensorFlow, "
                                                          "MXNet and Caffe models")
    p.add_argument("--version", action="version", version=f"aiacc {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("inspect", help="summarize a model: inputs/outputs, ops, parameters, FLOPs, memory plan")
    s.add_argument("model", nargs="?")
    s.add_argument("--example", help="inspect a bundled example (resnet50, bert) instead of a file")
    s.add_argument("--bind", action="append", metavar="SYM=INT", help="size of a symbolic dimension for FLOPs")
    s.add_argument("--optimize", action="store_true", help="also optimize and compare before/after")
    s.add_argument("--level", type=int, default=2)
    s.add_argument("--json", action="store_true", help="print JSON instead of tables")
    s.set_defaults(fn=cmd_inspect)

    s = sub.add_parser("dump", help="write the graph as text, JSON (+ .npz weights), DOT or ONNX")
    s.add_argument("model", nargs="?")
    s.add_argument("--example")
    s.add_argument("--format", choices=("text", "json", "dot", "svg", "onnx"), default="text")
    s.add_argument("--optimize", action="store_true", help="optimize (level 2) before writing")
    s.add_argument("--keep-fused", action="store_true", help="onnx: keep aiacc's fused ops (domain aiacc, "
                                                             "documented in the file) instead of decomposing them")
    s.add_argument("-o", "--output", default="-")
    s.set_defaults(fn=cmd_dump)

    s = sub.add_parser("optimize", help="optimize a model file")
    s.add_argument("model")
    s.add_argument("-o", "--output", required=True)
    s.add_argument("--level", type=int, default=2)
    s.add_argument("--passes", help="comma-separated passes to run (instead of the level's pipeline)")
    s.add_argument("--disable", help="comma-separated passes to skip")
    s.add_argument("--debug", action="store_true", help="verify the graph and numerics after every pass")
    s.add_argument("--no-verify", action="store_true", help="skip comparing the optimized model's outputs with "
                                                            "the original's on random inputs")
    s.add_argument("--strict", action="store_true", help="fail instead of falling back (not verified, kept "
                                                         "opaque, ...)")
    s.add_argument("-q", "--quiet", action="store_true")
    s.set_defaults(fn=cmd_optimize)

    s = sub.add_parser("example", help="write a bundled example model (random weights, fixed seed)")
    s.add_argument("name", choices=("resnet50", "bert"))
    s.add_argument("-o", "--output", required=True)
    s.add_argument("--image-size", type=int, default=None)
    s.set_defaults(fn=cmd_example)

    from aiacc.demo import add_arguments as demo_arguments

    s = sub.add_parser("demo", help="the main job: optimize the bundled models of every installed framework "
                                    "(both backends), time them and check their numbers")
    demo_arguments(s)
    s.set_defaults(fn=cmd_demo)

    from aiacc.distributed.testbed import add_cli as cluster_cli

    cluster_cli(sub)  # aiacc cluster {run,check,cleanup}: the emulated multi-node cluster
    from aiacc.view.cli import add_cli as view_cli

    view_cli(sub)  # aiacc view MODEL [--optimize] [-o report.html] [--trace out.json]
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except AiaccError as e:
        print(f"aiacc: error: {e}", file=sys.stderr)
        return 1
    except FileNotFoundError as e:
        print(f"aiacc: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
