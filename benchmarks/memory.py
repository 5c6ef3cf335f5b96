"""Memory planning benchmark: two rich tables.

1. Inference arena plans of the IR zoo at batch 1 (ResNet-50, MobileNetV2, DenseNet-121, GoogLeNet,
   BERT-base-style encoder): naive, the import-order lower bound (the graph's own order, no in-place
   reuse), the same order with in-place reuse, aiacc's chosen schedule and its lower bound, aiacc's arena,
   arena / bound, planning time.
2. Training under a memory budget (PyTorch, CPU): activation memory held between forward and backward
   and the step's peak (the CPU allocator's counters, via the torch profiler), and the step time, for
   the original and for aiacc at 50% and 25% of the original's activation memory. Step times are medians of
   interleaved runs in this process, printed as ratios to the original.

    python benchmarks/memory.py [--quick]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from aiacc.core import check_plan, plan_memory  # noqa: E402
from aiacc.core.memory import MemoryProblem, schedule_bound  # noqa: E402
from aiacc.zoo import ir_models as zoo  # noqa: E402
from aiacc import progress  # noqa: E402

MIB = 1 << 20


def inference_table(quick: bool) -> Table:
    table = Table(title="Inference memory plans, batch 1 (MiB)")
    for col in ("model", "nodes", "naive", "import-order bound", "+ in-place", "chosen schedule", "chosen bound",
                "arena", "arena / bound", "chosen vs import", "plan time"):
        table.add_column(col, justify="left" if col in ("model", "chosen schedule") else "right")
    models = dict(zoo.SMALL if quick else zoo.FULL)
    if not quick:  # long sequences: the attention scores dominate and the order of Q, K, V matters
        models["bert_encoder seq512"] = lambda: zoo.bert_encoder(seq=512)
    for name, build in progress.track(list(models.items()), "memory plans", label=lambda item: item[0]):
        g = build()
        t0 = time.perf_counter()
        plan = plan_memory(g, dims={"N": 1})
        seconds = time.perf_counter() - t0
        check_plan(plan)
        p = MemoryProblem.build(g, plan.alignment, {"N": 1})
        inplace_import = schedule_bound(p, list(range(len(p.nodes))), inplace=True)
        table.add_row(
            name, str(len(g)), f"{plan.naive_bytes / MIB:.2f}", f"{plan.import_order_bound_bytes / MIB:.2f}",
            f"{inplace_import / MIB:.2f}", plan.schedule_source, f"{plan.lower_bound_bytes / MIB:.2f}",
            f"{plan.arena_bytes / MIB:.2f}", f"{plan.arena_bytes / plan.lower_bound_bytes:.3f}",
            f"{100 * (1 - plan.lower_bound_bytes / plan.import_order_bound_bytes):.1f}% under",
            f"{seconds:.2f} s")
    return table


def resnet_like(blocks: int = 32, c: int = 32, batch: int = 8, size: int = 32):
    """Residual conv blocks (conv-BN-ReLU-conv-BN + skip), torch.fx-traceable."""
    import torch

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.b1 = torch.nn.Conv2d(c, c, 3, padding=1), torch.nn.BatchNorm2d(c)
            self.c2, self.b2 = torch.nn.Conv2d(c, c, 3, padding=1), torch.nn.BatchNorm2d(c)

        def forward(self, x):
            return torch.relu(x + self.b2(self.c2(torch.relu(self.b1(self.c1(x))))))

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = torch.nn.Conv2d(3, c, 3, padding=1)
            self.blocks = torch.nn.Sequential(*[Block() for _ in range(blocks)])
            self.fc = torch.nn.Linear(c, 10)

        def forward(self, x):
            return self.fc(self.blocks(torch.relu(self.stem(x))).mean((2, 3)))

    torch.manual_seed(0)
    return Net(), torch.randn(batch, 3, size, size)


def bert_like(layers: int = 8, d: int = 256, heads: int = 4, seq: int = 128, batch: int = 8):
    """Post-norm transformer encoder layers written with plain ops (torch.fx-traceable)."""
    import torch

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = torch.nn.Linear(d, 3 * d)
            self.proj = torch.nn.Linear(d, d)
            self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
            self.ff1, self.ff2 = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)
            self.drop = torch.nn.Dropout(0.1)

        def forward(self, x):
            q, k, v = self.qkv(x).reshape(batch, seq, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
            att = torch.softmax(q @ k.transpose(-1, -2) * (d // heads) ** -0.5, dim=-1)
            ctx = (self.drop(att) @ v).transpose(1, 2).reshape(batch, seq, d)
            x = self.ln1(x + self.proj(ctx))
            return self.ln2(x + self.ff2(self.drop(torch.nn.functional.gelu(self.ff1(x)))))

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.Sequential(*[Layer() for _ in range(layers)])

        def forward(self, x):
            return self.layers(x)

    torch.manual_seed(0)
    return Encoder(), torch.randn(batch, seq, d)


def training_table(quick: bool) -> Table:
    import torch

    from aiacc.core.memory_checkpoint import MemoryBudgetError
    from aiacc.plugins.torch.memory import measure_training_memory, plan_training_memory

    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))

    table = Table(title="Training under a memory budget (PyTorch CPU; MiB, step time as ratio to the original)")
    for col in ("model", "variant", "activations held", "step peak", "recompute", "step time", "note"):
        table.add_column(col, justify="left" if col in ("model", "variant", "note") else "right")
    # budgets are fractions of the original's measured activation memory (held between forward and backward)
    cases = {"resnet-like (32 blocks)": resnet_like(blocks=8 if quick else 32, batch=4),
             "bert-like (8 layers)": bert_like(layers=2 if quick else 8)}
    for name, (model, x) in cases.items():
        model.train()
        orig = measure_training_memory(model, x)
        variants = [("original", model, None, "")]
        for frac in (0.5, 0.25):
            budget = int(frac * orig["held"])
            try:
                m = plan_training_memory(model, x, memory_budget=budget)
                variants.append((f"aiacc {int(frac * 100)}%", m, m.aiacc_memory_plan, ""))
            except MemoryBudgetError as e:
                variants.append((f"aiacc {int(frac * 100)}%", None, None,
                                 f"unreachable: smallest {e.smallest / MIB:.2f} MiB"))
        # interleaved step timings
        times: dict[str, list[float]] = {v[0]: [] for v in variants if v[1] is not None}
        for rnd in range(4 if quick else 6):
            for label, m, _, _ in variants:
                if m is None:
                    continue
                m.zero_grad(set_to_none=True)
                t0 = time.perf_counter()
                m(x).pow(2).mean().backward()
                if rnd:  # the first round warms up
                    times[label].append(time.perf_counter() - t0)
        base_t = statistics.median(times["original"])
        for label, m, plan, note in variants:
            if m is None:
                table.add_row(name, label, "-", "-", "-", "-", note)
                continue
            meas = orig if m is model else measure_training_memory(m, x)
            t = statistics.median(times[label])
            table.add_row(name, label, f"{meas['held'] / MIB:.2f}", f"{meas['peak'] / MIB:.2f}",
                          "-" if plan is None else f"{100 * plan.recompute_fraction:.0f}% of fwd",
                          f"{t / base_t:.2f}x", note or (f"{len(plan.segments)} segments" if plan else
                                                         f"step {base_t * 1e3:.0f} ms"))
    return table


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small models (a smoke run)")
    ap.add_argument("--only", choices=("inference", "training"))
    args = ap.parse_args(argv)
    console = Console(width=170)
    if args.only != "training":
        console.print(inference_table(args.quick))
    if args.only != "inference":
        console.print(training_table(args.quick))


if __name__ == "__main__":
    main()
