"""The errors aiacc raises (every one names the node, layer or file at fault and what is wrong) and the
warning it gives when it does less than asked (`fallback`)."""
from __future__ import annotations

import contextlib
import contextvars
import warnings
from typing import Iterator


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


class OptionError(AiaccError, TypeError):
    """An option aiacc.optimize (or a plugin) does not have; the message lists the ones it has. A TypeError
    too, as Python's own error for an unexpected keyword argument is."""


class GuardError(AiaccError):
    """A call takes a path the optimized model was not specialised for: a Python branch on tensor data was
    fixed on the example's value (a value guard, aiacc::ValueGuard) and this call's value differs."""


class StaleWeightsError(GuardError):
    """An optimized inference module is called after the original's weights it copied from (folded, or held
    beside an opaque call) were changed in place, while it shares its other weights with the original: it
    would compute with a mix of old and new weights. Optimize the original again."""


class FallbackError(UnsupportedError):
    """strict=True: aiacc would have done less than asked (kept part of a model opaque, chosen a mode...)."""


class AiaccWarning(UserWarning, RuntimeWarning):
    """aiacc did less than asked and says what and why (what was kept opaque, which mode was used...).
    strict=True turns each into a FallbackError. A UserWarning and a RuntimeWarning, the categories these
    warnings had before they had their own."""


class AiaccNotice(UserWarning):
    """aiacc chose between ways of doing what was asked (e.g. which measured training step runs) and says
    which: not a fallback, so it is no AiaccWarning and strict=True accepts it."""


def first_line(e: BaseException, limit: int | None = None) -> str:
    """The first line of an exception's message, cut to `limit` characters (with '...'), or its type name when
    the message is empty: what a one-line aiacc error quotes of a library's long, multi-line one."""
    text = str(e).strip()
    if not text:
        return type(e).__name__
    line = text.splitlines()[0].rstrip()
    return line[:limit] + "..." if limit is not None and len(line) > limit else line


def describe(e: BaseException, limit: int | None = None) -> str:
    """'TypeName: first line of the message' (just the type name when the message is empty)."""
    return f"{type(e).__name__}: {first_line(e, limit)}" if str(e).strip() else type(e).__name__


# --------------------------------------------------------------------------------------------- fallbacks
# One optimize call collects its fallbacks here: each cause is warned once and ends up in the pass report.
_SCOPE: contextvars.ContextVar[Fallbacks | None] = contextvars.ContextVar("aiacc_fallbacks", default=None)


class Fallbacks:
    """The fallbacks of one optimize call: cause -> message, in the order they happened."""

    def __init__(self, strict: bool = False):
        self.strict = strict
        self.seen: dict[str, str] = {}

    @property
    def messages(self) -> list[str]:
        """Every distinct fallback's message, in order."""
        return list(self.seen.values())


@contextlib.contextmanager
def collecting_fallbacks(strict: bool = False) -> Iterator[Fallbacks]:
    """Collect the fallbacks of one call (aiacc.optimize): nested, the inner call joins the outer one's
    collection (strict if either asks for it)."""
    outer = _SCOPE.get()
    if outer is not None:
        outer.strict = outer.strict or bool(strict)
        yield outer
        return
    scope = Fallbacks(bool(strict))
    token = _SCOPE.set(scope)
    try:
        yield scope
    finally:
        _SCOPE.reset(token)


def fallback(cause: str, message: str, stacklevel: int = 3) -> None:
    """aiacc is about to do less than asked: warn once per `cause` (AiaccWarning) and record `message` for
    the report; under strict=True raise FallbackError with the message instead."""
    scope = _SCOPE.get()
    if scope is not None and scope.strict:
        raise FallbackError(f"{message} (strict=True refuses this fallback)")
    if scope is not None:
        if cause in scope.seen:
            return
        scope.seen[cause] = message
    warnings.warn(f"aiacc: {message}", AiaccWarning, stacklevel=stacklevel)
