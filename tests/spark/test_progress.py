"""Spark's tasks as progress ticks (docs/operations.md#progress): the watcher thread reads
the session's status tracker while a job runs, and says its tasks on a terminal only."""

from __future__ import annotations

import time

from pipeline.core.progress import Progress
from pipeline.spark.progress import tasks_done, watching


def _slow(x: int) -> int:
    time.sleep(0.4)
    return x


def _job(spark) -> None:
    spark.sparkContext.parallelize(range(8), 8).map(_slow).count()


def test_a_running_job_s_tasks_are_ticked_on_a_terminal(spark):
    lines: list[str] = []
    p = Progress(lines.append, terminal=True, every=0.0, after=0.0)
    with p.stage("resolve"):
        p.step("orders", 1, 1, "tables")
        with watching(spark, p, poll=0.05):
            _job(spark)
    ticks = [x for x in lines if "; Spark: " in x]
    assert ticks, lines
    assert all(x.startswith("resolve: orders 1/1 tables, ") for x in ticks)
    assert all(x.split("; Spark: ")[1].split(" ")[0].endswith("/8") for x in ticks), ticks
    assert tasks_done(spark) is None  # no job now


def test_off_a_terminal_no_watcher_runs(spark):
    lines: list[str] = []
    p = Progress(lines.append, terminal=False, every=0.0, after=0.0)
    with p.stage("resolve"), watching(spark, p, poll=0.05):
        _job(spark)
    assert len(lines) == 1 and lines[0].startswith("resolve: done in"), lines
