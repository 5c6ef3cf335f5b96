"""aiacc.errors.first_line / describe: how a one-line aiacc error quotes a library's long exception."""
from aiacc.errors import describe, first_line


def test_first_line_takes_the_first_line_of_the_stripped_message_and_cuts_it_with_an_ellipsis():
    e = ValueError("\n  shape mismatch at node conv1  \nTraceback (most recent call last): ...")
    assert first_line(e) == "shape mismatch at node conv1"
    assert first_line(e, 5) == "shape..."
    assert first_line(ValueError("short"), 5) == "short"


def test_an_empty_message_is_named_by_its_type():
    assert first_line(KeyError()) == "KeyError"
    assert describe(RuntimeError("")) == "RuntimeError"
    assert describe(RuntimeError("boom\nmore"), 3) == "RuntimeError: boo..."
