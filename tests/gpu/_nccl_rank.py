"""One rank of the NCCL checks (tests/gpu/test_nccl.py): a CUDA model trained 3 steps through aiacc's
DistributedOptimizer; prints one JSON line (backend, final parameters, the CPU collective's result)."""
import json
import sys

import torch

import aiacc.plugins.torch.horovod as hvd

hvd.init()
rank, size = hvd.rank(), hvd.size()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2)).cuda()
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters())
g = torch.Generator().manual_seed(1)
batches = [(torch.randn(8, 8, generator=g), torch.randn(8, 2, generator=g)) for _ in range(3)]
for x, y in batches:
    opt.zero_grad()
    half = x.shape[0] // size  # each rank its shard of the batch: the average equals the full batch
    xs, ys = x[rank * half:(rank + 1) * half].cuda(), y[rank * half:(rank + 1) * half].cuda()
    torch.nn.functional.mse_loss(model(xs), ys).backward()
    opt.step()
torch.cuda.synchronize()
cpu_sum = hvd.allreduce(torch.tensor([float(rank + 1)]), op=hvd.Sum)  # CPU tensors still go through gloo
print(json.dumps({"rank": rank, "backend": str(torch.distributed.get_backend()),
                  "params": [p.detach().cpu().reshape(-1).tolist() for p in model.parameters()],
                  "cpu_sum": float(cpu_sum), "device": str(next(model.parameters()).device)}))
sys.stdout.flush()
hvd.shutdown()
