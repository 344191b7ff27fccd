"""The Spark jobs a test's code starts, as the session's status tracker sees them."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any


def tasks_per_stage(spark: Any, run: Callable[[], object]) -> list[int]:
    """The tasks of each stage of the Spark jobs ``run()`` starts, in stage order (a stage
    adaptive execution skips is listed again by the job that skips it)."""
    sc = spark.sparkContext
    group = f"cdr-test-{uuid.uuid4().hex}"
    sc.setJobGroup(group, "counted")
    try:
        run()
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    tracker = sc.statusTracker()
    jobs = tracker.getJobIdsForGroup(group)
    stages = sorted(s for j in jobs for s in tracker.getJobInfo(j).stageIds)
    return [tracker.getStageInfo(s).numTasks for s in stages]
