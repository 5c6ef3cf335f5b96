"""The Caffe message classes (`pb.NetParameter`, `pb.LayerParameter`...), from the generated caffe_pb2.

caffe_pb2.py checks that the protobuf runtime has the major version of the protoc that generated it. When
it does not (another protobuf major installed), the same schema is built at run time from the serialized
descriptor inside caffe_pb2.py, which every protobuf runtime since 4.x reads.
"""
from __future__ import annotations

import ast
import os
from types import SimpleNamespace

_PROTO_NAME = "aiacc/plugins/caffe/caffe.proto"


def _from_source() -> SimpleNamespace:
    """The message classes and top-level enum values, built from caffe_pb2.py's serialized descriptor."""
    from google.protobuf import descriptor_pool, message_factory

    path = os.path.join(os.path.dirname(__file__), "caffe_pb2.py")
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    data = next(node.args[0].value for node in ast.walk(tree)
                if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "AddSerializedFile")
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(data)
    classes = message_factory.GetMessageClassesForFiles([_PROTO_NAME], pool)
    ns = SimpleNamespace(**{full.rsplit(".", 1)[-1]: cls for full, cls in classes.items() if full.count(".") == 2})
    fd = pool.FindFileByName(_PROTO_NAME)
    for enum in fd.enum_types_by_name.values():
        for value in enum.values:
            setattr(ns, value.name, value.number)
    return ns


try:
    from aiacc.plugins.caffe import caffe_pb2 as pb
except Exception:  # protobuf's VersionError (gencode and runtime of different majors)
    pb = _from_source()

__all__ = ["pb"]
