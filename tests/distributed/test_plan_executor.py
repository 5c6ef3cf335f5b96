"""PlanExecutor on one process: a bucket starts only once every one of its pieces is in, every bucket is
reduced exactly once per step, and the step refuses to finish otherwise.

(The 2-rank tests in tests/plugins/*/test_horovod_* train with the same plan shapes against single-process
training; these tests pin the bookkeeping itself, where a world of one would hide wrong values.)
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = torch.distributed

from aiacc.core.comm import CommError  # noqa: E402
from tests.distributed._plans import cut_in_bucket_plan, one_gradient_two_pieces_plan  # noqa: E402


@pytest.fixture(scope="module")
def group():
    """A gloo process group of one rank in this process (torn down afterwards)."""
    if dist.is_initialized():
        yield
        return
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _named():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    return list(model.named_parameters())


def _executor(plan, named, **kw):
    from aiacc.distributed.executor import PlanExecutor

    return PlanExecutor(plan, list(range(len(plan.buckets))), {n: p.numel() for n, p in named},
                        dtypes={n: p.dtype for n, p in named}, **kw)


@pytest.mark.parametrize("make_plan", [cut_in_bucket_plan, one_gradient_two_pieces_plan])
def test_bucket_starts_only_when_all_its_pieces_are_in(group, make_plan):
    named = _named()
    plan = make_plan(named)
    assert any(len({p.grad for p in b.pieces}) < len(b.pieces) for b in plan.buckets)  # the shape at stake
    ex = _executor(plan, named)
    grads = {n: torch.randn(p.shape) for n, p in named}
    done_pieces = {}
    for name in reversed([n for n, _ in named]):  # backward order
        ex.ready(name, grads[name].clone())
        done_pieces[name] = True
        for pos, bucket in enumerate(ex.buckets):
            complete = all(p.grad in done_pieces for p in bucket.pieces)
            started = pos < len(ex.works)
            # started buckets are a prefix (issue order) of the complete ones
            assert started <= complete, (pos, name)
            if complete and all(all(q.grad in done_pieces for q in b.pieces) for b in ex.buckets[:pos]):
                assert started, (pos, name)
    assert len(ex.works) == len(ex.buckets)
    out = ex.wait()
    for name, g in grads.items():  # a world of one: the mean is the gradient itself
        torch.testing.assert_close(out[name], g, rtol=0, atol=0)


def test_reduced_values_with_averaging_and_fp16(group):
    named = _named()
    ex = _executor(cut_in_bucket_plan(named, compression="fp16"), named, average=True)
    grads = {n: torch.randn(p.shape) for n, p in named}
    for name in reversed(list(grads)):
        ex.ready(name, grads[name].clone())
    out = ex.wait()
    for name, g in grads.items():
        np.testing.assert_allclose(out[name].numpy(), g.numpy(), rtol=1e-3, atol=1e-3)
        assert not np.array_equal(out[name].numpy(), g.numpy())  # went through float16: rounded


def test_step_cannot_finish_with_a_piece_missing(group):
    named = _named()
    ex = _executor(cut_in_bucket_plan(named), named)
    for name, p in reversed(named):
        ex.ready(name, torch.randn(p.shape))
    ex.left[1] = 1  # as if a piece of bucket 1 had never been copied in
    with pytest.raises(CommError, match=r"bucket 1 \(.*\) is missing 1 of its \d+ pieces"):
        ex.wait()


def test_a_bucket_cannot_be_counted_twice(group):
    named = _named()
    ex = _executor(cut_in_bucket_plan(named), named)
    for name, p in reversed(named):
        ex.ready(name, torch.randn(p.shape))
    name, p = named[-1]
    del ex.tensors[name]  # as if the same gradient were delivered again after its bucket started
    with pytest.raises(CommError, match=r"bucket \d+ \(.*\) received more pieces than the plan gives it "
                                        r"\(gradient 2.bias\)"):
        ex.ready(name, torch.randn(p.shape))


def test_wait_fills_unready_gradients_with_zeros_and_reduces_every_bucket(group):
    named = _named()
    ex = _executor(cut_in_bucket_plan(named), named)
    name, p = named[0]
    ex.ready(name, torch.ones(p.shape))
    out = ex.wait()
    assert ex.works == [] and len(out) == len(named)  # reset for the next step
    torch.testing.assert_close(out[name], torch.ones(p.shape))
    for other, q in named[1:]:
        assert float(out[other].abs().sum()) == 0.0
