"""The Delta commits of pipeline.lake, read back as a user reads them (deltalake and
DuckDB's delta extension), on a file store (and on the loopback S3 server:
tests/spark/test_lake.py)."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.lake import Lake
from tests.helpers import published as P

D1, D2 = date(2026, 11, 20), date(2026, 11, 21)
SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string())])


def files(tmp: Path, name: str, *chunks: list[tuple[int, str]]) -> list[Path]:
    out = []
    for i, rows in enumerate(chunks):
        p = tmp / f"{name}-{i}.parquet"
        ids, vs = zip(*rows, strict=True) if rows else ((), ())
        pq.write_table(pa.table({"id": list(ids), "v": list(vs)}, schema=SCHEMA), p)
        out.append(p)
    return out


def ids(rows: list[dict]) -> list[int]:
    return sorted(r["id"] for r in rows)


@pytest.fixture(params=["file"])  # and "s3": tests/spark/test_lake.py
def store(request):
    return request.getfixturevalue(f"{request.param}_store")


def test_a_rerun_of_a_date_replaces_its_partition_and_keeps_the_others(store, tmp_path: Path):
    lake, path = Lake(store), "published/t/conflicts"
    c0 = lake.commit(path, files(tmp_path, "a", [(1, "x"), (2, "y")], [(3, "z")]), SCHEMA,
                     {"run_id": "r1"}, dt=D1)  # fmt: skip
    assert (c0.version, c0.files, c0.rows) == (0, 2, 3)
    lake.commit(path, files(tmp_path, "b", [(10, "x")]), SCHEMA, {"run_id": "r2"}, dt=D2)
    c2 = lake.commit(path, files(tmp_path, "c", [(4, "w")]), SCHEMA, {"run_id": "r3"}, dt=D1)
    assert c2.version == 2
    assert ids(P.rows(store, path, D1)) == [4]  # the rerun's rows only
    assert ids(P.rows(store, path, D2)) == [10]
    assert ids(P.table(store, path, D1, version=0) or []) == [1, 2, 3]  # time travel
    assert ids(P.duckdb_rows(store, path, D1)) == [4]
    assert ids(P.duckdb_rows(store, path)) == [4, 10]
    runs = [h.get("cdr.run_id") for h in lake.history(path)]
    assert runs == ["r3", "r2", "r1"]


def test_an_empty_rerun_empties_its_partition(store, tmp_path: Path):
    lake, path = Lake(store), "published/t/quarantine"
    lake.commit(path, files(tmp_path, "a", [(1, "x")]), SCHEMA, {"run_id": "r1"}, dt=D1)
    lake.commit(path, [], SCHEMA, {"run_id": "r2"}, dt=D1)
    assert P.rows(store, path, D1) == []
    assert lake.version(path) == 1


def test_an_undated_table_is_replaced_whole(store, tmp_path: Path):
    lake, path = Lake(store), "published/t/state"
    lake.commit(path, files(tmp_path, "a", [(1, "x"), (2, "y")]), SCHEMA, {"run_id": "r1"})
    lake.commit(path, files(tmp_path, "b", [(3, "z")]), SCHEMA, {"run_id": "r2"})
    assert ids(P.rows(store, path)) == [3]
    assert ids(P.duckdb_rows(store, path)) == [3]
    assert [f.rsplit("/", 1)[-1][:3] for f in lake.files(path)] == ["r2-"]


def test_file_statistics_let_a_reader_skip_files(store, tmp_path: Path):
    lake, path = Lake(store), "published/t/snapshot"
    lake.commit(path, files(tmp_path, "a", [(1, "a"), (5, "e")], [(7, "g")]), SCHEMA,
                {"run_id": "r1"})  # fmt: skip
    adds = pa.table(lake.table(path).get_add_actions(flatten=True)).to_pylist()
    got = sorted((a["num_records"], a["min.id"], a["max.id"], a["null_count.v"]) for a in adds)
    assert got == [(1, 7, 7, 0), (2, 1, 5, 0)]


def test_every_table_carries_the_writers_retention_an_older_one_from_its_next_commit(
    store, tmp_path: Path
):
    from pipeline.lake import RETENTION_PROPERTIES

    def retention(path: str) -> dict[str, str | None]:
        config = Lake(store).table(path).metadata().configuration
        return {k: config.get(k) for k in RETENTION_PROPERTIES}

    older, path = Lake(store), "published/t/snapshot"  # a store an older version wrote
    older.write(path, pa.table({"id": [1]}), {"run_id": "a"}, work=tmp_path)
    assert retention(path) == dict.fromkeys(RETENTION_PROPERTIES)
    lake = Lake(store, retention_days=45)
    c = lake.write(path, pa.table({"id": [2]}), {"run_id": "b"}, work=tmp_path)
    assert retention(path) == dict.fromkeys(RETENTION_PROPERTIES, "interval 45 days")
    assert c.version == 2 and ids(P.rows(store, path)) == [2]  # its own commit, then b's
    assert lake.write(path, pa.table({"id": [3]}), {}, work=tmp_path).version == 3  # once
    new = "published/u/snapshot"
    assert lake.write(new, pa.table({"id": [1]}), {}, work=tmp_path).version == 0
    assert retention(new) == dict.fromkeys(RETENTION_PROPERTIES, "interval 45 days")
