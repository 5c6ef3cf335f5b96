"""One rank of the hvd.start_timeline test: two steps of a small model with a per-tensor plan (4 buckets),
recorded by hvd.start_timeline(argv[1]) ... hvd.stop_timeline()."""
import sys

import torch

import aiacc.plugins.torch.horovod as hvd

hvd.init()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters(), plan="per-tensor")
hvd.start_timeline(sys.argv[1])
g = torch.Generator().manual_seed(hvd.rank())
for _ in range(2):
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(torch.randn(8, 4, generator=g)), torch.randn(8, 2, generator=g)).backward()
    opt.step()
written = hvd.stop_timeline()
print("written", written)
hvd.shutdown()
