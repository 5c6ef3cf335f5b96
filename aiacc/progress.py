"""Progress for long work (optimize, demo, benchmarks, memory planning): a rich progress bar naming the
current pass or model, shown only when the output is a terminal.

One live display at a time (rich allows no more): the first `task` opens it, tasks opened inside add a line
to it and remove it when they end, so the demo's model bar and the pass manager's pass bar show together.
Nothing is written when the console is not a terminal (pipes, CI logs, captured test output), when the
environment variable CI is set, or when AIACC_PROGRESS=0; AIACC_PROGRESS=1 forces it on.

    with progress.task("optimize", total=len(passes)) as t:
        for p in passes:
            t.update(p.name)
            ...
            t.advance()

    for model in progress.track(models, "benchmark", label=str):
        ...
"""
from __future__ import annotations

import contextlib
import os
import threading
from typing import Any, Callable, Iterable, Iterator, TypeVar

T = TypeVar("T")

_lock = threading.RLock()
_console: Any = None  # the console use_console() set (tests, the demo); None: stderr
_live: Any = None  # the open rich Progress, if any
_choice: Any = None  # what optimize(progress=True/False) asked inside its call (see chosen()); None: decide


def _default_console():
    from rich.console import Console

    return Console(stderr=True)


def _enabled(console) -> bool:
    if _choice is not None:
        return bool(_choice)
    forced = os.environ.get("AIACC_PROGRESS", "").strip().lower()
    if forced in ("0", "false", "no", "off"):
        return False
    if forced in ("1", "true", "yes", "on"):
        return True
    if os.environ.get("CI") and _console is None:
        return False
    return bool(console.is_terminal) and not console.is_dumb_terminal


def enabled() -> bool:
    """True when a progress display would be shown now (the console is a terminal, not turned off)."""
    return _enabled(_console if _console is not None else _default_console())


@contextlib.contextmanager
def chosen(show: Any) -> Iterator[None]:
    """Inside the block progress is shown (show=True) or not (False) whatever the terminal and AIACC_PROGRESS
    say: `aiacc.optimize(..., progress=...)`. show=None leaves the usual choice."""
    global _choice
    with _lock:
        before = _choice
        if show is not None:
            _choice = bool(show)
    try:
        yield
    finally:
        with _lock:
            _choice = before


@contextlib.contextmanager
def use_console(console) -> Iterator[None]:
    """Draw progress on `console` (a rich Console) inside the block: the demo draws on its own console,
    tests on Console(force_terminal=True, file=StringIO())."""
    global _console
    with _lock:
        before, _console = _console, console
    try:
        yield
    finally:
        with _lock:
            _console = before


class Task:
    """One line of the display: `update(text)` names what runs now, `advance(n)` counts work done,
    `print(text)` writes a line above the display. All of it does nothing when progress is off (`shown` is
    False: a caller that must print anyway prints itself)."""

    def __init__(self, progress: Any = None, task_id: Any = None, description: str = ""):
        self._progress, self._id, self.description = progress, task_id, description

    @property
    def shown(self) -> bool:
        """True when this task is drawn."""
        return self._progress is not None

    def update(self, text: str | None = None, *, advance: float = 0) -> None:
        """Show `description: text` (or the description alone when text is None); advance by `advance`."""
        if self._progress is None:
            return
        desc = self.description if not text else (f"{self.description}: {text}" if self.description else text)
        # refresh now: a pass may take a millisecond and the periodic refresh would never show its name
        self._progress.update(self._id, description=desc, advance=advance, refresh=True)

    def advance(self, n: float = 1) -> None:
        """Count `n` units of work done."""
        if self._progress is not None:
            self._progress.update(self._id, advance=n, refresh=True)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """Print above the display (nothing when progress is off)."""
        if self._progress is not None:
            self._progress.console.print(*args, **kwargs)


def _new_progress(console):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    import sys

    # prints of the work itself go above the bar only when they go to the same terminal; stdout redirected
    # to a file must get them, not the terminal the bar is drawn on
    same = getattr(sys.stdout, "isatty", lambda: False)() and console.is_terminal
    return Progress(SpinnerColumn(), TextColumn("[progress.description]{task.description}"), BarColumn(),
                    MofNCompleteColumn(), TimeElapsedColumn(), console=console, transient=True,
                    redirect_stdout=same, redirect_stderr=same)


@contextlib.contextmanager
def task(description: str, total: float | None = None, *, when: bool = True) -> Iterator[Task]:
    """A line of the progress display for the block (see the module docstring); yields a Task.
    when=False: nothing shown (work that is quick on small inputs asks only for large ones)."""
    global _live
    console = _console if _console is not None else None
    with _lock:
        if not when:
            owner, progress = False, None
        elif _live is None:
            console = console or _default_console()
            if not _enabled(console):
                owner, progress = False, None
            else:
                progress = _live = _new_progress(console)
                progress.start()
                owner = True
        else:
            owner, progress = False, _live
    if progress is None:
        yield Task()
        return
    tid = progress.add_task(description, total=total)
    progress.refresh()
    try:
        yield Task(progress, tid, description)
    finally:
        with _lock:
            progress.remove_task(tid)
            if owner:
                progress.stop()
                _live = None


def track(items: Iterable[T], description: str, *, label: Callable[[T], str] = str,
          total: int | None = None) -> Iterator[T]:
    """Iterate over `items`, the display naming each one (`label(item)`) while it is worked on."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    with task(description, total=total) as t:
        for item in items:
            t.update(label(item))
            yield item
            t.advance()
