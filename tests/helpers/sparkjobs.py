"""The Spark jobs a test's code starts, as the session's status tracker sees them, and
whether the stages compiled their plans."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any


def in_a_group(spark: Any, fn: Any, jobs: dict[str, list[int]]) -> Any:
    """``fn`` run in a Spark job group of its own; ``jobs`` gets the ids of the Spark jobs
    each call started."""
    sc = spark.sparkContext

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        group = f"{fn.__name__}-{uuid.uuid4()}"  # Spark keeps the groups of earlier tests
        sc.setJobGroup(group, group)
        try:
            return fn(*args, **kwargs)
        finally:
            sc.setLocalProperty("spark.jobGroup.id", None)
            jobs[group] = list(sc.statusTracker().getJobIdsForGroup(group))

    return wrapped


def tasks_per_stage(spark: Any, run: Callable[[], object]) -> list[int]:
    """The tasks of each stage of the Spark jobs ``run()`` starts, in stage order (a stage
    adaptive execution skips is listed again by the job that skips it)."""
    jobs: dict[str, list[int]] = {}
    in_a_group(spark, run, jobs)()
    tracker = spark.sparkContext.statusTracker()
    stages = sorted(s for ids in jobs.values() for j in ids for s in tracker.getJobInfo(j).stageIds)
    return [tracker.getStageInfo(s).numTasks for s in stages]


def codegen_modes(monkeypatch) -> list[bool]:
    """Whether each stage that sized its Spark settings compiled its plans."""
    import pipeline.spark.session

    seen: list[bool] = []
    real = pipeline.spark.session.fit_codegen

    def spy(spark, records: int) -> bool:
        seen.append(real(spark, records))
        return seen[-1]

    monkeypatch.setattr(pipeline.spark.session, "fit_codegen", spy)
    return seen


def settled_disputes(monkeypatch: Any, module: Any) -> list[list[str]]:
    """The ids of the events ``module.settle_disputes`` moves, one sorted list per call
    (a run folds again the events whose copies sit under different keys)."""
    calls: list[list[str]] = []
    settle = module.settle_disputes

    def spy(copies: Any, ids: list[str]) -> Any:
        calls.append(sorted(ids))
        return settle(copies, ids)

    monkeypatch.setattr(module, "settle_disputes", spy)
    return calls
