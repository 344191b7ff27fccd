"""The ``runs`` table (pipeline.runs_table): appended by every run, read back by the
next run to find the state it starts from, and by users through DuckDB."""

from __future__ import annotations

from datetime import date, timedelta
from pathlib import Path

from pipeline import layout
from pipeline.lake import Lake
from pipeline.runs_table import RunRow, append, latest_date, latest_published, now, read_runs
from tests.helpers import published as P

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
    versions = [append(lake, r, tmp_path / "work") for r in rows]
    assert versions == [0, 1, 2, 3, 4, 5]
    got = read_runs(lake)
    assert [r.run_id for r in got] == ["r1", "r2", "r3", "r4", "r5", "r6"]
    assert got[3] == rows[3]  # every field, JSON ones and UTC timestamps included
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
    from pipeline.runs_table import version_of

    lake = Lake(file_store)
    versions = {
        f"r{i}": append(lake, row(f"r{i}", D1, "published", minutes=i), tmp_path / "w")
        for i in range(25)
    }
    assert versions["r0"] == 0 and versions["r24"] == 24
    for run_id in ("r24", "r10", "r0"):  # r0 is past the newest 20 commits
        assert version_of(lake, run_id) == versions[run_id]
    assert version_of(lake, "r-unknown") is None
