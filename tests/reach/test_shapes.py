"""Other input shapes than the example's (aiacc/plugins/torch/shapes.py): an optimized module called at another
batch size or sequence length gives the original's outputs (a specialization optimized for those shapes at the
first such call, warned once, listed in the report, dispatched to by shape), up to max_shapes; beyond it, after
torch.save/load, and on a dimension dynamic_shapes keeps static, an aiacc ShapeError naming the input and the
dimension, never a raw error from inside the graph."""
from __future__ import annotations

import copy
import io
import warnings

import pytest

torch = pytest.importorskip("torch")

import aiacc  # noqa: E402
from aiacc.errors import AiaccWarning, ShapeError  # noqa: E402
from tests.reach import _models  # noqa: E402


def _optimize(model, inputs, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return aiacc.optimize(model, inputs, **kw)


def _tokens(vocab, batch, seq, seed):
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(batch, seq, dtype=torch.int64)
    mask[0, seq - 2:] = 0
    return {"input_ids": torch.randint(0, vocab, (batch, seq), generator=g), "attention_mask": mask}


def _call(fast, inputs):
    return fast(**inputs) if isinstance(inputs, dict) else fast(*inputs)


def _assert_same(fast, model, inputs, new: bool):
    """fast(inputs) equals model(inputs) within 1e-4, as the same output type; a new specialization is warned
    (once), a known one is not."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = _call(fast, inputs)
    said = [w for w in seen if issubclass(w.category, AiaccWarning) and "optimizing it again" in str(w.message)]
    assert len(said) == (1 if new else 0), [str(w.message) for w in seen]
    with torch.no_grad():
        want = _call(model, inputs)
    assert type(got) is type(want)
    for k in (want.keys() if hasattr(want, "keys") else [None]):
        a, b = (got[k], want[k]) if k is not None else (got, want)
        if isinstance(b, torch.Tensor):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_hf_text_models_at_other_batch_sizes_and_sequence_lengths(name):
    model, x, _ = _models.hf_model(name, batch=2, seq=16)
    vocab = model.config.vocab_size
    fast = _optimize(model, x)
    _assert_same(fast, model, _tokens(vocab, 2, 16, 1), new=False)  # the example's shapes: the module itself
    for batch, seq in [(2, 32), (3, 16), (1, 7)]:  # (2, 32) was torch's RuntimeError from a folded constant
        _assert_same(fast, model, _tokens(vocab, batch, seq, seq), new=True)
    _assert_same(fast, model, _tokens(vocab, 2, 32, 5), new=False)  # cached: no new optimize, no warning
    shapes = fast.aiacc_report.shapes
    assert shapes[0].startswith("optimized for input_ids [2, 16], attention_mask [2, 16]") and len(shapes) == 4
    assert "specialization 2 built at the first call with input_ids [2, 32], attention_mask [2, 32]" in shapes[1]


def test_vit_at_other_batch_sizes():
    model, x, _ = _models.hf_model("vit", batch=2)
    fast = _optimize(model, x)
    for batch in (3, 1):
        pixels = torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(batch))
        _assert_same(fast, model, {"pixel_values": pixels}, new=not fast.aiacc_report.shapes[0].endswith(
            "(any batch size); a call at other shapes is optimized again for them (up to max_shapes=8 in all), "
            "then a ShapeError"))


def test_torchvision_cnn_runs_any_batch_and_specializes_an_image_size():
    model, (x,), _ = _models.tv_model("resnet18", size=64)
    fast = _optimize(model, (x,))
    assert "(any batch size)" in fast.aiacc_report.shapes[0]  # verify's second-batch check found it right
    _assert_same(fast, model, (torch.randn(3, 3, 64, 64),), new=False)
    _assert_same(fast, model, (torch.randn(1, 3, 80, 80),), new=True)
    _assert_same(fast, model, (torch.randn(4, 3, 80, 80),), new=False)  # that one takes any batch size too


def _seq_model():
    torch.manual_seed(0)

    class Seq(torch.nn.Module):  # a position table sliced to the sequence length: a constant of the trace
        def __init__(self):
            super().__init__()
            self.pos = torch.nn.Parameter(torch.randn(64, 8))
            self.fc = torch.nn.Linear(8, 8)

        def forward(self, x):
            return self.fc(torch.relu(x + self.pos[: x.shape[1]]))
    return Seq().eval()


def test_beyond_max_shapes_a_shape_error_names_the_input_the_dimension_and_what_was_built():
    model = _seq_model()
    fast = _optimize(model, (torch.randn(2, 6, 8),), max_shapes=2)
    with pytest.warns(AiaccWarning, match=r"Seq called with x \[2, 9, 8\] \(optimized for x \[2, 6, 8\]\): "
                                          r"optimizing it again .*specialization 2 of at most 2"):
        fast(torch.randn(2, 9, 8))
    with pytest.raises(ShapeError, match=r"Seq: input 'x' of shape \[2, 12, 8\]: its dimension 1 must be 6, the "
                                         r"size the model was built for \(built: x \[2, 6, 8\] \(any batch size\); x \[2, 9, "
                                         r"8\] \(any batch size\)\); max_shapes=2 specialization\(s\) are built"):
        fast(torch.randn(2, 12, 8))
    with pytest.raises(ShapeError, match=r"input 'x' of shape \[2, 6\] has 2 dimensions, the model was built for "
                                         r"\[2, 6, 8\]"):
        fast(torch.randn(2, 6))
    one = _optimize(model, (torch.randn(2, 6, 8),), max_shapes=1)
    with pytest.raises(ShapeError, match=r"its dimension 1 must be 6.*max_shapes=1: it is not optimized again"):
        one(torch.randn(2, 7, 8))
    with pytest.raises(aiacc.errors.OptionError, match="max_shapes=0"):
        aiacc.optimize(model, (torch.randn(2, 6, 8),), max_shapes=0)


def test_save_and_load_keep_the_module_and_its_guard():
    model = _seq_model()
    fast = _optimize(model, (torch.randn(2, 6, 8),))
    x9 = torch.randn(3, 9, 8)
    with pytest.warns(AiaccWarning):
        fast(x9)
    buf = io.BytesIO()
    torch.save(fast, buf)  # the specializations and the original model are not saved with it
    loaded = torch.load(io.BytesIO(buf.getvalue()), weights_only=False)
    x = torch.randn(5, 6, 8)
    torch.testing.assert_close(loaded(x), model(x), rtol=1e-4, atol=1e-4)
    with pytest.raises(ShapeError, match=r"input 'x' of shape \[3, 9, 8\]: its dimension 1 must be 6.*does not "
                                         r"hold the original model"):
        loaded(x9)
    torch.testing.assert_close(fast(x9), model(x9), rtol=1e-4, atol=1e-4)  # the live module still has it
    twin = copy.deepcopy(fast)  # a deep copy keeps its guard and builds specializations of its own
    with pytest.warns(AiaccWarning, match="optimizing it again"):
        torch.testing.assert_close(twin(x9), model(x9), rtol=1e-4, atol=1e-4)
    with pytest.raises(ShapeError, match=r"Seq: called with x \[2, 6, 7\] \(optimized for x \[2, 6, 8\]\): "
                                         r"optimizing the original for these shapes failed: .*fails on inputs"):
        twin(torch.randn(2, 6, 7))  # the original does not run there either


def test_train_mode_specializations_share_the_modules_parameters():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    pos = torch.randn(64, 8)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = model

        def forward(self, x):
            return self.body(x + pos[: x.shape[1]])
    net = Net().train()
    fast = _optimize(net, (torch.randn(2, 6, 8),), mode="train", framework_compile=False)
    with pytest.warns(AiaccWarning, match="optimizing it again"):
        fast(torch.randn(2, 9, 8)).sum().backward()
    (_, spec), = fast._compiled_call_impl.specs
    mine = dict(fast.named_parameters())
    assert mine and all(p is mine[k] for k, p in spec.named_parameters())
    assert all(p.grad is not None for p in fast.parameters())  # the call at the new shape trained these


def test_dynamic_shapes_say_which_dimensions_may_vary():
    Dim = torch.export.Dim
    model = _seq_model()
    fast = _optimize(model, (torch.randn(2, 6, 8),), dynamic_shapes={"x": {1: Dim("seq", min=2, max=16)}})
    assert "dynamic_shapes: x[1] may vary" in fast.aiacc_report.shapes[0]
    x = torch.randn(2, 10, 8)
    with pytest.warns(AiaccWarning, match="optimizing it again"):
        torch.testing.assert_close(fast(x), model(x), rtol=1e-4, atol=1e-4)
    with pytest.raises(ShapeError, match=r"input 'x' of shape \[2, 20, 8\]: its dimension 1 is 20, outside 2..16"):
        fast(torch.randn(2, 20, 8))
    with pytest.raises(ShapeError, match=r"input 'x' of shape \[2, 6, 4\]: its dimension 2 must be 8.*"
                                         r"dynamic_shapes does not mark dimension 2 of 'x' dynamic"):
        fast(torch.randn(2, 6, 4))
    with pytest.raises(ShapeError, match=r"its dimension 2 must be 8.*dynamic_shapes does not mark dimension 2"):
        fast(torch.randn(2, 11, 4))  # the marked dimension differs too: every dimension is checked
    with pytest.raises(aiacc.errors.OptionError, match=r"dimension 3 of 'x'"):
        aiacc.optimize(model, (torch.randn(2, 6, 8),), dynamic_shapes={"x": {3: Dim("d")}})


def test_dynamic_shapes_reach_torch_export():
    Dim = torch.export.Dim

    class Fixed(torch.nn.Module):  # adds a table of the example's length: its code fixes dimension 1
        def __init__(self):
            super().__init__()
            self.pos = torch.nn.Parameter(torch.randn(6, 8))

        def forward(self, x):
            return torch.relu(x + self.pos)
    fast = _optimize(Fixed().eval(), (torch.randn(2, 6, 8),), frontend="export",
                     dynamic_shapes={"x": {1: Dim("seq")}})
    assert any("export with the given dynamic_shapes failed" in f for f in fast.aiacc_report.fallbacks)
    model, x, _ = _models.hf_model("bert", batch=2, seq=16)
    seq = Dim("seq", min=2, max=64)
    fast = _optimize(model, x, frontend="export",
                     dynamic_shapes={"input_ids": {1: seq}, "attention_mask": {1: seq}})
    _assert_same(fast, model, _tokens(model.config.vocab_size, 2, 24, 3), new=True)


def test_a_specializations_own_fallback_is_warned_and_reported():
    torch.manual_seed(0)

    class Branch(torch.nn.Module):  # long sequences take a path with an op aiacc keeps opaque (kthvalue)
        def forward(self, x):
            if x.shape[1] > 8:
                return x - torch.kthvalue(x, 2, dim=1, keepdim=True).values
            return x * 2.0

    model = Branch().eval()
    fast = _optimize(model, (torch.randn(2, 6),))
    assert not fast.aiacc_report.fallbacks
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = fast(torch.randn(2, 12))
    said = [str(w.message) for w in seen if issubclass(w.category, AiaccWarning)]
    assert any("specialization 2 (x [2, 12])" in m and "kthvalue" in m for m in said), said
    assert any("kthvalue" in f for f in fast.aiacc_report.fallbacks), fast.aiacc_report.fallbacks
    x = torch.randn(2, 12)
    torch.testing.assert_close(fast(x), model(x))
    assert got.shape == (2, 12)
