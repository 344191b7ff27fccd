"""docs/outputs.md#instants: the conflict log carries each time twice, the µs the rules
compared and the same instant as a ``TIMESTAMP``, from both engines (a row table and a
cell table of one night: ``tests/golden/clock_skew_rows_and_cells.json``), and the
reasons print the instant with its µs."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipeline.core.instants import instant_micros
from tests.helpers import published as P
from tests.helpers import scenarios as S

NIGHT = Path(__file__).resolve().parent.parent / "golden" / "clock_skew_rows_and_cells.json"
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _tie(origin: str, qty: int, seq: int) -> dict:
    """A write of ``cells`` key 2's qty at the same µs as the other origin's: a conflict."""
    return {
        "op": "UPDATE",
        "key": {"id": 2},
        "ts": "2026-11-21T10:07:00.000001Z",
        "origin": origin,
        "event_id": f"c{origin}-tie",
        "after": {"qty": qty},
        "seq": seq,
    }


def test_the_conflict_log_has_each_time_as_micros_and_as_an_instant(tmp_path: Path, spark):
    s = json.loads(NIGHT.read_text())
    for exported in s["exports"].values():
        exported["cells"] += [_tie("A", 7, 5), _tie("B", 8, 6)]
    _got, failed = S.run_scenario(s, tmp_path)
    assert not failed
    store = tmp_path / "store"
    for table in ("rows", "cells"):
        path = store / "published" / table / "conflicts"
        log_ = spark.read.format("delta").load(path.as_uri())
        types = {f.name: f.dataType for f in log_.schema.fields}
        assert types["local_time"] == types["remote_time"] == T.TimestampType(), table
        assert types["local_ts"] == types["remote_ts"] == T.LongType(), table
        same = [
            F.unix_micros(F.col(f"{side}_time")).eqNullSafe(F.col(f"{side}_ts"))
            for side in ("local", "remote")
        ]
        assert log_.count() > 0 and log_.where(~(same[0] & same[1])).count() == 0, table
        rows = P.rows(store, f"published/{table}/conflicts", s["date"])  # another reader
        for r in rows:
            assert r["remote_time"] == EPOCH + timedelta(microseconds=r["remote_ts"])
            if r["local_ts"] is None:
                assert r["local_time"] is None
            else:
                assert r["local_time"] == EPOCH + timedelta(microseconds=r["local_ts"])
        if table == "rows":  # an update_missing has no local version; the others print it
            assert any(r["local_ts"] is None for r in rows)
            against = [r for r in rows if "local origin" in r["reason"]]
            assert against and all(
                r["reason"].endswith(f"ts {instant_micros(r['local_ts'])}") for r in against
            )
