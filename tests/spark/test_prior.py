"""What a run starts from (pipeline.ingest.prior): the state its previous date published, pinned
at the version that run's ``runs`` row names, and the ledger's window; a missing, cut or
foreign file stops the run with a message naming it. On a file store and on the loopback
S3 server."""

from __future__ import annotations

from datetime import date, timedelta

import pyarrow as pa
import pytest

from pipeline.core import layout
from pipeline.core.errors import PriorStateError
from pipeline.ingest.prior import ledger_window, pin_ledger, pin_state
from pipeline.storage.lake import Lake
from pipeline.storage.lake_read import read_pinned
from pipeline.storage.runs_table import RunRow, now

D1 = date(2026, 11, 20)
STATE = layout.table_path("t", layout.STATE)


@pytest.fixture(params=["file", "s3"])
def store(request):
    return request.getfixturevalue(f"{request.param}_store")


def published(lake: Lake, spark, run_id: str = "r1", rows: int = 3) -> RunRow:
    frame = spark.createDataFrame([(i, f"e{i}") for i in range(rows)], "id long, event_id string")
    c = lake.commit(STATE, frame.repartition(1), {"run_id": run_id}, dt=D1)
    t = now()
    return RunRow(run_id, D1, "published", t, t, None, "c" * 64,
                  counts={"tables": {"t": {"state_rows": rows}}},
                  versions={STATE: c.version})  # fmt: skip


def test_the_published_state_is_pinned_and_read_by_the_executors(store, spark):
    lake = Lake(store, spark=spark)
    run = published(lake, spark)
    pin = pin_state(store, lake, run, "t")
    assert (pin.version, pin.dates, pin.rows) == (0, (D1.isoformat(),), 3)
    assert sorted(r.id for r in read_pinned(spark, pin).collect()) == [0, 1, 2]


def test_a_state_updated_in_place_is_pinned_whole_at_its_version(file_store, spark):
    """A state table without date partitions: the state of a date is the version its
    runs row names, whole."""
    lake = Lake(file_store, spark=spark)
    frame = spark.createDataFrame([(i, f"e{i}") for i in range(3)], "id long, event_id string")
    c = lake.commit(STATE, frame, {"run_id": "r1"})
    lake.commit(STATE, frame.where("id = 0"), {"run_id": "r2"})  # a later date's
    t = now()
    counts = {"tables": {"t": {"state_rows": 3}}}
    run = RunRow("r1", D1, "published", t, t, None, "c" * 64, counts=counts, versions={STATE: 0})
    assert c.version == 0
    pin = pin_state(file_store, lake, run, "t")
    assert (pin.version, pin.dates, pin.rows) == (0, None, 3)
    assert sorted(r.id for r in read_pinned(spark, pin).collect()) == [0, 1, 2]


def test_an_empty_state_left_empty_names_the_version_before_it(file_store, spark):
    """A table whose state stays empty: the second run makes no commit and its row names
    the first run's version, which the third run accepts; a row that says it has rows
    does not."""
    lake = Lake(file_store, spark=spark)
    empty = spark.createDataFrame([], "id long, event_id string")
    assert lake.commit(STATE, empty, {"run_id": "r1"}).version == 0
    t = now()
    second = RunRow("r2", D1, "published", t, t, None, "c" * 64,
                    counts={"tables": {"t": {"state_rows": 0}}}, versions={STATE: 0})  # fmt: skip
    assert pin_state(file_store, lake, second, "t").rows == 0
    said = RunRow(**{**second.__dict__, "counts": {"tables": {"t": {"state_rows": 3}}}})
    with pytest.raises(PriorStateError, match="committed by 'r1'"):
        pin_state(file_store, lake, said, "t")


def test_a_missing_or_cut_file_stops_the_run(store, spark):
    lake = Lake(store, spark=spark)
    run = published(lake, spark)
    (add,) = pa.table(lake.table(STATE).get_add_actions(flatten=True)).to_pylist()
    key = f"{STATE}/{add['path']}"
    store.write_bytes(key, store.read_bytes(key)[:-10])  # the file cut short
    with pytest.raises(PriorStateError, match=r"not the file the Delta log names"):
        pin_state(store, lake, run, "t")
    store.delete([key])
    with pytest.raises(PriorStateError, match=r"missing \(3 rows\)"):
        pin_state(store, lake, run, "t")


def test_a_version_another_run_committed_stops_the_run(file_store, spark):
    lake = Lake(file_store, spark=spark)
    run = published(lake, spark, "r1")
    published(lake, spark, "r2")  # a later run of the same date, not in r1's row
    named_later = RunRow(**{**run.__dict__, "versions": {STATE: 1}})
    with pytest.raises(PriorStateError, match="committed by 'r2'"):
        pin_state(file_store, lake, named_later, "t")


def test_the_ledger_window_is_the_grace_period_before_the_date(file_store, spark):
    lake, path = Lake(file_store, spark=spark), layout.table_path("t", layout.LEDGER)
    for back in range(0, 13):  # D1 and the twelve days before it
        d = D1 - timedelta(days=back)
        frame = spark.createDataFrame([(back, f"e{back}")], "id long, event_id string")
        lake.commit(path, frame, {"run_id": "r"}, dt=d)
    pin = pin_ledger(file_store, lake, "t", D1, 10 * 86_400)
    assert pin is not None
    assert pin.dates == tuple((D1 - timedelta(days=b)).isoformat() for b in range(10, 0, -1))
    days = sorted(r.id for r in read_pinned(spark, pin).collect())
    assert days == list(range(1, 11))  # [D1 - 10 days, D1): not D1 itself
    assert pin_ledger(file_store, lake, "t", D1 - timedelta(days=20), 10 * 86_400) is None
    assert ledger_window(D1, 864000) == (D1 - timedelta(days=10), D1)
    assert ledger_window(D1, 3600) == (D1, D1)  # under a day: no earlier date
