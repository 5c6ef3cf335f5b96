"""Input-shape guards, the same for every plugin: what an optimized model takes (`ShapeSpec`) and how a call
that does not fit is refused (the ShapeError's wording).

aiacc specializes an optimized model to its example's shapes wherever its IR holds them as numbers. A plugin
builds one ShapeSpec per optimized model and checks every call against it where the model takes its inputs
(torch: shapes.ShapeHook; TF: tf/guard.GuardedCall; MXNet: mxnet/guard.ShapeGuardHook), so a call at other
shapes is an aiacc ShapeError naming the input, the dimension, the size the model was built for and why,
never a raw error from inside the framework or a wrong answer. What stays free:

- a dimension the model keeps dynamic (None in the spec: a TF signature's None that the IR kept symbolic,
  a dimension verify ran at another size with the same outputs), any size;
- dimension 0 where verify's second-batch check found the model right at another batch size (`free_batch`):
  any size, but a call's inputs must agree on it.

`found` (`FOUND`, set by Plugin.optimize around verify) is what those checks found, for the plugin that
builds the spec after them.
"""
from __future__ import annotations

import contextvars
from typing import Any

from aiacc.errors import ShapeError

# what verify's checks at other sizes found while optimize runs (base.Plugin._optimize sets a dict):
#   "batch": ("free",) or ("fixed", batch, why)      the second-batch check's verdict
#   "free_dims": {(input index, dim), ...}           non-batch dimensions found right at another size
FOUND: contextvars.ContextVar = contextvars.ContextVar("aiacc_shapes_found", default=None)


def shape_text(shape: tuple) -> str:
    """A shape as the error messages print it: [2, None, 16]."""
    return "[" + ", ".join(str(d) for d in shape) + "]"


def describe(shapes: dict[str, tuple]) -> str:
    """'input_ids [2, 16], attention_mask [2, 16]' (None: a dimension of any size)."""
    return ", ".join(f"{k} {shape_text(v)}" for k, v in shapes.items())


class ShapeSpec:
    """The shapes one specialization takes: every dimension fixed to its example's, except a None dimension
    (kept dynamic: any size) and dimension 0 of the inputs when the batch is free (verify found the model
    right at another batch size; a call's inputs must then still agree on it). `declared`:
    {(input, dim): (min, max)} from torch's dynamic_shapes."""

    def __init__(self, shapes: dict[str, tuple], free_batch: bool = False, batch_why: str = "",
                 declared: dict | None = None):
        self.shapes, self.free_batch, self.batch_why = dict(shapes), free_batch, batch_why
        self.declared = dict(declared or {})

    def mismatches(self, got: dict[str, tuple]) -> list[tuple[str, int, Any]]:
        """(input, dimension, the size it must have) for every difference of a call's shapes, in order; the
        dimension is -1 for a rank or a missing input (then that input's dimensions are not compared)."""
        found, batch = [], None
        for name, want in self.shapes.items():
            shape = got.get(name)
            if shape is None or len(shape) != len(want):
                found.append((name, -1, want))
                continue
            for d, (w, g) in enumerate(zip(want, shape)):
                if w is None:  # kept dynamic: any size
                    continue
                if d == 0 and self.free_batch:
                    if batch is not None and g != batch:
                        found.append((name, 0, batch))
                    batch = g
                elif w != g:
                    found.append((name, d, w))
        return found

    def mismatch(self, got: dict[str, tuple]) -> tuple[str, int, Any] | None:
        """The first of `mismatches`, else None."""
        found = self.mismatches(got)
        return found[0] if found else None

    def matches(self, got: dict[str, tuple]) -> bool:
        """True when a call of these shapes (input name -> shape) fits."""
        return self.mismatch(got) is None

    def message(self, model: str, got: dict[str, tuple], built: list[str], why: str) -> str:
        """The ShapeError's text for a call that fits none of `built` (this spec first)."""
        name, d, want = self.mismatch(got)
        shape = got.get(name)
        if shape is None:
            return f"{model}: input {name!r} is not given; the model was built for {built[0]} ({why})"
        if d == -1:
            return (f"{model}: input {name!r} of shape {shape_text(shape)} has {len(shape)} dimensions, the model was "
                    f"built for {shape_text(want)} ({why})")
        if d == 0 and self.batch_why and not self.free_batch:  # the second-batch check's own wording
            return (f"{model}: input {name!r} of shape {shape_text(shape)}: its dimension 0 must be {want}, the batch "
                    f"size the model was built for ({self.batch_why}); {why}")
        return (f"{model}: input {name!r} of shape {shape_text(shape)}: its dimension {d} must be {want}, the size the "
                f"model was built for (built: {'; '.join(built)}); {why}")


class ShapeCheck:
    """A ShapeSpec applied to a call's flat inputs in order (TF's flattened arguments, a Gluon block's
    NDArrays): `check(inputs)` raises the ShapeError. A class, not a closure, so a guarded model pickles."""

    def __init__(self, spec: ShapeSpec, names: list[str], model: str, why: str):
        self.spec, self.names, self.model, self.why = spec, list(names), model, why

    def shapes(self, inputs: Any) -> dict[str, tuple]:
        """{input name: shape} of the array-likes among `inputs` (others, such as Python numbers or the MXNet
        Symbols a block is traced on, left out)."""
        got = {}
        for i, x in enumerate(inputs):
            try:
                shape = getattr(x, "shape", None)
                dims = None if shape is None else tuple(None if d is None else int(d) for d in shape)
            except (TypeError, ValueError, AttributeError):  # a symbolic value without a concrete shape
                dims = None
            if dims is not None and i < len(self.names):
                got[self.names[i]] = dims
        return got

    def check(self, inputs: Any) -> None:
        """ShapeError for a call whose arrays the spec does not take. Only the inputs given as arrays are
        compared: a call with other values (fewer arguments, Symbols) is the framework's to refuse or take."""
        got = self.shapes(inputs)
        spec = self.spec
        if set(got) != set(spec.shapes):
            spec = ShapeSpec({k: v for k, v in spec.shapes.items() if k in got}, spec.free_batch, spec.batch_why)
        if not spec.matches(got):
            raise ShapeError(spec.message(self.model, got, [describe(self.spec.shapes)], self.why))


def unique_names(names: list[Any]) -> list[str]:
    """One name per input: the given one, else (missing or taken) 'input i'."""
    out: list[str] = []
    for i, n in enumerate(names):
        out.append(str(n) if n and str(n) not in out else f"input {i}")
    return out


def graph_spec(shapes: list[Any], names: list[str], found: dict | None) -> ShapeSpec:
    """The ShapeSpec of an optimized model whose inputs have the IR shapes `shapes` (in order; an int is
    specialized, a symbol kept dynamic, None an unknown shape: not guarded) after verify `found` what it
    found (FOUND's dict): dimension 0 free where the batch check found it free, fixed to the example's batch
    where it found it specialized; a dimension verify found right at another size free."""
    found = found or {}
    batch = found.get("batch") or ()
    free_dims = found.get("free_dims") or set()
    spec_shapes: dict[str, tuple] = {}
    for i, (name, shape) in enumerate(zip(names, shapes)):
        if shape is None:
            continue
        dims = [d if isinstance(d, int) else None for d in shape]
        for d in range(len(dims)):
            if (i, d) in free_dims:
                dims[d] = None
        if dims and batch[:1] == ("fixed",):
            dims[0] = batch[1]
        spec_shapes[name] = tuple(dims)
    return ShapeSpec(spec_shapes, free_batch=batch[:1] == ("free",),
                     batch_why=batch[2] if batch[:1] == ("fixed",) else "")


def shapes_line(spec: ShapeSpec) -> str:
    """The pass report's `shapes` line for a model guarded by `spec` (the plugins without specializations)."""
    free = " (None: any size)" if any(d is None for v in spec.shapes.values() for d in v) else ""
    batch = spec.free_batch and any(v and v[0] is not None for v in spec.shapes.values())
    return (f"optimized for {describe(spec.shapes)}{free}" + (" (any batch size)" if batch else "") +
            "; a call at other shapes is a ShapeError")


def other_shapes_why(title: str) -> str:
    """Why a call at other shapes is refused rather than optimized again (TF, MXNet: no specializations)."""
    return (f"the {title} plugin does not optimize it again for other shapes; optimize the original with an "
            f"example of these shapes")
