"""Bad Caffe input gets an aiacc error naming the file line, layer or blob at fault."""
import numpy as np
import pytest

from aiacc.errors import AiaccError, GraphError, ParseError, ShapeError, UnsupportedError
from aiacc.plugins.caffe import CaffeModel
from aiacc.plugins.caffe.proto import array_to_blob
from tests.zoo import caffe_models as zoo


def test_malformed_prototxt_names_the_line(tmp_path):
    path = tmp_path / "bad.prototxt"
    path.write_text('name: "x"\n'
                    'layer { name: "data" type: "Input" top: "data" }\n'
                    'layer { name: "c" type: "Convolution" bottom: "data" top: "c"\n'
                    '        convolution_param { num_output: 4 kernel_sise: 3 } }\n')
    with pytest.raises(ParseError) as e:
        CaffeModel.load(path)
    msg = str(e.value)
    assert "bad.prototxt" in msg and "line 4" in msg and "kernel_sise" in msg
    assert isinstance(e.value, AiaccError)


def test_unbalanced_braces_name_the_line():
    with pytest.raises(ParseError, match="line 2, column 25"):
        CaffeModel.from_text('name: "x"\nlayer { name: "a" type: "ReLU"\n')


def test_caffemodel_blob_shape_mismatch_names_layer_and_both_shapes(tmp_path):
    model = zoo.build("lenet")
    prototxt, caffemodel = zoo.write(model, str(tmp_path), "lenet")
    # the same layer names, but conv2 declared with 3 more outputs than the caffemodel holds
    text = open(prototxt).read().replace("num_output: 10", "num_output: 13", 1)
    assert text != open(prototxt).read()
    with open(prototxt, "w") as f:
        f.write(text)
    with pytest.raises(ShapeError) as e:
        CaffeModel.load(prototxt, caffemodel).graph
    msg = str(e.value)
    assert "conv2" in msg and "Convolution" in msg
    assert "[10, 6, 3, 5]" in msg and "[13, 6, 3, 5]" in msg


def test_blob_holding_the_wrong_number_of_values():
    model = CaffeModel.from_text('name: "x" input: "d" input_shape { dim: 1 dim: 2 }\n'
                                 'layer { name: "ip" type: "InnerProduct" bottom: "d" top: "ip" '
                                 'inner_product_param { num_output: 2 bias_term: false } }')
    blob = array_to_blob(np.ones((2, 2), np.float32), model.layer("ip").blobs.add())
    blob.data.append(1.0)
    with pytest.raises(ParseError, match="'ip'.*4 values.*holds 5"):
        model.graph


def test_bottom_that_no_layer_produces():
    text = ('name: "x" layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 3 } } }\n'
            'layer { name: "r" type: "ReLU" bottom: "dat" top: "r" }')
    with pytest.raises(GraphError) as e:
        CaffeModel.from_text(text).graph
    assert "'r'" in str(e.value) and "'dat'" in str(e.value) and "data" in str(e.value)


def test_missing_weights_say_so():
    model = CaffeModel.from_text(zoo.LENET)
    with pytest.raises(ShapeError, match="conv1.*needs 2 weight blob.*no caffemodel was loaded"):
        model.graph


def test_input_without_shape():
    with pytest.raises(ShapeError, match="'data' has no shape"):
        CaffeModel.from_text('name: "x" layer { name: "in" type: "Input" top: "data" }').graph


def test_v0_and_mixed_nets_are_refused():
    with pytest.raises(ParseError, match="mixes V1"):
        CaffeModel.from_text('layer { name: "a" type: "ReLU" } layers { name: "b" type: RELU }')
    with pytest.raises(UnsupportedError, match="V0"):
        CaffeModel.from_text('layers { name: "b" layer: "x" }')


def test_not_a_caffemodel(tmp_path):
    prototxt = tmp_path / "m.prototxt"
    prototxt.write_text(zoo.LENET)
    weights = tmp_path / "m.caffemodel"
    weights.write_bytes(b"\xff\xff\xff\xff garbage")
    with pytest.raises(ParseError, match="m.caffemodel"):
        CaffeModel.load(prototxt, weights)


def test_bad_layer_parameters():
    base = 'name: "x" input: "d" input_shape { dim: 1 dim: 4 dim: 6 dim: 6 }\n'
    with pytest.raises(ShapeError, match="'s'.*2 slice points for 2 tops"):
        CaffeModel.from_text(base + 'layer { name: "s" type: "Slice" bottom: "d" top: "a" top: "b" '
                                    'slice_param { slice_point: 1 slice_point: 2 } }').graph
    with pytest.raises(ShapeError, match="'c'.*group 3 does not divide"):
        CaffeModel.from_text(base + 'layer { name: "c" type: "Convolution" bottom: "d" top: "c" '
                                    'convolution_param { num_output: 6 kernel_size: 1 group: 3 } }').graph
    with pytest.raises(ShapeError, match="'e'.*different shapes"):
        CaffeModel.from_text(base + 'layer { name: "p" type: "Pooling" bottom: "d" top: "p" '
                                    'pooling_param { kernel_size: 2 stride: 2 } }\n'
                                    'layer { name: "e" type: "Eltwise" bottom: "d" bottom: "p" top: "e" }').graph


def test_wrong_forward_inputs():
    model = zoo.build("lenet")
    with pytest.raises(ShapeError, match="data"):
        model.forward(data=np.zeros((2, 1, 27, 28), np.float32))
    with pytest.raises(ShapeError, match="no input named 'image'"):
        model.forward(image=np.zeros((2, 1, 28, 28), np.float32))


def test_schema_builds_without_the_generated_module():
    # the fallback used when caffe_pb2's protobuf version check fails: same schema, same wire format
    from google.protobuf import text_format

    from aiacc.plugins.caffe.schema import _from_source, pb

    alt = _from_source()
    net = text_format.Parse(zoo.LENET, alt.NetParameter())
    assert net.layer[2].pooling_param.pool == alt.PoolingParameter.MAX and alt.TEST == pb.TEST == 1
    assert pb.NetParameter.FromString(net.SerializeToString()) == text_format.Parse(zoo.LENET, pb.NetParameter())
