"""Cross-framework regression suite: one architecture, every framework, one IR.

For each shared architecture (tests/zoo/shared_arch.py: MLP, LeNet, ResNet-style, BERT-style layer) and
each framework that can express it (torch, tf, mxnet, caffe; ONNX as the reference):

- the importers give the same canonical IR text (after `canonicalize`, printed by `canonical_text`), equal to
  the golden file tests/golden/shared/<arch>.canonical.txt; level-2 optimization of any of them gives the same
  text again, equal to tests/golden/shared/<arch>.opt2.txt;
- every framework's model computes the same outputs as onnxruntime on the ONNX reference (same weights,
  inputs converted to the framework's layout);
- the imported graph, its canonical form and its level-2 optimization compute those outputs on the reference
  executor, and onnxruntime computes them on their ONNX exports (aiacc.core.onnx.to_onnx);
- aiacc.optimize(model) returns a model of the same framework that computes them too.

Regenerate the goldens with `pytest tests/crossframework --update-goldens` (see tests/golden/__init__.py).
"""
from __future__ import annotations

import functools

import numpy as np
import pytest

from aiacc.core.canonical_text import canonical_text
from aiacc.core.passes import canonicalize, run_passes
from aiacc.core.runtime.executor import run
from tests.golden import check as check_golden
from tests.zoo import shared_arch as sa

# outputs are O(1); float32 arithmetic in different orders (and folded BatchNorm) agrees to ~1e-6
RTOL, ATOL = 1e-4, 1e-5

PAIRS = [(a, fw) for a in sa.ARCHS for fw in sa.FRAMEWORKS[a] if fw != "onnx"]


def _close(actual, expected, what: str) -> None:
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    scale = float(np.max(np.abs(expected)))
    err = float(np.max(np.abs(actual.astype(np.float64) - expected)))
    assert err <= ATOL + RTOL * scale, f"{what}: differs by {err:.3g} (max |expected| {scale:.3g})"


# ------------------------------------------------------------------------------------- shared, cached work
@functools.lru_cache(maxsize=None)
def built(arch: str, fw: str):
    return sa.build(arch, fw)


@functools.lru_cache(maxsize=None)
def reference_output(arch: str) -> np.ndarray:
    """onnxruntime on the ONNX reference model, canonical input."""
    model, feeds = built(arch, "onnx")
    return sa.run_model("onnx", model, feeds)


def framework_array(arch: str, fw: str) -> np.ndarray:
    """The example input as a numpy array in the framework's layout."""
    x = sa.canonical_input(arch)
    return np.ascontiguousarray(x.transpose(0, 2, 3, 1)) if fw == "tf" and sa.ARCHS[arch].image else x


def traced(arch: str, fw: str):
    """A fresh import of the framework model into the IR."""
    model, ex = built(arch, fw)
    if fw == "onnx":
        from aiacc.core.onnx import from_onnx

        return from_onnx(model)
    import aiacc

    return aiacc.trace(model, ex)


@functools.lru_cache(maxsize=None)
def _canonical(arch: str, fw: str):
    g = traced(arch, fw)
    canonicalize(g, input_shapes=[sa.ARCHS[arch].input_shape])
    g.verify()
    return g


def canonical(arch: str, fw: str):
    return _canonical(arch, fw).copy()


@functools.lru_cache(maxsize=None)
def optimized_canonical(arch: str, fw: str):
    g = canonical(arch, fw)
    run_passes(g, level=2)
    g.verify()
    return g


def ort_run(graph, feeds: dict) -> list[np.ndarray]:
    import onnxruntime as ort

    from aiacc.core.onnx import to_onnx

    sess = ort.InferenceSession(to_onnx(graph).SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


# ------------------------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("arch", list(sa.ARCHS))
def test_importers_agree_on_canonical_ir(arch, update_goldens):
    """Every importer, after canonicalization, prints the same IR text as the ONNX reference."""
    texts = {fw: canonical_text(canonical(arch, fw)) for fw in sa.FRAMEWORKS[arch]}
    ref = texts["onnx"]
    for fw, text in texts.items():
        assert text == ref, f"{arch}: the {fw} importer's canonical IR differs from ONNX's:\n{text}\nvs\n{ref}"
    check_golden(f"shared/{arch}.canonical.txt", ref, update_goldens)


@pytest.mark.parametrize("arch", list(sa.ARCHS))
def test_optimized_ir_agrees(arch, update_goldens):
    """Level 2 on any importer's canonical graph gives the same IR (kept as a golden file)."""
    texts = {fw: canonical_text(optimized_canonical(arch, fw)) for fw in sa.FRAMEWORKS[arch]}
    ref = texts["onnx"]
    for fw, text in texts.items():
        assert text == ref, f"{arch}: level 2 on the {fw} import differs from level 2 on ONNX's:\n{text}\nvs\n{ref}"
    check_golden(f"shared/{arch}.opt2.txt", ref, update_goldens)


@pytest.mark.parametrize("arch,fw", PAIRS)
def test_framework_models_agree(arch, fw):
    """The framework's own runtime computes what onnxruntime computes on the reference model."""
    model, ex = built(arch, fw)
    _close(sa.run_model(fw, model, ex), reference_output(arch), f"{arch}/{fw} vs the ONNX reference")


@pytest.mark.parametrize("arch,fw", PAIRS + [(a, "onnx") for a in sa.ARCHS])
def test_ir_numerics(arch, fw):
    """Imported, canonical and optimized graphs compute the reference outputs, on the reference executor and
    on onnxruntime via their ONNX export."""
    expected = reference_output(arch)
    g = traced(arch, fw)
    feeds = {g.inputs[0].name: framework_array(arch, fw)}
    _close(run(g, feeds)[g.outputs[0].name], expected, f"{arch}/{fw} imported graph (reference executor)")
    _close(ort_run(g, feeds)[0], expected, f"{arch}/{fw} imported graph exported to ONNX (onnxruntime)")
    for what, cg in (("canonical", canonical(arch, fw)), ("optimized", optimized_canonical(arch, fw))):
        cfeeds = {cg.inputs[0].name: sa.canonical_input(arch)}  # the canonical graph reads NCHW
        _close(run(cg, cfeeds)[cg.outputs[0].name], expected, f"{arch}/{fw} {what} graph (reference executor)")
        _close(ort_run(cg, cfeeds)[0], expected, f"{arch}/{fw} {what} graph exported to ONNX (onnxruntime)")


@pytest.mark.parametrize("arch,fw", PAIRS)
def test_optimize_keeps_outputs(arch, fw):
    """aiacc.optimize (level 2) returns a model of the same framework computing the reference outputs."""
    import aiacc

    model, ex = built(arch, fw)
    fast = aiacc.optimize(model, ex, level=2, verify=False)  # compared here, against ONNX's numbers
    _close(sa.run_model(fw, fast, ex), reference_output(arch), f"{arch}/{fw} after aiacc.optimize")


def test_canonical_layout_is_recorded():
    """TF's NHWC image input becomes an NCHW input of the canonical graph, and the graph says so."""
    g = canonical("lenet", "tf")
    assert g.inputs[0].shape == sa.ARCHS["lenet"].input_shape
    assert g.meta["canonical_layout"] == {g.inputs[0].name: {"input_perm": [0, 3, 1, 2]}}
    assert not g.find_nodes("Transpose")


def test_optimization_changes_the_graph():
    """The optimized goldens are not the canonical ones: level 2 really folds BatchNorm into Conv and fuses."""
    for arch in ("resnet", "lenet"):
        before, after = canonical(arch, "onnx"), optimized_canonical(arch, "onnx")
        assert len(after) < len(before)
    assert not optimized_canonical("resnet", "onnx").find_nodes("BatchNormalization")
