"""aiacc.plugins.tf.horovod on 2 processes over gloo/loopback (the file is also the worker)."""
import os
import sys

import numpy as np
import pytest

if __name__ != "__main__":
    pytest.importorskip("tensorflow")
    pytest.importorskip("torch")

STEPS = 3
GLOBAL_BATCH = 8


def data():
    rng = np.random.default_rng(3)
    return [(rng.standard_normal((GLOBAL_BATCH, 5)).astype("float32"),
             rng.standard_normal((GLOBAL_BATCH, 2)).astype("float32")) for _ in range(STEPS)]


def build(seed):
    import keras

    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(2)])
    return model


def train(model, tape_wrap, slices, keras_fit=False, opt=None):
    import keras
    import tensorflow as tf

    if keras_fit:
        model.compile(optimizer=opt, loss="mse", jit_compile=False)
        x = np.concatenate([x[slices] for x, _ in data()])
        y = np.concatenate([y[slices] for _, y in data()])
        per = len(range(GLOBAL_BATCH)[slices])
        model.fit(x, y, batch_size=per, epochs=1, shuffle=False, verbose=0)
    else:
        opt = opt or keras.optimizers.SGD(0.1, momentum=0.9)
        for x, y in data():
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(x[slices]) - y[slices]) ** 2)
            tape = tape_wrap(tape)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
    return [v.numpy() for v in model.trainable_variables]


def reference():
    import keras

    tape = train(build(100), lambda t: t, slice(None))
    fit = train(build(100), None, slice(None), keras_fit=True, opt=keras.optimizers.SGD(0.1, momentum=0.9))
    adam = train(build(100), lambda t: t, slice(None), opt=keras.optimizers.Adam(0.01))
    return tape, fit, adam


def worker(out):
    import keras
    import aiacc.plugins.tf.horovod as hvd
    from aiacc.core.comm import CommError

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    per = GLOBAL_BATCH // n
    mine = slice(r * per, (r + 1) * per)
    res = {}
    for label, kw in (("tape", {}), ("tape-fp16", {"compression": hvd.Compression.fp16}),
                      ("tape-bytescheduler", {"plan": "bytescheduler"})):
        model = build(100 + r)
        hvd.broadcast_variables(model.variables, root_rank=0)
        tapes = []

        def wrap(t, kw=kw):
            tapes.append(hvd.DistributedGradientTape(t, **kw))
            return tapes[-1]

        for i, v in enumerate(train(model, wrap, mine)):
            res[f"{label}/{i}"] = v
        res[f"{label}/bytes"] = np.array(tapes[-1]._cache["executor"].bytes_last_step)  # handed to all_reduce
    # Keras fit: the update of each bucket overlapped with the reduction of later ones (default), the
    # synchronous path, and the plan made from the IR's gradient specs of the traced model
    for label, kw in (("fit", {}), ("fit-sync", {"overlap": False}), ("fit-ir", {"model": True, "plan": "per-tensor"})):
        model = build(100 + r)
        hvd.broadcast_variables(model.variables, root_rank=0)
        if kw.get("model"):
            kw = {**kw, "model": model}
        opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), **kw)
        for i, v in enumerate(train(model, None, mine, keras_fit=True, opt=opt)):
            res[f"{label}/{i}"] = v
        if label == "fit-ir":
            spec = opt._aiacc_cache["spec"]
            res["fit-ir/spec"] = np.array([g.name for g in spec.gradients()])
    # eager apply, one bucket per tensor, Adam (its step counter must advance once per apply): the events
    # show every all-reduce started before the first update, and updates between the waits
    model = build(100 + r)
    hvd.broadcast_variables(model.variables, root_rank=0)
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(0.01), plan="per-tensor")
    for i, v in enumerate(train(model, lambda t: t, mine, opt=opt)):
        res[f"adam/{i}"] = v
    res["adam/events"] = np.array([f"{kind} {what}" for kind, what in opt._aiacc_cache["reducer"].events])
    res["adam/iterations"] = np.array(int(opt.iterations.numpy()))
    res["allreduce"] = hvd.allreduce(np.array([r + 1.0], dtype="float32")).numpy()
    # ranks holding different variables: every rank gets a clear error, and the job goes on
    import keras

    variables = list(build(1).variables) + ([keras.Variable(np.zeros(3, "float32"), name="extra")] if r == 1 else [])
    try:
        hvd.broadcast_variables(variables, root_rank=0)
        res["mismatch"] = np.array("NO_ERROR")
    except CommError as e:
        res["mismatch"] = np.array(f"{type(e).__name__}: {e}")
    res["after"] = hvd.allreduce(np.array([2.0 * r], dtype="float32")).numpy()
    if r == 0:  # the single-process reference on the combined batch (saves importing TF in pytest)
        ref_tape, ref_fit, ref_adam = reference()
        res.update({f"ref-adam/{i}": v for i, v in enumerate(ref_adam)})
        res.update({f"ref-tape/{i}": v for i, v in enumerate(ref_tape)})
        res.update({f"ref-fit/{i}": v for i, v in enumerate(ref_fit)})
    np.savez(f"{out}.{r}.npz", **res)
    hvd.shutdown()


ENV = {"TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}


def test_two_ranks_match_single_process_training(tmp_path):
    from tests.plugins._horovod_launch import run_two_ranks

    _check(run_two_ranks(__file__, [str(tmp_path / "out")], tmp_path / "out", timeout=240, env=ENV))


def test_two_nodes_of_the_testbed_match_single_process_training(tmp_path):
    """The same on 2 nodes of the emulated cluster (100 Mbit/s links, torchrun on each node). Planned for
    the link's nominal speed: calibrating on the testbed's link is proven by torch's testbed run, and this
    API's calibrated planning by its loopback run."""
    from tests.plugins._horovod_launch import NO_CALIBRATION, TESTBED, need_testbed, run_two_ranks

    need_testbed()
    _check(run_two_ranks(__file__, [str(tmp_path / "out")], tmp_path / "out", timeout=240,
                         env={**ENV, **NO_CALIBRATION}, testbed=TESTBED))


def _check(ranks):
    r0, r1 = ranks
    n = len([k for k in r0.files if k.startswith("ref-tape/")])
    assert n == 4
    ref_tape, ref_fit, ref_adam = ([r0[f"{kind}/{i}"] for i in range(n)] for kind in ("ref-tape", "ref-fit", "ref-adam"))
    for label, ref in (("tape", ref_tape), ("tape-fp16", ref_tape), ("tape-bytescheduler", ref_tape),
                       ("fit", ref_fit), ("fit-sync", ref_fit), ("fit-ir", ref_fit), ("adam", ref_adam)):
        tol = 2e-2 if "fp16" in label else 1e-5
        for i, want in enumerate(ref):
            np.testing.assert_array_equal(r0[f"{label}/{i}"], r1[f"{label}/{i}"], err_msg=f"{label} variable {i}")
            np.testing.assert_allclose(r0[f"{label}/{i}"], want, rtol=tol, atol=tol, err_msg=f"{label} variable {i}")
    # the IR's specs name every variable, in the order the forward reads them
    assert [s.split(":")[0] for s in r0["fit-ir/spec"]] == [str(i) for i in range(n)][::-1]  # backward order
    # what overlaps (eager apply, 4 buckets): all 4 all-reduces start before the first wait, and each
    # bucket's update runs before the next bucket is waited for (the later ones are still on the wire)
    ev = [str(e) for e in r0["adam/events"]]
    kinds = [e.split()[0] for e in ev]
    assert kinds == ["add", "start"] * 4 + ["done", "update"] * 4, ev
    assert int(r0["adam/iterations"]) == STEPS  # one step of the counter per apply, not per bucket
    # fp16 really went over the wire in fp16: half the bytes, and rounded results
    assert 2 * int(r0["tape-fp16/bytes"]) == int(r0["tape/bytes"]) == 4 * sum(v.size for v in ref_tape)
    assert not all(np.array_equal(r0[f"tape-fp16/{i}"], r0[f"tape/{i}"]) for i in range(n))
    np.testing.assert_allclose(r0["allreduce"], [1.5])
    for r in (r0, r1):
        assert str(r["mismatch"]).startswith("RankMismatchError: ranks hold different variables: first mismatch at "
                                             "variable #4: rank 0 has nothing, rank 1 has 4:extra shape (3,) float32"), \
            str(r["mismatch"])
        np.testing.assert_allclose(r["after"], [1.0])


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    worker(sys.argv[1])
