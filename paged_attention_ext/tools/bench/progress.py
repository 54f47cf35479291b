"""A live progress line on stderr while the benchmark runs (rich), so stdout keeps the table."""

from __future__ import annotations

from contextlib import contextmanager


class _RichProgress:
    def __init__(self, progress, task):
        self._progress, self._task = progress, task

    def phase(self, text: str):
        self._progress.update(self._task, description=text)

    def advance(self):
        self._progress.advance(self._task)


@contextmanager
def progress_display(total: int, enabled: bool = True):
    """Yields an object with .phase(text) / .advance(); a no-op one when disabled."""
    if not enabled:
        from .runner import _NoProgress
        yield _NoProgress()
        return
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn,
                               TextColumn, TimeElapsedColumn)

    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
               MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("starting", total=total)
        yield _RichProgress(progress, task)
