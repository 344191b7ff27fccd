"""The ``runs`` table (pipeline.storage.runs_table): appended by every run, read back by the
next run to find the state it starts from, and by users through DuckDB."""

from __future__ import annotations

from dataclasses import replace
from datetime import date, timedelta
from pathlib import Path

import pytest

from pipeline.core import layout
from pipeline.core.errors import LockedError
from pipeline.storage.lake import Lake
from pipeline.storage.runs_table import (
    RunRow,
    append,
    latest_date,
    latest_published,
    now,
    read_runs,
)
from tests.helpers import published as P

pytestmark = pytest.mark.usefixtures("spark")  # the Delta tables are written by delta-spark

D1, D2, D3 = date(2026, 11, 19), date(2026, 11, 20), date(2026, 11, 21)


def row(run_id: str, dt: date, status: str, tables=("orders",), minutes: int = 0) -> RunRow:
    t = now() + timedelta(minutes=minutes)
    return RunRow(
        run_id=run_id,
        dt=dt,
        status=status,
        started_at=t,
        finished_at=t + timedelta(seconds=30),
        prior_run_id=None,
        config_sha256="c" * 64,
        inputs=[{"manifest": "exports/replica=a/table=orders/_manifest.json", "sha256": "ab"}],
        verdict={"passed": status == "published"},
        counts={"tables": {t: {"applied": 3} for t in tables}},
        versions={f"published/{t}/state": 1 for t in tables},
    )


def test_runs_are_appended_and_the_prior_run_is_the_last_published(file_store, tmp_path: Path):
    lake = Lake(file_store)
    rows = [
        row("r1", D1, "published", minutes=0),
        row("r2", D2, "published", minutes=1),
        row("r3", D2, "failed", minutes=2),  # a failed rerun does not replace r2
        row("r4", D2, "published", tables=("orders", "products"), minutes=3),
        row("r5", D3, "dry_run", minutes=4),
        row("r6", D2, "failed", minutes=5),  # nor does one after it
    ]
    versions = [append(lake, r) for r in rows]
    assert versions == [0, 1, 2, 3, 4, 5]
    got = read_runs(lake)
    assert [r.run_id for r in got] == ["r1", "r2", "r3", "r4", "r5", "r6"]
    # every field, JSON ones and UTC timestamps included; the row names its own commit
    assert got[3] == replace(rows[3], versions={**rows[3].versions, layout.RUNS: 3})
    assert latest_published(got, "orders", D3).run_id == "r4"
    assert latest_published(got, "orders", D2).run_id == "r1"
    assert latest_published(got, "products", D2) is None
    assert latest_date(got, "orders") == D2
    assert latest_date(got, "customers") is None
    by_duckdb = P.duckdb_rows(file_store, layout.RUNS)
    assert sorted((r["run_id"], r["status"]) for r in by_duckdb) == [
        ("r1", "published"), ("r2", "published"), ("r3", "failed"), ("r4", "published"),
        ("r5", "dry_run"), ("r6", "failed"),
    ]  # fmt: skip


def test_version_of_names_the_commit_that_appended_a_runs_row(file_store, tmp_path: Path):
    """The asset events' ``runs_version``: the commit of the run's own row, whether it is
    among the newest commits or older than the first page of the history."""
    from pipeline.storage.runs_table import version_of

    lake = Lake(file_store)
    versions = {f"r{i}": append(lake, row(f"r{i}", D1, "published", minutes=i)) for i in range(25)}
    assert versions["r0"] == 0 and versions["r24"] == 24
    for run_id in ("r24", "r10", "r0"):  # r0 is past the newest 20 commits
        assert version_of(lake, run_id) == versions[run_id]
    assert version_of(lake, "r-unknown") is None


def test_runs_are_ordered_by_their_commit_not_by_a_hosts_clock(file_store, tmp_path: Path):
    """A rerun of D2 on a host whose clock is an hour behind finishes "before" the run
    it replaces: it is still the later one, the one D2 stands for."""
    lake = Lake(file_store)
    for r in (
        row("r1", D1, "published", minutes=0),
        row("r2", D2, "published", minutes=0),
        row("r2-rerun", D2, "published", minutes=-60),
    ):
        append(lake, r)
    got = read_runs(lake)
    assert [(r.run_id, r.seq) for r in got] == [("r1", 0), ("r2", 1), ("r2-rerun", 2)]
    assert latest_published(got, "orders", D3).run_id == "r2-rerun"


def test_a_row_names_the_version_its_commit_made_or_is_not_committed(file_store, tmp_path: Path):
    lake = Lake(file_store)
    append(lake, row("r1", D1, "published"))
    meta = {"run_id": "late"}
    version = lake.next_version(layout.RUNS, meta)  # 1
    append(lake, row("r2", D2, "published"))  # another writer took it
    late = row("late", D3, "published").to_arrow()
    with pytest.raises(LockedError, match="at version 1, not 0: another writer"):
        lake.write(layout.RUNS, late, meta, mode="append", version=version)
    assert [r.run_id for r in read_runs(lake)] == ["r1", "r2"]
    assert lake.read(layout.RUNS).num_rows == 2


def test_on_an_older_store_a_row_names_the_commit_after_the_retentions(file_store, tmp_path: Path):
    """The first run of a store written without the retention: its runs table gets the
    retention in a commit of its own, and the row names the commit after it."""
    append(Lake(file_store), row("old", D1, "published"))
    assert append(Lake(file_store, 30), row("new", D2, "published")) == 2
    assert [(r.run_id, r.seq) for r in read_runs(Lake(file_store))] == [("old", 0), ("new", 2)]
