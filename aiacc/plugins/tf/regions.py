"""Opaque regions: TF subgraphs the IR keeps whole (control flow, TensorLists, function calls).

Some TF constructs cannot be split into IR nodes op by op:

* functional control flow (While / StatelessWhile / If / StatelessIf / Case, PartitionedCall): the node
  refers to functions in the graph's function library, which an op-by-op NodeDef does not carry;
* tensors of the handle dtypes `variant` (TensorList, Optional, ...) and `resource`, which the IR cannot
  hold: a Keras LSTM passes TensorLists from TensorListFromTensor through its While loop to TensorListStack.

The importer groups such ops into *regions*: every op with a function attribute, and every connected set
of ops joined by variant/resource edges (plus the ops that would otherwise make the region a cycle with
the rest of the graph, and the small constants only the region reads). A region becomes one opaque IR
node in the domain "tf" whose attribute `graph_def` is a self-contained GraphDef (placeholders `aiacc_in<k>`
for the region's inputs, the region's NodeDefs and the function definitions they need). Its inputs and
outputs have IR dtypes; handles never leave the region. The exporter imports that GraphDef into the
tf.function being built (functions included, SavedModel-portable); the reference executor and the
onnxruntime backend run it through an eager kernel.
"""
from __future__ import annotations

import base64
from typing import Any, Callable, Iterable

from aiacc.errors import KernelError, UnsupportedError, first_line
from aiacc.plugins.tf._tf import tf

HANDLE_DTYPES = {"variant", "resource"}
# the op a region is named after, in order of preference
CONTROL_FLOW = ("While", "StatelessWhile", "If", "StatelessIf", "Case", "StatelessCase", "PartitionedCall",
                "StatefulPartitionedCall")
INPUT_PREFIX = "aiacc_in"
SMALL_CONST = 64  # constants up to this many elements move into the region that alone reads them


# ------------------------------------------------------------------------------------------ graph analysis
def function_refs(attr_map) -> list[str]:
    """Names of the functions a NodeDef's attributes refer to (func and list(func) attributes)."""
    names = []
    for value in attr_map.values():
        if value.HasField("func") and value.func.name:
            names.append(value.func.name)
        if value.HasField("list"):
            names.extend(f.name for f in value.list.func if f.name)
    return names


def _is_seed(op, library: set[str]) -> bool:
    if op.type in library or function_refs(op.node_def.attr):
        return True
    return any(t.dtype.name in HANDLE_DTYPES for t in list(op.inputs) + list(op.outputs))


def topo_order(ops: list) -> list:
    """`ops` (TF operations) sorted so that every op comes after the producers of its data inputs; ties keep
    the given order. A frozen FuncGraph lists ops in creation order, which is not always topological."""
    index = {op.name: i for i, op in enumerate(ops)}
    indeg = {op.name: 0 for op in ops}
    users: dict[str, list] = {op.name: [] for op in ops}
    for op in ops:
        preds = {t.op.name for t in op.inputs if t.op.name in index}
        preds |= {c.name for c in op.control_inputs if c.name in index}
        indeg[op.name] = len(preds)
        for p in preds:
            users[p].append(op)
    import heapq

    ready = [(index[op.name], op.name) for op in ops if indeg[op.name] == 0]
    heapq.heapify(ready)
    by_name = {op.name: op for op in ops}
    out = []
    while ready:
        _, name = heapq.heappop(ready)
        out.append(by_name[name])
        for u in users[name]:
            indeg[u.name] -= 1
            if indeg[u.name] == 0:
                heapq.heappush(ready, (index[u.name], u.name))
    if len(out) != len(ops):  # a cycle (lowered control flow): keep the rest in creation order
        seen = {op.name for op in out}
        out.extend(op for op in ops if op.name not in seen)
    return out


def contract(ops: list, regions: list[list]) -> list:
    """`ops` in topological order with each region standing as one unit (a list of ops) placed where all of
    its inputs are defined; other units are single ops."""
    unit_of: dict[str, int] = {}
    units: list = []
    for region in regions:
        for op in region:
            unit_of[op.name] = len(units)
        units.append(region)
    for op in ops:
        if op.name not in unit_of:
            unit_of[op.name] = len(units)
            units.append(op)
    first = {}
    for i, op in enumerate(ops):
        first.setdefault(unit_of[op.name], i)
    preds: dict[int, set[int]] = {u: set() for u in range(len(units))}
    users: dict[int, set[int]] = {u: set() for u in range(len(units))}
    for op in ops:
        u = unit_of[op.name]
        for t in op.inputs:
            p = unit_of.get(t.op.name)
            if p is not None and p != u:
                preds[u].add(p)
                users[p].add(u)
    import heapq

    indeg = {u: len(p) for u, p in preds.items()}
    ready = [(first[u], u) for u in indeg if indeg[u] == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        _, u = heapq.heappop(ready)
        out.append(units[u])
        for v in users[u]:
            indeg[v] -= 1
            if indeg[v] == 0:
                heapq.heappush(ready, (first[v], v))
    if len(out) != len(units):
        raise UnsupportedError("the TF graph has a cycle outside functional control flow (lowered "
                               "Switch/Merge loops are not supported)")
    return out


def find_regions(ops: list, library: set[str]) -> list[list]:
    """The regions among `ops` (topologically ordered TF operations), each a list of ops in that order."""
    names = {op.name for op in ops}
    parent = {op.name: op.name for op in ops}

    def find(a):
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    def union(a, b):
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[rb] = ra

    seeds = {op.name for op in ops if _is_seed(op, library)}
    if not seeds:
        return []
    for op in ops:
        for t in op.inputs:
            if t.op.name in names and t.dtype.name in HANDLE_DTYPES:
                union(op.name, t.op.name)
    groups: dict[str, set[str]] = {}
    for name in seeds:
        groups.setdefault(find(name), set()).add(name)
    for op in ops:  # complete each group with all ops of its component
        r = find(op.name)
        if r in groups:
            groups[r].add(op.name)
    regions = [set(g) for g in groups.values()]
    regions = _close_cycles(ops, regions)
    order = {op.name: i for i, op in enumerate(ops)}
    by_name = {op.name: op for op in ops}
    out = []
    for region in regions:
        _absorb_constants(by_name, region, names)
        out.append(sorted((by_name[n] for n in region), key=lambda o: order[o.name]))
    return out


def _close_cycles(ops: list, regions: list[set[str]]) -> list[set[str]]:
    """Absorb into each region the outside ops that lie on a path from the region back into it (the region
    as one node would otherwise sit on a cycle); regions that come to share ops are merged."""
    names = {op.name for op in ops}
    succ: dict[str, set[str]] = {n: set() for n in names}
    pred: dict[str, set[str]] = {n: set() for n in names}
    for op in ops:
        for t in op.inputs:
            if t.op.name in names:
                succ[t.op.name].add(op.name)
                pred[op.name].add(t.op.name)

    def reach(start: Iterable[str], edges) -> set[str]:
        seen, stack = set(), list(start)
        while stack:
            n = stack.pop()
            for m in edges[n]:
                if m not in seen:
                    seen.add(m)
                    stack.append(m)
        return seen

    changed = True
    while changed:
        changed = False
        for region in regions:
            between = (reach(region, succ) & reach(region, pred)) - region
            if between:
                region |= between
                changed = True
        merged: list[set[str]] = []
        for region in regions:
            for m in merged:
                if m & region:
                    m |= region
                    changed = True
                    break
            else:
                merged.append(region)
        regions = merged
    return regions


def _absorb_constants(by_name: dict, region: set[str], names: set[str]) -> None:
    """Small Const ops read only by the region move into it (shape inference inside sees their values)."""
    for n in list(region):
        for t in by_name[n].inputs:
            p = t.op
            if p.type != "Const" or p.name in region or p.name not in names:
                continue
            if any(c.name not in region for c in _consumers(p)):
                continue
            shape = t.shape
            if shape.rank is not None and shape.is_fully_defined() and shape.num_elements() <= SMALL_CONST:
                region.add(p.name)


def _consumers(op) -> list:
    return [c for t in op.outputs for c in t.consumers()]


# ------------------------------------------------------------------------------------------ the GraphDef
def region_graph_def(region: list, library_def, versions=None) -> tuple[Any, list, list]:
    """(GraphDef, external input tensors, output tensors) of a region. Outputs are the region's tensors read
    outside it; `library_def` is the FunctionDefLibrary of the whole graph (the needed part is copied)."""
    tfm = tf()
    names = {op.name for op in region}
    external: list = []
    ext_index: dict[str, int] = {}
    gd = tfm.compat.v1.GraphDef()
    for op in region:
        nd = gd.node.add()
        nd.CopyFrom(op.node_def)
        nd.device = ""
        if "_class" in nd.attr:  # colocation with ops that may not be in the region
            del nd.attr["_class"]
        del nd.input[:]
        for t in op.inputs:
            if t.op.name in names:
                nd.input.append(t.op.name if t.value_index == 0 else f"{t.op.name}:{t.value_index}")
                continue
            if t.name not in ext_index:
                ext_index[t.name] = len(external)
                external.append(t)
            nd.input.append(f"{INPUT_PREFIX}{ext_index[t.name]}")
        nd.input.extend(f"^{c.name}" for c in op.control_inputs if c.name in names)
    for k, t in enumerate(external):
        ph = gd.node.add()
        ph.name = f"{INPUT_PREFIX}{k}"
        ph.op = "Placeholder"
        ph.attr["dtype"].type = t.dtype.as_datatype_enum
    outputs = [t for op in region for t in op.outputs if any(c.name not in names for c in t.consumers())]
    if library_def is not None:
        _copy_library(region, library_def, gd.library)
    if versions is not None:
        gd.versions.CopyFrom(versions)
    return gd, external, outputs


def _copy_library(region: list, library_def, out) -> None:
    funcs = {f.signature.name: f for f in library_def.function}
    todo = []
    for op in region:
        todo.extend(function_refs(op.node_def.attr))
        if op.type in funcs:
            todo.append(op.type)
    done: set[str] = set()
    while todo:
        name = todo.pop()
        if name in done or name not in funcs:
            continue
        done.add(name)
        fdef = funcs[name]
        out.function.add().CopyFrom(fdef)
        for nd in fdef.node_def:
            todo.extend(function_refs(nd.attr))
            if nd.op in funcs:
                todo.append(nd.op)
    out.gradient.extend(g for g in library_def.gradient if g.function_name in done)


def encode(gd) -> str:
    return base64.b64encode(gd.SerializeToString()).decode()


def decode(text: str):
    gd = tf().compat.v1.GraphDef()
    gd.ParseFromString(base64.b64decode(text))
    return gd


def rebuild_region(gd, inputs: list, output_names: list[str], scope: str = "aiacc_region") -> list:
    """Import the region's GraphDef into the current graph reading `inputs`; its output tensors."""
    tfm = tf()
    return list(tfm.graph_util.import_graph_def(gd, input_map={f"{INPUT_PREFIX}{k}": x for k, x in enumerate(inputs)},
                                                return_elements=list(output_names), name=scope))


def region_kernel(gd, output_names: list[str], label: str) -> Callable:
    """A numpy-level kernel running the region eagerly (one traced tf.function per input signature)."""
    return eager_kernel(lambda xs: rebuild_region(gd, xs, output_names), f"TF region {label}")


def eager_kernel(build: Callable[[list], list], what: str) -> Callable:
    """A numpy-level kernel running `build(input tensors) -> output tensors` in a tf.function traced once per
    input signature; a TF runtime error inside becomes a KernelError naming `what`."""
    cache: dict = {}

    def kernel(*arrays):
        tfm = tf()
        key = tuple((a.dtype.str, a.shape) for a in arrays)
        fn = cache.get(key)
        if fn is None:
            specs = [tfm.TensorSpec(a.shape, tfm.as_dtype(a.dtype)) for a in arrays]
            fn = tfm.function(lambda *xs: build(list(xs)), autograph=False).get_concrete_function(*specs)
            cache[key] = fn
        try:
            outs = fn(*[tfm.constant(a) for a in arrays])
        except Exception as e:  # a TF runtime error inside the op or region
            raise KernelError(f"{what} failed: {first_line(e)}") from e
        return [o.numpy() for o in outs]

    return kernel


def main_op(region: list):
    """The op a region is named after: its control-flow op, else a function call, else a handle producer."""
    for kind in CONTROL_FLOW:
        for op in region:
            if op.type == kind:
                return op
    for op in region:
        if function_refs(op.node_def.attr):
            return op
    for op in region:
        if any(t.dtype.name in HANDLE_DTYPES for t in op.outputs):
            return op
    return region[0]
