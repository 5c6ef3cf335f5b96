"""The plugin protocol: what every framework plugin (torch, tf, mxnet, caffe, onnx) implements, the same way.

A plugin is one `Plugin` subclass instance, `aiacc.plugins.<name>.plugin`. It answers:

    detect(model)              is this a model of my framework? (looks at sys.modules, imports nothing)
    trace(model, inputs)       the model as an IR Graph
    optimize(model, inputs)    trace -> core passes -> export -> verify against the original (written here)
    export(graph, backend=, providers=)
                               the graph as a model of the framework: backend "native" calls the plugin's
                               `export_native`, backend "onnxruntime" its `export_onnxruntime` (with
                               `providers`); the dispatch is written here, once
    run(model, inputs)         outputs as numpy, without side effects (the before/after comparison)
    runner(model, inputs)      a no-argument callable running the model (timing: inputs converted once)
    feeds(graph, inputs)       the inputs as IR feeds for the reference executor (debug mode)
    load_file(path)            a model file of the framework as an IR Graph (`aiacc inspect/dump`)
    optimize_file(path, out)   optimize a model file and write the result; a `FileReport` (`aiacc optimize`)

A plugin module imports its framework only inside the methods that need it: importing any plugin package
is cheap, which lets `aiacc.plugins.framework_of` ask every plugin's `detect` in turn.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from aiacc.core.compare import compare_outputs, recheck_float64
from aiacc.core.ir import Graph
from aiacc.errors import OptionError, UnsupportedError, VerificationError, collecting_fallbacks, describe, fallback

BACKENDS = ("native", "onnxruntime", "aiacc")

# The options every plugin's optimize takes, name -> what it is for. A plugin declares its own in its class's
# `options`; any other name is refused (Plugin.check_options), so a misspelt option never silently does nothing.
OPTIONS: dict[str, str] = {
    "level": "0 (translate only) to 3 (every pass)",
    "passes": "run exactly these passes",
    "disable": "skip these passes",
    "backend": "'native' or 'onnxruntime' (where the optimized model runs)",
    "providers": "onnxruntime's execution providers (backend='onnxruntime')",
    "verify": "compare the optimized model's outputs with the original's on the example inputs",
    "debug": "check the graph and its numerics after every pass",
    "strict": "turn every fallback (something kept opaque, a mode chosen for you) into an error",
    "mode": "'inference' or 'train'",
    "progress": "True/False: show or hide the progress bar (default: shown on a terminal only)",
}


@dataclass
class FileReport:
    """What `Plugin.optimize_file` did (the same type for every plugin and for aiacc's own graph files)."""

    source: str  # the model file read
    framework: str  # the plugin that read it ("torch", "tf", "mxnet", "caffe", "onnx")
    written: list[str] = field(default_factory=list)  # every file written, in order
    passes: Any = None  # the pass report (aiacc.core.passes.PassReport); None when no pass ran
    model: Any = None  # the optimized model object (a framework model, or the IR Graph)
    verified: str = ""  # what the numerics check compared, or why there was none


class Plugin:
    """One framework's half of aiacc. Subclasses set the class attributes and override `detect`, `trace`,
    `export_native`, `export_onnxruntime`, `run` and, where they can, `feeds` and `runner`; the files
    entry points live in the plugin's `files` module (`load_graph`, `optimize_file`)."""

    name = "?"  # the plugin's name in aiacc.plugins ("torch", ...)
    title = "?"  # how messages name the framework ("TF", "MXNet", ...)
    install_hint = ""  # how to install the framework ("pip install 'aiacc[torch]'")
    rtol = 1e-4
    atol = 1e-5
    modes: tuple[str, ...] = ("inference",)  # the optimize modes the plugin has ("train" where it trains)
    options: dict[str, str] = {}  # the plugin's own optimize options beyond OPTIONS: name -> what it is for
    checks_batch = False  # verify also runs both models at another batch size (`with_batch`, `guard_batch`)

    def known_options(self) -> dict[str, str]:
        """Every option this plugin's optimize takes: OPTIONS and the plugin's own, name -> what it is for."""
        return {**OPTIONS, **self.options}

    def check_options(self, options: Any, where: str = "aiacc.optimize") -> None:
        """An OptionError (a TypeError too) naming the first option this plugin does not have, the closest
        known name, and every option it has."""
        known = self.known_options()
        unknown = [k for k in options if k not in known]
        if not unknown:
            return
        import difflib

        name = unknown[0]
        close = difflib.get_close_matches(name, list(known), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise OptionError(f"{where} ({self.title}): unknown option {name!r}{hint}; the {self.title} plugin's "
                          f"options are: {', '.join(sorted(known))}")

    def check_mode(self, mode: Any) -> str:
        """`mode` in its one spelling ("inference" or "train"; "training" accepted); an aiacc
        error listing the accepted names when it is unknown, naming the framework when it lacks it."""
        from aiacc.core.passes.manager import normalize_mode

        m = normalize_mode("inference" if mode is None else mode)
        if m not in self.modes:
            raise UnsupportedError(f"the {self.title} plugin has no mode={m!r} (it supports: "
                                   f"{', '.join(repr(x) for x in self.modes)})")
        return m

    # ------------------------------------------------------------------------------------------ the protocol
    def detect(self, model: Any) -> bool:
        """True when `model` belongs to this plugin's framework. Must not import anything: it looks at
        sys.modules (a user holding a torch model has imported torch already)."""
        raise NotImplementedError

    def trace(self, model: Any, example_inputs: Any = None, **options: Any) -> Graph:
        """Translate `model` into an IR graph (inference or training semantics as options say)."""
        raise NotImplementedError

    def export(self, graph: Graph, *, original: Any = None, backend: str = "native", providers: Any = None,
               **options: Any) -> Any:
        """Turn an (optimized) graph into a model of this framework: backend "native" lowers it to the
        framework's own ops, backend "onnxruntime" runs it in onnxruntime on `providers` (default: the
        best available, see aiacc.backends.onnxruntime)."""
        if backend == "native":
            return self.export_native(graph, original=original, **options)
        if backend == "onnxruntime":
            return self.export_onnxruntime(graph, original=original, providers=providers, **options)
        if backend == "aiacc":  # aiacc's own runtime (planned arena, numba kernels): aiacc/plugins/aiacc_backend.py
            from aiacc.plugins.aiacc_backend import export_aiacc

            return export_aiacc(self, graph, original=original, **options)
        if backend == "auto" and self.export_auto is not None:  # the plugins whose optimize measures a choice
            return self.export_auto(graph, original=original, providers=providers, **options)
        raise UnsupportedError(f"the {self.title} plugin has no backend {backend!r} "
                               f"(use {' or '.join(repr(b) for b in BACKENDS)})")

    # backend="auto", where a plugin offers it: export_auto(graph, original=, providers=, **options) returns
    # the native model carrying what optimize needs to measure it against its onnxruntime twin (torch)
    export_auto: Callable[..., Any] | None = None

    def export_native(self, graph: Graph, *, original: Any = None, **options: Any) -> Any:
        """The graph as a model of this framework, in its own ops (backend="native")."""
        raise NotImplementedError

    def export_onnxruntime(self, graph: Graph, *, original: Any = None, providers: Any = None,
                           **options: Any) -> Any:
        """A model of this framework's kind whose forward runs the graph in onnxruntime on `providers`."""
        raise NotImplementedError

    def run(self, model: Any, example_inputs: Any) -> list[np.ndarray]:
        """Run a model of this framework (original or optimized); outputs flattened to a list of numpy
        arrays, without side effects on the model (only original-vs-optimized comparisons use this)."""
        raise NotImplementedError

    def output_names(self, model: Any) -> list[str] | None:
        """The names a model of this framework gives its outputs (Caffe blobs, ...), in `run`'s order, or
        None where outputs have no names; verification compares them as well as the values."""
        return None

    def run_named(self, model: Any, example_inputs: Any) -> tuple[list[np.ndarray], list[str] | None]:
        """`run`'s outputs and one name per output, in the same order: where each output sits in what the
        model returns (a dict key, a field, a position, the containers on the way; see `output_paths`) and
        the framework's own output names. None: the outputs have no names. verify refuses an optimized model
        whose names differ from the original's (a renamed output, a changed order or structure)."""
        return self.run(model, example_inputs), self.output_names(model)

    def runner(self, model: Any, inputs: Any) -> Callable[[], list[np.ndarray]]:
        """A no-argument callable running `model` on `inputs` (as aiacc.zoo gives them) and returning its
        outputs as numpy arrays, for timing; plugins convert the inputs to framework tensors once here."""
        return lambda: self.run(model, inputs)

    def feeds(self, graph: Graph, example_inputs: Any) -> dict[str, np.ndarray] | None:
        """The example inputs as IR feeds (graph input name -> array in the IR's layout), for per-pass
        numerics checks on the reference executor; None when the plugin cannot provide them."""
        return None

    # ------------------------------------------------------------------------------------------ optimize
    def optimize(self, model: Any, example_inputs: Any = None, *, level: int = 2, passes: Any = None,
                 disable: Any = None, backend: str = "native", verify: bool = True, debug: bool = False,
                 strict: bool = False, **options: Any) -> Any:
        """trace -> core passes -> export -> (verify against the original on the example inputs). The
        result carries the pass report as `aiacc_report` where the object accepts the attribute; every
        fallback is warned once (AiaccWarning) and listed in the report's `fallbacks`, or with strict=True
        refused (FallbackError). An option the plugin does not have is an OptionError."""
        self.check_options(options)
        from aiacc import progress

        with progress.chosen(options.pop("progress", None)), collecting_fallbacks(strict) as fallbacks:
            out, report = self._optimize(model, example_inputs, level, passes, disable, backend, verify, debug,
                                         options)
            if report is not None:
                report.fallbacks = fallbacks.messages
        try:
            out.aiacc_report = report
        except (AttributeError, TypeError):
            pass
        return out

    def _optimize(self, model: Any, example_inputs: Any, level: int, passes: Any, disable: Any, backend: str,
                  verify: bool, debug: bool, options: dict) -> tuple[Any, Any]:
        """optimize's steps: (the optimized model, the pass report or None)."""
        if "mode" in options:
            options["mode"] = self.check_mode(options["mode"])
        graph = self.trace(model, example_inputs, **options)
        report = None
        if level > 0 or passes:
            from aiacc.core.passes import run_passes

            feeds = self.feeds(graph, example_inputs) if debug else None
            report = run_passes(graph, level=level, passes=passes, disable=disable, debug=debug, feeds=feeds,
                                mode=options.get("mode", "inference"))
        out = self.export(graph, original=model, backend=backend, **options)
        from aiacc.plugins.shape_guard import FOUND

        token = FOUND.set({})  # what verify's checks at other sizes find, for guard_shapes
        try:
            self._verify(model, out, example_inputs, report, level, passes, disable, backend, verify, options)
            spec = self.guard_shapes(out, model, FOUND.get())
            if spec is not None and report is not None:
                from aiacc.plugins.shape_guard import shapes_line

                report.shapes = [shapes_line(spec)] + FOUND.get().get("dim_lines", [])
        finally:
            FOUND.reset(token)
        return out, report

    def _verify(self, model: Any, out: Any, example_inputs: Any, report: Any, level: int, passes: Any,
                disable: Any, backend: str, verify: bool, options: dict) -> None:
        """Compare the optimized model with the original on the example inputs (a VerificationError when they
        differ), then, where the plugin checks it, at another batch size and other sizes of its dimensions."""
        if verify and example_inputs is None:
            fallback("verify", f"the optimized {self.title} model was not verified: no example inputs were given "
                     f"(pass example inputs, or verify=False to skip the check)")
        if verify and example_inputs is not None:
            expected, names = self.run_named(model, example_inputs)
            got, new_names = self.run_named(out, example_inputs)
            if names is not None and new_names != names:
                raise VerificationError(f"aiacc.optimize ({self.name}, backend={backend}): "
                                        f"{renamed_output(names, new_names)}")
            problem = self.outputs_agree(model, out, example_inputs, expected, got)
            if problem:
                culprit = self._find_culprit(model, example_inputs, level, passes, disable, options)
                raise VerificationError(f"aiacc.optimize ({self.name}, backend={backend}): {problem}; {culprit}")
            if self.checks_batch and report is not None:
                report.interface = self._check_batch(model, out, example_inputs)
                self._check_dims(model, out, example_inputs)

    def outputs_agree(self, model: Any, out: Any, inputs: Any, expected: list[np.ndarray] | None = None,
                      got: list[np.ndarray] | None = None) -> str | None:
        """None when the optimized `out` computes what `model` does on `inputs` (`expected`, `got`: their
        outputs there, run when not given), else why not. The float32 outputs are compared first
        (compare_outputs); where they differ and the plugin can run both models in float64 (`float64_outputs`),
        the float64 re-check decides (compare.recheck_float64), so a model whose float32 rounding is amplified
        beyond the tolerance is not refused for a correct optimization that rounds differently."""
        expected = self.run(model, inputs) if expected is None else expected
        got = self.run(out, inputs) if got is None else got
        problem = compare_outputs(expected, got, self.rtol, self.atol)
        if not problem:
            return None
        try:
            truth = self.float64_outputs(model, inputs)
            got64 = None if truth is None else self.float64_outputs(out, inputs)
        except Exception as e:  # noqa: BLE001 - a model that cannot run in float64: the float32 verdict stands
            return f"{problem} (the float64 re-check could not run: {describe(e, 120)})"
        if truth is None or got64 is None:
            return problem
        why = recheck_float64(expected, got, truth, got64, self.rtol, self.atol)
        return f"{problem}; float64 re-check: {why}" if why else None

    def float64_outputs(self, model: Any, inputs: Any) -> list[np.ndarray] | None:
        """`run`'s outputs of a float64 copy of `model` on float64 copies of `inputs` (the model given is not
        changed; the copy is dropped after the run, so one copy is held at a time), for `outputs_agree`'s
        float64 re-check; None where the plugin cannot make one."""
        return None

    # ------------------------------------------------------------------------------------------ interfaces
    def with_batch(self, example_inputs: Any, n: int) -> Any:
        """The example inputs with `n` rows in their first dimension (rows repeated, float rows perturbed so
        they differ), or None when the inputs have no common first dimension."""
        return None

    def guard_batch(self, model: Any, batch: int, why: str) -> bool:
        """Make the optimized `model` refuse inputs whose first dimension is not `batch` (a ShapeError naming
        `why`); False where the plugin cannot."""
        return False

    def guard_shapes(self, model: Any, original: Any, found: dict) -> Any:
        """Put the shape guard (shape_guard.ShapeSpec, every dimension aiacc specialized) on the optimized
        `model`, after verify `found` (shape_guard.FOUND) which dimensions run at other sizes; the ShapeSpec,
        or None where there is none (the plugins whose models guard themselves otherwise, torch:
        shapes.install, or that nothing can guard)."""
        return None

    def dims_to_check(self, model: Any, example_inputs: Any) -> list[tuple[int, int, int]]:
        """(input index, dimension, its size in the example) of the non-batch dimensions the optimized `model`
        may take at other sizes, to be checked by running both models there (`_check_dims`); none where its
        graph fixes them (then the shape guard fixes them without a check)."""
        return []

    def with_dims(self, example_inputs: Any, dims: list[tuple[int, int]]) -> Any:
        """The example inputs with each (input index, dimension) of `dims` one larger, or None."""
        return None

    def batch_precheck(self, model: Any, inputs: Any, expected: list[np.ndarray]) -> str:
        """Why the optimized `model` cannot run on `inputs` (another batch size; `expected`: the original's
        outputs there), found without running it, or "" (then `_check_batch` runs and compares it)."""
        return ""

    def _check_batch(self, model: Any, out: Any, example_inputs: Any) -> list[str]:
        """Run the original and the optimized model at another batch size: the report's `interface` lines.
        A result that differs there gets a guard (guard_batch) or is refused (VerificationError)."""
        batch = _first_dim(example_inputs)
        if batch is None:
            return []
        n = batch + 4 if batch < 4 else batch + 1
        bigger = self.with_batch(example_inputs, n)
        if bigger is None:
            return []
        try:
            expected = self.run(model, bigger)
        except Exception as e:  # noqa: BLE001 - the original itself takes only its example's batch size
            return [f"batch: traced at {batch}; the original does not run at batch {n} either "
                    f"({type(e).__name__}), so other sizes were not checked"]
        try:
            # a plugin may know without running it that the optimized model does not fit the other size
            # (MXNet: a kernel given shapes its symbol was not built for can crash the process)
            problem = self.batch_precheck(out, bigger, expected) or self.outputs_agree(
                model, out, bigger, expected, self.run(out, bigger))
        except Exception as e:  # noqa: BLE001 - any failure of the optimized model at the other size
            problem = describe(e, 160)
        from aiacc.plugins.shape_guard import FOUND

        found = FOUND.get()
        if not problem:
            if found is not None:
                found["batch"] = ("free",)
            return [f"batch: traced at {batch}, runs at other sizes (checked at batch {n}: same outputs)"]
        why = f"the optimized model was specialized to batch {batch} (at batch {n}: {problem})"
        if not self.guard_batch(out, batch, why):
            raise VerificationError(f"aiacc.optimize ({self.name}): {why}, and the {self.title} plugin cannot "
                                    f"make it refuse other sizes")
        if found is not None:
            found["batch"] = ("fixed", batch, why)
        return [f"batch: specialized to {batch} (at batch {n}: {problem}); calling it with another batch size "
                f"is a ShapeError"]

    def _check_dims(self, model: Any, out: Any, example_inputs: Any) -> None:
        """Run the original and the optimized model with each dimension of `dims_to_check` one larger (inputs
        whose dimensions have the same place and size grow together: a sequence length shared by the ids and
        their mask). One right there is free (shape_guard.FOUND's "free_dims"); any other stays fixed, for
        the shape guard; what each check found is a line of FOUND's "dim_lines" (the report's `shapes`)."""
        from aiacc.plugins.shape_guard import FOUND

        dims = self.dims_to_check(out, example_inputs)
        found = FOUND.get()
        if not dims or found is None:
            return
        groups: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for i, d, size in dims:
            groups.setdefault((d, size), []).append((i, d))
        lines = found.setdefault("dim_lines", [])
        for (d, size), group in groups.items():
            bigger = self.with_dims(example_inputs, group)
            if bigger is None:
                continue
            what = f"dimension {d} ({size} in the example)"
            try:
                expected = self.run(model, bigger)
            except Exception as e:  # noqa: BLE001 - the original itself takes only the example's size there
                lines.append(f"{what}: the original does not run at {size + 1} either ({type(e).__name__}); another "
                             f"size is a ShapeError")
                continue
            try:
                problem = self.batch_precheck(out, bigger, expected) or self.outputs_agree(
                    model, out, bigger, expected, self.run(out, bigger))
            except Exception as e:  # noqa: BLE001 - any failure of the optimized model at the other size
                problem = describe(e, 160)
            if problem:
                lines.append(f"{what}: specialized (at {size + 1}: {problem}); another size is a ShapeError")
            else:
                lines.append(f"{what}: runs at other sizes (checked at {size + 1}: same outputs)")
                found.setdefault("free_dims", set()).update(group)

    def _find_culprit(self, model: Any, example_inputs: Any, level: int, passes: Any, disable: Any,
                      options: dict) -> str:
        """Replay the passes in debug mode on the reference executor to name the pass that broke numerics."""
        if not (level > 0 or passes):
            return "no pass ran: the translation itself differs"
        from aiacc.core.passes import run_passes

        graph = self.trace(model, example_inputs, **options)
        feeds = self.feeds(graph, example_inputs)
        if feeds is None:
            return "the plugin cannot replay the passes to name the one responsible"
        try:
            replay = run_passes(graph, level=level, passes=passes, disable=disable, debug=True, feeds=feeds,
                                mode=options.get("mode", "inference"))
        except VerificationError as e:
            return str(e)
        unchecked = [r.checked for r in replay.records if r.checked != "graph+numerics"]
        if unchecked:  # the reference executor could not run the graph: no pass and no export can be blamed
            return (f"aiacc could not check which pass or the export is responsible: {unchecked[0][len('graph; '):]}"
                    if unchecked[0].startswith("graph; ") else
                    f"aiacc could not check which pass or the export is responsible ({unchecked[0]})")
        return "every pass preserves numerics on the reference executor: the export (lowering) differs"

    # ------------------------------------------------------------------------------------------ files
    def files(self):
        """The plugin's `files` module, imported on first use; a clear UnsupportedError when it is missing
        or the framework it needs is not installed."""
        module = f"aiacc.plugins.{self.name}.files"
        try:
            return importlib.import_module(module)
        except ModuleNotFoundError as e:
            missing = e.name or ""
            if missing.startswith("aiacc"):
                raise UnsupportedError(f"reading {self.name} models needs {module}, which this aiacc does not "
                                       f"have") from e
            raise UnsupportedError(f"reading {self.name} models needs the {missing!r} package "
                                   f"({self.install_hint})") from e

    def load_file(self, path: str, **options: Any) -> Graph:
        """The IR graph of a model file of this framework (`files.load_graph`)."""
        return self.files().load_graph(path, **options)

    def optimize_file(self, path: str, out: str, **options: Any) -> FileReport:
        """Optimize a model file of this framework and write the result at `out` (`files.optimize_file`;
        options: level, passes, disable, debug, verify and the framework's own)."""
        return self.files().optimize_file(path, out, **options)


def grow_arrays(example_inputs: Any, n: int, seed: int = 0) -> Any:
    """`example_inputs` (a nest of dicts, lists and tuples) with every array-like leaf as a numpy array of `n`
    rows: rows repeated, float rows perturbed by 1% noise so they differ; scalars and other leaves as they
    are. `Plugin.with_batch` of the plugins whose models take numpy arrays (TF, MXNet, ONNX)."""
    rng = np.random.default_rng(seed)

    def grow(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: grow(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return type(x)(grow(v) for v in x) if not hasattr(type(x), "_fields") else type(x)(*map(grow, x))
        if not hasattr(x, "shape") or len(getattr(x, "shape")) == 0:
            return x
        a = x.asnumpy() if hasattr(x, "asnumpy") else np.asarray(x)
        big = np.concatenate([a] * -(-n // a.shape[0]), axis=0)[:n].copy()
        if np.issubdtype(big.dtype, np.floating):
            big = (big + 0.01 * rng.standard_normal(big.shape)).astype(a.dtype)
        return big
    return grow(example_inputs)


def _first_dim(inputs: Any) -> int | None:
    """The first dimension every array-like leaf of `inputs` shares, or None (no arrays, scalars, disagree)."""
    dims = set()

    def walk(x):
        if isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)
        elif hasattr(x, "shape") and len(getattr(x, "shape")) > 0:
            dims.add(int(x.shape[0]))
    walk(inputs)
    return dims.pop() if len(dims) == 1 else None


def grow_dims(example_inputs: Any, dims: list[tuple[int, int]], seed: int = 0) -> Any:
    """`example_inputs` (a list/tuple of arrays, or one array) with each (input index, dimension) of `dims` one
    larger: the last slice along it repeated, float values perturbed by 1% noise so the new slice differs.
    `Plugin.with_dims` of the plugins whose models take numpy arrays."""
    rng = np.random.default_rng(seed)
    single = not isinstance(example_inputs, (list, tuple))
    xs = [example_inputs] if single else list(example_inputs)
    out = []
    for i, x in enumerate(xs):
        a = x.asnumpy() if hasattr(x, "asnumpy") else np.asarray(x)
        for j, d in dims:
            if j == i:
                a = np.concatenate([a, np.take(a, [-1], axis=d)], axis=d)
                if np.issubdtype(a.dtype, np.floating):
                    a = (a + 0.01 * rng.standard_normal(a.shape)).astype(a.dtype)
        out.append(a)
    return out[0] if single else type(example_inputs)(out) if isinstance(example_inputs, tuple) else out


def renamed_output(names: list[str], new_names: list[str] | None) -> str:
    """The message for outputs whose names differ: the first output that differs, then both lists."""
    new_names = list(new_names or [])
    for i in range(max(len(names), len(new_names))):
        was = names[i] if i < len(names) else None
        now = new_names[i] if i < len(new_names) else None
        if was != now:
            if now is None:
                first = f"output {i} ({was}) is missing"
            elif was is None:
                first = f"output {i} ({now}) is one the original does not have"
            else:
                first = f"output {i} is {now}, the original's is {was}"
            break
    return f"{first} (the outputs are named {new_names}, the original's {names})"


def output_paths(out: Any, is_leaf: Callable[[Any], bool], sort_keys: bool = False,
                 sequence_types: bool = True) -> list[tuple[str, Any]]:
    """(path, leaf) for every leaf of a model's output, in flattening order. A path names each container
    on the way by its type: "dict['logits']", "tuple[1]/Out.aux" (a namedtuple or dataclass field), "output"
    for a lone leaf. sort_keys: dict keys in sorted order (tf.nest's order), else insertion order (torch's);
    sequence_types=False writes every list and tuple as "seq" (MXNet returns lists for a tuple). A value that
    is neither a container nor a leaf (None, a number) is kept as a leaf too, so its place is compared."""
    import dataclasses
    from collections.abc import Mapping

    found: list[tuple[str, Any]] = []

    def walk(x: Any, path: str) -> None:
        sep = "/" if path else ""
        kind = type(x).__name__
        if is_leaf(x):
            found.append((path or "output", x))
        elif isinstance(x, Mapping):
            keys = sorted(x, key=str) if sort_keys else list(x)
            for k in keys:
                walk(x[k], f"{path}{sep}{kind}[{k!r}]")
        elif isinstance(x, tuple) and hasattr(type(x), "_fields"):  # a namedtuple
            for f, v in zip(type(x)._fields, x):
                walk(v, f"{path}{sep}{kind}.{f}")
        elif dataclasses.is_dataclass(x) and not isinstance(x, type):
            for f in dataclasses.fields(x):
                walk(getattr(x, f.name), f"{path}{sep}{kind}.{f.name}")
        elif isinstance(x, (list, tuple)):
            for i, v in enumerate(x):
                walk(v, f"{path}{sep}{kind if sequence_types else 'seq'}[{i}]")
        else:
            found.append((f"{path or 'output'}: {kind}", x))
    walk(out, "")
    return found


def to_numpy_list(out: Any) -> list[np.ndarray]:
    """Model outputs (a tensor, a tuple/list/dict of them, of any of the frameworks) as numpy arrays."""
    if isinstance(out, dict):
        return [a for v in out.values() for a in to_numpy_list(v)]
    if isinstance(out, (list, tuple)):
        return [a for v in out for a in to_numpy_list(v)]
    if hasattr(out, "asnumpy"):  # MXNet NDArray (waits for the result)
        return [out.asnumpy()]
    if hasattr(out, "detach"):  # torch.Tensor
        return [out.detach().cpu().numpy()]
    if hasattr(out, "numpy"):  # tf.Tensor
        return [out.numpy()]
    return [np.asarray(out)]
