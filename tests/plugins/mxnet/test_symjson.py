"""The symbol JSON reader/writer and MXNet's string attributes."""
import json
import subprocess
import sys

import numpy as np
import pytest

from aiacc.errors import ParseError
from aiacc.plugins.mxnet.symjson import (MxNode, attr_bool, attr_float, attr_int, attr_tuple, format_attr,
                                         parse_symbol_json)


def node(**attrs):
    return MxNode(0, "Op", "n0", {k: v for k, v in attrs.items()})


@pytest.mark.parametrize("text,expected", [("(3, 3)", (3, 3)), ("(1L, 2L)", (1, 2)), ("[4,5]", (4, 5)),
                                           ("(3,)", (3,)), ("7", (7,)), ("()", ())])
def test_tuples(text, expected):
    assert attr_tuple(node(k=text), "k") == expected


def test_tuples_with_none_and_defaults():
    assert attr_tuple(node(k="(None, 1, -2)"), "k", allow_none=True) == (None, 1, -2)
    assert attr_tuple(node(), "k", (1, 1)) == (1, 1)
    assert attr_tuple(node(k="None"), "k", (0,)) == (0,)
    with pytest.raises(ParseError, match=r"node 'n0' \(Op\): attribute k='\(None, 1\)' holds None"):
        attr_tuple(node(k="(None, 1)"), "k")


@pytest.mark.parametrize("text,expected", [("True", True), ("False", False), ("1", True), ("0", False),
                                           ("true", True)])
def test_bools(text, expected):
    assert attr_bool(node(k=text), "k", not expected) is expected


def test_numbers():
    assert attr_float(node(k="1e-05"), "k") == 1e-05
    assert attr_float(node(k="-inf"), "k") == -np.inf
    assert attr_int(node(k="64"), "k") == 64
    assert attr_int(node(k="3.0"), "k") == 3
    with pytest.raises(ParseError, match="not an integer"):
        attr_int(node(k="2.5"), "k")
    with pytest.raises(ParseError, match="not a bool"):
        attr_bool(node(k="2"), "k", False)
    with pytest.raises(ParseError, match="not a number"):
        attr_float(node(k="(1, 2)"), "k")


@pytest.mark.parametrize("value,text", [((3, 3), "(3, 3)"), ((4,), "(4,)"), (True, "True"), (1e-5, "1e-05"),
                                        ("relu", "relu"), (7, "7"), ((None, 2), "(None, 2)")])
def test_format_attr(value, text):
    assert format_attr(value) == text


def test_written_json_loads_in_mxnet():
    from aiacc.plugins.mxnet._import import import_mxnet

    mx = import_mxnet()
    x = mx.sym.var("data")
    sym = mx.sym.Pooling(mx.sym.Convolution(x, num_filter=2, kernel=(3, 3), name="c"), kernel=(2, 2), name="p")
    parsed = parse_symbol_json(sym.tojson())
    assert [n.op for n in parsed.nodes] == ["null", "null", "null", "Convolution", "Pooling"]
    again = mx.sym.load_json(parsed.to_json())
    assert again.list_arguments() == sym.list_arguments()
    assert json.loads(again.tojson())["nodes"][3]["attrs"] == json.loads(sym.tojson())["nodes"][3]["attrs"]


def test_structure_errors():
    with pytest.raises(ParseError, match="no outputs"):
        parse_symbol_json({"nodes": [{"op": "null", "name": "x", "inputs": []}], "heads": []})
    with pytest.raises(ParseError, match="output head"):
        parse_symbol_json({"nodes": [{"op": "null", "name": "x", "inputs": []}], "heads": [[3, 0, 0]]})
    with pytest.raises(ParseError, match=r"node 0: every node needs string fields"):
        parse_symbol_json({"nodes": [{"op": 5}], "heads": [[0, 0, 0]]})
    with pytest.raises(ParseError, match=r"node 1 'r' \(relu\): input \[0\] is not"):
        parse_symbol_json({"nodes": [{"op": "null", "name": "x", "inputs": []},
                                     {"op": "relu", "name": "r", "inputs": [[0]]}], "heads": [[1, 0, 0]]})


def test_plugin_import_does_not_import_mxnet():
    code = ("import sys, aiacc, aiacc.plugins.mxnet, aiacc.plugins.mxnet.symjson, aiacc.plugins.mxnet.importer, "
            "aiacc.plugins.mxnet.exporter; print('mxnet' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
