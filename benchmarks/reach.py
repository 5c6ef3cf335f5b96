"""Reach sweep: models nobody here wrote (torchvision, timm, transformers) through aiacc, one line each.

    python benchmarks/reach.py                 # the default sample
    python benchmarks/reach.py --only bert,gpt2

Per model: traced (whole: no opaque node), the opaque count and their reasons, optimized output verified
on a fresh input (max error relative to the output's magnitude, 1e-4), or the error that stopped it.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402

from tests.reach import _models as M  # noqa: E402
from aiacc import progress  # noqa: E402

TV = ["resnet18", "mobilenet_v3_small", "efficientnet_b0", "convnext_tiny", "swin_t", "maxvit_t",
      "regnet_y_400mf", "shufflenet_v2_x0_5", "squeezenet1_1", "densenet121", "googlenet", "mnasnet0_5",
      "vit_b_16", "swin_v2_t", "efficientnet_v2_s", "regnet_x_400mf", "shufflenet_v2_x1_0", "mnasnet1_0",
      "squeezenet1_0", "inception_v3", "vit_b_32", "resnext50_32x4d", "wide_resnet50_2", "alexnet", "vgg11_bn",
      "mobilenet_v2", "mobilenet_v3_large"]
TV_SEG = ["lraspp_mobilenet_v3_large", "fcn_resnet50", "deeplabv3_mobilenet_v3_large", "deeplabv3_resnet50"]
# name or name@size (default 64; a family with a fixed token grid needs its own size)
TIMM = ["resnet18", "mobilenetv3_small_050", "efficientnet_b0", "convnext_atto", "levit_128s@224",
        "edgenext_xx_small", "mobilevit_xxs", "vit_tiny_patch16_224@224", "deit_tiny_patch16_224@224", "regnetx_002",
        "ghostnet_050", "resnest14d", "coat_lite_tiny@224", "poolformer_s12", "mixer_s16_224@224",
        "mobilevitv2_050", "levit_128@224", "edgenext_x_small", "poolformerv2_s12", "coatnet_0_rw_224@224",
        "deit_tiny_distilled_patch16_224@224", "beit_base_patch16_224@224", "cait_xxs24_224@224",
        "xcit_nano_12_p16_224@224", "mixer_s32_224@224", "resmlp_12_224@224", "regnetz_005", "ghostnetv2_100",
        "hrnet_w18_small", "efficientformer_l1@224", "efficientformerv2_s0@224", "fastvit_t8", "repvit_m1",
        "crossvit_tiny_240@240", "pit_ti_224@224", "twins_svt_small@224", "pvt_v2_b0",
        "swin_tiny_patch4_window7_224@224", "maxvit_tiny_tf_224@224", "mvitv2_tiny@224", "nfnet_l0", "dla34",
        "dpn48b", "cspresnet50", "cspdarknet53", "rexnet_100", "lcnet_050", "tinynet_e", "mixnet_s", "fbnetv3_b",
        "hardcorenas_a", "res2net50_14w_8s", "selecsls42b", "ese_vovnet19b_dw", "tresnet_m", "gernet_s",
        "regnety_002", "resnetv2_18", "densenet121", "inception_v3@96", "xception41", "eva02_tiny_patch14_224@224",
        "flexivit_small@240", "volo_d1_224@224", "sequencer2d_s@224", "gcvit_xxtiny@224", "davit_tiny@224",
        "focalnet_tiny_srf@224", "inception_next_atto", "efficientvit_b0@224", "tiny_vit_5m_224@224"]
HF = list(M._HF)


def sample():
    """(label, builder) for every model of the sweep."""
    out = [(f"tv/{n}", (lambda n=n: M.tv_model(n, 224 if n.startswith(("vit", "maxvit", "swin")) else
                                                96 if n.startswith("inception") else 64))) for n in TV]
    out += [(f"tv/{n}", (lambda n=n: M.tv_segmentation(n, 64))) for n in TV_SEG]
    out += [(f"timm/{n.split('@')[0]}", (lambda n=n: M.timm_model(n.split("@")[0], int(n.split("@")[1])
                                                                   if "@" in n else 64))) for n in TIMM]
    out += [(f"hf/{n}", (lambda n=n: M.hf_model(n))) for n in HF]
    return out


def rel_err(a, b) -> float:
    from torch.utils import _pytree as pytree
    xa = [t for t in pytree.tree_leaves(a) if isinstance(t, torch.Tensor)]
    xb = [t for t in pytree.tree_leaves(b) if isinstance(t, torch.Tensor)]
    if len(xa) != len(xb):
        return float("inf")
    worst = 0.0
    for x, y in zip(xa, xb):
        if x.shape != y.shape:
            return float("inf")
        scale = float(x.detach().abs().max()) or 1.0
        worst = max(worst, float((x.detach().double() - y.detach().double()).abs().max()) / scale)
    return worst


def call(model, inputs):
    with torch.no_grad():
        return model(**inputs) if isinstance(inputs, dict) else model(*inputs)


def one(label, build, do_optimize=True) -> dict:
    """Trace, count opaque nodes, optimize and verify on a fresh input."""
    import aiacc
    row = {"model": label, "traced": False, "opaque": None, "verified": None, "error": "", "reasons": {}}
    t0 = time.time()
    try:
        model, x, fresh = build()
    except ImportError as e:
        row["error"] = f"skipped: {e}"
        return row
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            g = aiacc.trace(model, x)
        opaque = [n for n in g.nodes if n.domain == "torch"]
        row["traced"], row["opaque"] = True, len(opaque)
        row["reasons"] = dict(list(g.meta.get("torch.opaque_reasons", {}).items())[:3])
        if do_optimize:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fast = aiacc.optimize(model, x)
            err = rel_err(call(model, fresh), call(fast, fresh))
            row["verified"] = err <= 1e-4
            row["err"] = err
            if type(call(fast, fresh)) is not type(call(model, fresh)):
                row["error"] = f"return type {type(call(fast, fresh)).__name__}"
    except Exception as e:  # noqa: BLE001 - a sweep reports every failure and goes on
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
    row["s"] = time.time() - t0
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated substrings of model labels")
    ap.add_argument("--trace-only", action="store_true", help="skip optimize/verify")
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    rows = []
    for label, build in progress.track(sample(), "reach", label=lambda item: item[0]):
        if args.only and not any(s in label for s in args.only.split(",")):
            continue
        r = one(label, build, not args.trace_only)
        rows.append(r)
        print(f"{r['model']:36s} traced={'ok' if r['traced'] else 'FAIL':4s} opaque={r['opaque']!s:4s} "
              f"verified={r['verified']!s:5s} {r.get('s', 0):5.1f}s {r['error']} "
              f"{'' if r['opaque'] in (0, None) else r['reasons']}", flush=True)
    whole = sum(1 for r in rows if r["opaque"] == 0)
    ok = sum(1 for r in rows if r["verified"])
    print(f"# {len(rows)} models: {whole} traced whole (0 opaque), {ok} verified, "
          f"{sum(r['opaque'] or 0 for r in rows)} opaque nodes in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
