"""`aiacc view MODEL [--optimize] [-o report.html] [--trace out.json]`: the argparse setup and the command.

aiacc/cli.py adds it with `add_cli(subparsers)`.
"""
from __future__ import annotations


def cmd_view(args) -> int:
    """Write the HTML view (and the Chrome trace) of a model file or a bundled example."""
    from aiacc.view import view

    if args.example:
        from aiacc.core.onnx import from_onnx
        from aiacc.examples import EXAMPLES
        from aiacc.errors import UnsupportedError

        if args.example not in EXAMPLES:
            raise UnsupportedError(f"unknown example {args.example!r} (known: {', '.join(sorted(EXAMPLES))})")
        model, title = from_onnx(EXAMPLES[args.example](None)), f"example {args.example}"
    elif args.model:
        model, title = args.model, args.model
    else:
        from aiacc.errors import UnsupportedError

        raise UnsupportedError("give a MODEL file or --example NAME")
    dims = {}
    for item in args.bind or ():
        key, sep, val = item.partition("=")
        if not sep or not val.strip().isdigit():
            from aiacc.errors import UnsupportedError

            raise UnsupportedError(f"--bind expects SYMBOL=INT, got {item!r}")
        dims[key.strip()] = int(val)
    path = view(model, optimize=args.optimize, output=args.output, level=args.level, dims=dims,
                data_parallel=args.data_parallel, strategy=args.strategy, network_gbps=args.gbps,
                trace=args.trace, timeline=args.timeline, title=title)
    print(f"wrote {path}" + (f" and {args.trace}" if args.trace else ""))
    return 0


def add_cli(sub) -> None:
    """Add the `view` subcommand to an argparse subparsers object."""
    s = sub.add_parser("view", help="write an HTML view of a model: graph, passes, memory plan, communication")
    s.add_argument("model", nargs="?")
    s.add_argument("--example", help="view a bundled example (resnet50, bert) instead of a file")
    s.add_argument("--optimize", action="store_true", help="optimize and show before and after with the passes")
    s.add_argument("--level", type=int, default=2)
    s.add_argument("-o", "--output", default="report.html")
    s.add_argument("--bind", action="append", metavar="SYM=INT", help="size of a symbolic dimension (default 1)")
    s.add_argument("--data-parallel", type=int, metavar="WORKERS", default=None,
                   help="plan and simulate gradient communication for this many workers")
    s.add_argument("--strategy", default="aiacc", help="communication strategy (aiacc, horovod, ddp, ...)")
    s.add_argument("--gbps", type=float, default=25.0, help="network between nodes, Gbit/s")
    s.add_argument("--trace", metavar="OUT.json", help="write the timeline as a Chrome trace (implies "
                                                       "--data-parallel 8 when not given)")
    s.add_argument("--timeline", metavar="TRACE.json", help="also draw a timeline recorded by hvd.start_timeline")
    s.set_defaults(fn=cmd_view)
