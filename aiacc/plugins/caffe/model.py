"""`CaffeModel`: a Caffe net (structure and weights) as a Python object that aiacc can optimize.

There is no Caffe runtime here: a CaffeModel is read from and written to Caffe's own files (.prototxt and
.caffemodel, via the protobuf schema in caffe.proto) and runs on aiacc's runtime (planned arena).

    model = CaffeModel.load("deploy.prototxt", "weights.caffemodel")
    outputs = model.forward(data=image)          # {output blob name: array}
    fast = aiacc.optimize(model, {"data": image})
    fast.save("fast.prototxt", "fast.caffemodel")
"""
from __future__ import annotations

import os
import weakref
from typing import Any, Sequence

import numpy as np

from aiacc.errors import ShapeError
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


# CaffeModel -> (the graph's structure when planned, its AiaccRuntime): the arena is planned once and kept
# while the net is unchanged (a weak key: the model stays picklable and copyable, the entry dies with it)
_RUNTIMES: "weakref.WeakKeyDictionary[Any, tuple]" = weakref.WeakKeyDictionary()


def _runtime(model: "CaffeModel", graph):
    """The AiaccRuntime running `graph` for `model`, made again when the net changed (nodes, weights or
    outputs)."""
    from aiacc.core.runtime.backend import AiaccRuntime

    key = (tuple(model.outputs), tuple(map(id, model.graph.nodes)),
           tuple(id(v.const) for v in model.graph.initializers.values()))
    cached = _RUNTIMES.get(model)
    if cached is None or cached[0] != key:
        cached = _RUNTIMES[model] = (key, AiaccRuntime(graph))
    return cached[1]


class CaffeModel:
    """A Caffe net: `net` is its NetParameter with the weights (blobs) inside the layers.

    `outputs` names the blobs `forward` returns; by default the blobs no later layer reads (Caffe's net
    outputs), in the order they were last written.
    """

    def __init__(self, net: pb.NetParameter, outputs: list[str] | None = None, *, source: str = "<net>",
                 has_weights: bool = True):
        self.net = net
        self.source = source
        self._outputs = list(outputs) if outputs is not None else None
        self._has_weights = has_weights
        self._graph = None

    # -- files -------------------------------------------------------------------------------------
    @classmethod
    def load(cls, prototxt: str | os.PathLike, caffemodel: str | os.PathLike | None = None) -> "CaffeModel":
        """Read a net from a .prototxt and, optionally, its weights from a .caffemodel."""
        net = read_prototxt(prototxt)
        if caffemodel is not None:
            merge_weights(net, read_caffemodel(caffemodel))
        return cls(net, source=os.fspath(prototxt), has_weights=caffemodel is not None)

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
        return CaffeModel(net, self._outputs, source=self.source, has_weights=self._has_weights)

    @property
    def inputs(self) -> dict[str, tuple]:
        """Input blob name -> shape."""
        return {v.name: v.shape for v in self.graph.inputs}

    @property
    def outputs(self) -> list[str]:
        """The blob names `forward` returns."""
        return list(self._outputs) if self._outputs is not None else list(self.graph.meta["caffe_outputs"])

    # -- running -----------------------------------------------------------------------------------
    def forward(self, *args: Any, **inputs: Any) -> dict[str, np.ndarray]:
        """Run the net on aiacc's runtime (the planned arena, numba kernels for fused elementwise layers; see
        aiacc.core.runtime.backend), the runtime Caffe nets get where no other one is present: inputs by
        blob name (or positionally in the order of the net's inputs); returns {output blob name: array}."""
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
        results = _runtime(self, g).run_dict(feeds)
        return {blob: results[v.name] for blob, v in zip(self.outputs, g.outputs)}

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
