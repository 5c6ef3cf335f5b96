"""Level 3's whole-network guard (torch native backend): the per-node choices (numba elementwise, the conv
epilogue, SE squeeze/gate, 1x1 conv as GEMM, depthwise numba) are each timed alone, and a few nodes timed at
0.96-0.99x can add up to a network slower than level 2. So where level 3 kept any such kernel, the export also
builds level 2's lowering of the same graph (every kept decision treated as dropped); optimize times both
modules interleaved on the example inputs and returns level 2's unless level 3 timed under timing.KEEP_BELOW of
it. Reported as the `elementwise_fusion` note "level 3 as a whole".

Skipped where nothing was kept, where an environment switch forces a kernel on (a test or a user asking for
it), and with AIACC_LEVEL3_GUARD=off."""
from __future__ import annotations

import os
import weakref
from typing import Any, Callable

GUARD_ENV = "AIACC_LEVEL3_GUARD"  # "on" (default) or "off"
NOTE_KEY = "level 3 as a whole"  # the key of the guard's note among the per-node notes

# the switches that force a level-3 kernel on: then the kernel is what was asked for, not guarded
FORCING = {"AIACC_FUSED_ELEMENTWISE": "numba", "AIACC_SE_GATE": "on", "AIACC_SE_SQUEEZE": "on",
           "AIACC_CONV1X1_GEMM": "on", "AIACC_DEPTHWISE": "on"}


def _decision_keys() -> tuple[str, ...]:
    from aiacc.plugins.torch import numba_op, numba_op_depthwise, pointwise, se_gate

    return numba_op.META_KEY, se_gate.META_KEY, pointwise.META_KEY, numba_op_depthwise.META_KEY


def kept_any(graph) -> bool:
    """Whether level 3 kept any per-node kernel (or a conv epilogue) in `graph`."""
    from aiacc.plugins.torch.numba_op import EPILOGUE_KEY, META_KEY

    keys = _decision_keys()
    for node in graph:
        if node.meta.get(EPILOGUE_KEY) is not None or node.meta.get(META_KEY + ".form"):
            return True
        if any((d := node.meta.get(k)) and d[0] for k in keys):
            return True
    return False


def skip_reason(graph) -> str | None:
    """Why the guard does not run on `graph` (None: it runs)."""
    if os.environ.get(GUARD_ENV, "on").lower() == "off":
        return f"{GUARD_ENV}=off"
    forced = [f"{k}={v}" for k, v in FORCING.items() if os.environ.get(k, "").lower() == v]
    if forced:
        return f"{', '.join(forced)} forces a kernel on"
    if not kept_any(graph):
        return "nothing kept"
    return None


def as_level2(graph):
    """A copy of `graph` with every level-3 kept decision dropped: what the export lowers as level 2 does."""
    from aiacc.plugins.torch.numba_op import EPILOGUE_KEY, META_KEY

    g = graph.copy()
    keys = _decision_keys()
    for node in g:
        node.meta.pop(EPILOGUE_KEY, None)
        node.meta.pop(META_KEY + ".form", None)
        for k in keys:
            d = node.meta.get(k)
            if d and d[0]:
                node.meta[k] = (False, "dropped: level 3 as a whole", *d[2:])
    return g


def time_pair(level3: Any, level2: Any, args: tuple, kwargs: dict) -> tuple[float, float]:
    """(level 3, level 2) in ms per call on the example inputs, timed interleaved (timing.interleaved_times):
    level 2's median, and level 3's as that times the median of the per-round ratios (each round's two calls
    ran back to back, so a ratio of one round is not moved by the load changing between rounds); more rounds
    while the two are within 10% of each other, about three seconds at most."""
    import statistics

    import torch

    from aiacc.plugins.timing import interleaved_times

    with torch.no_grad():
        t = interleaved_times({"level 3": lambda: level3(*args, **kwargs), "level 2": lambda: level2(*args, **kwargs)},
                              rounds=9, warmup=2, max_rounds=41, max_seconds=3.0, ambiguous=0.1)
    ms2 = statistics.median(t["level 2"]) * 1e3
    ratio = statistics.median(a / b for a, b in zip(t["level 3"], t["level 2"]) if b > 0)
    return ratio * ms2, ms2


TIMER: Callable[[Any, Any, tuple, dict], tuple[float, float]] = time_pair  # tests replace it

# level 2's lowering for each exported level-3 module, until optimize's guard takes it: kept beside the module,
# not on it, so a module exported outside optimize (aiacc.export) still pickles (a closure would not)
_PENDING: "weakref.WeakKeyDictionary[Any, Callable[[], Any]]" = weakref.WeakKeyDictionary()


def attach(module: Any, make_level2: Callable[[], Any]) -> None:
    """Remember how to build level 2's lowering of `module`'s graph, for `choose`."""
    _PENDING[module] = make_level2


def pending(module: Any) -> bool:
    """Whether `module` waits for the guard (export attached a level-2 lowering to it)."""
    try:
        return module in _PENDING
    except TypeError:  # not weak-referenceable: nothing was attached
        return False


def verdict(ms3: float, ms2: float) -> str:
    """The guard's note for level 3 timed at `ms3` ms and level 2's lowering at `ms2` ms."""
    from aiacc.plugins.timing import KEEP_BELOW

    r = ms3 / ms2 if ms2 > 0 else float("inf")
    if r < KEEP_BELOW:
        return f"kept {r:.2f}x of level 2 ({ms3:.2f} ms vs {ms2:.2f} ms)"
    told = f"{r:.2f}x, not below {KEEP_BELOW:.2f}x" if r < 1.0 else f"slower {r:.2f}x"
    return f"dropped: level 3 as a whole {told} of level 2 ({ms3:.2f} ms vs {ms2:.2f} ms), level 2's lowering used"


def graph_note(graph) -> str | None:
    """For `aiacc inspect --optimize --level 3` (a graph, no original module, no example inputs): after
    numba_op.choose_fusions decided `graph`'s nodes, the guard's note as the torch native export would reach it,
    timed now on random inputs of the graph's input shapes; None where the guard would not run."""
    if skip_reason(graph) is not None:
        return None
    import numpy as np
    import torch

    from aiacc.plugins.torch import export_ops  # noqa: F401  (the exporter's op table)
    from aiacc.plugins.torch.exporter import export

    rng = np.random.default_rng(0)
    xs = []
    for v in graph.inputs:
        if v.shape is None or not all(isinstance(d, int) for d in v.shape) or v.dtype not in ("float32", "float64"):
            return f"not timed: input {v.name} has no fixed float shape; level 3 as chosen"
        xs.append(torch.from_numpy(rng.standard_normal(v.shape).astype(v.dtype)))
    level2 = as_level2(graph)
    try:
        ms3, ms2 = TIMER(export(graph, None), export(level2, None), tuple(xs), {})
    except Exception as e:  # noqa: BLE001
        return f"not measured ({type(e).__name__}: {e}); level 3 as chosen"
    return verdict(ms3, ms2) + " (as the torch native export would choose, measured now)"


def choose(plugin: Any, model: Any, out: Any, example_inputs: Any) -> Any:
    """optimize's guard: `out` (level 3's verified native module, `attach`ed to its level-2 lowering where the
    guard applies) or level 2's lowering of the same graph, whichever the rule above picks; the note goes into
    the module's `aiacc_fused_elementwise` notes. Level 2's module is checked against the original's outputs
    on the example inputs before it is returned (otherwise level 3 stays, said in the note)."""
    make = _PENDING.pop(out, None) if pending(out) else None
    notes = getattr(out, "aiacc_fused_elementwise", None)
    if make is None or example_inputs is None or notes is None:
        return out
    from aiacc.core.compare import compare_outputs
    from aiacc.plugins.timing import KEEP_BELOW
    from aiacc.plugins.torch.importer import normalize_inputs

    try:
        level2 = make()
        args, kwargs = normalize_inputs(model, example_inputs)
        ms3, ms2 = TIMER(out, level2, tuple(args), dict(kwargs))
    except Exception as e:  # noqa: BLE001  (the guard cannot run: level 3 as verified stays)
        notes[NOTE_KEY] = f"not measured ({type(e).__name__}: {e}); level 3 kept"
        return out
    r = ms3 / ms2 if ms2 > 0 else float("inf")
    if r < KEEP_BELOW:
        notes[NOTE_KEY] = verdict(ms3, ms2)
        return out
    problem = compare_outputs(plugin.run(model, example_inputs), plugin.run(level2, example_inputs),
                              plugin.rtol, plugin.atol)
    if problem:
        notes[NOTE_KEY] = f"{r:.2f}x of level 2, but level 2's lowering differs ({problem}); level 3 kept"
        return out
    level2_notes = {k: (f"dropped (level 3 as a whole): {v[len('kept: '):]}" if v.startswith("kept") else v)
                    for k, v in notes.items()}
    level2_notes[NOTE_KEY] = verdict(ms3, ms2)
    level2.aiacc_fused_elementwise = level2_notes
    for name in ("_aiacc_make_ort", "aiacc_report"):  # backend="auto"'s onnxruntime twin, the pass report
        if name in out.__dict__:
            object.__setattr__(level2, name, out.__dict__.pop(name))
    return level2
