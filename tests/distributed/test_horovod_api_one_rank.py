"""The torch Horovod API in a job of one (no launcher): what the 2-rank tests do not pin down.

backward_passes_per_step accumulates locally and communicates once; compression names are checked (an
unknown one would silently send full precision); a plan made for fp16 cannot be run uncompressed.
"""
import pytest

torch = pytest.importorskip("torch")

from aiacc.core.comm import CommError  # noqa: E402


@pytest.fixture
def hvd(monkeypatch):
    import aiacc.plugins.torch.horovod as hvd
    from aiacc.distributed.launch import free_port

    if torch.distributed.is_initialized():
        pytest.skip("a process group is already open in this process")
    for k, v in dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                     MASTER_PORT=str(free_port())).items():
        monkeypatch.setenv(k, v)
    hvd.init()
    try:
        yield hvd
    finally:
        hvd.shutdown()


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def test_process_functions(hvd):
    assert (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size()) == (0, 1, 0, 1)
    torch.testing.assert_close(hvd.allreduce(torch.tensor([3.0])), torch.tensor([3.0]))
    torch.testing.assert_close(hvd.allreduce(torch.tensor([3.0]), op=hvd.Sum), torch.tensor([3.0]))
    torch.testing.assert_close(hvd.allgather(torch.arange(3)), torch.arange(3))
    assert hvd.broadcast_object({"a": 1}) == {"a": 1}
    third = torch.tensor([1 / 3])
    fp16 = hvd.allreduce(third, compression=hvd.Compression.fp16)
    assert fp16.dtype == torch.float32 and float(fp16) == float(third.half()) != float(third)  # went as fp16


def test_backward_passes_per_step_accumulates_then_communicates_once(hvd):
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(4, 4, generator=g), torch.randn(4, 2, generator=g)) for _ in range(4)]
    ref = _model()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for i in range(0, 4, 2):
        ref_opt.zero_grad()
        for x, y in batches[i:i + 2]:
            torch.nn.functional.mse_loss(ref(x), y).backward()
        ref_opt.step()
    model = _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), backward_passes_per_step=2)
    ex = opt._aiacc_scheduler.executor
    for i in range(0, 4, 2):
        opt.zero_grad()
        for j, (x, y) in enumerate(batches[i:i + 2]):
            torch.nn.functional.mse_loss(model(x), y).backward()
            ex = opt._aiacc_scheduler.executor
            assert len(ex.works) == (len(ex.buckets) if j == 1 else 0)  # nothing sent after the first pass
        opt.step()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("plan", ["aiacc", "cut"])
@pytest.mark.parametrize("passes", [1, 2])
@pytest.mark.parametrize("set_to_none", [True, False])
def test_zero_grad_either_way_gives_plain_training(hvd, set_to_none, passes, plan):
    """zero_grad(set_to_none=False) zeroes every gradient in place; set_to_none=True zeroes those that live
    in their buckets in place (backward accumulates into the bucket) and drops the others (cut over
    buckets): both end each step with the gradients held whole in their bucket's buffer and the
    parameters of plain training, with backward_passes_per_step accumulating, and with tensors cut."""
    from tests.distributed._plans import cut_in_bucket_plan

    g = torch.Generator().manual_seed(2)
    batches = [(torch.randn(4, 4, generator=g), torch.randn(4, 2, generator=g)) for _ in range(6 * passes)]
    ref = _model()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    model = _model()
    named = list(model.named_parameters())
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=named, backward_passes_per_step=passes,
                                   plan="aiacc" if plan == "aiacc" else cut_in_bucket_plan(named))
    for i in range(0, len(batches), passes):
        ref_opt.zero_grad()
        opt.zero_grad(set_to_none=set_to_none)
        if i:
            kept = set(opt._aiacc_scheduler.executor.homes) if set_to_none else set(dict(named))
            for n, p in named:
                assert (p.grad is not None and not p.grad.any()) if n in kept else p.grad is None, n
        for x, y in batches[i:i + passes]:
            torch.nn.functional.mse_loss(ref(x), y).backward()
            torch.nn.functional.mse_loss(model(x), y).backward()
        ex = opt._aiacc_scheduler.executor  # this step's (the step after profiling installs a new one)
        opt.step()
        ref_opt.step()
        flats = {f.untyped_storage().data_ptr() for f in ex.flats if f is not None}
        whole = set(ex.homes)
        assert whole  # every plan here holds some gradient whole
        for n, p in named:  # a gradient held whole is its bucket's slice; one cut over buckets is not
            assert (p.grad.untyped_storage().data_ptr() in flats) == (n in whole), n
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-6)


def test_unknown_compression_is_refused(hvd):
    model = _model()
    with pytest.raises(CommError, match="unknown compression 'float16'"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=model.named_parameters(), compression="float16")
    with pytest.raises(CommError, match="unknown compression"):
        hvd.allreduce(torch.ones(2), compression="half")


def test_plan_for_fp16_cannot_run_uncompressed(hvd):
    from tests.distributed._plans import cut_in_bucket_plan

    model = _model()
    named = list(model.named_parameters())
    with pytest.raises(CommError, match="made for compression 'fp16'"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=named,
                                 plan=cut_in_bucket_plan(named, compression="fp16"))


class _Branchy(torch.nn.Module):
    """Nested modules, a parameter owned by the parent, and a branch that skips a layer on odd steps."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.body = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8))
        self.side = torch.nn.Linear(8, 8)
        self.scale = torch.nn.Parameter(torch.ones(8))
        self.head = torch.nn.Linear(8, 2)
        self.skip_side = False

    def forward(self, x):
        h = self.body(x) * self.scale
        if not self.skip_side:
            h = torch.tanh(self.side(h))
        return self.head(h)


@pytest.mark.parametrize("skip", [False, True])
@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
def test_per_layer_waits_train_exactly_like_step_time_updates(hvd, opt_name, skip):
    """forward_module: step() defers, each layer's forward pre-hook applies its update. With an LR
    schedule stepping after step() and zero_grad() before the forward, the parameters are those of plain
    training; with a layer skipped on some steps (its deferred update then comes from the next backward,
    or a later forward), those of the engine's step-time updates (which give a gradient-less parameter
    zeros, as all ranks must reduce the same buckets)."""
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(6, 4, generator=g), torch.randn(6, 2, generator=g)) for _ in range(7)]

    def make(m):
        if opt_name == "sgd":
            return torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
        return torch.optim.Adam(m.parameters(), lr=0.01)

    def train(mode):
        m = _Branchy()
        opt = make(m)
        if mode != "plain":
            opt = hvd.DistributedOptimizer(opt, named_parameters=m.named_parameters(),
                                           forward_module=m if mode == "deferred" else None)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
        for i, (x, y) in enumerate(batches):
            m.skip_side = skip and i % 3 == 1
            opt.zero_grad()
            torch.nn.functional.mse_loss(m(x), y).backward()
            opt.step()
            sched.step()
        if mode == "deferred":
            assert opt._aiacc_scheduler.pending  # the last update waits for a forward...
            opt.finish_step()  # ...or for finish_step()
            assert opt._aiacc_scheduler.pending is None
        return {k: v.detach().clone() for k, v in m.named_parameters()}

    want, got = train("hvd" if skip else "plain"), train("deferred")
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-6, atol=1e-6, msg=k)
    assert any(not torch.equal(got[k], _Branchy().state_dict()[k]) for k in got)  # it trained


def test_per_layer_waits_refuse_a_closure(hvd):
    m = _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), named_parameters=m.named_parameters(),
                                   forward_module=m)
    m(torch.randn(2, 4)).sum().backward()
    with pytest.raises(CommError, match="cannot take a closure"):
        opt.step(lambda: 0.0)


def test_per_layer_waits_with_a_parameter_read_outside_its_module(hvd):
    """nn.MultiheadAttention reads its out_proj's weight without calling out_proj: that parameter's update
    belongs to the attention module's pre-hook (learnt from the first forward), not to a hook that never
    runs (which would leave it stale in the forward and updated during backward)."""
    def build():
        torch.manual_seed(5)
        return torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(8, 2, 16, 0.0, batch_first=True), 2,
                                           enable_nested_tensor=False)

    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(3, 5, 8, generator=g), torch.randn(3, 5, 8, generator=g)) for _ in range(4)]

    def train(deferred):
        m = build()
        opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
        if deferred:
            opt = hvd.DistributedOptimizer(opt, named_parameters=m.named_parameters(), forward_module=m)
        for x, y in batches:
            opt.zero_grad()
            torch.nn.functional.mse_loss(m(x), y).backward()
            opt.step()
        if deferred:
            opt.finish_step()
        return {k: v.detach().clone() for k, v in m.named_parameters()}

    want, got = train(False), train(True)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-6, atol=1e-6, msg=k)


def test_overlap_forward_auto_follows_the_plan_and_trains_like_plain_sgd(hvd):
    """overlap_forward="auto": the planner chooses (a job of one has nothing to overlap, so step() updates
    at once, as without forward_module); overlap_forward=True always defers; anything else is refused."""
    g = torch.Generator().manual_seed(2)
    batches = [(torch.randn(4, 4, generator=g), torch.randn(4, 2, generator=g)) for _ in range(3)]

    def train(**kw):
        m = _model()
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        if kw:
            opt = hvd.DistributedOptimizer(opt, named_parameters=m.named_parameters(), forward_module=m, **kw)
        for x, y in batches:
            opt.zero_grad()
            torch.nn.functional.mse_loss(m(x), y).backward()
            opt.step()
            if kw:
                assert opt.defers == (kw["overlap_forward"] is True)
                assert opt.plan.params.get("sync") == ("step" if kw["overlap_forward"] == "auto" else "layer")
                assert bool(opt._aiacc_scheduler.pending) == opt.defers  # a deferred update waits
        if kw:
            opt.finish_step()
        return {k: v.detach().clone() for k, v in m.named_parameters()}

    want = train()
    for mode in ("auto", True):
        got = train(overlap_forward=mode)
        for k in want:
            torch.testing.assert_close(got[k], want[k], rtol=1e-6, atol=1e-6, msg=f"{mode} {k}")
    m = _model()
    with pytest.raises(CommError, match="overlap_forward"):
        hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), named_parameters=m.named_parameters(),
                                 forward_module=m, overlap_forward="sometimes")
