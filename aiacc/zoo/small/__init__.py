"""The catalogue's test-size models: small versions of the bundled architectures and a few small nets of
their own (torch ResNet-18 and an MLP, Keras MLP and a layout-sensitive CNN, Gluon MLP and a masked BERT,
Caffe LeNet / ResNet-style / SqueezeNet / AlexNet), built in code with fixed seeds so a forward takes
milliseconds. One module per framework, each with a `ZOO` (TF: `TF_ZOO`; Caffe: `PROTOTXTS` and `build`)
mapping a name to its builder. The tests (tests/zoo re-exports these and adds what only the tests need),
the goldens (tests/golden/zoo) and quick benchmark runs share them.

Importing this package imports no framework; importing one of its modules imports that framework.
"""
import importlib

FRAMEWORKS = ("torch", "tf", "mxnet", "caffe")


def module(framework: str):
    """The test-size model module of `framework` (imports the framework)."""
    if framework not in FRAMEWORKS:
        from aiacc.errors import UnsupportedError

        raise UnsupportedError(f"no test-size models for {framework!r} (known: {', '.join(FRAMEWORKS)})")
    return importlib.import_module(f"aiacc.zoo.small.{framework}_models")
