"""Golden IR text of the catalogue's test-size models (aiacc.zoo.small.<fw>_models) that are cheap to import.

For each model: the canonical IR (import + canonicalize) and its level-2 optimization, printed with
canonical_text, must equal tests/golden/zoo/<fw>_<model>.{canonical,opt2}.txt; canonicalization and level 2
must keep the imported graph's outputs (reference executor). A change in an importer or a pass shows up as a
reviewable diff of these files; regenerate with `pytest tests/crossframework --update-goldens`.
"""
from __future__ import annotations

import numpy as np
import pytest

from aiacc.core.canonical_text import canonical_text
from aiacc.core.passes import canonicalize, random_feeds, run_passes
from aiacc.core.runtime.executor import run
from tests.golden import check as check_golden

# (framework, model): small models only, and none with opaque parts (their attributes hold framework
# payloads that are not meant to be stable text)
MODELS = [("caffe", n) for n in ("lenet", "resnet", "squeezenet", "alexnet")] + \
         [("torch", n) for n in ("resnet18", "mobilenet_v2", "bert_encoder", "mlp")] + \
         [("mxnet", n) for n in ("mlp", "bert_encoder")] + \
         [("tf", n) for n in ("mlp", "small_cnn")]


def _trace(fw: str, name: str):
    import aiacc
    from aiacc.zoo import small

    zoo = small.module(fw)
    if fw == "caffe":
        return aiacc.trace(zoo.build(name), None)
    model, ex = (zoo.TF_ZOO if fw == "tf" else zoo.ZOO)[name]()
    return aiacc.trace(model, ex)


def _outputs(g, feeds):
    out = run(g, feeds)
    return [out[v.name] for v in g.outputs]


@pytest.mark.parametrize("fw,name", MODELS, ids=[f"{fw}-{n}" for fw, n in MODELS])
def test_zoo_golden(fw, name, update_goldens):
    g = _trace(fw, name)
    feeds = random_feeds(g, seed=3)
    expected = _outputs(g, feeds)
    canonicalize(g)
    g.verify()
    layout = g.meta.get("canonical_layout", {})
    cfeeds = {k: (np.ascontiguousarray(a.transpose(layout[k]["input_perm"]))
                  if "input_perm" in layout.get(k, {}) else a) for k, a in feeds.items()}
    outs_layout = [layout.get(v.name, {}).get("output_perm") for v in g.outputs]
    got = _outputs(g, cfeeds)
    for i, (e, a, perm) in enumerate(zip(expected, got, outs_layout)):
        e = e.transpose(perm) if perm else e
        np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-4 * max(1.0, float(np.max(np.abs(e)))),
                                   err_msg=f"{fw}/{name}: canonicalize changed output {i}")
    check_golden(f"zoo/{fw}_{name}.canonical.txt", canonical_text(g), update_goldens)
    run_passes(g, level=2)
    g.verify()
    for i, (e, a) in enumerate(zip(got, _outputs(g, cfeeds))):
        np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-4 * max(1.0, float(np.max(np.abs(e)))),
                                   err_msg=f"{fw}/{name}: level 2 changed output {i}")
    check_golden(f"zoo/{fw}_{name}.opt2.txt", canonical_text(g), update_goldens)
