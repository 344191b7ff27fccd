"""What a run starts from (pipeline.prior): the state its previous date published,
checked against that run's ``runs`` row, and the ledger's window; a missing, short or
foreign file stops the run with a message naming it."""

from __future__ import annotations

from datetime import date, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline import layout
from pipeline.errors import PriorStateError
from pipeline.lake import Lake
from pipeline.prior import stage_ledger, stage_state
from pipeline.runs_table import RunRow, now

D1 = date(2026, 11, 20)
SCHEMA = pa.schema([("id", pa.int64()), ("event_id", pa.string())])
STATE = layout.table_path("t", layout.STATE)


def parquet(tmp: Path, name: str, n: int, first: int = 0) -> Path:
    p = tmp / f"{name}.parquet"
    ids = list(range(first, first + n))
    pq.write_table(pa.table({"id": ids, "event_id": [f"e{i}" for i in ids]}, schema=SCHEMA), p)
    return p


def published(lake: Lake, tmp: Path, run_id: str = "r1", rows: int = 3) -> RunRow:
    c = lake.commit(STATE, [parquet(tmp, run_id, rows)], SCHEMA, {"run_id": run_id}, dt=D1)
    t = now()
    return RunRow(run_id, D1, "published", t, t, None, "c" * 64,
                  counts={"tables": {"t": {"state_rows": rows}}},
                  versions={STATE: c.version})  # fmt: skip


@pytest.fixture(params=["file"])  # and "s3": tests/spark/test_prior.py
def store(request):
    return request.getfixturevalue(f"{request.param}_store")


def test_the_published_state_is_staged_whole(store, tmp_path: Path):
    lake = Lake(store)
    run = published(lake, tmp_path)
    staged = stage_state(store, lake, run, "t", tmp_path / "stage")
    assert staged.rows == 3
    got = sorted(r["id"] for f in staged.files for r in pq.read_table(f).to_pylist())
    assert got == [0, 1, 2]


def test_a_missing_or_short_file_stops_the_run(store, tmp_path: Path):
    lake = Lake(store)
    run = published(lake, tmp_path)
    adds = pa.table(lake.table(STATE).get_add_actions(flatten=True)).to_pylist()
    (key,) = [f"{STATE}/{a['path']}" for a in adds]
    short = parquet(tmp_path, "short", 2)
    store.upload(short, key)  # the file under the same name, with a row fewer
    with pytest.raises(PriorStateError, match="2 rows, but the Delta log says 3"):
        stage_state(store, lake, run, "t", tmp_path / "stage1")
    store.delete([key])
    with pytest.raises(PriorStateError, match=r"missing \(3 rows\)"):
        stage_state(store, lake, run, "t", tmp_path / "stage2")


def test_a_version_another_run_committed_stops_the_run(file_store, tmp_path: Path):
    lake = Lake(file_store)
    run = published(lake, tmp_path, "r1")
    published(lake, tmp_path, "r2")  # a later run of the same date, not in r1's row
    named_later = RunRow(**{**run.__dict__, "versions": {STATE: 1}})
    with pytest.raises(PriorStateError, match="committed by 'r2'"):
        stage_state(file_store, lake, named_later, "t", tmp_path / "stage")
    fewer = RunRow(**{**run.__dict__, "counts": {"tables": {"t": {"state_rows": 4}}}})
    with pytest.raises(PriorStateError, match="lists 3 rows, the runs row 4"):
        stage_state(file_store, lake, fewer, "t", tmp_path / "stage")


def test_the_ledger_window_is_the_grace_period_before_the_date(file_store, tmp_path: Path):
    lake, path = Lake(file_store), layout.table_path("t", layout.LEDGER)
    for back in range(0, 13):  # D1 and the twelve days before it
        d = D1 - timedelta(days=back)
        lake.commit(path, [parquet(tmp_path, f"l{back}", 1, back)], SCHEMA, {"run_id": "r"}, dt=d)
    staged = stage_ledger(file_store, lake, "t", D1, 10 * 86_400, tmp_path / "stage")
    assert staged == [(D1 - timedelta(days=b)).isoformat() for b in range(10, 0, -1)]
    files = (tmp_path / "stage").rglob("*.parquet")
    days = sorted(r["id"] for f in files for r in pq.read_table(f).to_pylist())
    assert days == list(range(1, 11))  # [D1 - 10 days, D1): not D1 itself
