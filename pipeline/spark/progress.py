"""Spark's side of the progress lines (:mod:`pipeline.core.progress`): a thread that
reads the session's status tracker while a stage's Spark work runs and reports what the
active Spark stages' tasks have done, as ticks (said on a terminal only, throttled; with
no Spark stage active, a tick names the step, if its own line was not said).
Spark's own console progress bar stays off (``pipeline.spark.session``)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from pipeline.core.progress import Progress, current

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: seconds between two reads of the status tracker
POLL = 1.0


def tasks_done(spark: SparkSession) -> str | None:
    """The active Spark stages' completed and total tasks (``Spark: 57/200 tasks``);
    None when no stage is active."""
    tracker = spark.sparkContext.statusTracker()
    infos = [tracker.getStageInfo(i) for i in tracker.getActiveStageIds()]
    stages = [s for s in infos if s is not None]
    if not stages:
        return None
    done = sum(s.numCompletedTasks for s in stages)
    total = sum(s.numTasks for s in stages)
    many = f" in {len(stages)} stages" if len(stages) > 1 else ""
    return f"Spark: {done}/{total} tasks{many}"


@contextmanager
def watching(
    spark: SparkSession | Callable[[], SparkSession] | None,
    progress: Progress | None = None,
    poll: float = POLL,
) -> Iterator[None]:
    """Ticks of ``spark``'s tasks while the block runs, when ``progress`` (default: the
    installed one) says ticks; nothing for a session not started yet (a callable)."""
    p = progress or current()
    if spark is None or callable(spark) or not p.ticks:
        yield
        return
    stop = threading.Event()
    thread = threading.Thread(
        target=_watch, args=(spark, p, stop, poll), name="cdr-progress", daemon=True
    )
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _watch(spark: Any, progress: Progress, stop: threading.Event, poll: float) -> None:
    while not stop.wait(poll):
        try:
            text = tasks_done(spark)
        except Exception:  # the session stopped: nothing more to watch
            return
        progress.tick(text)  # None: no Spark stage active, the step itself
