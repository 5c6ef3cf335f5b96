"""Errors raised by communication planning and distributed execution."""
from aiacc.errors import AiaccError


class CommError(AiaccError):
    """A communication plan is malformed, or a collective failed (a peer died, a timeout...)."""


class RankMismatchError(CommError):
    """The ranks of a job disagree (different parameter names, shapes or dtypes)."""


class RankFailureError(CommError):
    """A collective did not complete: a peer rank exited, crashed or stopped answering."""
