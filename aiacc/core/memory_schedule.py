"""Schedule search: a topological order of the nodes with a lower memory peak.

Dynamic programming over the sets of nodes already run (downsets), one step at a time (in the spirit of
Serenity, Ahn et al. 2020). What is live after a set S of nodes ran depends only on S, so two ways of
reaching S only differ by the peak they went through: keep the lower one. The number of downsets is small
on the nets we care about (it collapses to one at every cut point: a ResNet block output, an Inception
concat), and `beam` bounds it elsewhere, which turns the exact search into a beam search.

The memory model is the planner's (`aiacc.core.memory`): while node u runs, its inputs and its outputs
are live; an output written in place over an input that dies at u costs nothing extra.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from aiacc.core.memory import MemoryProblem


def search_schedule(p: "MemoryProblem", beam: int = 64, inplace: bool = True) -> list[int]:
    """The best schedule found (node indices). Falls back to the graph's order if the search cannot
    improve on it."""
    n = len(p.nodes)
    if n == 0:
        return []
    bit = [1 << i for i in range(n)]
    pred = [0] * n
    for i in range(n):
        for j in p.reads[i]:
            pred[i] |= bit[p.producer[j]]
    cons_mask = [0] * len(p.values)
    for j, cs in enumerate(p.consumers):
        for c in cs:
            cons_mask[j] |= bit[c]
    out_cost = [sum(p.size[j] for j in p.writes[i]) for i in range(n)]
    # outputs nobody reads (and that are not graph outputs) die right after their node
    dead_out = [sum(p.size[j] for j in p.writes[i] if not p.consumers[j] and not p.is_output[j]) for i in range(n)]
    cands = p.inplace_candidates if inplace else [[] for _ in range(n)]

    succ: list[list[int]] = [[] for _ in range(n)]
    for i in range(n):
        for j in p.writes[i]:
            for c in sorted(p.consumers[j]):
                if c not in succ[i]:
                    succ[i].append(c)
    roots = tuple(i for i in range(n) if not pred[i])

    # state: S -> (peak, live, parent S, node, ready nodes)
    level: dict[int, tuple] = {0: (0, 0, -1, -1, roots)}
    history: list[dict[int, tuple]] = [level]
    for _ in range(n):
        nxt: dict[int, tuple] = {}
        for s, (peak, live, _, _, ready) in level.items():
            for u in ready:
                s2 = s | bit[u]
                freed = 0
                credit = 0
                for j in p.reads[u]:
                    if not p.is_output[j] and not (cons_mask[j] & ~s2):
                        freed += p.size[j]
                if cands[u]:
                    for j in cands[u]:
                        if not p.is_output[j] and not (cons_mask[j] & ~s2):
                            credit = p.size[p.writes[u][0]]
                            freed -= p.size[j]  # its memory passes to the output
                            break
                during = live + out_cost[u] - credit
                new_live = during - freed - dead_out[u]
                new_peak = peak if peak > during else during
                old = nxt.get(s2)
                if old is None or (new_peak, new_live) < (old[0], old[1]):
                    r2 = tuple(x for x in ready if x != u) + tuple(
                        c for c in succ[u] if not (pred[c] & ~s2))
                    nxt[s2] = (new_peak, new_live, s, u, r2)
        if len(nxt) > beam:
            kept = sorted(nxt.items(), key=lambda kv: (kv[1][0], kv[1][1]))[:beam]
            nxt = dict(kept)
        history.append(nxt)
        level = nxt
    # walk back from the best full state
    s = min(level, key=lambda k: level[k][:2])
    order: list[int] = []
    for k in range(n, 0, -1):
        _, _, parent, u, _ = history[k][s]
        order.append(u)
        s = parent
    order.reverse()
    return order
