"""``cdr vacuum --retain-days N``: the files of versions no reader may still ask for go;
the latest version, the window's versions and every version a retained ``runs`` row names
stay, so the tables and the runs' time travel read the same after it. No Spark: tables
committed with ``pipeline.storage.lake``, read back with ``deltalake``."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest

from pipeline.app.cli import main
from pipeline.core import layout
from pipeline.core.errors import LockedError
from pipeline.publish.vacuum import Why, vacuum
from pipeline.storage.lake import Lake
from pipeline.storage.runs_table import RunRow, append, read_runs, retained_rows
from pipeline.storage.store import FileStore
from tests.helpers import configs
from tests.helpers import published as P

pytestmark = pytest.mark.usefixtures("spark")  # the Delta tables are written by delta-spark

D1, D2 = date(2026, 11, 20), date(2026, 11, 21)
LOG = layout.table_path("t", "conflicts")  # a dated table
SNAPSHOT = layout.table_path("t", layout.SNAPSHOT)


def _run(lake: Lake, tmp: Path, run_id: str, dt: date, ids: list[int]) -> RunRow:
    """A run of ``dt`` that commits its partition of a dated log and the snapshot
    (replaced whole), then its runs row."""
    c = lake.write(LOG, pa.table({"id": ids}), {"run_id": run_id}, dt=dt)
    s = lake.write(SNAPSHOT, pa.table({"id": ids}), {"run_id": run_id})
    t = datetime.now(UTC)
    row = RunRow(run_id, dt, "published", t, t, None, "c" * 64,
                 counts={"tables": {"t": {"state_rows": len(ids)}}},
                 versions={LOG: c.version, SNAPSHOT: s.version})  # fmt: skip
    append(lake, row)
    return row


def _ids(store, path: str, run: RunRow | None = None) -> list[int]:
    """The table's ids now, or at the version ``run``'s row names."""
    if run is None:
        return sorted(r["id"] for r in P.rows(store, path))
    (row,) = [r for r in P.runs(store) if r["run_id"] == run.run_id]
    return sorted(r["id"] for r in P.as_of(store, path, row))


def _files_of(lake: Lake, path: str, version: int, dt: date | None = None) -> set[str]:
    """The keys of the data files that version ``version`` of ``path`` reads (of ``dt``)."""
    adds = pa.table(lake.table(path, version).get_add_actions(flatten=True)).to_pylist()
    return {f"{path}/{a['path']}" for a in adds if dt is None or a["partition.dt"] == dt}


def test_vacuum_removes_what_no_retained_version_needs(file_store, tmp_path: Path, capsys):
    lake = Lake(file_store)
    _run(lake, tmp_path, "d1", D1, [1, 2])
    first = _run(lake, tmp_path, "d2-first", D2, [3])
    latest = _run(lake, tmp_path, "d2-again", D2, [4, 5])  # a rerun replaces D2's partition
    stray = f"{LOG}/dt={D2}/crashed-attempt-00000.parquet"  # never committed
    file_store.write_bytes(stray, b"PAR1")
    files = lambda: sorted(k for k in file_store.list(LOG) if "_delta_log" not in k)  # noqa: E731
    before = files()
    assert len(before) == 4

    kept = vacuum(file_store, retain_days=7)  # everything is within the week
    assert kept.files == 1 and kept.removed == {LOG: [stray]}  # only the stray goes
    assert [(g.why, g.keys) for g in kept.groups] == [(Why.UNLOGGED, (stray,))]
    assert "failed before its commit" in kept.groups[0].line()
    assert len(files()) == 3

    later = datetime.now(UTC) + timedelta(days=30)  # a month on: only retained rows count
    res = vacuum(file_store, retain_days=7, now=later, dry_run=True)
    (gone,) = res.removed[LOG]  # the first run of D2: replaced, and no row keeps it
    assert gone in _files_of(lake, LOG, first.versions[LOG], D2), gone
    # the snapshots of d1 and d2-first: replaced since, and their rows are past the window
    replaced = _files_of(lake, SNAPSHOT, 0) | _files_of(lake, SNAPSHOT, 1)
    assert sorted(res.removed[SNAPSHOT]) == sorted(replaced)
    # each group says why: the version that replaced it, before the window
    (why,) = [g for g in res.groups if g.path == LOG]
    replaced_by = first.versions[LOG] + 1  # the rerun's commit
    assert why.why is Why.REPLACED and f"replaced by version {replaced_by} (" in why.detail
    assert "before the window (since " in why.detail
    assert {g.why for g in res.groups if g.path == SNAPSHOT} == {Why.REPLACED}
    assert res.summary("would remove", "S").startswith("would remove 3 file(s) from S/published; ")
    assert res.kept[LOG] == 2 and res.kept[SNAPSHOT] == 1  # d1's and d2-again's; d2-again's
    kept_all = f"kept {sum(res.kept.values())} data file(s) of {len(res.kept)} table(s)"
    assert kept_all in res.summary("", "S") and "retained runs row(s) name" in res.summary("", "S")
    assert len(files()) == 3  # a dry run removes nothing
    cfg = configs.write(tmp_path / "cdr.yaml", configs.config(), store=tmp_path / "store")
    capsys.readouterr()
    assert main(["vacuum", "--config", str(cfg), "--retain-days", "0", "--dry-run"]) == 0
    said = capsys.readouterr().out.splitlines()  # as cdr says it: a summary, a line a group
    assert said[0].startswith("would remove 3 file(s) from file://") and "kept " in said[0]
    assert f"  {LOG}: 1 file(s), replaced by version {replaced_by} (" in "\n".join(said)
    res = vacuum(file_store, retain_days=7, now=later)
    assert len(files()) == 2 and res.files == 3
    assert _ids(file_store, LOG) == [1, 2, 4, 5]  # the latest version reads whole
    assert _ids(file_store, LOG, latest) == [1, 2, 4, 5]  # and the last run's pinned one
    assert _ids(file_store, SNAPSHOT, latest) == _ids(file_store, SNAPSHOT) == [4, 5]


def test_vacuum_keeps_every_row_of_the_window_and_each_tables_last_run(tmp_path: Path):
    """A row past the window is kept when it is the run a table was last published by
    (the state the next run starts from), even if the window holds other rows."""
    store = FileStore(tmp_path / "store")
    lake = Lake(store)
    only = _run(lake, tmp_path, "d1", D1, [1, 2])
    other = "published/u/snapshot"
    lake.write(other, pa.table({"id": [9]}), {"run_id": "u1"})
    t = datetime.now(UTC) + timedelta(days=30)
    row = RunRow("u1", D2, "published", t, t, None, "c" * 64,
                 counts={"tables": {"u": {}}}, versions={other: 0})  # fmt: skip
    append(lake, row)
    kept = retained_rows(read_runs(lake), t - timedelta(days=7))
    assert {r.run_id for r in kept} == {only.run_id, "u1"}
    _run(lake, tmp_path, "d0", D1 - timedelta(days=1), [3])  # a backfill of an older date
    later = _run(lake, tmp_path, "d3", D2 + timedelta(days=1), [4])  # t's last run
    kept = retained_rows(read_runs(lake), later.finished_at)
    # and the run t was last published by when the window began (d1, not the backfill)
    assert {r.run_id for r in kept} == {later.run_id, "u1", only.run_id}


def test_vacuum_waits_for_no_run(file_store, tmp_path: Path):
    from pipeline.storage import lease

    lease.acquire(file_store, "night", lease.SECONDS)
    with pytest.raises(LockedError, match="night"):
        vacuum(file_store, retain_days=7)


def test_vacuum_removes_the_logs_of_failed_runs_past_the_window(file_store, tmp_path: Path):
    """A failed run's own tables (``_failed/run=<id>/``) go whole once its row has left
    the window, and so do those of a run killed before its row went in; a failed run
    within the window keeps them."""
    lake = Lake(file_store)
    _run(lake, tmp_path, "d1", D1, [1])
    for run_id in ("old-failure", "killed", "new-failure"):
        path = layout.failed_output(run_id, "t", "conflicts")
        lake.write(path, pa.table({"id": [9]}), {"run_id": run_id}, dt=D2)
    t = datetime.now(UTC)
    for run_id, finished in (("old-failure", t), ("new-failure", t + timedelta(days=20))):
        row = RunRow(run_id, D2, "failed", finished, finished, None, "c" * 64)
        append(lake, row)
    now = vacuum(file_store, retain_days=14, now=t + timedelta(seconds=1))
    assert not [p for p in now.removed if p.startswith("published/_failed/")]  # all recent
    later = t + timedelta(days=30)
    res = vacuum(file_store, retain_days=14, now=later)
    gone = {p for p in res.removed if p.startswith("published/_failed/")}
    assert gone == {layout.failed_output(r, "t", "conflicts") for r in ("old-failure", "killed")}
    assert not file_store.list("published/_failed/run=old-failure")
    assert not file_store.list("published/_failed/run=killed")
    path = layout.failed_output("new-failure", "t", "conflicts")
    assert [r["id"] for r in P.rows(file_store, path)] == [9]
    assert _ids(file_store, LOG) == [1] and _ids(file_store, SNAPSHOT) == [1]


def test_vacuum_removes_the_state_of_a_backfill_with_its_row(file_store, tmp_path: Path):
    """A backfill's state (``_backfills/run=<id>/``) goes whole once its run's row has left
    the window; a newer backfill keeps its own."""
    lake = Lake(file_store)
    _run(lake, tmp_path, "d2", D2, [1])
    t = datetime.now(UTC)
    for run_id, finished in (("old-backfill", t), ("new-backfill", t + timedelta(days=20))):
        path = layout.backfill_state(run_id, "t")
        c = lake.write(path, pa.table({"id": [7]}), {"run_id": run_id})
        row = RunRow(run_id, D1, "published", finished, finished, None, "c" * 64,
                     versions={path: c.version})  # fmt: skip
        append(lake, row)
    res = vacuum(file_store, retain_days=14, now=t + timedelta(days=30))
    gone = {p for p in res.removed if p.startswith(layout.BACKFILLS)}
    assert gone == {layout.backfill_state("old-backfill", "t")}
    assert not file_store.list(f"{layout.BACKFILLS}/run=old-backfill")
    assert [r["id"] for r in P.rows(file_store, layout.backfill_state("new-backfill", "t"))] == [7]
    assert _ids(file_store, LOG) == [1]


def test_vacuum_removes_takeover_markers_past_the_window(file_store):
    """The markers of lease takeovers stay as a record for the window, then go."""
    from pipeline.storage import lease

    for run_id in ("gone-a", "gone-b"):  # each expires and is taken over
        lease.acquire(file_store, run_id, 0)
    lease.acquire(file_store, "last", 600)
    lease.release(file_store, "last")
    assert len(lease.takeovers(file_store)) == 2
    assert vacuum(file_store, retain_days=7).removed == {}
    later = datetime.now(UTC) + timedelta(days=8)
    res = vacuum(file_store, retain_days=7, now=later)
    assert len(res.removed[layout.LOCK_TAKEOVER]) == 2
    assert lease.takeovers(file_store) == []


def test_vacuum_removes_the_staging_folders_of_killed_runs(file_store):
    """A run killed between its resolve stage and the end of its publish leaves its staged
    output files (``published/_staging/run=<id>/``); vacuum, which no run can be in while
    it holds the lease, removes them (a dry run lists them)."""
    key = f"{layout.STAGING}/run=killed/t/state/dt=2026-11-21/killed-0-00000.parquet"
    file_store.write_bytes(key, b"PAR1")
    res = vacuum(file_store, retain_days=7, dry_run=True)
    assert res.removed == {layout.STAGING: [key]} and file_store.exists(key)
    assert vacuum(file_store, retain_days=7).removed == {layout.STAGING: [key]}
    assert not file_store.exists(key)


def test_vacuum_keeps_the_deletion_vectors_the_log_refers_to_and_removes_the_others(
    file_store, spark
):
    """A MERGE leaves a deletion vector on a file of the state; a crashed one left a
    vector file no commit refers to. Vacuum removes that one only, and the rows the kept
    vector removes stay removed for every reader."""
    from delta.tables import DeltaTable

    lake = Lake(file_store, spark=spark)
    lake.write(LOG, pa.table({"id": list(range(10))}), {"run_id": "d1"}, dt=D1)
    (
        DeltaTable.forPath(spark, lake.spark_uri(LOG))
        .alias("t")
        .merge(spark.createDataFrame([(3,)], "id long").alias("s"), "t.id = s.id")
        .whenMatchedDelete()
        .execute()
    )
    (live,) = [k for k in file_store.list(LOG) if k.endswith(".bin")]
    stray = f"{LOG}/deletion_vector_00000000-0000-4000-8000-000000000000.bin"
    file_store.write_bytes(stray, b"\x01")
    res = vacuum(file_store, retain_days=7)
    assert res.removed == {LOG: [stray]}
    assert file_store.exists(live) and not file_store.exists(stray)
    want = [i for i in range(10) if i != 3]
    assert _ids(file_store, LOG) == want
    assert sorted(r["id"] for r in P.duckdb_rows(file_store, LOG)) == want
