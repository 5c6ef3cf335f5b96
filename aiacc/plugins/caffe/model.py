"""`CaffeModel`: a Caffe net (structure and weights) as a Python object that aiacc can optimize.

There is no Caffe runtime here: a CaffeModel is read from and written to Caffe's own files (.prototxt and
.caffemodel, via the protobuf schema in caffe.proto) and `forward` runs it on the faster of aiacc's runtime
(planned arena, numba kernels, numpy/BLAS) and onnxruntime (when installed), measured on the first call for
each input shape (`runtime="auto"`; `model.runtime_choice` says which runs and the measured times), or on the
one asked for (`CaffeModel.load(..., runtime="aiacc")`, or `model.runtime = "onnxruntime"`).

    model = CaffeModel.load("deploy.prototxt", "weights.caffemodel")
    outputs = model.forward(data=image)          # {output blob name: array}
    fast = aiacc.optimize(model, {"data": image})
    fast.save("fast.prototxt", "fast.caffemodel")
"""
from __future__ import annotations

import os
import statistics
import threading
import weakref
from typing import Any, Sequence

import numpy as np

from aiacc.core.runtime.executor import check_inputs
from aiacc.errors import AiaccError, ShapeError, UnsupportedError
from aiacc.plugins.timing import interleaved_times
from aiacc.plugins.caffe.schema import pb
from aiacc.plugins.caffe.proto import (array_to_blob, merge_weights, parse_caffemodel, parse_prototxt,
                                       read_caffemodel, read_prototxt, to_prototxt)


def blob_feeds(net: str, names: Sequence[str], example_inputs: Any,
               check_names: bool = True) -> dict[str, np.ndarray]:
    """Inputs of the net `net` with input blobs `names`, given as a dict, one array or a sequence, as
    {input blob name: float32 array}. A ShapeError names a wrong count and, with check_names, an unknown
    or a missing blob (without, the reference executor's input check reports those)."""
    if isinstance(example_inputs, dict):
        given = dict(example_inputs)
    elif isinstance(example_inputs, (list, tuple)):
        if len(example_inputs) != len(names):
            raise ShapeError(f"net {net!r} takes {len(names)} inputs ({', '.join(names)}), got {len(example_inputs)}")
        given = dict(zip(names, example_inputs))
    else:
        if len(names) != 1:
            raise ShapeError(f"net {net!r} takes {len(names)} inputs ({', '.join(names)}): pass a dict")
        given = {names[0]: example_inputs}
    unknown = sorted(set(given) - set(names)) if check_names else []
    if unknown:
        raise ShapeError(f"net {net!r} has no input blob {unknown[0]!r} (inputs: {', '.join(names)})")
    missing = [n for n in names if n not in given] if check_names else []
    if missing:
        raise ShapeError(f"net {net!r}: input blob {missing[0]!r} not given")
    return {k: np.asarray(v, dtype=np.float32) for k, v in given.items()}


#: the runtimes CaffeModel.forward can run a net on ("auto": the faster of them, measured on first use)
RUNTIMES = ("auto", "aiacc", "onnxruntime")


def _onnxruntime_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("onnxruntime") is not None


def _lrn_on_numba(graph):
    """A copy of `graph` whose LRN nodes run on aiacc's numba LRN kernel between onnxruntime's sessions
    (each becomes an opaque node carrying that kernel; OrtGraphRunner runs opaque nodes through their
    kernels). onnxruntime's LRN is a scalar loop with a pow per element: measured at 1x192x56x56 (GoogLeNet's
    second LRN, 2 threads), 24 ms, and 18 ms as Mul/AveragePool/Sqrt ops, against 2-3 ms in the numba
    kernel. The graph is returned unchanged when it has no LRN the kernel takes or numba is missing."""
    try:
        from aiacc.core.runtime.numba_nn import lrn_into
    except ImportError:
        return graph
    todo = {n.name for n in graph.nodes if n.op == "LRN" and n.domain == "" and n.inputs[0].type is not None
            and n.inputs[0].dtype == "float32" and n.inputs[0].shape is not None and len(n.inputs[0].shape) >= 3
            and all(isinstance(d, int) for d in n.inputs[0].shape) and n.attr("size")}
    if not todo:
        return graph
    g = graph.copy()
    for node in [n for n in g.nodes if n.name in todo]:
        def kernel(x, node=node):
            x = np.ascontiguousarray(x)
            out = np.empty_like(x)
            if not lrn_into(node, [x], out):
                out = node.schema.run(node, [x])[0]
            return out
        new = g.add_opaque("LRN", [node.inputs[0]], domain="aiacc_runtime", name=f"{node.name}_numba",
                           output_types=[node.output.type], meta={"kernel": kernel})
        g.move_before(new, node)
        node.output.replace_all_uses_with(new.output)
        g.erase(node)
    return g


# opaque layers whose tops depend only on their bottoms' shapes (Caffe's PriorBox reads the feature map's and
# the image's sizes, never their values)
_SHAPE_ONLY = ("PriorBox",)


def _shape_only_as_constants(graph):
    """A copy of `graph` where each opaque layer of _SHAPE_ONLY type with static shapes is its output,
    computed once (its kernel on zeros of those shapes) and held as a constant: the runtimes then neither run
    it per call nor split onnxruntime's graph around it. The model's own graph (and so the saved net) keeps
    the layer. The graph is returned unchanged when it has none."""
    def static(v):
        return v is not None and v.shape is not None and all(isinstance(d, int) for d in v.shape)

    todo = [n.name for n in graph.nodes if n.is_opaque and n.op in _SHAPE_ONLY and n.domain == "caffe"
            and n.meta.get("kernel") is not None and all(static(v) for v in n.inputs) and len(n.outputs) == 1
            and static(n.outputs[0])]
    if not todo:
        return graph
    g = graph.copy()
    for node in [n for n in g.nodes if n.name in todo]:
        zeros = [v.const if v.const is not None else np.zeros(v.shape, np.float32) for v in node.inputs]
        try:
            out = node.meta["kernel"](*zeros)
        except AiaccError:
            continue  # it runs per call as before, and fails there with its error
        out = np.asarray(out[0] if isinstance(out, (list, tuple)) else out, np.float32)
        if tuple(out.shape) != tuple(node.outputs[0].shape):
            continue
        v = node.outputs[0]
        if v.is_graph_output:
            continue  # the caller asked for it: it stays a computed output
        v.replace_all_uses_with(g.add_initializer(g.fresh_name(f"{node.name}/value"), out))
        g.erase(node)
    return g


def _normalize_as_ir(graph):
    """A copy of `graph` where each opaque SSD Normalize layer with its scale blob runs as IR ops,
    x / sqrt(sum of x^2 over channels (across_spatial: over C, H, W) + eps) * scale, as the SSD fork's
    normalize_layer.cpp (and OpenCV) compute it: the runtimes then fuse it and onnxruntime runs it in the same
    session as its neighbours. The model's own graph (so the saved net) keeps the layer. Unchanged when none."""
    from google.protobuf import text_format

    todo = [n.name for n in graph.nodes if n.is_opaque and n.op == "Normalize" and n.domain == "caffe"
            and len(n.inputs) == 2 and n.inputs[1].const is not None and n.inputs[0].shape is not None
            and len(n.inputs[0].shape) >= 2 and isinstance(n.inputs[0].shape[1], int)]
    if not todo:
        return graph
    g = graph.copy()
    for node in [n for n in g.nodes if n.name in todo]:
        layer = pb.LayerParameter()
        text_format.Parse(node.attrs["layer_param"], layer)
        if layer.aiacc_unknown_text:
            continue
        p = layer.norm_param
        x, scale = node.inputs[0], np.asarray(node.inputs[1].const, np.float32).reshape(-1)
        rank, c = len(x.shape), x.shape[1]
        if scale.size not in (1, c) or (scale.size == 1) != bool(p.channel_shared) and c != 1:
            continue
        axes = list(range(1, rank)) if p.across_spatial else [1]

        def add(op, *inputs, **attrs):
            return g.add_node(op, list(inputs), attrs, name=f"{node.name}/{op.lower()}", before=node).output

        def const(what, array):
            return g.add_initializer(g.fresh_name(f"{node.name}/{what}"), np.asarray(array))

        sq = add("ReduceSumSquare", x, const("axes", np.asarray(axes, np.int64)), keepdims=1)
        norm = add("Sqrt", add("Add", sq, const("eps", np.float32(p.eps))))
        shape = (1, c) + (1,) * (rank - 2) if scale.size == c and c != 1 else ()
        y = add("Mul", add("Div", x, norm), const("scale", scale.reshape(shape)))
        node.outputs[0].replace_all_uses_with(y)
        g.erase(node)
    return g


def runtime_graph(graph):
    """The graph as the runtimes run it: PriorBox outputs as constants, Normalize as IR ops (the graph itself,
    kept for saving, is not changed)."""
    return _normalize_as_ir(_shape_only_as_constants(graph))


# the candidate of runtime="auto" running LRN in onnxruntime itself (its key in runtime_choice["ms"])
OWN_LRN = "onnxruntime (its own LRN)"


class _Runner:
    """Runs one graph for a CaffeModel on the runtime the model asks for. With "auto" it measures, on the
    first call for each set of input shapes, aiacc's runtime against onnxruntime (when installed; for a net
    with LRN both with the numba LRN between sessions and with onnxruntime's own LRN) on those very inputs,
    interleaved (one warm-up each, then rounds of one call each until one is clearly faster
    or three rounds are done: the medians decide), and keeps the faster for those shapes. `choice` says
    which runs and what was measured."""

    def __init__(self, graph, runtime: str):
        from aiacc.core.runtime.backend import AiaccRuntime

        graph = runtime_graph(graph)
        self.graph = graph
        self.runtime = runtime
        self.aiacc = AiaccRuntime(graph)
        self._ort = None
        self._ort_error: str | None = None
        self.choices: dict[tuple, dict] = {}  # input shapes -> {"runtime", "ms": {...}, "why"}
        self._lock = threading.Lock()
        self.last: dict | None = None

    def ort(self):
        """The onnxruntime runner of the graph (built on first use), or None with `_ort_error` saying why."""
        if self._ort is None and self._ort_error is None:
            if not _onnxruntime_available():
                self._ort_error = "onnxruntime is not installed"
            else:
                from aiacc.backends.onnxruntime import OrtGraphRunner

                try:
                    self._ort = OrtGraphRunner(_lrn_on_numba(self.graph))
                except AiaccError as e:
                    self._ort_error = f"onnxruntime cannot run the net: {e}"
        return self._ort

    def _ort_own_lrn(self):
        """onnxruntime running its own LRN (one session), when the graph has an LRN the numba kernel takes:
        measured too, as on small maps (CaffeNet's 27x27 and 13x13 after pooling) one session wins over the
        faster kernel between sessions. None when there is no such LRN or onnxruntime refuses the graph."""
        if self._ort is None or self._ort.graph is self.graph or not any(n.op == "LRN" for n in self.graph.nodes):
            return None
        from aiacc.backends.onnxruntime import OrtGraphRunner

        try:
            return OrtGraphRunner(self.graph)
        except AiaccError:
            return None

    def _measure(self, feeds) -> tuple[dict, list]:
        runs = {"aiacc": lambda: self.aiacc.run(feeds), "onnxruntime": lambda: self._ort.run(feeds)}
        own = self._ort_own_lrn()
        if own is not None:
            runs[OWN_LRN] = lambda: own.run(feeds)
        outs: dict[str, list] = {}
        # each candidate's last answer is kept: the winner's answers this first call without running again
        keeping = {k: (lambda k=k, fn=fn: outs.__setitem__(k, fn())) for k, fn in runs.items()}
        # one warm-up each (plans, arena, numba compilation, onnxruntime's first run), then up to 3 interleaved
        # rounds, stopping after one where the two fastest are clearly apart (1.5x: more would not change it)
        times = interleaved_times(keeping, rounds=1, warmup=1, max_rounds=3, ambiguous=0.5)
        ms = {k: round(statistics.median(v) * 1e3, 3) for k, v in times.items()}
        best = min(ms, key=ms.get)
        measured = ", ".join(f"{v:.2f} ms {k}" for k, v in ms.items())
        out = outs[best]  # the answer of the runtime that will answer from now on (its last timed run on these feeds)
        if best == OWN_LRN:  # onnxruntime answers from now on, with its own LRN
            self._ort = own
            return {"runtime": "onnxruntime", "ms": ms, "why": f"measured faster with onnxruntime's own LRN "
                                                               f"in one session ({measured})"}, out
        return {"runtime": best, "ms": ms, "why": f"measured faster ({measured})"}, out

    def run(self, feeds) -> list:
        """The graph's outputs in order, from the runtime chosen for these input shapes."""
        key = tuple((k, np.shape(v)) for k, v in sorted(feeds.items()))
        with self._lock:
            choice = self.choices.get(key)
            if choice is None:
                if self.runtime == "aiacc":
                    choice = {"runtime": "aiacc", "ms": {}, "why": "asked for (runtime='aiacc')"}
                elif self.runtime == "onnxruntime":
                    if self.ort() is None:
                        raise UnsupportedError(f"net {self.graph.name!r}: runtime='onnxruntime': {self._ort_error}")
                    choice = {"runtime": "onnxruntime", "ms": {}, "why": "asked for (runtime='onnxruntime')"}
                elif self.ort() is None:
                    choice = {"runtime": "aiacc", "ms": {}, "why": self._ort_error}
                else:
                    choice, out = self._measure(feeds)
                    if choice["runtime"] == "onnxruntime":  # the arena of these shapes is not needed
                        self.aiacc.forget(self.aiacc.bind(feeds))
                    self.choices[key] = self.last = choice
                    return out
                self.choices[key] = choice
            self.last = choice
        if choice["runtime"] == "onnxruntime":
            return self._ort.run(feeds)
        return self.aiacc.run(feeds)


# CaffeModel -> (the graph's structure when built, its _Runner): plans and choices are made once and kept
# while the net is unchanged (a weak key: the model stays picklable and copyable, the entry dies with it)
_RUNTIMES: "weakref.WeakKeyDictionary[Any, tuple]" = weakref.WeakKeyDictionary()


def _runtime(model: "CaffeModel", graph) -> _Runner:
    """The runner of `graph` for `model`, made again when the net changed (nodes, weights, outputs or the
    runtime asked for)."""
    key = (tuple(model.outputs), tuple(map(id, model.graph.nodes)),
           tuple(id(v.const) for v in model.graph.initializers.values()), model.runtime)
    cached = _RUNTIMES.get(model)
    if cached is None or cached[0] != key:
        cached = _RUNTIMES[model] = (key, _Runner(graph, model.runtime))
    return cached[1]


class CaffeModel:
    """A Caffe net: `net` is its NetParameter with the weights (blobs) inside the layers.

    `outputs` names the blobs `forward` returns; by default the blobs no later layer reads (Caffe's net
    outputs), in the order they were last written.
    """

    def __init__(self, net: pb.NetParameter, outputs: list[str] | None = None, *, source: str = "<net>",
                 has_weights: bool = True, runtime: str = "auto"):
        self.net = net
        self.runtime = runtime
        self.source = source
        self._outputs = list(outputs) if outputs is not None else None
        self._has_weights = has_weights
        self._graph = None

    # -- files -------------------------------------------------------------------------------------
    @classmethod
    def load(cls, prototxt: str | os.PathLike, caffemodel: str | os.PathLike | None = None, *,
             runtime: str = "auto") -> "CaffeModel":
        """Read a net from a .prototxt and, optionally, its weights from a .caffemodel. `runtime`: what
        `forward` runs on (RUNTIMES; "auto" measures)."""
        net = read_prototxt(prototxt)
        if caffemodel is not None:
            merge_weights(net, read_caffemodel(caffemodel))
        return cls(net, source=os.fspath(prototxt), has_weights=caffemodel is not None, runtime=runtime)

    @classmethod
    def from_text(cls, prototxt: str, caffemodel: bytes | None = None, *, name: str = "<prototxt>") -> "CaffeModel":
        """Build from prototxt text and, optionally, caffemodel bytes."""
        net = parse_prototxt(prototxt, name)
        if caffemodel is not None:
            merge_weights(net, parse_caffemodel(caffemodel, name))
        return cls(net, source=name, has_weights=caffemodel is not None)

    def save(self, prototxt: str | os.PathLike, caffemodel: str | os.PathLike | None = None) -> None:
        """Write the structure as text (prototxt) and the weights as a binary NetParameter (caffemodel)."""
        with open(prototxt, "w", encoding="utf-8") as f:
            f.write(self.to_prototxt())
        if caffemodel is not None:
            with open(caffemodel, "wb") as f:
                f.write(self.to_caffemodel())

    def to_prototxt(self) -> str:
        return to_prototxt(self.net)

    def to_caffemodel(self) -> bytes:
        return self.net.SerializeToString()

    # -- structure ---------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.net.name

    def layer(self, name: str) -> pb.LayerParameter:
        for layer in self.net.layer:
            if layer.name == name:
                return layer
        raise KeyError(f"net {self.net.name!r} has no layer {name!r}")

    @property
    def layer_types(self) -> list[str]:
        return [layer.type for layer in self.net.layer]

    @property
    def graph(self):
        """The net as an aiacc IR graph (translated once, then cached; `invalidate()` after editing `net`)."""
        if self._graph is None:
            from aiacc.plugins.caffe import import_ops  # noqa: F401  (fills the importer's table)
            from aiacc.plugins.caffe.importer import import_net

            hint = "" if self._has_weights else " (no caffemodel was loaded: give one, or call fill_random())"
            self._graph = import_net(self.net, where=self.source, weights_hint=hint)
        return self._graph

    def invalidate(self) -> None:
        self._graph = None

    def reshape(self, **shapes: Sequence[int]) -> "CaffeModel":
        """A copy of the net (with its weights) whose input blobs have the given shapes, as Caffe's
        `net.blobs[name].reshape(...)` + `net.reshape()`: e.g. `model.reshape(data=(1, 3, 227, 227))` runs
        a deploy net declared for batch 10 on one image. The inputs are rewritten where the file declares
        them (net-level input_dim or input_shape, or an Input layer); the net's layers are unchanged."""
        net = pb.NetParameter()
        net.CopyFrom(self.net)
        names = list(net.input)
        given = {k: [int(d) for d in v] for k, v in shapes.items()}
        done = set()
        if names and net.input_dim:
            if len(net.input_dim) != 4 * len(names):
                raise ShapeError(f"net {self.name!r}: {len(names)} inputs but {len(net.input_dim)} input_dim values")
            dims = [int(d) for d in net.input_dim]
            for i, n in enumerate(names):
                if n in given:
                    if len(given[n]) != 4:
                        raise ShapeError(f"net {self.name!r}: input {n!r} is declared by input_dim (4-d), "
                                         f"got shape {given[n]}")
                    dims[4 * i:4 * i + 4] = given[n]
                    done.add(n)
            del net.input_dim[:]
            net.input_dim.extend(dims)
        elif names and net.input_shape:
            for n, s in zip(names, net.input_shape):
                if n in given:
                    del s.dim[:]
                    s.dim.extend(given[n])
                    done.add(n)
        for layer in net.layer:
            if layer.type != "Input":
                continue
            tops = list(layer.top)
            if len(layer.input_param.shape) == 1 and len(tops) > 1 and any(t in given for t in tops):
                # one shape for several tops: give each top its own before changing one
                first = list(layer.input_param.shape[0].dim)
                for _ in tops[1:]:
                    layer.input_param.shape.add().dim.extend(first)
            for t, s in zip(tops, layer.input_param.shape):
                if t in given:
                    del s.dim[:]
                    s.dim.extend(given[t])
                    done.add(t)
        unknown = sorted(set(given) - done)
        if unknown:
            declared = names + [t for layer in net.layer if layer.type == "Input" for t in layer.top]
            raise ShapeError(f"net {self.name!r} has no input blob {unknown[0]!r} with a declared shape "
                             f"(inputs: {', '.join(declared) or 'none'})")
        return CaffeModel(net, self._outputs, source=self.source, has_weights=self._has_weights,
                          runtime=self.runtime)

    @property
    def inputs(self) -> dict[str, tuple]:
        """Input blob name -> shape."""
        return {v.name: v.shape for v in self.graph.inputs}

    @property
    def outputs(self) -> list[str]:
        """The blob names `forward` returns."""
        return list(self._outputs) if self._outputs is not None else list(self.graph.meta["caffe_outputs"])

    # -- running -----------------------------------------------------------------------------------
    @property
    def runtime(self) -> str:
        """What `forward` runs the net on: "auto" (the faster of aiacc's runtime and onnxruntime, measured
        on the first call for each input shape), "aiacc" or "onnxruntime"."""
        return self._runtime

    @runtime.setter
    def runtime(self, value: str) -> None:
        if value not in RUNTIMES:
            raise UnsupportedError(f"net {self.net.name!r}: unknown runtime {value!r} (one of {', '.join(RUNTIMES)})")
        self._runtime = value

    @property
    def runtime_choice(self) -> dict | None:
        """What the last `forward` ran on: {"runtime": "aiacc" | "onnxruntime", "ms": the measured median
        ms of each (empty when nothing was measured), "why": the reason}; None before the first forward."""
        cached = _RUNTIMES.get(self)
        return dict(cached[1].last) if cached is not None and cached[1].last is not None else None

    def forward(self, *args: Any, **inputs: Any) -> dict[str, np.ndarray]:
        """Run the net on `runtime` (see the class): inputs by blob name (or positionally in the order of
        the net's inputs); returns {output blob name: array}."""
        g = self.graph
        feeds = self.feeds(args if args else inputs)
        if self.outputs != g.meta["caffe_outputs"]:
            # outputs chosen by the exporter (e.g. a blob other layers also read): make them graph outputs
            blobs = g.meta["caffe_blobs"]
            missing = [b for b in self.outputs if b not in blobs]
            if missing:
                raise ShapeError(f"net {self.name!r} has no blob {missing[0]!r} to output")
            g = g.copy()
            g.outputs = [g.value(blobs[b]) for b in self.outputs]
        runner = _runtime(self, g)
        feeds = check_inputs(runner.graph, feeds)  # names, shapes and dtypes, before either runtime sees them
        return dict(zip(self.outputs, runner.run(feeds)))

    def feeds(self, example_inputs: Any) -> dict[str, np.ndarray]:
        """Normalize inputs given as a dict, one array or a sequence into {input name: float32 array}."""
        return blob_feeds(self.name, [v.name for v in self.graph.inputs], example_inputs, check_names=False)

    # -- weights -----------------------------------------------------------------------------------
    def fill_random(self, seed: int = 0, scale: float = 0.5) -> "CaffeModel":
        """Give every layer that lacks weights random ones of the right shapes (for tests and benchmarks).

        BatchNorm variances are positive and its moving-average factor is 1."""
        from aiacc.plugins.caffe import import_ops  # noqa: F401  (fills the importer's table)
        from aiacc.plugins.caffe.importer import expected_blob_shapes

        rng = np.random.default_rng(seed)
        for layer, shapes in expected_blob_shapes(self.net):
            if layer.blobs:
                continue
            for i, (what, shape) in enumerate(shapes):
                if layer.type == "BatchNorm":
                    a = [rng.normal(0, scale, shape), rng.uniform(0.5, 1.5, shape), np.ones(shape)][i]
                elif layer.type in ("Convolution", "Deconvolution", "InnerProduct") and what == "weights":
                    fan_in = int(np.prod(shape[1:])) if layer.type != "InnerProduct" else int(shape[-1])
                    a = rng.normal(0, 1.0 / np.sqrt(max(fan_in, 1)), shape)
                elif what == "scale":
                    a = rng.uniform(0.5, 1.5, shape)
                else:
                    a = rng.normal(0, scale, shape)
                array_to_blob(np.asarray(a, dtype=np.float32), layer.blobs.add())
        self._has_weights = True
        self.invalidate()
        return self

    def __repr__(self) -> str:
        return f"<CaffeModel {self.net.name!r}: {len(self.net.layer)} layers from {self.source}>"
