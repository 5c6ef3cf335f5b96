"""Data-parallel training on aiacc's communication plans: the one transport (torch.distributed: gloo on
CPU, NCCL on GPU) under the Horovod-compatible APIs of every framework (aiacc.plugins.{torch,tf,mxnet}.horovod).

    compression  Average, Sum, Compression (hvd.*) and their checks            (torch-free)
    process      the torchrun environment, init/shutdown/rank/size, timeouts,   (torch imported on first use)
                 failures turned into RankFailureError
    transport    consistency checks (RankMismatchError) and broadcasts
    planning     calibrate the network, rank 0's plan shared by all ranks
    executor     PlanExecutor (a plan's all-reduces on torch tensors) and allreduce_arrays (numpy)
    optimizer    wrapping an optimizer as a subclass of its own class          (torch-free)
    launch       launch_local: N ranks on loopback (tests, benchmarks)          (torch-free)
    testbed      an emulated multi-node cluster (network namespaces, tc) and `aiacc cluster`

Importing this package, `compression`, `process`, `optimizer`, `launch` or `testbed` does not import torch:
the TensorFlow and MXNet Horovod modules need torch only when they join a job.
"""
from aiacc.distributed.compression import Average, Compression, Sum
from aiacc.distributed.launch import launch_local

__all__ = ["Average", "Compression", "Sum", "launch_local"]
