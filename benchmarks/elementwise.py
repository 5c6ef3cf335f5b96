"""Elementwise-heavy nets: aiacc level 3 (numba-fused elementwise kernels where measured faster) against level 2
and torch.compile, on torch CPU, 2 threads, every candidate timed interleaved in this one process.

    .venv/bin/python benchmarks/elementwise.py                         # the three nets, batch 1 and 8
    .venv/bin/python benchmarks/elementwise.py --models efficientnet --batch 1 --iters 20
    .venv/bin/python benchmarks/elementwise.py --kernels               # numba serial / parallel / torch by size

The nets (defined here, random weights; torchvision is not needed):
    efficientnet   EfficientNet-B0-style: MBConv blocks with SiLU and squeeze-excite, BatchNorm, 224x224
    mobilenetv3    MobileNetV3-Small-style: HardSwish / ReLU, squeeze-excite with HardSigmoid, 224x224
    bert           aiacc.zoo bert_encoder (4 layers, hidden 256, seq 128)
Ratios are median latencies against level 2 (below 1: faster than level 2). The pass report of the level-3
model says, per fused node, whether the numba kernel was kept ("kept: numba 0.41x") or dropped.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from aiacc.demo import median_ms, set_threads, time_interleaved  # noqa: E402


def _nets():
    """The benchmark nets (torch imported only after set_threads)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    ns = {"torch": torch, "nn": nn, "F": F}
    exec(compile(NETS, "<benchmarks/elementwise.py nets>", "exec"), ns)  # noqa: S102
    return ns


NETS = """

class SE(nn.Module):
    def __init__(self, c, r, act=nn.SiLU, gate=nn.Sigmoid):
        super().__init__()
        self.fc1 = nn.Conv2d(c, r, 1); self.fc2 = nn.Conv2d(r, c, 1); self.act = act(); self.gate = gate()
    def forward(self, x):
        s = F.adaptive_avg_pool2d(x, 1)
        return x * self.gate(self.fc2(self.act(self.fc1(s))))

class MBConv(nn.Module):
    def __init__(self, cin, cout, expand, k, stride, act=nn.SiLU, se=True, gate=nn.Sigmoid):
        super().__init__()
        mid = cin * expand
        layers = []
        if expand != 1:
            layers += [nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), act()]
        layers += [nn.Conv2d(mid, mid, k, stride, k // 2, groups=mid, bias=False), nn.BatchNorm2d(mid), act()]
        if se:
            layers += [SE(mid, max(1, cin // 4), act=act if act is nn.SiLU else nn.ReLU, gate=gate)]
        layers += [nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.block = nn.Sequential(*layers)
        self.res = stride == 1 and cin == cout
    def forward(self, x):
        y = self.block(x)
        return x + y if self.res else y

def efficientnet(width=1.0):
    cfg = [(1,16,1,3,1),(6,24,2,3,2),(6,40,2,5,2),(6,80,3,3,2),(6,112,3,5,1),(6,192,4,5,2),(6,320,1,3,1)]
    layers = [nn.Conv2d(3, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.SiLU()]
    c = 32
    for e, co, n, k, s in cfg:
        for i in range(n):
            layers.append(MBConv(c, co, e, k, s if i == 0 else 1)); c = co
    layers += [nn.Conv2d(c, 1280, 1, bias=False), nn.BatchNorm2d(1280), nn.SiLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(1280, 1000)]
    return nn.Sequential(*layers)

def mobilenetv3():
    # (k, exp, out, se, act, stride) of MobileNetV3-Small
    cfg = [(3,16,16,True,"RE",2),(3,72,24,False,"RE",2),(3,88,24,False,"RE",1),(5,96,40,True,"HS",2),
           (5,240,40,True,"HS",1),(5,240,40,True,"HS",1),(5,120,48,True,"HS",1),(5,144,48,True,"HS",1),
           (5,288,96,True,"HS",2),(5,576,96,True,"HS",1),(5,576,96,True,"HS",1)]
    layers = [nn.Conv2d(3,16,3,2,1,bias=False), nn.BatchNorm2d(16), nn.Hardswish()]
    c = 16
    for k, ex, co, se, a, s in cfg:
        act = nn.Hardswish if a == "HS" else nn.ReLU
        layers.append(MBConv3(c, ex, co, k, s, act, se)); c = co
    layers += [nn.Conv2d(c,576,1,bias=False), nn.BatchNorm2d(576), nn.Hardswish(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
               nn.Linear(576,1024), nn.Hardswish(), nn.Linear(1024,1000)]
    return nn.Sequential(*layers)

class MBConv3(nn.Module):
    def __init__(self, cin, mid, cout, k, s, act, se):
        super().__init__()
        layers = []
        if mid != cin:
            layers += [nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), act()]
        layers += [nn.Conv2d(mid, mid, k, s, k//2, groups=mid, bias=False), nn.BatchNorm2d(mid), act()]
        if se:
            layers += [SE(mid, _div8(mid // 4), act=nn.ReLU, gate=nn.Hardsigmoid)]
        layers += [nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.block = nn.Sequential(*layers); self.res = s == 1 and cin == cout
    def forward(self, x):
        y = self.block(x)
        return x + y if self.res else y

def _div8(v):
    return max(8, int(v + 4) // 8 * 8)
"""


def build(name: str, batch: int):
    import torch

    if name == "bert":
        from aiacc import zoo

        model, inputs = zoo.build("torch", "bert_encoder", batch=batch)
        return model.eval(), tuple(inputs)
    ns = _nets()
    torch.manual_seed(0)
    model = {"efficientnet": ns["efficientnet"], "mobilenetv3": ns["mobilenetv3"]}[name]().eval()
    with torch.no_grad():  # BatchNorm statistics that are not the identity
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    return model, (torch.randn(batch, 3, 224, 224, generator=torch.Generator().manual_seed(1)),)


def bench_model(name: str, batch: int, iters: int, compile_: bool) -> dict:
    import torch

    import aiacc

    model, xs = build(name, batch)
    cands, setup = {}, {}
    for level in (2, 3):
        t = time.perf_counter()
        cands[f"level {level}"] = aiacc.optimize(model, xs, level=level)
        setup[f"level {level}"] = time.perf_counter() - t
    if compile_:
        t = time.perf_counter()
        c = torch.compile(model)
        with torch.no_grad():
            c(*xs)
        cands["torch.compile"] = c
        setup["torch.compile"] = time.perf_counter() - t
    notes = cands["level 3"].aiacc_report["elementwise_fusion"].notes
    kept = sum(1 for n in notes if ": kept" in n)
    with torch.no_grad():
        ref = model(*xs)
        ref = ref if isinstance(ref, torch.Tensor) else torch.as_tensor(ref[0])
        errs = {}
        for k, m in cands.items():
            out = m(*xs)
            out = out if isinstance(out, torch.Tensor) else out[0]
            errs[k] = float((out - ref).abs().max() / ref.abs().max())
        fns = {k: (lambda m=m: m(*xs)) for k, m in cands.items()}
        times = time_interleaved(fns, iters, warmup=2)
    ms = {k: median_ms(v) for k, v in times.items()}
    return {"model": name, "batch": batch, "ms": ms, "err": errs, "setup": setup, "fused": len(notes),
            "kept": kept, "notes": notes}


def print_rows(rows: list[dict]) -> None:
    print("| model | batch | level 2 ms | level 3 ms | torch.compile ms | L3/L2 | compile/L2 | fused nodes kept | max rel err L3 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ms = r["ms"]
        tc = ms.get("torch.compile")
        l2, l3 = ms["level 2"], ms["level 3"]
        tc_ms = "-" if tc is None else f"{tc:.2f}"
        tc_x = "-" if tc is None else f"{tc / l2:.3f}"
        print(f"| {r['model']} | {r['batch']} | {l2:.2f} | {l3:.2f} | {tc_ms} | {l3 / l2:.3f} | {tc_x} | "
              f"{r['kept']}/{r['fused']} | {r['err']['level 3']:.1e} |")


def bench_kernels(iters: int) -> None:
    """numba serial vs parallel vs torch, one fused program, by size (what PARALLEL_MIN_ELEMENTS rests on)."""
    import torch

    from aiacc.core.runtime import numba_kernels as nk

    programs = {"mul+add+relu": ("t0=Mul(i0,i1);t1=Add(t0,i2);t2=Relu(t1)",
                                 lambda x, s, t: torch.relu(x * s + t)),
                "silu": ("t0=Sigmoid(i0);t1=Mul(i0,t0)", lambda x, s, t: torch.nn.functional.silu(x))}
    print("| program | elements | numba serial us | numba parallel us | torch us | serial/torch | parallel/torch |")
    print("|---|---|---|---|---|---|---|")
    for label, (p, ref) in programs.items():
        n_in = 3 if "i2" in p else 1
        fn = nk.fused_elementwise_kernel(p, n_in, "float32")
        for n in (1_000, 10_000, 100_000, 1_000_000, 10_000_000):
            x = torch.randn(n)
            s, t = torch.tensor(1.5), torch.tensor(0.25)
            args = [x.numpy(), s.numpy(), t.numpy()][:n_in]
            out = np.empty(n, np.float32)
            lay = nk._plan_layout([a.shape for a in args], None)
            par, ser = fn.functions(lay.inner)
            flat = [a.reshape(-1) for a in args]
            call = lambda f: f(out, lay.last, lay.chunk, lay.tpr, lay.odims, lay.strides, *flat)  # noqa: E731
            reps = max(1, 2_000_000 // n)
            fns = {"serial": lambda: [call(ser) for _ in range(reps)],
                   "parallel": lambda: [call(par) for _ in range(reps)],
                   "torch": lambda: [ref(x, s, t) for _ in range(reps)]}
            times = time_interleaved(fns, iters, warmup=1)
            us = {k: min(v) / reps * 1e6 for k, v in times.items()}
            print(f"| {label} | {n:,} | {us['serial']:.1f} | {us['parallel']:.1f} | {us['torch']:.1f} | "
                  f"{us['serial'] / us['torch']:.2f} | {us['parallel'] / us['torch']:.2f} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="efficientnet,mobilenetv3,bert")
    ap.add_argument("--batch", default="1,8")
    ap.add_argument("--iters", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-compile", action="store_true", help="leave torch.compile out (it compiles for minutes)")
    ap.add_argument("--kernels", action="store_true", help="the kernel-size sweep instead of the nets")
    ap.add_argument("--notes", action="store_true", help="print the level-3 per-node kept/dropped notes")
    args = ap.parse_args()
    set_threads(args.threads)
    import torch

    torch.set_num_threads(args.threads)
    if args.kernels:
        bench_kernels(args.iters)
        return 0
    rows = []
    for name in args.models.split(","):
        for batch in (int(b) for b in args.batch.split(",")):
            r = bench_model(name, batch, args.iters, not args.no_compile)
            rows.append(r)
            print(f"# {name} batch {batch}: " + ", ".join(f"{k} {v:.2f} ms (setup {r['setup'][k]:.1f} s)"
                                                         for k, v in r["ms"].items()), flush=True)
            if args.notes:
                for n in r["notes"]:
                    print("#   ", n)
    print_rows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
