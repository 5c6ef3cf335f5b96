"""A rank of tests/distributed/test_sum_order.py: float32 gradients all-reduced by gloo with two bucket
layouts (one bucket, and two buckets cut at an odd offset), on all ranks and on a group of 2; rank 0
writes what it got and the float64 sums to the .npz named by argv[1]."""
import sys

import numpy as np
import torch
import torch.distributed as dist

N = 50_001  # elements of the "gradient"
CUT = 16_661  # where the two-bucket layout cuts it


def reduce(grad: torch.Tensor, cut: int | None, group=None) -> torch.Tensor:
    """The sum over the group's ranks of `grad`, all-reduced whole or as [0, cut) and [cut, N)."""
    out = grad.clone()
    parts = [out] if cut is None else [out[:cut], out[cut:]]
    for p in parts:
        flat = p.contiguous()
        dist.all_reduce(flat, group=group)
        p.copy_(flat)
    return out


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    grads = [torch.from_numpy(np.random.default_rng(10 + r).standard_normal(N).astype(np.float32) * 1e-2)
             for r in range(world)]
    pair = dist.new_group([0, 1])  # every rank takes part in creating it
    res = {"whole": reduce(grads[rank], None), "cut": reduce(grads[rank], CUT)}
    if rank < 2:
        res["pair_whole"] = reduce(grads[rank], None, pair)
        res["pair_cut"] = reduce(grads[rank], CUT, pair)
    dist.barrier()
    if rank == 0:
        g64 = np.stack([g.numpy().astype(np.float64) for g in grads])
        np.savez(sys.argv[1], **{k: v.numpy() for k, v in res.items()}, sum64=g64.sum(0),
                 pair64=g64[:2].sum(0), abs64=np.abs(g64).sum(0), world=world)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
