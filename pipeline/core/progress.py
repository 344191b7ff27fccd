"""What a run is doing and how far along it is, for the person or the log that watches
it (docs/operations.md#progress).

Each stage says its steps (``resolve: orders 2/3 tables, 12s``) and, when it ends, how
long it took. On a terminal a line comes at most every ``every`` seconds: a step that
follows too soon after the line before is not said then, and while a step runs longer
than ``after`` seconds, what Spark's tasks have done is (a *tick*, from
:mod:`pipeline.spark.progress`), or else the step itself if it was not said. Anywhere
else (Airflow's log, a file) every step gets its line and there are no ticks.

Pure: the lines go to a ``say`` function and the time comes from ``clock``. The CLI
installs one :class:`Progress` for the command (:func:`installed`); the stages report
to :func:`current`, which says nothing when none is installed (a library call, a test).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

#: seconds between two lines on a terminal, at most one line in this time
EVERY = 5.0
#: seconds a step runs before its Spark tasks are reported (a tick)
AFTER = 3.0


class Progress:
    """The lines of one command's stages. ``terminal``: throttled lines and ticks;
    else one line per step and no ticks. Safe to call from several threads."""

    def __init__(
        self,
        say: Callable[[str], None],
        *,
        terminal: bool = False,
        clock: Callable[[], float] = time.monotonic,
        every: float = EVERY,
        after: float = AFTER,
    ) -> None:
        self._say = say
        self.terminal = terminal
        self._clock = clock
        self._every = every
        self._after = after
        self._lock = threading.Lock()
        self._stage: str | None = None
        self._stage_started = 0.0
        self._step = ""
        self._step_started = 0.0
        self._step_said = False  # whether the current step's own line was said
        self._last: float | None = None  # when the last line was said

    @property
    def ticks(self) -> bool:
        """Whether ticks are said (a Spark watcher is worth starting)."""
        return self.terminal

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """The stage ``name`` runs in the block; a line says when it is done."""
        with self._lock:
            outer = self._stage, self._stage_started, self._step
            self._stage, self._stage_started, self._step = name, self._clock(), ""
        try:
            yield
            with self._lock:
                self._line(f"{name}: done in {self._elapsed()}")
        finally:
            with self._lock:
                self._stage, self._stage_started, self._step = outer

    def step(
        self, what: str, done: int | None = None, total: int | None = None, unit: str = ""
    ) -> None:
        """A step of the current stage begins: ``what``, the ``done``-th of ``total``
        ``unit`` (``orders``, 2, 3, ``tables``)."""
        count = f" {done}/{total} {unit}".rstrip() if total is not None else ""
        with self._lock:
            now = self._clock()
            self._step, self._step_started = f"{what}{count}", now
            self._step_said = not self.terminal or self._quiet_for(now) >= self._every
            if self._step_said:
                self._line(self._where())

    def tick(self, detail: str | None = None) -> None:
        """How far the current step is (``Spark: 57/200 tasks``), or (None) that it is
        still running: said on a terminal only, once the step has run ``after`` seconds
        and the last line is ``every`` seconds old; without a detail, only for a step
        whose own line was not said."""
        with self._lock:
            now = self._clock()
            if not self.terminal or self._stage is None:
                return
            if now - self._step_started < self._after or self._quiet_for(now) < self._every:
                return
            if detail is None and (self._step_said or not self._step):
                return
            self._step_said = True
            self._line(f"{self._where()}; {detail}" if detail else self._where())

    def _quiet_for(self, now: float) -> float:
        return float("inf") if self._last is None else now - self._last

    def _elapsed(self) -> str:
        return f"{self._clock() - self._stage_started:.0f}s"

    def _where(self) -> str:
        step = f"{self._step}, " if self._step else ""
        return f"{self._stage or 'cdr'}: {step}{self._elapsed()}"

    def _line(self, text: str) -> None:
        self._last = self._clock()
        self._say(text)


class _Silent(Progress):
    """Says nothing: what :func:`current` is when no command installed one."""

    def __init__(self) -> None:
        super().__init__(lambda _: None)

    def _line(self, text: str) -> None:
        pass


SILENT: Progress = _Silent()
_current: Progress = SILENT


def current() -> Progress:
    """The installed :class:`Progress` (:data:`SILENT` when none is)."""
    return _current


@contextmanager
def installed(progress: Progress | None) -> Iterator[Progress]:
    """``progress`` is :func:`current` in the block (None: :data:`SILENT`, ``--quiet``)."""
    global _current
    outer, _current = _current, progress or SILENT
    try:
        yield _current
    finally:
        _current = outer
