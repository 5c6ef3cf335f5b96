"""Bad MXNet input gets an aiacc error that names the node or parameter at fault."""
import json

import numpy as np
import pytest

import aiacc
from aiacc.errors import AiaccError, ParseError, ShapeError, UnsupportedError
from aiacc.plugins.mxnet import files
from aiacc.plugins.mxnet._import import import_mxnet

mx = import_mxnet()


def _small_symbol():
    data = mx.sym.var("data")
    c = mx.sym.Convolution(data, num_filter=4, kernel=(3, 3), name="conv0")
    return mx.sym.FullyConnected(mx.sym.relu(c), num_hidden=3, name="fc0")


def _params(sym, shape=(1, 2, 5, 5)):
    arg_shapes, _, _ = sym.infer_shape(data=shape)
    rng = np.random.default_rng(0)
    return {n: mx.nd.array(rng.standard_normal(s)) for n, s in zip(sym.list_arguments(), arg_shapes) if n != "data"}


def test_symbol_with_missing_param_names_it():
    sym = _small_symbol()
    args = _params(sym)
    del args["fc0_weight"]
    x = np.zeros((1, 2, 5, 5), np.float32)
    with pytest.raises(UnsupportedError, match=r"fc0_weight.*fc0.*FullyConnected.*missing"):
        aiacc.trace((sym, args, {}), (x,))


def test_symbol_with_missing_param_by_name_names_it():
    sym = _small_symbol()
    args = _params(sym)
    del args["conv0_bias"]
    x = np.zeros((1, 2, 5, 5), np.float32)
    with pytest.raises(UnsupportedError, match=r"'conv0_bias' \(read by node 'conv0' \(Convolution\)\).*missing"):
        aiacc.trace((sym, args, {}), {"data": x})


def test_param_with_wrong_shape_names_it():
    sym = _small_symbol()
    args = _params(sym)
    args["conv0_weight"] = mx.nd.zeros((4, 3, 3, 3))  # 3 input channels, the data has 2
    x = np.zeros((1, 2, 5, 5), np.float32)
    with pytest.raises(ShapeError, match=r"conv0_weight.*conv0.*Convolution.*\[4, 3, 3, 3\].*\[4, 2, 3, 3\]"):
        aiacc.trace((sym, args, {}), (x,))


def test_malformed_json_file(tmp_path):
    path = tmp_path / "bad-symbol.json"
    path.write_text('{"nodes": [{"op": "null", "name": "data", "inputs": []}, ')
    with pytest.raises(ParseError, match="bad-symbol.json: not valid JSON"):
        files.load_graph(str(path))


def test_json_node_with_dangling_input_is_named(tmp_path):
    doc = {"nodes": [{"op": "null", "name": "data", "inputs": []},
                     {"op": "relu", "name": "act0", "inputs": [[5, 0, 0]]}],
           "arg_nodes": [0], "heads": [[1, 0, 0]]}
    path = tmp_path / "dangling-symbol.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ParseError, match=r"node 1 'act0' \(relu\): input refers to node 5"):
        files.load_graph(str(path), input_shapes={"data": (1, 3)})


def test_json_bad_attribute_is_named(tmp_path):
    doc = {"nodes": [{"op": "null", "name": "data", "inputs": []},
                     {"op": "Convolution", "name": "convX", "attrs": {"kernel": "(3, x)", "num_filter": "2",
                                                                        "no_bias": "True"},
                      "inputs": [[0, 0, 0], [2, 0, 0]]}],
           "arg_nodes": [0], "heads": [[1, 0, 0]]}
    path = tmp_path / "attr-symbol.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ParseError, match=r"attr-symbol.json: node 1 'convX'"):
        files.load_graph(str(path))


def test_json_attribute_value_is_checked_when_translating():
    from aiacc.plugins.mxnet.importer import import_symbol
    from aiacc.plugins.mxnet.symjson import parse_symbol_json
    from aiacc.core.ir import TensorType

    doc = {"nodes": [{"op": "null", "name": "data", "inputs": []},
                     {"op": "Pooling", "name": "poolZ", "attrs": {"kernel": "(2, 2.5)"}, "inputs": [[0, 0, 0]]}],
           "heads": [[1, 0, 0]]}
    with pytest.raises(ParseError, match=r"node 'poolZ' \(Pooling\): attribute kernel=.*not an integer"):
        import_symbol(parse_symbol_json(doc), {}, {"data": TensorType("float32", (1, 1, 4, 4))})


def test_not_a_symbol_file(tmp_path):
    path = tmp_path / "x-symbol.json"
    path.write_text('{"layers": []}')
    with pytest.raises(ParseError, match="not an MXNet symbol"):
        files.load_graph(str(path))


def test_plain_block_is_refused():
    class Plain(mx.gluon.Block):
        def forward(self, x):
            return x * 2

    with pytest.raises(UnsupportedError, match="not a HybridBlock"):
        aiacc.trace(Plain(), np.zeros((1, 2), np.float32))


def test_block_without_example_inputs_is_refused():
    net = mx.gluon.nn.Dense(3)
    net.initialize()
    with pytest.raises(UnsupportedError, match="needs example inputs"):
        aiacc.trace(net)


def test_all_errors_are_aiacc_errors():
    assert issubclass(ParseError, AiaccError) and issubclass(UnsupportedError, AiaccError)


def test_too_many_example_inputs():
    sym = _small_symbol()
    x = np.zeros((1, 2, 5, 5), np.float32)
    with pytest.raises(ShapeError, match=r"2 example inputs given, but the model has 1 input variable\(s\): data"):
        aiacc.trace((sym, _params(sym), {}), (x, x))
