"""JSON + .npz save/load of graphs."""
from __future__ import annotations

import json

import numpy as np
import pytest

from aiacc import examples
from aiacc.core import parse
from aiacc.core.serialize import load, save
from aiacc.errors import ParseError


def test_bert_round_trip(tmp_path):
    from aiacc.core.onnx import from_onnx

    g = from_onnx(examples.bert_encoder_onnx())
    path = tmp_path / "bert.json"
    wpath = save(g, path)
    assert wpath.endswith("bert.npz")
    g2 = load(path)
    g2.verify()
    assert g2.equals(g) and str(g2) == str(g)


def test_attributes_opaque_nodes_and_odd_names(tmp_path):
    text = """graph g(%"a:0": float32[N,4]) {
  %k: int64[2] = Constant<c>() {value=tensor<int64[2]>[2, 2]}
  %y: float32[*] = vendor::Thing<t>(%"a:0", _, %k) {f=0.5, fs=[1.0, 2.5], i=3, s="x", ss=["p", "q"]}
  return %y
}
"""
    g = parse(text)
    save(g, tmp_path / "g.json")
    g2 = load(tmp_path / "g.json")
    assert str(g2) == text
    assert isinstance(g2.nodes[1].attrs["f"], float) and isinstance(g2.nodes[1].attrs["i"], int)


def test_malformed_files_raise_parse_errors(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text("{not json")
    with pytest.raises(ParseError, match="bad.json: not valid JSON"):
        load(p)
    p.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(ParseError, match="not an aiacc graph"):
        load(p)
    g = parse("graph g(%x: float32[2]) {\n  %w: float32[20] = const\n  %y: float32[20] = Relu<r>(%w)\n  return %y\n}",
              {"w": np.ones(20, np.float32)})
    save(g, tmp_path / "g.json")
    (tmp_path / "g.npz").unlink()
    with pytest.raises(ParseError, match="weights for initializer 'w' are missing"):
        load(tmp_path / "g.json")
