"""What the resolve stage's plans read: each output a table's fold gives (state, conflict
log, quarantine, divergence, fates, changes) is written from the persisted classification
and fold output, never by computing them again. Spark matches a persisted DataFrame by
its plan; a union of two DataFrames derived from one whose plan read the copies a second
time (the unique-value coupling did) silently stopped matching, and each write ran the
classification again: a 3-event run of a table with a unique constraint took 35 Spark
jobs to write its outputs. The other shapes here passed before the fix; they guard
against the same miss."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import scenarios as S
from test_scenarios import run_scenario

from pipeline import resolve


def files_read_again(df: Any) -> set[str]:
    """The relations over files among the leaves of ``df``'s plan once Spark has put the
    persisted DataFrames in (each one leaf, ``InMemoryRelation``): the classification
    reads the copies' files, so computing it again shows as one of them. Frames made on
    the driver (``LocalRelation``, ``LogicalRDD``) are not."""
    found: set[str] = set()
    todo = [df._jdf.queryExecution().withCachedData()]
    while todo:
        node = todo.pop()
        children = node.children()
        if children.isEmpty():
            found.add(node.getClass().getSimpleName())
        todo.extend(children.apply(i) for i in range(children.size()))
    return found & {"LogicalRelation", "DataSourceV2Relation", "HiveTableRelation"}


@pytest.mark.parametrize(
    "name",
    [
        "pg_multiple_unique_conflicts_apply",  # unique values couple keys
        "dw_transaction_scope",  # transactions admitted against the state
        "pg_delta_two_credits",  # delta columns
        "scylla_rule2_dead_beats_live",  # the cell engine
    ],
)
def test_the_fold_outputs_are_written_from_the_persisted_fold(
    name: str, tmp_path: Path, spark, monkeypatch
):
    written: dict[str, set[str]] = {}
    write = resolve._write

    def spy(df, path: Path, mode: str = "overwrite") -> None:
        written[path.name] = files_read_again(df)
        write(df, path, mode)

    monkeypatch.setattr(resolve, "_write", spy)
    s = json.loads((S.SCENARIOS / f"{name}.json").read_text())
    run_scenario(s, tmp_path)
    fold_outputs = {"state_pre", "conflicts", "quarantine", "divergence", "fates"}
    assert fold_outputs <= set(written), written
    assert {k: v for k, v in written.items() if k in fold_outputs and v} == {}


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


def test_the_typed_copies_and_the_ledger_are_read_without_a_spark_job(
    tmp_path: Path, spark, monkeypatch
):
    """The fetch types every record of an export into copies of one known schema
    (``frames.copy_schema``), and the ledger's files have one too (``frames.LEDGER_SCHEMA``):
    reading them names the schema instead of inferring it, which would take a Spark job
    per read (three per table and run)."""
    jobs: dict[str, list[int]] = {}
    for name in ("read_copies", "set_duplicates_aside"):
        monkeypatch.setattr(resolve, name, in_a_group(spark, getattr(resolve, name), jobs))
    s = json.loads((S.SCENARIOS / "dw_row_local_newer.json").read_text())
    assert s.get("history"), "a scenario of two nights: the second reads the first's ledger"
    run_scenario(s, tmp_path)
    assert sum(g.startswith("read_copies") for g in jobs) == 2, jobs
    assert sum(g.startswith("set_duplicates_aside") for g in jobs) == 2, jobs
    assert {g: ids for g, ids in jobs.items() if ids} == {}


@pytest.mark.parametrize(
    ("name", "stops"), [("pg_update_differ_error", True), ("pg_update_differ_apply", False)]
)
def test_the_errored_conflict_is_looked_for_only_when_the_fold_stopped(
    name: str, stops: bool, tmp_path: Path, spark, monkeypatch
):
    """A run stops at an ``error`` conflict (§12); finding it is a Spark job, which the
    runs that did not stop (the fates say so) do not pay: the conflict log's write is then
    the only Spark work of ``_write_conflicts``."""
    sc = spark.sparkContext
    jobs: dict[str, list[int]] = {}
    write = resolve._write

    def writing(df: Any, path: Path, mode: str = "overwrite") -> None:
        outer = sc.getLocalProperty("spark.jobGroup.id")
        sc.setJobGroup("write", "write")
        try:
            write(df, path, mode)
        finally:
            sc.setLocalProperty("spark.jobGroup.id", outer)

    monkeypatch.setattr(resolve, "_write", writing)
    monkeypatch.setattr(
        resolve, "_write_conflicts", in_a_group(spark, resolve._write_conflicts, jobs)
    )
    s = json.loads((S.SCENARIOS / f"{name}.json").read_text())
    _, failed = run_scenario(s, tmp_path)
    assert failed is stops
    assert jobs and all(bool(ids) is stops for ids in jobs.values()), jobs
