"""Progress of the long CLI jobs: a live bar on a terminal, plain lines in a log.

Rich's bar redraws one line in place. A terminal shows it; a log file, a pipe, `nohup` or a cluster job's
output shows nothing until the job ends (a `steptp run` on an attention block is silent for minutes).
`progress` chooses by `console.is_terminal`: the transient bar, or one line `description: done/total,
elapsed` when the job starts, at most every `every_s` seconds while it runs, and when it ends.
"""
from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

EVERY_S = 30.0
"""Seconds between two progress lines when the output is not a terminal."""

Update = Callable[..., None]
"""`update(completed, description=None, total=None)`: the job's count so far and, optionally, a new
description and a total learnt while the job runs."""


@contextlib.contextmanager
def progress(console: Console, description: str, total: int, every_s: float = EVERY_S) -> Iterator[Update]:
    """A progress display for a job of `total` items (see the module docstring); yields `update`."""
    if console.is_terminal:
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=console, transient=True) as bar:
            task = bar.add_task(description, total=total)
            yield lambda completed, text=None, total=None: bar.update(
                task, completed=completed, description=text or description, **({"total": total} if total else {}))
        return
    started = time.monotonic()
    state = {"completed": 0, "text": description, "printed": -math.inf, "total": total}

    def line() -> None:
        state["printed"] = time.monotonic()
        console.print(f"{state['text']}: {state['completed']}/{state['total']}, {state['printed'] - started:.0f} s",
                      highlight=False, markup=False, soft_wrap=True)

    def update(completed: int, text: str | None = None, total: int | None = None) -> None:
        state.update(completed=completed, text=text or description, total=total or state["total"])
        if time.monotonic() - state["printed"] >= every_s:
            line()

    yield update
    line()
