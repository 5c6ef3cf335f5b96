"""aiacc.plugins.mxnet.horovod on 2 processes over gloo/loopback (the file is also the worker)."""
import sys

import numpy as np
import pytest

STEPS = 3
GLOBAL_BATCH = 8


def mxnet():
    from aiacc.plugins.mxnet._import import import_mxnet

    return import_mxnet()


if __name__ != "__main__":
    pytest.importorskip("torch")
    try:
        mxnet()
    except ImportError:
        pytest.skip("mxnet is not installed", allow_module_level=True)


def data():
    rng = np.random.default_rng(5)
    return [(rng.standard_normal((GLOBAL_BATCH, 5)).astype("float32"),
             rng.standard_normal((GLOBAL_BATCH, 2)).astype("float32")) for _ in range(STEPS)]


def build(seed):
    mx = mxnet()
    mx.random.seed(seed)
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(8, in_units=5, activation="tanh"), mx.gluon.nn.Dense(2, in_units=8))
    net.initialize(mx.init.Normal(0.5))
    return net


def train(net, trainer, rows):
    mx = mxnet()
    loss_fn = mx.gluon.loss.L2Loss()
    for x, y in data():
        with mx.autograd.record():
            loss = loss_fn(net(mx.nd.array(x[rows])), mx.nd.array(y[rows]))
        loss.backward()
        trainer.step(len(range(GLOBAL_BATCH)[rows]))
    return [p.data().asnumpy() for p in net.collect_params().values()]


OPT_PARAMS = {"sgd": {"learning_rate": 0.1, "momentum": 0.9}, "adam": {"learning_rate": 0.01}}


def reference(optimizer="sgd"):
    mx = mxnet()
    net = build(100)
    trainer = mx.gluon.Trainer(net.collect_params(), optimizer, OPT_PARAMS[optimizer], kvstore=None)
    return train(net, trainer, slice(None))


def worker(out):
    import aiacc.plugins.mxnet.horovod as hvd
    from aiacc.core.comm import CommError

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    per = GLOBAL_BATCH // n
    res = {}
    for label, kw in (("aiacc", {}), ("fp16", {"compression": hvd.Compression.fp16}), ("ddp", {"plan": "ddp"}),
                      ("sync", {"overlap": False}), ("ptensor", {"plan": "per-tensor"}),
                      ("adam", {"plan": "per-tensor", "optimizer": "adam"})):
        net = build(100 + r)
        params = net.collect_params()
        hvd.broadcast_parameters(params, root_rank=0)
        optimizer = kw.pop("optimizer", "sgd")
        trainer = hvd.DistributedTrainer(params, optimizer, OPT_PARAMS[optimizer], **kw)
        for i, v in enumerate(train(net, trainer, slice(r * per, (r + 1) * per))):
            res[f"{label}/{i}"] = v
        if label == "ptensor":  # what overlapped in the last step
            res["events"] = np.array([f"{kind} {what}" for kind, what in trainer._aiacc_cache["reducer"].events])
        res[f"{label}/bytes"] = np.array(trainer._aiacc_cache["executor"].bytes_last_step)  # handed to all_reduce
    res["allreduce"] = hvd.allreduce(mxnet().nd.array([r + 1.0])).asnumpy()
    # ranks holding different parameters: every rank gets a clear error, and the job goes on
    params = dict(build(1).collect_params().items())
    if r == 1:
        params["extra"] = mxnet().nd.zeros((3,))
    try:
        hvd.broadcast_parameters(params, root_rank=0)
        res["mismatch"] = np.array("NO_ERROR")
    except CommError as e:
        res["mismatch"] = np.array(f"{type(e).__name__}: {e}")
    res["after"] = hvd.allreduce(mxnet().nd.array([2.0 * r])).asnumpy()
    if r == 0:  # the single-process reference on the combined batch
        res.update({f"ref/{i}": v for i, v in enumerate(reference())})
        res.update({f"ref-adam/{i}": v for i, v in enumerate(reference("adam"))})
    np.savez(f"{out}.{r}.npz", **res)
    hvd.shutdown()


def test_two_ranks_match_single_process_training(tmp_path):
    from tests.plugins._horovod_launch import run_two_ranks

    _check(run_two_ranks(__file__, [str(tmp_path / "out")], tmp_path / "out", timeout=240))


def test_two_nodes_of_the_testbed_match_single_process_training(tmp_path):
    """The same on 2 nodes of the emulated cluster (100 Mbit/s links, torchrun on each node). Planned for
    the link's nominal speed: calibrating on the testbed's link is proven by torch's testbed run, and this
    API's calibrated planning by its loopback run."""
    from tests.plugins._horovod_launch import NO_CALIBRATION, TESTBED, need_testbed, run_two_ranks

    need_testbed()
    _check(run_two_ranks(__file__, [str(tmp_path / "out")], tmp_path / "out", timeout=240, env=NO_CALIBRATION,
                         testbed=TESTBED))


def _check(ranks):
    r0, r1 = ranks
    ref = [r0[f"ref/{i}"] for i in range(len([k for k in r0.files if k.startswith("ref/")]))]
    assert len(ref) == 4
    ref_adam = [r0[f"ref-adam/{i}"] for i in range(len(ref))]
    for label in ("aiacc", "fp16", "ddp", "sync", "ptensor", "adam"):
        tol = 2e-2 if label == "fp16" else 1e-5
        for i, want in enumerate(ref_adam if label == "adam" else ref):
            np.testing.assert_array_equal(r0[f"{label}/{i}"], r1[f"{label}/{i}"], err_msg=f"{label} param {i}")
            np.testing.assert_allclose(r0[f"{label}/{i}"], want, rtol=tol, atol=tol, err_msg=f"{label} param {i}")
    # what overlapped (one bucket per parameter): each bucket's all-reduce started as soon as its gradient
    # was taken from the engine, before the next gradient (backward still running), and each bucket's
    # update was pushed before the next bucket was waited for
    ev = [str(e) for e in r0["events"]]
    assert [e.split()[0] for e in ev] == ["add", "start"] * 4 + ["done", "update"] * 4, ev
    assert [e.split()[1].split(":")[0] for e in ev if e.startswith("add")] == ["3", "2", "1", "0"]  # backward order
    # fp16 really went over the wire in fp16: half the bytes, and rounded results
    assert 2 * int(r0["fp16/bytes"]) == int(r0["aiacc/bytes"]) == 4 * sum(v.size for v in ref)
    assert not all(np.array_equal(r0[f"fp16/{i}"], r0[f"aiacc/{i}"]) for i in range(len(ref)))
    np.testing.assert_allclose(r0["allreduce"], [1.5])
    for r in (r0, r1):
        assert str(r["mismatch"]).startswith("RankMismatchError: ranks hold different parameters: first mismatch at "
                                             "parameter #4: rank 0 has nothing, rank 1 has extra shape (3,) float32"), \
            str(r["mismatch"])
        np.testing.assert_allclose(r["after"], [1.0])


if __name__ == "__main__":
    worker(sys.argv[1])
