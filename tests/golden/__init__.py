"""Golden files: text that a change in the importers or the passes must not alter silently.

`check(name, text, update)` compares `text` with tests/golden/NAME and fails with a unified diff on any
difference; with update=True it (re)writes the file instead. Regenerate every golden file with

    .venv/bin/python -m pytest tests/crossframework --update-goldens -q      (or AIACC_UPDATE_GOLDENS=1)

then review the diff (`git diff tests/golden`) like any other code change.
"""
from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent


def update_requested(config=None) -> bool:
    """True when the goldens should be rewritten (pytest --update-goldens or AIACC_UPDATE_GOLDENS=1)."""
    if os.environ.get("AIACC_UPDATE_GOLDENS", "") not in ("", "0"):
        return True
    return bool(config is not None and config.getoption("--update-goldens", default=False))


def check(name: str, text: str, update: bool) -> None:
    path = ROOT / name
    if update:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return
    if not path.exists():
        pytest.fail(f"golden file tests/golden/{name} is missing: run pytest with --update-goldens to create it")
    expected = path.read_text()
    if expected != text:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), text.splitlines(True),
                                            f"tests/golden/{name}", "now", n=2))
        pytest.fail(f"tests/golden/{name} differs (run pytest --update-goldens if the change is intended):\n{diff}")
