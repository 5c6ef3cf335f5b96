"""mode="train" for TensorFlow: the exported training step runs on the original model's own variables.

The importer (mode="train") leaves the variables unfrozen: each one is a graph input
(graph.meta["tf_variables"]: input name, index in `model.variables`, trainable) and each variable the step
assigns (BatchNormalization's moving statistics, Keras' dropout seed generator) an extra graph output
(graph.meta["tf_assigns"]). `export_training` builds one tf.function that reads those same tf.Variable
objects, computes the optimized graph and assigns the updates back, so a GradientTape, an existing optimizer,
checkpoints and `trainable_variables` see the original's variables. A Keras original gives a keras.Model
(`AiaccTrainModel`: `fit` trains it); a tf.Module a tf.Module tracking the same variables.

The verification in optimize runs both models in training semantics with every variable restored after
each run (`training_runs`), so the dropout masks (drawn from the same seed state) and the BatchNorm updates
are the same in both runs.
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Any

import numpy as np

from aiacc.core.ir import Graph, const_value
from aiacc.errors import AiaccError, UnsupportedError, first_line
from aiacc.plugins.tf._tf import tf
from aiacc.plugins.tf.exporter import Emitter, Untracked, input_signature, lowerable_copy, module_name, pack_outputs
from aiacc.plugins.tf.importer import _is_keras_model, model_variables

# set while optimize(mode="train") verifies: the variables restored after each run
TRAINING_RUN: contextvars.ContextVar = contextvars.ContextVar("aiacc_tf_training_run", default=None)


def _producer(v: Any, *ops: str) -> Any:
    """v's producer when it is one of `ops` (qualified names or bare op names), else None."""
    p = None if v is None else v.producer
    return p if p is not None and (p.op in ops or p.qualified_op in ops) else None


def _perm(node: Any) -> list | None:
    return None if node is None else [int(a) for a in node.attrs.get("perm", [])]


def _other(node: Any, v: Any) -> Any:
    """The other input of a two-input node one of whose inputs is `v` (None when neither is)."""
    a, b = node.inputs[:2]
    return b if a is v else a if b is v else None


def match_batchnorm(y: Any) -> dict | None:
    """Keras' BatchNormalization in training (tf.nn.moments, then x * inv + (beta - mean * inv) with
    inv = rsqrt(var + eps) * gamma) ending at the Add node `y`, on an NCHW rank-4 float32 IR value x read
    channels-last: {"x", "gamma", "beta", "eps", "mean", "var" (the Squeeze nodes of the batch statistics,
    read by the moving-average updates), "skip" (ids of the pattern's other nodes, read by nothing outside
    it)}; None when `y` is not that pattern."""
    if y.op != "Add" or len(y.inputs) != 2:
        return None
    for mul1, sub in ((_producer(y.inputs[0], "Mul"), _producer(y.inputs[1], "Sub")),
                      (_producer(y.inputs[1], "Mul"), _producer(y.inputs[0], "Sub"))):
        if mul1 is not None and sub is not None:
            break
    else:
        return None
    # mul1 = Transpose(x, to NHWC) * inv
    xt = next((v for v in mul1.inputs if _perm(_producer(v, "Transpose")) == [0, 2, 3, 1]), None)
    if xt is None:
        return None
    inv = _other(mul1, xt)
    x = xt.producer.inputs[0]
    mul_inv = _producer(inv, "Mul")
    beta, mul2 = sub.inputs[0], _producer(sub.inputs[1], "Mul")
    if mul_inv is None or mul2 is None or beta is None or not beta.is_graph_input or inv not in mul2.inputs:
        return None
    mean_v = _other(mul2, inv)
    rs = next((v for v in mul_inv.inputs if _producer(v, "Reciprocal", "Rsqrt") is not None), None)
    if rs is None:
        return None
    gamma = _other(mul_inv, rs)
    rnode = rs.producer
    add_eps = _producer(rnode.inputs[0], "Add") if rnode.op == "Rsqrt" else _producer(
        getattr(_producer(rnode.inputs[0], "Sqrt"), "inputs", [None])[0], "Add")
    if gamma is None or not gamma.is_graph_input or add_eps is None:
        return None
    eps_v = next((v for v in add_eps.inputs if const_value(v) is not None), None)
    if eps_v is None or np.asarray(const_value(eps_v)).size != 1:
        return None
    var_v = _other(add_eps, eps_v)
    sq_mean, sq_var = _producer(mean_v, "Squeeze"), _producer(var_v, "Squeeze")
    if sq_mean is None or sq_var is None:
        return None
    mt, vt = _producer(sq_mean.inputs[0], "Transpose"), _producer(sq_var.inputs[0], "Transpose")
    mean, var = (None if t is None else _producer(t.inputs[0], "ReduceMean") for t in (mt, vt))
    if mean is None or var is None or mean.inputs[0] is not x:
        return None
    sqd = _producer(var.inputs[0], "Mul")
    if sqd is None or sqd.inputs[0] is not sqd.inputs[1]:
        return None
    diff = _producer(sqd.inputs[0], "Sub")
    if diff is None or diff.inputs[0] is not x:
        return None
    t_back = _producer(diff.inputs[1], "Transpose")
    stop = None if t_back is None else _producer(t_back.inputs[0], "tf::StopGradient")
    if stop is None or stop.inputs[0] is not mt.outputs[0]:
        return None
    for r in (mean, var):
        axes = const_value(r.inputs[1]) if len(r.inputs) > 1 else None
        if axes is None or sorted(int(a) % 4 for a in np.asarray(axes).reshape(-1)) != [0, 2, 3]:
            return None
    if (x.dtype != "float32" or x.shape is None or len(x.shape) != 4 or mean_v.shape is None
            or len(mean_v.shape) != 1):
        return None
    skip = [mean, mt, stop, t_back, diff, sqd, var, vt, add_eps, rnode, mul_inv, mul1, mul2, sub, xt.producer]
    if rnode.op == "Reciprocal":
        skip.append(rnode.inputs[0].producer)
    inside = {id(n) for n in skip} | {id(y), id(sq_mean), id(sq_var)}
    for n in skip:
        for o in n.outputs:
            if o.is_graph_output or any(id(u) not in inside for u in o.users()):
                if n is xt.producer:  # x's channels-last transpose read elsewhere: it is then emitted too
                    continue
                return None
    return {"x": x, "gamma": gamma, "beta": beta, "eps": float(np.asarray(const_value(eps_v)).reshape(-1)[0]),
            "mean": sq_mean, "var": sq_var, "y": y, "skip": {id(n) for n in skip if n is not xt.producer}}


class TrainEmitter(Emitter):
    """The TF emitter of a training step. With `fuse_batchnorm`, each Keras BatchNormalization in training
    (match_batchnorm) runs as one FusedBatchNormV3 (is_training=True, channels-last): its batch mean and
    variance feed the moving averages as Keras' moments do (the kernel's Bessel-corrected variance scaled
    back to Keras' biased one), and its gradient is TF's fused BatchNorm gradient, the same function of the
    input as the gradient of Keras' moments graph (whose stopped mean has no gradient path)."""

    fuse_batchnorm = False

    def run(self, xs: list, identities: bool = True) -> list:
        self._bn: dict[int, dict] = {}
        if self.fuse_batchnorm:
            for n in self.graph:
                m = match_batchnorm(n)
                if m is not None:
                    for k in ("mean", "var", "y"):
                        self._bn[id(m[k])] = m
                    for k in m["skip"]:
                        self._bn[k] = None  # not emitted
        return super().run(xs, identities)

    def emit(self, node: Any) -> None:
        bn = getattr(self, "_bn", None)
        if not bn or id(node) not in bn:
            return super().emit(node)
        m = bn[id(node)]
        if m is None:
            return None
        if "out" not in m:
            tfm = tf()
            x = self.nhwc(m["x"])
            empty = tfm.constant([], tfm.float32)
            y, mean, var = tfm.raw_ops.FusedBatchNormV3(
                x=x, scale=self.std(m["gamma"]), offset=self.std(m["beta"]), mean=empty, variance=empty,
                epsilon=m["eps"], exponential_avg_factor=1.0, data_format="NHWC", is_training=True)[:3]
            count = tfm.cast(tfm.size(x) // tfm.shape(x)[-1], tfm.float32)
            # the kernel returns the variance with Bessel's correction; Keras' moments the biased one
            m["out"] = {"y": y, "mean": mean, "var": var * ((count - 1.0) / count)}
        for k in ("mean", "var", "y"):
            if m[k] is node:
                self.set(node.outputs[0], m["out"][k])  # y: the IR's value is channels-last already
        return None


class XlaRandomEmitter(TrainEmitter):
    """The TF emitter for a step that XLA compiles: TensorFlow's stateless Philox draws (Keras' dropout:
    StatelessRandomGetKeyCounter, a float32 StatelessRandomUniformV2 with the Philox or auto-select alg)
    written in integer ops (aiacc/plugins/tf/philox.py), which XLA computes bit for bit as TensorFlow's
    kernels do, where XLA's own lowering of those ops draws other numbers (other dropout masks)."""

    def emit(self, node: Any) -> None:
        from aiacc.plugins.tf import philox

        if node.qualified_op == "tf::StatelessRandomGetKeyCounter" and len(node.inputs) == 1:
            key, counter = philox.key_counter(self.std(node.inputs[0]))
            self.set(node.outputs[0], key)
            self.set(node.outputs[1], counter)
            return
        if node.qualified_op == "tf::StatelessRandomUniformV2" and xla_exact_uniform(node):
            shape, key, counter = (self.std(v) for v in node.inputs[:3])
            self.set(node.outputs[0], philox.uniform_float32(shape, key, counter))
            return
        super().emit(node)


def xla_exact_uniform(node: Any) -> bool:
    """A StatelessRandomUniformV2 node that philox.uniform_float32 reproduces: float32, a constant alg that
    TF's kernels draw with Philox."""
    from aiacc.plugins.tf import philox

    if len(node.inputs) != 4 or node.outputs[0].dtype != "float32" or node.inputs[3].const is None:
        return False
    return int(np.asarray(node.inputs[3].const).reshape(-1)[0]) in philox.PHILOX_ALGS


def xla_random_ops(graph: Graph) -> list:
    """The random ops of `graph` whose numbers XLA does not reproduce even through XlaRandomEmitter (a
    stateful RandomUniform, a float16 uniform, ThreeFry): under jit_compile they draw other numbers than
    TensorFlow's kernels."""
    out = set()
    for n in graph:
        if "Random" not in n.op or n.qualified_op == "tf::StatelessRandomGetKeyCounter":
            continue
        if n.qualified_op == "tf::StatelessRandomUniformV2" and xla_exact_uniform(n):
            continue
        out.add(n.op)
    return sorted(out)


def fused(cls: type, fuse_batchnorm: bool) -> type:
    """The emitter class `cls` (a TrainEmitter) with its BatchNorm fusion on or off."""
    if not fuse_batchnorm:
        return cls
    return type(f"FusedBatchNorm{cls.__name__}", (cls,), {"fuse_batchnorm": True})


def has_fusable_batchnorm(graph: Graph) -> bool:
    """Whether the lowered training graph has a Keras BatchNormalization that TrainEmitter fuses."""
    return any(n.op == "Add" and match_batchnorm(n) is not None for n in graph)


def step_function(graph: Graph, variables: list, jit_compile: bool = False, xla_random: bool | None = None,
                  fuse_batchnorm: bool = False) -> Any:
    """The tf.function (flat data inputs -> outputs in the original structure) of a training-mode graph:
    reads the variables, runs the graph, assigns the updated state back; compiled by XLA with
    jit_compile=True (its gradient function too). `xla_random` (default: jit_compile) emits TensorFlow's
    Philox draws in integer ops (XlaRandomEmitter), for a step that XLA compiles, here or in a caller's
    jit_compile function (Keras' fit step under XLA): the same dropout masks as TensorFlow's kernels.
    `fuse_batchnorm`: Keras' BatchNormalizations as FusedBatchNormV3 (TrainEmitter)."""
    tfm = tf()
    emitter = fused(XlaRandomEmitter if (jit_compile if xla_random is None else xla_random) else TrainEmitter,
                    fuse_batchnorm)
    graph = lowerable_copy(graph)
    n_data = graph.meta["tf_data_inputs"]
    n_model = graph.meta["tf_model_outputs"]
    by_input = {name: k for name, k, _ in graph.meta["tf_variables"]}
    reads = [variables[by_input[v.name]] for v in graph.inputs[n_data:]]
    assigns = [(i, variables[k]) for i, k in graph.meta["tf_assigns"]]
    structure = graph.meta.get("tf_output_structure")

    recompute = {a: b for a, b in graph.meta.get("tf_recompute", [])}
    nodes = list(graph)
    later = _read_later(graph, nodes, recompute)

    def run(xs):
        if not recompute:
            return emitter(graph).run(xs, identities=False)  # no Identity per output: 41 on a ResNet-18
        e = emitter(graph)
        for v, x in zip(graph.inputs, xs):
            e.env[id(v)] = (x, False)
        i = 0
        while i < len(nodes):
            if i in recompute:
                _emit_recomputed(e, nodes[i:recompute[i] + 1], later[i])
                i = recompute[i] + 1
            else:
                e.emit(nodes[i])
                i += 1
        return [e.std(v) for v in graph.outputs]

    def step(*args):
        xs = list(tfm.nest.flatten(args)) + [tfm.convert_to_tensor(v) for v in reads]
        outs = run(xs)
        for i, var in assigns:
            var.assign(outs[i])
        return pack_outputs(structure, outs[:n_model])

    return tfm.function(step, input_signature=input_signature(graph), autograph=False, reduce_retracing=True,
                        jit_compile=jit_compile or None)


# the candidate with each Keras BatchNormalization in training as one FusedBatchNormV3 (TrainEmitter)
FUSED_BN = "aiacc graph, BatchNorm as FusedBatchNormV3"
# the candidate that draws the dropout masks in TF's own kernels outside XLA and runs the rest under XLA
SPLIT_XLA = "aiacc graph + XLA (jit_compile=True), dropout drawn outside XLA"
# set while a SplitStep's XLA program is traced: the random draws (node id -> tensor) it takes as inputs
SPLIT_MASKS: contextvars.ContextVar = contextvars.ContextVar("aiacc_tf_split_masks", default=None)


def in_xla_context() -> bool:
    """Whether the function being traced is (inside) a jit_compile=True function: a nested XLA function's
    gradient there recompiles every step, and TF's random ops draw XLA's numbers."""
    from tensorflow.python.ops import control_flow_util

    return control_flow_util.GraphOrParentsInXlaContext(tf().compat.v1.get_default_graph())


def drawn_values(graph: Graph) -> list:
    """The random ops of `graph` whose values a SplitStep draws outside XLA (every op that draws random
    numbers, Keras' StatelessRandomUniformV2 among them; the key/counter derivation is only their input)."""
    return [n for n in graph if "Random" in n.op and n.qualified_op != "tf::StatelessRandomGetKeyCounter"
            and len(n.outputs) == 1]


class MaskInputEmitter(TrainEmitter):
    """The TF emitter of a SplitStep's XLA program: each random op's value is the tensor drawn outside XLA."""

    def __init__(self, graph: Graph, masks: dict):
        super().__init__(graph)
        self.masks = masks

    def emit(self, node: Any) -> None:
        if id(node) in self.masks:
            self.set(node.outputs[0], self.masks[id(node)])
            return
        super().emit(node)


class SplitStep:
    """A training step in two parts: `draw` builds the graph's random draws (Keras' dropout uniforms and
    what they read: the seed variable, the shapes) with TensorFlow's own kernels, outside any XLA program,
    so the masks are bit for bit the original's; `body` is the step (reads the variables, runs the graph,
    assigns the updates back) with those draws as inputs, for one jit_compile=True function that XLA
    compiles with the backward (and, in fit, the optimizer update). XLA's own lowering of TF's Philox draws
    other numbers, and philox.py's integer emulation costs ~80 ms of a BERT b8 step under XLA's CPU backend;
    drawn outside, the masks cost what they cost in Keras' own step."""

    def __init__(self, graph: Graph, variables: list):
        self.graph = graph = lowerable_copy(graph)
        self.n_data = graph.meta["tf_data_inputs"]
        self.n_model = graph.meta["tf_model_outputs"]
        by_input = {name: k for name, k, _ in graph.meta["tf_variables"]}
        self.reads = [variables[by_input[v.name]] for v in graph.inputs[self.n_data:]]
        self.assigns = [(i, variables[k]) for i, k in graph.meta["tf_assigns"]]
        self.structure = graph.meta.get("tf_output_structure")
        self.draws = drawn_values(graph)
        if not self.draws:
            raise UnsupportedError(f"graph {graph.name}: no random op to draw outside XLA")
        # the draws' ancestors, in graph order: what `draw` emits
        need = {id(n) for n in self.draws}
        nodes = list(graph)
        for n in reversed(nodes):
            if id(n) in need:
                need.update(id(v.producer) for v in n.inputs if v is not None and v.producer is not None)
        self.draw_nodes = [n for n in nodes if id(n) in need]

    def _inputs(self, args: tuple) -> list:
        tfm = tf()
        return list(tfm.nest.flatten(args)) + [tfm.convert_to_tensor(v) for v in self.reads]

    def draw(self, *args: Any) -> list:
        """The random draws of one step on `args` (the step's data inputs), in TF's kernels (call outside XLA)."""
        e = Emitter(self.graph)
        for v, x in zip(self.graph.inputs, self._inputs(args)):
            e.env[id(v)] = (x, False)
        for n in self.draw_nodes:
            e.emit(n)
        return [e.std(n.outputs[0]) for n in self.draws]

    def body(self, masks: list, *args: Any) -> Any:
        """The step on `args` with the random draws `masks` (draw's result) as inputs; assigns the state."""
        e = MaskInputEmitter(self.graph, {id(n): m for n, m in zip(self.draws, masks)})
        outs = e.run(self._inputs(args), identities=False)
        for i, var in self.assigns:
            var.assign(outs[i])
        return pack_outputs(self.structure, outs[:self.n_model])

    def xla_body(self, *args: Any) -> Any:
        """The step on `args` for a caller's XLA program (nothing drawn outside it): XlaRandomEmitter's draws."""
        outs = XlaRandomEmitter(self.graph).run(self._inputs(args), identities=False)
        for i, var in self.assigns:
            var.assign(outs[i])
        return pack_outputs(self.structure, outs[:self.n_model])

    def step_function(self) -> Any:
        """The step as one tf.function (flat data inputs, as the exported step takes them): the draws in
        TF's kernels, then the rest as a nested jit_compile=True function (inside a caller's tf.function
        the Python body is inlined, the nested XLA call kept: call_step); its aiacc_split_traces
        ["xla_traces"] counts the traces of that XLA function."""
        tfm = tf()
        holder = {"xla_traces": 0}

        def xla_part(masks, args):
            holder["xla_traces"] += 1
            return self.body(masks, *args)

        xla = tfm.function(xla_part, jit_compile=True, autograph=False, reduce_retracing=True)

        def step(*args):
            if in_xla_context():  # a caller's XLA program: one program, TF's Philox draws in integer ops
                return self.xla_body(*args)
            return xla(self.draw(*args), args)

        fn = tfm.function(step, input_signature=input_signature(self.graph), autograph=False,
                          reduce_retracing=True)
        fn.aiacc_split_traces = holder  # the tests read that the XLA part was traced (and so runs)
        return fn


def _read_later(graph: Graph, nodes: list, recompute: dict) -> dict:
    """For each recomputed range's first node index: ids of the values read after the range or returned."""
    out = {}
    returned = {id(v) for v in graph.outputs}
    for a, b in recompute.items():
        after = {id(v) for n in nodes[b + 1:] for v in n.inputs if v is not None}
        out[a] = after | returned
    return out


# set by TFPlugin.optimize for a mode='train' call with memory_budget=: (bytes, example batch)
MEMORY_BUDGET: contextvars.ContextVar = contextvars.ContextVar("aiacc_tf_memory_budget", default=None)


def export_training(graph: Graph, original: Any) -> Any:
    """The trained model: a keras.Model (AiaccTrainModel) for a Keras original, else a tf.Module whose
    __call__ is the step; either way on the original's variables."""
    if original is None:
        raise UnsupportedError(f"graph {graph.name}: a training-mode graph exports onto the original model's "
                               f"variables; pass original=")
    variables = model_variables(original)
    plan = None
    budget = MEMORY_BUDGET.get()
    if budget is not None:
        lowered = lowerable_copy(graph)
        plan = plan_memory(lowered, budget[0], budget[1])
        graph = lowered
    step = step_function(graph, variables)
    try:  # build the TF graph now, so that a lowering problem surfaces here as an aiacc error
        step.get_concrete_function()
    except AiaccError:
        raise
    except Exception as e:
        raise UnsupportedError(f"graph {graph.name}: TensorFlow refused the exported training graph: {first_line(e)}") from e
    if _is_keras_model(original):
        model = keras_model(original, step, nested=graph.meta.get("tf_input_structure") is not None)
        model._aiacc_xla_step = xla_variant(graph, variables, step)
    else:
        tfm = tf()
        cls = type("AiaccTFTrainModule", (tfm.Module,), {
            "__call__": lambda self, *args: call_step(self._aiacc_step, *args),
            "__doc__": "A TF model optimized by aiacc for training: its variables are the original's.",
        })
        model = cls(name=module_name(graph.name))
        model.original_variables = list(variables)  # tracked: trainable_variables are the original's
        model._aiacc_step = step
    model.aiacc_graph = Untracked(graph)
    model._aiacc_variables = Untracked(variables)
    model._aiacc_original = Untracked(original)  # a candidate step of choose_step (original_step)
    if plan is not None:
        model.aiacc_memory_plan = Untracked(plan)
    return model


def xla_variant(graph: Graph, variables: list, step: Any) -> Any:
    """The step a caller's XLA program (Keras' fit step under jit_compile) inlines: `step` itself unless the
    graph draws random numbers that XlaRandomEmitter writes in integer ops, then the step emitted so
    (xla_random=True), which XLA computes to TensorFlow's own masks."""
    if not any(n.qualified_op == "tf::StatelessRandomUniformV2" and xla_exact_uniform(n) for n in graph):
        return step
    return step_function(graph, variables, xla_random=True)


def _measured_step(body: Any, inputs: list, trainable: list, assigned: list) -> tuple:
    """(loss, gradients) of one forward + backward of `body` on `inputs` (the mean square of its float outputs, the
    timed step of the train choice), with the variables the forward assigns (BatchNormalization's moving
    statistics) put back afterwards, so repeated timing runs leave the model as it was. Call inside a
    tf.function."""
    tfm = tf()
    saved = [tfm.identity(v) for v in assigned]  # read before the step assigns (program order)
    with tfm.GradientTape() as tape:
        out = body(*inputs)
        loss = tfm.add_n([tfm.reduce_mean(tfm.square(tfm.cast(o, tfm.float32)))
                          for o in tfm.nest.flatten(out) if o.dtype.is_floating])
    grads = tape.gradient(loss, trainable)
    for v, a in zip(assigned, saved):
        v.assign(a)
    return loss, grads


def choose_step(model: Any, example_inputs: Any, setting: Any) -> Any:
    """The exported model with its step compiled by XLA (jit_compile=True), or replaced by the original
    model's own forward under XLA (original_step), when that trains faster on the example inputs
    (framework_compile='auto': forward + GradientTape backward, measured interleaved; the state the step
    assigns is put back after every measured step), with the choice attached and noted in the report."""
    from aiacc.plugins.train_choice import LOSS_DIFFERS, TrainChoice, attach, choose, note, perturb

    tfm = tf()
    graph = model.aiacc_graph.__dict__["_obj"]
    variables = model._aiacc_variables.__dict__["_obj"]
    if example_inputs is None and setting in ("auto", *FIT_PATHS):
        return attach(model, TrainChoice("aiacc graph", reason="no example inputs to measure on"))
    given = [] if example_inputs is None else example_inputs
    xs = [tfm.constant(a) for a in (given if isinstance(given, (list, tuple)) else [given])]
    assigned = [variables[k] for _, k in graph.meta["tf_assigns"]]
    trainable = [v for v in variables if v.trainable]

    def step_of(fn, inputs=xs):
        # forward and backward in one tf.function, the candidate's Python body inlined as call_step inlines
        # it into a Keras fit step or a user's tf.function step: measured eagerly, the gradient's separate
        # function call and the eager tape hide most of the difference between the graphs (TF resnet_small
        # b8: aiacc's graph 47.0 ms and Keras' 43.5 ms measured eagerly, 24.8 ms and 18.9 ms in a
        # tf.function step). An XLA candidate stays a nested XLA function (inlined, it would not be XLA).
        body = fn if getattr(fn, "_jit_compile", None) else getattr(fn, "python_function", fn)

        @tfm.function(autograph=False)
        def step():
            return _measured_step(body, inputs, trainable, assigned)
        return step

    base = model._aiacc_step
    # aiacc's own step on its float inputs perturbed at rounding level: the gradients' noise floor
    # (train_choice.noise_floor; max-pool near-ties move BatchNorm gradients by 2.5e-2 under XLA)
    noisy = [tfm.constant(perturb(x.numpy(), k)) for k, x in enumerate(xs)]
    perturbed = step_of(base, noisy) if any(x.dtype.is_floating for x in xs) else None
    original = getattr(model, "_aiacc_original", None)
    more = {} if original is None else {
        ORIGINAL_FUNCTION: lambda: original_step(original.__dict__["_obj"], jit_compile=False),
        ORIGINAL_XLA: lambda: original_step(original.__dict__["_obj"])}
    # where the graph draws random numbers (Keras' dropout): the draws in TF's kernels, the rest under XLA
    splittable = bool(drawn_values(graph)) and not graph.meta.get("tf_recompute")
    if splittable:
        more[SPLIT_XLA] = lambda: SplitStep(graph, variables).step_function()
    if not graph.meta.get("tf_recompute") and has_fusable_batchnorm(lowerable_copy(graph)):
        more[FUSED_BN] = lambda: step_function(graph, variables, fuse_batchnorm=True)
    # a fit step candidate's name pins the fit choice (choose_fit); the step itself is then measured
    step_setting = "auto" if setting in FIT_PATHS else setting
    chosen, choice = choose("aiacc graph", lambda: step_function(graph, variables, jit_compile=True), step_of,
                            base, step_setting, "XLA (jit_compile=True)",
                            # an embedding's gradient is IndexedSlices: compared dense
                            to_arrays=lambda r: [r[0].numpy()] + [tfm.convert_to_tensor(g).numpy()
                                                                  for g in r[1] if g is not None],
                            more=more, perturbed=perturbed,
                            # aiacc's graph with the BatchNorms fused is kept unless another is clearly
                            # faster: the same computation in fewer kernels (resnet_small b32: 0.87-0.91x of
                            # the unfused graph in two runs, a tie at b8), so timing noise does not flip a
                            # measured gain back to the unfused graph
                            keep=FUSED_BN if FUSED_BN in more else None)
    # random ops whose numbers aiacc's XLA candidates do not reproduce (XlaRandomEmitter writes Keras'
    # stateless Philox dropout in integer ops, which XLA computes as TF's kernels do)
    random_ops = xla_random_ops(graph)
    drawn = sorted({n.op for n in graph if "Random" in n.op})
    if drawn and choice.refused(LOSS_DIFFERS, "XLA"):
        # measured (TF 2.21, BERT-style encoder, dropout 0.1, batch 8): the loss under XLA 6.1e-3 away
        # from aiacc's step and the original's tf.function step, and 0.0 away with the dropout rates at 0
        which = (f"{random_ops[0]} under jit_compile=True gives" if random_ops else
                 f"the original model's {drawn[-1]} under jit_compile=True (XLA's own lowering) gives")
        choice.reason += (f"; XLA draws its own random numbers: {which} other values than TensorFlow's kernel "
                          f"from the same seed (other dropout masks), so that step under XLA does not train "
                          f"as the original does" + ("" if random_ops else
                          "; aiacc's own XLA candidates draw TensorFlow's Philox numbers exactly") +
                          f"; framework_compile={ORIGINAL_XLA!r} runs the original under XLA anyway")
    model._aiacc_step = chosen
    # what a caller's XLA program inlines (Keras' fit step under jit_compile): the chosen step, except that
    # where the graph draws Keras' dropout, aiacc's graph with TF's Philox draws in integer ops (the nested
    # XLA candidate already is that; the original model's forward would draw XLA's own numbers)
    exact = xla_variant(graph, variables, base)
    xla_step = chosen if exact is base or choice.path == "aiacc graph + XLA (jit_compile=True)" else exact
    if hasattr(model, "_aiacc_xla_step"):
        model._aiacc_xla_step = xla_step
    report = getattr(model, "aiacc_report", None)
    note(report, choice)
    if hasattr(model, "_aiacc_fit_xla"):  # a Keras model: what model.fit compiles its step with
        split = SplitStep(graph, variables) if splittable else None
        fit = choose_fit(chosen, xs, noisy, trainable, assigned, setting,
                         random_ops if xla_step is not chosen or choice.path.startswith("aiacc graph")
                         else drawn, xla_step, split)
        model._aiacc_fit_xla = fit.path == FIT_XLA
        model._aiacc_fit_split = Untracked(split) if fit.path == FIT_SPLIT else None
        model.aiacc_fit_choice = fit
        if report is not None:
            report.note("fit_step", [f"model.fit: {fit.path}", *(f"{k}: {v:.1f} ms" for k, v in fit.ms.items()),
                                     fit.reason])
    return attach(model, choice)


def set_fit_path(model: Any, path: str) -> Any:
    """Pin what `model.fit` compiles the step of an aiacc TF training model (a Keras original's) with: one of
    FIT_PATHS, unmeasured (a choice measured once, reproduced without measuring again: benchmarks/
    training.py's memory subprocess). Returns the model; UnsupportedError for another model, OptionError for
    another name, or FIT_SPLIT on a graph that draws no random numbers."""
    from aiacc.errors import OptionError
    from aiacc.plugins.train_choice import TrainChoice

    if not hasattr(model, "_aiacc_fit_xla"):
        raise UnsupportedError(f"set_fit_path: {type(model).__name__} is not an aiacc TF training model of a "
                               f"Keras original")
    if path not in FIT_PATHS:
        raise OptionError(f"set_fit_path: the fit path must be one of {', '.join(map(repr, FIT_PATHS))}, "
                          f"not {path!r}")
    graph = model.aiacc_graph.__dict__["_obj"]
    split = None
    if path == FIT_SPLIT:
        if not drawn_values(graph):
            raise UnsupportedError(f"set_fit_path: graph {graph.name} draws no random numbers; {FIT_SPLIT!r} "
                                   f"has nothing to draw outside XLA")
        split = Untracked(SplitStep(graph, model._aiacc_variables.__dict__["_obj"]))
    model._aiacc_fit_xla = path == FIT_XLA
    model._aiacc_fit_split = split
    model.aiacc_fit_choice = TrainChoice(path, reason="set_fit_path: pinned, not measured")
    return model


# the candidates of the fit step choice (choose_fit): the chosen step inlined into Keras' tf.function train
# step as Keras runs it on a CPU (compile's jit_compile='auto' means False there), and the same whole step
# (forward, backward and, in fit, the optimizer update) compiled as one XLA program
FIT_GRAPH = "Keras fit step (tf.function)"
FIT_XLA = "Keras fit step (tf.function) + XLA (jit_compile=True)"
# the fit step with the dropout draws in TF's kernels (a SplitStep's draw) and forward, backward, optimizer
# update and metrics as one nested XLA program (AiaccTrainModel.train_step)
FIT_SPLIT = "Keras fit step (tf.function), dropout drawn outside one XLA program of the rest"
FIT_PATHS = (FIT_XLA, FIT_GRAPH, FIT_SPLIT)


def choose_fit(step: Any, xs: list, noisy: list, trainable: list, assigned: list, setting: Any,
               random_ops: list, xla_step: Any = None, split: Any = None) -> Any:
    """The TrainChoice of what `model.fit` compiles the aiacc model's train step with: FIT_XLA when one XLA
    program of the whole step (forward + backward, the chosen `step`'s Python body inlined) measures clearly
    faster than the same step in a plain tf.function and its loss and gradients agree (train_choice.choose,
    the rounding-noise floor from `noisy` inputs), else FIT_GRAPH. XLA of a nested step function (the step
    choice's XLA candidates) compiles forward and backward as two programs and measured slower than Keras'
    graph (resnet_small b8: 19.2 vs 16.4 ms); one program of the whole step measured 0.84x of it (benchmarks/
    training.py), so only the caller's compile can win with XLA, and in fit aiacc is the caller.
    framework_compile: True uses XLA unmeasured, False or another candidate's name pinned keeps FIT_GRAPH,
    FIT_XLA pins it. The XLA compile time (its first step) is in the reason.
    With `split` (a SplitStep: the graph draws dropout) FIT_SPLIT is measured too: the draws in TF's own
    kernels in the tf.function, everything else in one nested XLA program, so XLA runs the step with the
    original's masks without philox.py's integer Philox (~80 ms of a BERT b8 step under XLA); FIT_SPLIT pins
    it."""
    import time

    from aiacc.plugins import train_choice
    from aiacc.plugins.train_choice import LOSS_DIFFERS, TrainChoice

    tfm = tf()
    if setting == FIT_SPLIT and split is None:
        return TrainChoice(FIT_GRAPH, reason=f"framework_compile={setting!r}: the graph draws no random "
                                             f"numbers, so there is nothing to draw outside XLA")
    if setting not in ("auto", True, *FIT_PATHS):
        return TrainChoice(FIT_GRAPH, reason=f"framework_compile={setting!r}: the fit step is not measured")
    if setting == FIT_GRAPH:
        setting = False
    compile_s: dict[str, float] = {}
    body = getattr(step, "python_function", step)
    # the XLA program inlines the step as AiaccTrainModel.call does under Keras' jit_compile: its XLA variant
    xla_body = getattr(xla_step, "python_function", xla_step) if xla_step is not None else body

    def fit_step_of(kind: str, inputs: list = xs) -> Any:
        if kind == FIT_SPLIT:
            @tfm.function(autograph=False, jit_compile=True)
            def rest(masks):
                return _measured_step(lambda *a: split.body(masks, *a), inputs, trainable, assigned)

            @tfm.function(autograph=False)
            def run():
                return rest(split.draw(*inputs))
        else:
            @tfm.function(autograph=False, jit_compile=(kind == FIT_XLA) or None)
            def run():
                return _measured_step(xla_body if kind == FIT_XLA else body, inputs, trainable, assigned)

        def timed():  # the first call traces and (XLA) compiles: its time is the compile's
            if kind in compile_s:
                return run()
            t = time.perf_counter()
            r = run()
            compile_s[kind] = time.perf_counter() - t
            return r
        return timed

    perturbed = fit_step_of(FIT_GRAPH, noisy) if any(x.dtype.is_floating for x in xs) else None
    _, fit = train_choice.choose(FIT_GRAPH, lambda: FIT_XLA, fit_step_of, FIT_GRAPH, setting,
                                 "XLA (jit_compile=True)",
                                 to_arrays=lambda r: [r[0].numpy()] + [tfm.convert_to_tensor(g).numpy()
                                                                       for g in r[1] if g is not None],
                                 more={} if split is None else {FIT_SPLIT: lambda: FIT_SPLIT},
                                 perturbed=perturbed)
    if FIT_XLA in compile_s:
        fit.reason += f"; XLA's compile of the step took {compile_s[FIT_XLA]:.1f} s (once, at optimize time)"
    if FIT_SPLIT in compile_s:
        fit.reason += (f"; XLA's compile of the step with the dropout drawn outside took "
                       f"{compile_s[FIT_SPLIT]:.1f} s")
    if random_ops and fit.refused(LOSS_DIFFERS, "XLA"):
        fit.reason += (f"; XLA draws its own random numbers ({random_ops[0]}: other dropout masks than "
                       f"TensorFlow's kernel from the same seed), so fit under XLA would not train as the "
                       f"original does; compile(jit_compile=True) runs it anyway")
    if fit.path == FIT_XLA:
        fit.reason += "; model.fit compiles its step with jit_compile=True unless compile() is given jit_compile=False"
    if fit.path == FIT_SPLIT:
        fit.reason += ("; model.fit draws the dropout masks with TensorFlow's kernels and runs the rest of its step "
                       "(forward, backward, optimizer update, metrics) as one XLA program (compile(jit_compile="
                       "True) compiles all of it instead, with philox.py's draws)")
    return fit


# the candidates that run the original model's own forward in a tf.function, with and without XLA
# (aiacc_train_path names them)
ORIGINAL_XLA = "original model in XLA (jit_compile=True)"
ORIGINAL_FUNCTION = "original model in tf.function"


def original_step(original: Any, jit_compile: bool = True) -> Any:
    """The original model's own training forward as the step (flat data inputs, as the exported step takes
    them): a tf.function, with jit_compile=True by default. Keras' BatchNormalization and dropout update the same
    variables the exported step assigns; inside a caller's tf.function its Python body (the original's
    call) is inlined as the exported step's is (call_step)."""
    tfm = tf()
    keras_model_ = _is_keras_model(original)

    def step(*args):
        if keras_model_:
            return original(args[0] if len(args) == 1 else list(args), training=True)
        return original(*args)

    return tfm.function(step, jit_compile=jit_compile or None, reduce_retracing=True)


def _step_args(inputs: Any, nested: bool) -> tuple:
    """A Keras call's inputs as the step's positional arguments (a multi-input model: flat positional)."""
    return tuple(inputs) if isinstance(inputs, (list, tuple)) and not nested else (inputs,)


def call_step(step: Any, *args: Any) -> Any:
    """Run the exported step: eagerly, its own tf.function (XLA-compiled where optimize chose that); while
    a caller's tf.function is being traced (a custom train step, model.fit), its Python body inlined into
    the caller's graph, so the caller's compiler sees one graph (a nested function's gradient under the
    caller's jit_compile=True recompiles every step)."""
    if not tf().executing_eagerly() and hasattr(step, "python_function"):
        return step.python_function(*args)
    return step(*args)


def keras_model(original: Any, step: Any, nested: bool = False) -> Any:
    """A keras.Model whose training calls (training=True, or not given) run the aiacc step and whose
    inference calls (training=False: predict, evaluate) run the original; it tracks the original, so its
    variables, trainable_variables and checkpoints are the original's and `fit` trains them."""
    import keras

    class AiaccTrainModel(keras.Model):
        """A Keras model optimized by aiacc for training (its variables are the original's)."""

        def __init__(self, inner, fn):
            super().__init__(name=f"aiacc_{inner.name}")
            self.original = inner
            self._aiacc_step = fn

        def _resolve_auto_jit_compile(self):
            # compile(jit_compile='auto') (Keras' default) and a fit without compile's say: XLA where aiacc's
            # fit step choice measured it faster (choose_fit), else Keras' own rule (False on a CPU)
            if self._aiacc_fit_xla:
                from keras.src.trainers.trainer import model_supports_jit

                return model_supports_jit(self)
            return super()._resolve_auto_jit_compile()

        def train_step(self, data):
            # FIT_SPLIT (choose_fit): the dropout draws here, in TF's kernels, the rest of Keras' own step in
            # one nested XLA program that takes them as inputs (call reads them from SPLIT_MASKS)
            split = self._aiacc_fit_split
            if split is None or self._jit_compile is True or tf().executing_eagerly() or in_xla_context():
                return super().train_step(data)
            split = split.__dict__["_obj"]
            x = keras.utils.unpack_x_y_sample_weight(data)[0]
            masks = split.draw(*_step_args(x, nested))
            if self._aiacc_split_train is None:
                self._aiacc_split_train = Untracked(tf().function(self._aiacc_split_body, jit_compile=True,
                                                                  autograph=False))
            return self._aiacc_split_train.__dict__["_obj"](data, masks)

        def _aiacc_split_body(self, data, masks):
            token = SPLIT_MASKS.set(masks)
            try:
                self._aiacc_split_traces += 1
                return super().train_step(data)
            finally:
                SPLIT_MASKS.reset(token)

        def call(self, inputs, training=None):
            if training is False:
                return self.original(inputs, training=False)
            masks = SPLIT_MASKS.get()
            if masks is not None and self._aiacc_fit_split is not None:  # inside train_step's XLA program
                return self._aiacc_fit_split.__dict__["_obj"].body(masks, *_step_args(inputs, nested))
            step = self._aiacc_step
            if not tf().executing_eagerly() and (self._jit_compile is True or in_xla_context()):
                # Keras traces its fit step for XLA, or a user's jit_compile=True step calls the model: the
                # step whose random draws XLA computes as TF does (one program: no nested XLA function)
                step = self._aiacc_xla_step
            if isinstance(inputs, (list, tuple)) and not nested:  # a multi-input model: flat positional
                return call_step(step, *inputs)
            return call_step(step, inputs)

    model = AiaccTrainModel(original, step)
    model._aiacc_fit_xla = False  # set by choose_step (choose_fit)
    model._aiacc_xla_step = step  # set by export_training and choose_step (xla_variant)
    model._aiacc_fit_split = None  # set by choose_step: Untracked(SplitStep) where FIT_SPLIT was chosen
    model._aiacc_split_train = None
    model._aiacc_split_traces = 0  # traces of train_step's XLA program (read by the tests)
    model.built = True
    return model


def _restorable(model: Any) -> list:
    try:
        return model_variables(model)
    except UnsupportedError:
        return []


@contextlib.contextmanager
def training_runs(model: Any):
    """While active, the plugin's run() runs models in training semantics and restores the variables of
    `model` (the original, whose variables the optimized model shares) after every run."""
    token = TRAINING_RUN.set(_restorable(model))
    try:
        yield
    finally:
        TRAINING_RUN.reset(token)


def run_training(model: Any, xs: list) -> list[np.ndarray]:
    """One forward in training semantics (BatchNorm on batch statistics, dropout drawn from the current seed
    state), the outputs as numpy, every variable put back as it was."""
    tfm = tf()
    variables = TRAINING_RUN.get() or _restorable(model)
    saved = [v.numpy().copy() for v in variables]
    arg = xs[0] if len(xs) == 1 else xs
    try:
        if _is_keras_model(model):
            out = model(arg, training=True)
        else:
            out = model(*xs)
        return [np.asarray(o) for o in tfm.nest.flatten(out)]
    finally:
        for v, a in zip(variables, saved):
            v.assign(a)


# ------------------------------------------------------------------------------------------------
# memory_budget: recomputation chosen on the IR, carried out by tf.recompute_grad
# ------------------------------------------------------------------------------------------------
def _bytes(v: Any, batch: int) -> int:
    """Bytes of a value, symbolic dimensions taken as the example batch (the planner's estimate)."""
    if v.shape is None or v.dtype is None:
        return 0
    n = 1
    for d in v.shape:
        n *= d if isinstance(d, int) else batch
    return n * np.dtype(v.dtype).itemsize


def _stateful_random(node: Any) -> bool:
    """An op drawing from a hidden RNG state: recomputing it would draw a different mask."""
    return "Random" in node.op and "Stateless" not in node.op


def memory_units(graph: Graph, batch: int) -> tuple[list, list]:
    """The training graph cut into units where exactly one data-dependent value flows from everything
    before to everything after (values computed from variables alone, like a transposed kernel, and values
    only returned as outputs, like BatchNorm's updated statistics, do not count): ([(first, last) node
    index], [aiacc.core.memory_checkpoint.Unit]). A unit's saved bytes are its data-dependent outputs (what
    its backward keeps), its cost the elements it produces; a unit with a stateful random op is not
    checkpointable."""
    from aiacc.core.memory_checkpoint import Unit

    nodes = list(graph)
    pos = {id(n): i for i, n in enumerate(nodes)}
    data = {id(v) for v in graph.inputs[:graph.meta["tf_data_inputs"]]}
    for n in nodes:  # data-dependent values, forward
        if any(v is not None and id(v) in data for v in n.inputs):
            data.update(id(o) for o in n.outputs)
    last_use: dict[int, int] = {}
    for n in nodes:
        for v in n.inputs:
            if v is not None and id(v) in data:
                last_use[id(v)] = max(last_use.get(id(v), -1), pos[id(n)])
    live: dict[int, Any] = {}  # data-dependent values defined so far that a later node reads
    bounds, units, start, entering = [], [], 0, 0
    for i, n in enumerate(nodes):
        for o in n.outputs:
            if id(o) in data and last_use.get(id(o), -1) > i:
                live[id(o)] = o
        for k in [k for k in live if last_use[k] <= i]:
            del live[k]
        if len(live) == 1 and i < len(nodes) - 1:
            (cut,) = live.values()
            bounds.append((start, i))
            units.append((entering, cut))
            start, entering = i + 1, _bytes(cut, batch)
    bounds.append((start, len(nodes) - 1))
    units.append((entering, None))
    out = []
    for (a, b), (inp, _) in zip(bounds, units):
        members = nodes[a:b + 1]
        produced = [o for m in members for o in m.outputs if id(o) in data]
        out.append(Unit(name=f"{members[0].name}..{members[-1].name}" if b > a else members[0].name,
                        saved=sum(_bytes(o, batch) for o in produced), input=inp,
                        cost=float(sum(_bytes(o, batch) for o in produced)),
                        checkpointable=a > 0 and not any(_stateful_random(m) for m in members)))
    return bounds, out


def plan_memory(graph: Graph, memory_budget: Any, batch: int) -> Any:
    """The CheckpointPlan (aiacc.core.memory_checkpoint) for the lowered training graph under
    `memory_budget` bytes of activations; MemoryBudgetError with the smallest achievable figure when none
    fits. plan.segments index the units; graph.meta['tf_recompute'] gets the node ranges to recompute."""
    from aiacc.core.memory_checkpoint import MemoryBudgetError, plan_checkpoints

    if memory_budget is None or not isinstance(memory_budget, (int, float)) or memory_budget <= 0:
        raise MemoryBudgetError(f"memory_budget must be a positive number of bytes, got {memory_budget!r}", 0)
    bounds, units = memory_units(graph, batch)
    try:
        plan = plan_checkpoints(units, int(memory_budget))
    except MemoryBudgetError as e:
        raise MemoryBudgetError(f"graph {graph.name} (TF): {e}", e.smallest) from None
    graph.meta["tf_recompute"] = [(bounds[a][0], bounds[b][1]) for a, b in plan.segments]
    return plan


def _with_read_around(nodes: list) -> list:
    """The nodes outside `nodes` whose values they read and that the TF emitter builds only when read
    (BUILT_WHEN_READ), with such nodes those read in turn, producers first."""
    from aiacc.plugins.tf.exporter import BUILT_WHEN_READ

    inside = {id(n) for n in nodes}
    out: list = []
    seen: set = set()

    def visit(v: Any) -> None:
        p = None if v is None or v.const is not None else v.producer
        if p is None or id(p) in inside or id(p) in seen or p.qualified_op not in BUILT_WHEN_READ:
            return
        seen.add(id(p))
        for u in p.inputs:
            visit(u)
        out.append(p)  # after its own producers: an emitting order
    for n in nodes:
        for v in n.inputs:
            visit(v)
    return out


def _emit_recomputed(emitter: Any, nodes: list, later: set) -> None:
    """Emit `nodes` as one function under tf.recompute_grad: its activations are recomputed in the backward
    pass. Every value it reads from outside is an explicit argument (so gradients reach the variables
    behind it); every value read after it (or returned) is a result. A value it reads from a node outside
    that the emitter builds only when read (BUILT_WHEN_READ: a kernel Transpose, a shared kernel's too) is
    computed inside as well, that node repeated (pure, and no TF op at all where Conv reads around it): a
    consumer reading around it needs the node's own inputs, which then are arguments."""
    tfm = tf()
    results_of = nodes
    nodes = _with_read_around(nodes) + nodes
    inside = {id(o) for n in nodes for o in n.outputs}
    ins, seen = [], set()
    for n in nodes:
        for v in n.inputs:
            if v is not None and v.const is None and id(v) not in inside and id(v) not in seen:
                seen.add(id(v))
                ins.append(v)
    outs = [o for n in results_of for o in n.outputs if id(o) in later]
    in_flags = [emitter.env_entry(v)[1] for v in ins]
    out_flags: list = []

    def segment(*tensors):
        sub = type(emitter)(emitter.graph)  # an XlaRandomEmitter's segment draws as it does
        for v, t, flag in zip(ins, tensors, in_flags):
            sub.env[id(v)] = (t, flag)
        for n in nodes:
            sub.emit(n)
        out_flags[:] = [sub.env_entry(o)[1] for o in outs]
        return [sub.env_entry(o)[0] for o in outs]

    results = tfm.recompute_grad(segment)(*[emitter.env_entry(v)[0] for v in ins])
    for o, t, flag in zip(outs, tfm.nest.flatten(results), out_flags):
        emitter.env[id(o)] = (t, flag)
