"""The errors aiacc raises. Every one names the node, layer or file at fault and what is wrong."""


class AiaccError(Exception):
    """Base class of every error aiacc raises on purpose."""


class GraphError(AiaccError):
    """The IR breaks one of its invariants (dangling input, cycle, broken use-def lists...)."""


class ShapeError(AiaccError):
    """Shapes or dtypes do not fit an op, or inputs given to a model do not match its signature."""


class AttributeError_(AiaccError):
    """An attribute is unknown to the op schema or has the wrong type."""


class ParseError(AiaccError):
    """A text, JSON, prototxt or other file could not be read; the message gives the line where known."""


class KernelError(AiaccError):
    """No kernel is available for an op (e.g. an opaque node) or a kernel failed."""


class UnsupportedError(AiaccError):
    """A model, object or construct aiacc cannot handle."""


class VerificationError(AiaccError):
    """An optimized model's outputs differ from the original's beyond tolerance."""
