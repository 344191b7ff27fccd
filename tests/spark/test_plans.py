"""What the resolve stage's plans cost in Spark jobs: the row engine folds a table and
writes its outputs in one Spark job; reading the typed copies and the ledger names their
schema (no inference job); finding the error that stopped a run reads files on the driver;
and each output of the cell engine (state, conflict log, quarantine, divergence, fates,
changes) is written from its resolution's files, never by computing it again (an earlier
design persisted the resolution, and Spark matches a persisted DataFrame by its plan: a
union of two DataFrames derived from it whose plan read the copies a second time silently
stopped matching, and each write ran the resolution again)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pipeline.resolve import engine
from pipeline.resolve import stage as resolve
from tests.helpers import scenarios as S
from tests.helpers.sparkjobs import in_a_group


def relations_read(df: Any) -> set[str]:
    """What the leaves of ``df``'s plan read: the folder of each relation over files, the
    class of any other relation. Frames made on the driver (``LocalRelation``,
    ``LogicalRDD``) are left out."""
    found: set[str] = set()
    todo = [df._jdf.queryExecution().withCachedData()]
    while todo:
        node = todo.pop()
        children = node.children()
        name = node.getClass().getSimpleName()
        if name == "LogicalRelation":
            paths = node.relation().location().rootPaths()
            found |= {Path(paths.apply(i).toUri().getPath()).name for i in range(paths.size())}
        elif children.isEmpty() and name not in ("LocalRelation", "LogicalRDD"):
            found.add(name)
        todo.extend(children.apply(i) for i in range(children.size()))
    return found


@pytest.mark.parametrize("name", ["scylla_rule2_dead_beats_live"])
def test_the_cell_outputs_are_written_from_the_resolutions_files(
    name: str, tmp_path: Path, spark, monkeypatch
):
    written: dict[str, set[str]] = {}
    write = resolve._write

    def spy(df, path: Path, mode: str = "overwrite") -> None:
        written[path.name] = relations_read(df)
        write(df, path, mode)

    monkeypatch.setattr(resolve, "_write", spy)
    s = json.loads((S.SCENARIOS / f"{name}.json").read_text())
    s["config"]["cdc"] = S.CDC
    S.run_scenario(s, tmp_path)
    fold_outputs = {"state_pre", "conflicts", "quarantine", "divergence", "fates", "changes"}
    assert fold_outputs <= set(written), written
    assert {k: v for k, v in written.items() if k in fold_outputs} == {
        **{k: {resolve.RESOLUTION} for k in fold_outputs},
        "divergence": set(),  # a cell table converges: made on the driver, empty
    }
    assert not list(tmp_path.rglob(resolve.RESOLUTION))  # removed once they are written


@pytest.fixture
def one_job_per_action(spark):
    """Adaptive execution off: it submits each shuffle's map stage as a Spark job of its
    own, so that the jobs of one action are counted as one."""
    key = "spark.sql.adaptive.enabled"
    before = spark.conf.get(key)
    spark.conf.set(key, "false")
    yield
    spark.conf.set(key, before)


@pytest.mark.parametrize(
    ("name", "jobs_per_fold"),
    [
        ("pg_insert_exists_apply", [1]),
        ("pg_delta_two_credits", [1]),
        # copies under different keys: folded again, their winners broadcast
        ("differing_copies", [1, 2]),
        # the coupled keys (a frame made on the driver) are broadcast to both branches
        ("pg_multiple_unique_conflicts_apply", [3]),
        # the admitted transactions: their times, and the keys they touch, broadcast
        ("dw_transaction_scope", [4]),
    ],
)
def test_the_row_engine_folds_a_table_in_one_spark_job(
    name: str, jobs_per_fold: list[int], tmp_path: Path, spark, monkeypatch, one_job_per_action
):
    """The fold of a row table is one Spark job: the shuffle by key and the tasks that fold
    each partition and write every output; nothing computes an output again. A broadcast
    frame is collected by a job of its own."""
    jobs: dict[str, list[int]] = {}
    monkeypatch.setattr(engine, "fold", in_a_group(spark, engine.fold, jobs))
    path = S.SCENARIOS / f"{name}.json"
    s = json.loads((path if path.exists() else S.GOLDEN / f"{name}.json").read_text())
    S.run_scenario(s, tmp_path)
    nights = len(s.get("history", [])) + 1
    row_tables = sum(t.get("policy") != "scylla" for t in s["config"]["tables"].values())
    assert [len(ids) for ids in jobs.values()] == jobs_per_fold * nights * row_tables, jobs


def test_the_typed_copies_and_the_ledger_are_read_without_a_spark_job(
    tmp_path: Path, spark, monkeypatch
):
    """The fetch types every record of an export into copies of one known schema
    (``frames.copy_schema``), and the ledger's files have one too (``frames.LEDGER_SCHEMA``):
    reading them names the schema instead of inferring it, which would take a Spark job
    per read (three per table and run)."""
    jobs: dict[str, list[int]] = {}
    monkeypatch.setattr(resolve, "read_copies", in_a_group(spark, resolve.read_copies, jobs))
    monkeypatch.setattr(engine, "with_seen", in_a_group(spark, engine.with_seen, jobs))
    s = json.loads((S.SCENARIOS / "dw_row_local_newer.json").read_text())
    assert s.get("history"), "a scenario of two nights: the second reads the first's ledger"
    S.run_scenario(s, tmp_path)
    assert sum(g.startswith("read_copies") for g in jobs) == 2, jobs
    assert sum(g.startswith("with_seen") for g in jobs) == 2, jobs
    assert {g: ids for g, ids in jobs.items() if ids} == {}


@pytest.mark.parametrize(
    ("name", "stops"), [("pg_update_differ_error", True), ("pg_update_differ_apply", False)]
)
def test_the_errored_conflict_is_found_on_the_driver_only_when_the_fold_stopped(
    name: str, stops: bool, tmp_path: Path, spark, monkeypatch
):
    """A run stops at an ``error`` conflict (docs/rules.md#what-is-quarantined): the fates
    say so, and only then is the conflict log read (on the driver, without a Spark job) and
    cut at the first one."""
    jobs: dict[str, list[int]] = {}
    monkeypatch.setattr(resolve, "_cut_at_error", in_a_group(spark, resolve._cut_at_error, jobs))
    s = json.loads((S.SCENARIOS / f"{name}.json").read_text())
    _, failed = S.run_scenario(s, tmp_path)
    assert failed is stops
    assert len(jobs) == (1 if stops else 0), jobs
    assert not any(jobs.values()), jobs


def test_a_small_run_takes_at_most_15_spark_jobs_per_table(tmp_path: Path, spark, monkeypatch):
    """Issue 15: a small run (a few events) takes at most 15 Spark jobs per table, from the
    fetch to validation's measures. Below ``spark.CODEGEN_MIN_RECORDS`` records its plans
    are interpreted and adaptive execution is off (it would submit every shuffle's map
    stage as a job of its own); the session's settings come back after the stage."""
    from pipeline import stages

    jobs: dict[str, list[int]] = {}
    monkeypatch.setattr(stages, "resolve", in_a_group(spark, stages.resolve, jobs))
    adaptive = spark.conf.get("spark.sql.adaptive.enabled")
    s = json.loads((S.SCENARIOS / "pg_update_differ_apply.json").read_text())
    assert len(s["config"]["tables"]) == 1 and not s.get("history")
    S.run_scenario(s, tmp_path)
    assert len(jobs) == 1
    assert 0 < len(next(iter(jobs.values()))) <= 15, jobs
    assert spark.conf.get("spark.sql.adaptive.enabled") == adaptive
