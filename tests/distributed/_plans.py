"""Communication plans of every shape the executor must run correctly, built by hand.

The strategies rarely produce some of these shapes (it depends on the measured link speed), so the
tests build them directly: gradients cut into pieces, several pieces of one gradient in one bucket
(not adjacent, not in order), and buckets that span layers.
"""
from aiacc.core.comm import gradient_specs_from_params
from aiacc.core.comm.plan import Bucket, Piece, Plan


def cut_in_bucket_plan(named, piece=7, per_bucket=5, compression="none"):
    """Every gradient cut into `piece`-element pieces; each gradient's pieces listed evens first, then
    odds, in backward order; `per_bucket` consecutive pieces per bucket (so a bucket holds several
    pieces of one gradient and often the end of one layer and the start of the next)."""
    spec = gradient_specs_from_params([(n, tuple(p.shape), p.dtype) for n, p in named])
    pieces = []
    for g, _, _ in spec.backward_order():
        cuts = [Piece(g.name, s, min(g.numel, s + piece)) for s in range(0, g.numel, piece)]
        pieces += cuts[0::2] + cuts[1::2]
    buckets = tuple(Bucket(tuple(pieces[i:i + per_bucket])) for i in range(0, len(pieces), per_bucket))
    plan = Plan("cut-in-bucket", buckets, compression=compression)
    plan.validate(spec)
    return plan


def one_gradient_two_pieces_plan(named):
    """Each gradient alone in its bucket, cut in two halves: the shape whose readiness count went
    negative (the bucket was never all-reduced)."""
    spec = gradient_specs_from_params([(n, tuple(p.shape), p.dtype) for n, p in named])
    buckets = []
    for g, _, _ in spec.backward_order():
        half = max(1, g.numel // 2)
        cuts = (Piece(g.name, 0, half), Piece(g.name, half, g.numel)) if g.numel > 1 else (Piece(g.name, 0, 1),)
        buckets.append(Bucket(cuts))
    plan = Plan("two-pieces", tuple(buckets))
    plan.validate(spec)
    return plan


def guard_cluster(rate: float):
    """2 nodes whose all-reduce of n bytes took 0.2 ms + n / `rate` (measured-looking samples, so the
    planner's margins apply)."""
    from aiacc.core.comm import ClusterSpec

    sizes = (4, 1 << 12, 1 << 16, 1 << 20, 1 << 22, 1 << 24)
    return ClusterSpec(2, 1, rate, allreduce_samples=tuple((float(b), 2e-4 + b / rate) for b in sizes))


def ddp_default_fallback_plan(named):
    """The plan the planner's DDP-default guard (`planning.keep_or_ddp_default`) runs for these parameters
    where another plan (here one all-reduce per gradient) is predicted no faster than DDP's default layout
    (a compute-bound step on a fast link): DDP's 25 MB layout with the guard's params (fallback, sync)."""
    from aiacc.core.comm import strategies
    from aiacc.distributed.planning import keep_or_ddp_default

    entries = [(n, tuple(p.shape), p.dtype) for n, p in named]
    spec = gradient_specs_from_params(entries, forward_s=1e-2, backward_s=2e-2)  # compute-bound on 16 Gbit/s
    other = strategies.per_tensor(spec)
    plan = keep_or_ddp_default(spec, guard_cluster(2e9), other)
    assert plan.params["fallback"] and plan.buckets == strategies.ddp_layout(spec).buckets != other.buckets
    return plan
