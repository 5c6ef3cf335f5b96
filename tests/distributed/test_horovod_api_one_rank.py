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
