"""One spelling of the optimize modes everywhere: "train" (alias "training") and "inference",
in the pass manager and in every plugin; an unknown mode is one aiacc error listing the accepted names."""
import pytest

from aiacc.core.ir import Graph
from aiacc.core.passes import run_passes
from aiacc.core.passes.manager import MODES, PassContext, get_pass, normalize_mode, pipeline, skipped_passes
from aiacc.errors import AiaccError
from aiacc.plugins.base import Plugin


def test_one_spelling_and_aliases():
    assert MODES == ("inference", "train")
    assert normalize_mode("train") == normalize_mode("training") == "train"
    assert normalize_mode("inference") == "inference"
    assert PassContext("training").mode == "train"


@pytest.mark.parametrize("bad", ["Train", "fit", "eval", "", None, 1])
def test_unknown_mode_lists_the_accepted_ones(bad):
    with pytest.raises(AiaccError, match=r"unknown mode .*accepted: 'inference', 'train', 'training'\)"):
        normalize_mode(bad)


def test_pipeline_same_for_both_spellings():
    for level in range(4):
        assert [p.name for p in pipeline(level, "train")] == [p.name for p in pipeline(level, "training")]
    assert get_pass("batchnorm_folding").applies("inference")
    assert not get_pass("batchnorm_folding").applies("training")
    assert get_pass("gelu_recognition").applies("train")


def _tiny() -> Graph:
    g = Graph("tiny")
    x = g.add_input("x", "float32", (2, 4))
    g.add_output(g.op("Relu", x))
    return g


def test_report_says_which_passes_training_skips_and_why():
    report = run_passes(_tiny(), level=3, mode="training")
    assert report.mode == "train"
    assert "batchnorm_folding" in report.skipped and "batch" in report.skipped["batchnorm_folding"]
    assert "affine_folding" in report.skipped and "elementwise_fusion" in report.skipped
    kept = {r.name for r in report.records}
    assert {"gelu_recognition", "layernorm_recognition", "gemm_fusion", "conv_fusion"} <= kept
    assert not kept & set(report.skipped)
    assert report.as_dict()["skipped"] == report.skipped
    assert "skipped in training mode" in str(report)
    assert skipped_passes(2, "inference") == {}
    assert "skipped" not in run_passes(_tiny(), level=2).as_dict()


def test_plugin_without_training_refuses_train_naming_the_framework():
    class NoTrain(Plugin):
        name, title = "x", "Caffe"

    with pytest.raises(AiaccError, match="Caffe plugin has no mode='train'"):
        NoTrain().check_mode("training")
    with pytest.raises(AiaccError, match="unknown mode 'learn'"):
        NoTrain().check_mode("learn")
    assert NoTrain().check_mode(None) == "inference"


@pytest.mark.parametrize("plugin", ["torch", "tf", "mxnet"])
def test_frameworks_train_in_both_spellings(plugin):
    import importlib

    p = importlib.import_module(f"aiacc.plugins.{plugin}.translator").PLUGIN
    assert p.check_mode("train") == p.check_mode("training") == "train"
    with pytest.raises(AiaccError, match="unknown mode 'trian'"):
        p.check_mode("trian")
