"""ONNX's own backend test suite (onnx.backend.test node cases) run against aiacc's ONNX backend.

Included: every node case whose graph uses only ops of the issue-2 list (single-op cases and the
`_expanded` function-body variants built from those ops), and the small converted models shipped with onnx
(pytorch-converted, pytorch-operator, simple) made only of those ops, on CPU. Only those cases are collected;
the excluded ones among them (listed below) are reported as skipped with their reason. Cases outside the op list
and the CUDA variants are not collected at all, so the summary counts what ran.
The cases come from the python definitions shipped with onnx (no data download).
"""
from __future__ import annotations

import re
import unittest
import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

import onnx.backend.test  # noqa: E402
from onnx.backend.test.loader import load_model_tests  # noqa: E402

import aiacc.backends.onnx_conformance as aiacc_backend  # noqa: E402

ISSUE_OPS = set("""
Conv ConvTranspose BatchNormalization Relu LeakyRelu PRelu Elu Sigmoid Tanh HardSigmoid HardSwish Clip Gelu Softplus
Erf Add Sub Mul Div Pow Sqrt Exp Log Neg Abs Reciprocal MatMul Gemm MaxPool AveragePool GlobalAveragePool
GlobalMaxPool LRN Flatten Reshape Transpose Squeeze Unsqueeze Concat Split Slice Gather Pad Softmax LogSoftmax
ReduceMean ReduceSum ReduceMax LayerNormalization Dropout Identity Cast Shape Constant Expand Where Equal Less
Greater Resize
""".split())

# name pattern -> reason. Every exclusion is a type that is not a numeric tensor: the IR holds numeric tensors
# only (bfloat16, float8, float4, int4 and int2 are ml_dtypes' numpy dtypes and run).
EXCLUDED = {
    r"test_cast(like)?_.*(STRING|string)": "string tensors are not supported by the numeric IR",
    r"test_equal_string": "string tensors are not supported by the numeric IR",
    r"test_identity_(opt|sequence)": "optional and sequence types are not tensors; the IR holds tensors only",
}

# ml_dtypes float types numpy's isclose cannot promote with a Python float (the runner widens bfloat16 only)
_WIDENED = {"float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu",
            "float4_e2m1fn"}


class _Runner(onnx.backend.test.BackendTest):
    """onnx's runner with one repair to its comparison: an expected float8/float4 output is checked for the
    same dtype, then compared as float32 (every such value is exact in float32) with the case's own rtol/atol.
    With numpy < 2 the runner's assert_allclose raises DTypePromotionError on these dtypes for any backend."""

    @classmethod
    def assert_similar_outputs(cls, ref_outputs, outputs, rtol, atol, model_dir=None):
        if len(ref_outputs) == len(outputs):
            ref_outputs, outputs = list(ref_outputs), list(outputs)
            for i, ref in enumerate(ref_outputs):
                if isinstance(ref, np.ndarray) and ref.dtype.name in _WIDENED:
                    np.testing.assert_equal(outputs[i].dtype, ref.dtype)
                    ref_outputs[i], outputs[i] = ref.astype(np.float32), outputs[i].astype(np.float32)
        super().assert_similar_outputs(ref_outputs, outputs, rtol, atol, model_dir=model_dir)


def _selected_cases() -> list[str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = load_model_tests(kind="node")
    return sorted(c.name for c in cases if {n.op_type for n in c.model.graph.node} <= ISSUE_OPS)


def _selected_model_cases() -> list[str]:
    """The small converted models shipped with onnx (pytorch-converted, pytorch-operator, simple; opsets 6 to 9,
    so they also exercise the importer's opset upgrades) whose ops are all in the list."""
    import os

    names = []
    for kind in ("pytorch-converted", "pytorch-operator", "simple"):
        for c in load_model_tests(kind=kind):
            if c.model_dir is None:
                continue
            m = onnx.load(os.path.join(c.model_dir, "model.onnx"))
            if {n.op_type for n in m.graph.node} <= ISSUE_OPS:
                names.append(c.name)
    return sorted(names)


SELECTED = _selected_cases()
SELECTED_MODELS = _selected_model_cases()


def _excluded(name: str) -> str | None:
    for pattern, reason in EXCLUDED.items():
        if re.search(pattern, name):
            return reason
    return None


# collected test name -> reason to skip it (None: it runs)
CASES = {f"{n}_cpu": _excluded(n) for n in SELECTED}
CASES.update({f"{n}_cpu": None for n in SELECTED_MODELS})


def _collected_classes() -> dict[str, type[unittest.TestCase]]:
    """The runner's generated unittest classes, keeping only the methods named in CASES (the runner would emit
    every case it knows, marking the rest as skipped); classes left with no case are dropped."""
    classes = {}
    for class_name, case in _Runner(aiacc_backend, __name__).test_cases.items():
        for attr in [a for a in vars(case) if a.startswith("test_")]:
            if attr not in CASES:
                delattr(case, attr)
            elif CASES[attr] is not None:
                setattr(case, attr, unittest.skip(CASES[attr])(getattr(case, attr)))
        if any(a.startswith("test_") for a in vars(case)):
            classes[class_name] = case
    return classes


# the unittest classes the runner generates (OnnxBackendNodeModelTest, ...), collected by pytest
COLLECTED = _collected_classes()
globals().update(COLLECTED)


def test_selection_is_broad():
    """The suite covers every op of the list that ONNX has node cases for, and most cases run."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = load_model_tests(kind="node")
    covered = {n.op_type for c in cases if c.name in SELECTED for n in c.model.graph.node}
    assert covered == ISSUE_OPS
    run = [n for n in SELECTED if _excluded(n) is None]
    assert len(run) >= 400, len(run)
    # only the non-numeric cases skip (strings, optionals, sequences): every numeric dtype and seeded Dropout runs
    assert sorted(set(SELECTED) - set(run)) == ["test_equal_string", "test_equal_string_broadcast",
                                                "test_identity_opt", "test_identity_sequence"]
    assert len(SELECTED_MODELS) >= 100, len(SELECTED_MODELS)


def test_every_selected_case_is_collected():
    """Each selected name is a case the onnx runner generated, so none of them silently vanishes."""
    collected = {a for case in COLLECTED.values() for a in vars(case) if a.startswith("test_")}
    assert collected == set(CASES), sorted(set(CASES) ^ collected)[:10]


def test_old_module_name_reexports_the_backend():
    """`aiacc.onnx_backend` (the module's former home) still gives the same backend."""
    import aiacc.onnx_backend as old

    assert old.AiaccBackend is aiacc_backend.AiaccBackend and old.prepare is aiacc_backend.prepare
