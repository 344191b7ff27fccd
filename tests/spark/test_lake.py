"""The Delta commits of pipeline.storage.lake (delta-spark, deletion vectors on), read back as a
user reads them (deltalake's query engine and DuckDB's delta extension), on a file store
and on the loopback S3 server through s3a."""

from __future__ import annotations

import uuid
from datetime import date

import pyarrow as pa
import pytest

from pipeline.storage.lake import FEATURES, Files, Lake
from pipeline.storage.lake_retention import RETENTION_PROPERTIES
from tests.helpers import published as P

D1, D2 = date(2026, 11, 20), date(2026, 11, 21)
SCHEMA = "id long, v string"


def ids(rows: list[dict]) -> list[int]:
    return sorted(r["id"] for r in rows)


@pytest.fixture(params=["file", "s3"])
def store(request):
    return request.getfixturevalue(f"{request.param}_store")


def test_a_rerun_of_a_date_replaces_its_partition_and_keeps_the_others(store, spark):
    lake, path = Lake(store, spark=spark), "published/t/conflicts"
    rows = spark.createDataFrame([(1, "x"), (2, "y"), (3, "z")], SCHEMA).repartition(2)
    assert lake.commit(path, rows, {"run_id": "r1"}, dt=D1).version == 0
    lake.commit(path, spark.createDataFrame([(10, "x")], SCHEMA), {"run_id": "r2"}, dt=D2)
    c2 = lake.commit(path, spark.createDataFrame([(4, "w")], SCHEMA), {"run_id": "r3"}, dt=D1)
    assert c2.version == 2
    assert ids(P.rows(store, path, D1)) == [4]  # the rerun's rows only
    assert ids(P.rows(store, path, D2)) == [10]
    assert ids(P.table(store, path, D1, version=0) or []) == [1, 2, 3]  # time travel
    assert ids(P.duckdb_rows(store, path, D1)) == [4]
    assert ids(P.duckdb_rows(store, path)) == [4, 10]
    runs = [P.commit_meta(h).get("run_id") for h in lake.history(path)]
    assert runs == ["r3", "r2", "r1"]
    assert ids(r.asDict() for r in lake.frame(path, version=1, dt=D1).collect()) == [1, 2, 3]


def test_an_empty_rerun_empties_its_partition(store, spark):
    lake, path = Lake(store, spark=spark), "published/t/quarantine"
    lake.commit(path, spark.createDataFrame([(1, "x")], SCHEMA), {"run_id": "r1"}, dt=D1)
    assert lake.commit(path, None, {"run_id": "r2"}, dt=D1).version == 1
    assert P.rows(store, path, D1) == []
    assert lake.commit(path, None, {"run_id": "r3"}, dt=D2).version == 1  # nothing to do


def test_an_undated_table_is_replaced_whole(store, spark):
    lake, path = Lake(store, spark=spark), "published/t/snapshot"
    lake.commit(path, spark.createDataFrame([(1, "x"), (2, "y")], SCHEMA), {"run_id": "r1"})
    lake.commit(path, spark.createDataFrame([(3, "z")], SCHEMA), {"run_id": "r2"})
    assert ids(P.rows(store, path)) == [3]
    assert ids(P.duckdb_rows(store, path)) == [3]


def test_file_statistics_let_a_reader_skip_files(store, spark):
    lake, path = Lake(store, spark=spark), "published/t/snapshot"
    rows = spark.createDataFrame([(1, "a"), (5, "e"), (7, "g")], SCHEMA).repartition(1)
    lake.commit(path, rows, {"run_id": "r1"})
    (add,) = pa.table(lake.table(path).get_add_actions(flatten=True)).to_pylist()
    assert (add["num_records"], add["min.id"], add["max.id"], add["null_count.v"]) == (3, 1, 7, 0)


def test_files_a_task_wrote_are_committed_as_they_are_with_their_statistics(store, spark, tmp_path):
    """A run's Parquet files (written by its tasks with pyarrow) become the table's files:
    copied into the date's folder by the executors, with statistics from their footers (a
    long string's bounds left out), read alike by every reader; a rerun of the date removes
    them in its one commit and another date's stay."""
    import pyarrow.parquet as pq
    from pyspark.sql.types import StructType

    lake, path = Lake(store, spark=spark), "published/t/conflicts"
    long_text = "x" * 40
    parts = [[(1, "a"), (5, None)], [(7, long_text)]]
    uris = []
    for i, rows in enumerate(parts):
        f = tmp_path / f"part-{i}.parquet"
        ids_, vs = zip(*rows, strict=True)
        pq.write_table(pa.table({"id": pa.array(ids_, pa.int64()), "v": list(vs)}), f)
        uris.append(str(f))
    schema = StructType.fromDDL(SCHEMA)
    assert lake.commit(path, Files(uris, schema), {"run_id": "r1"}, dt=D1).version == 0
    lake.commit(path, Files(uris[1:], schema), {"run_id": "r2"}, dt=D2)
    adds = pa.table(lake.table(path).get_add_actions(flatten=True)).to_pylist()
    first = sorted((a for a in adds if a["partition.dt"] == D1), key=lambda a: a["num_records"])
    assert [a["num_records"] for a in first] == [1, 2]
    assert (first[1]["min.id"], first[1]["max.id"], first[1]["null_count.v"]) == (1, 5, 1)
    assert (first[1]["min.v"], first[1]["max.v"]) == ("a", "a")
    assert first[0]["min.v"] is None and first[0]["min.id"] == 7  # 40 characters: no bounds
    assert all(a["path"].startswith("dt=") for a in adds)
    want = [1, 5, 7]
    assert ids(P.rows(store, path, D1)) == ids(P.duckdb_rows(store, path, D1)) == want
    assert ids(r.asDict() for r in lake.frame(path, dt=D1).collect()) == want
    assert "deletionVectors" in (Lake(store).table(path).protocol().reader_features or [])
    assert lake.commit(path, Files(uris[:1], schema), {"run_id": "r3"}, dt=D1).version == 2
    assert ids(P.rows(store, path, D1)) == [1, 5]
    assert ids(P.rows(store, path, D2)) == [7]
    assert ids(P.table(store, path, D1, version=0) or []) == want  # time travel


def test_files_replace_a_date_without_a_file_list_in_the_checksum(store, spark, tmp_path):
    """With no checksum file, a date's files still go in the one commit that adds the new
    ones as they are (Delta's scan of the state finds them); a new column: Delta's writer."""
    import pyarrow.parquet as pq
    from pyspark.sql.types import StructType

    lake, path = Lake(store, spark=spark), "published/t/ledger"
    lake.commit(path, spark.createDataFrame([(1, "a")], SCHEMA), {}, dt=D1)
    lake.commit(path, spark.createDataFrame([(2, "b")], SCHEMA), {}, dt=D2)
    store.delete([k for k in store.list(f"{path}/_delta_log/") if k.endswith(".crc")])
    spark.sparkContext._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()  # its copy too
    f = tmp_path / "part-0.parquet"
    pq.write_table(pa.table({"id": pa.array([3], pa.int64()), "v": ["c"]}), f)
    assert lake.commit(path, Files([str(f)], StructType.fromDDL(SCHEMA)), {}, dt=D1).version == 2
    assert ids(P.rows(store, path, D1)) == [3] and ids(P.rows(store, path, D2)) == [2]
    adds = pa.table(Lake(store).table(path).get_add_actions(flatten=True)).to_pylist()
    (add,) = [a for a in adds if a["partition.dt"] == D1]
    assert add["path"].startswith("dt=2026-11-20/cdr-")  # the file itself, not rewritten
    wide = tmp_path / "part-1.parquet"
    pq.write_table(pa.table({"id": pa.array([4], pa.int64()), "v": ["d"], "n": [1]}), wide)
    lake.commit(path, Files([str(wide)], StructType.fromDDL(SCHEMA + ", n long")), {}, dt=D2)
    assert [(r["id"], r["n"]) for r in P.rows(store, path, D2)] == [(4, 1)]


def test_every_table_is_created_with_the_projects_features_and_the_writers_retention(store, spark):
    def config(path: str) -> dict[str, str | None]:
        c = Lake(store).table(path).metadata().configuration
        return {k: c.get(k) for k in (*RETENTION_PROPERTIES, *FEATURES)}

    lake, path = Lake(store, retention_days=45, spark=spark), "published/t/snapshot"
    lake.write(path, _arrow([1]), {"run_id": "a"})
    want = {**dict.fromkeys(RETENTION_PROPERTIES, "interval 45 days"), **FEATURES}
    assert config(path) == want
    assert "deletionVectors" in (Lake(store).table(path).protocol().reader_features or [])
    longer = Lake(store, retention_days=60, spark=spark)  # the setting changed
    c = longer.write(path, _arrow([2]), {"run_id": "b"})
    assert c.version == 2 and ids(P.rows(store, path)) == [2]  # its own commit, then b's
    assert config(path)["delta.logRetentionDuration"] == "interval 60 days"
    assert P.commit_meta(longer.history(path)[1]).get("operation") == "set the table properties"
    assert longer.write(path, _arrow([3]), {}).version == 3  # once


def _arrow(values: list[int]):
    import pyarrow as pa

    return pa.table({"id": pa.array(values, pa.int64())})


def test_readers_agree_on_a_version_after_a_merge_that_updated_and_deleted(store, spark):
    """delta-spark, delta-rs and DuckDB read the same rows at a version after a MERGE
    that went through deletion vectors; reading the version's files as plain Parquet
    would not (the rows a deletion vector removed come back)."""
    from delta.tables import DeltaTable

    lake, path = Lake(store, spark=spark), "published/t/conflicts"
    rows = spark.createDataFrame([(i, str(i)) for i in range(20)], SCHEMA).repartition(1)
    lake.commit(path, rows, {"run_id": "r1"}, dt=D1)
    changes = spark.createDataFrame(
        [(3, "new", False), (4, None, True)], "id long, v string, gone boolean"
    )
    (
        DeltaTable.forPath(spark, lake.spark_uri(path))
        .alias("t")
        .merge(changes.alias("s"), "t.id = s.id")
        .whenMatchedDelete("s.gone")
        .whenMatchedUpdate(set={"v": "s.v"})
        .execute()
    )
    assert lake.version(path) == 1
    metrics = DeltaTable.forPath(spark, lake.spark_uri(path)).history(1).collect()[0]
    assert metrics.operationMetrics["numTargetDeletionVectorsAdded"] == "1"
    want = sorted((i, "new" if i == 3 else str(i)) for i in range(20) if i != 4)
    by_spark = sorted((r.id, r.v) for r in lake.frame(path, version=1).collect())
    by_rs = sorted((r["id"], r["v"]) for r in P.table(store, path, version=1) or [])
    by_duckdb = sorted((r["id"], r["v"]) for r in P.duckdb_rows(store, path))
    assert by_spark == by_rs == by_duckdb == want
    assert sorted((r["id"], r["v"]) for r in lake.read(path, version=1).to_pylist()) == want


def _jobs_of(spark, work) -> int:
    """The Spark jobs ``work()`` ran (in a job group of its own: a name from ``id(work)``
    was taken again by the next call's lambda once the first was freed, and the status
    tracker counted both calls' jobs)."""
    sc = spark.sparkContext
    group = f"cdr-test-{uuid.uuid4().hex}"
    sc.setJobGroup(group, group)
    try:
        work()
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    return len(sc.statusTracker().getJobIdsForGroup(group))


def test_a_replace_takes_the_files_it_removes_from_the_checksum_not_a_scan(store, spark):
    """A partition replaced after a MERGE that left a deletion vector: the partition's
    files go (the one with its vector too), the other date's stay, and the commit ran one
    Spark job (the write), not Delta's reconstruction of the table's state."""
    from delta.tables import DeltaTable

    lake, path = Lake(store, spark=spark), "published/t/conflicts"
    lake.commit(path, spark.createDataFrame([(i, "a") for i in range(6)], SCHEMA), {}, dt=D1)
    lake.commit(path, spark.createDataFrame([(9, "b")], SCHEMA), {}, dt=D2)
    (
        DeltaTable.forPath(spark, lake.spark_uri(path))
        .alias("t")
        .merge(spark.createDataFrame([(2, "x")], SCHEMA).alias("s"), "t.id = s.id")
        .whenMatchedDelete()
        .execute()
    )
    rows = spark.createDataFrame([(7, "c")], SCHEMA)
    jobs = _jobs_of(spark, lambda: lake.commit(path, rows, {"run_id": "r"}, dt=D1))
    assert jobs == 1
    assert ids(P.rows(store, path, D1)) == [7] and ids(P.rows(store, path, D2)) == [9]
    assert ids(P.duckdb_rows(store, path)) == [7, 9]
    assert P.commit_meta(lake.history(path, 1)[0]).get("run_id") == "r"
    whole = spark.createDataFrame([(8, "d")], SCHEMA)
    lake.commit("published/t/snapshot", whole, {})  # a new table: Delta's own writer
    assert _jobs_of(spark, lambda: lake.commit("published/t/snapshot", rows, {})) == 1
    assert ids(P.rows(store, "published/t/snapshot")) == [7]


def test_without_a_file_list_in_the_checksum_a_replace_is_deltas_own(store, spark):
    """No checksum file (a table another writer made), or a new column: Delta's overwrite
    (its scan of the state, its schema merge) does the replace, with the same result."""
    lake, path = Lake(store, spark=spark), "published/t/ledger"
    lake.commit(path, spark.createDataFrame([(1, "a")], SCHEMA), {}, dt=D1)
    lake.commit(path, spark.createDataFrame([(2, "b")], SCHEMA), {}, dt=D2)
    store.delete([k for k in store.list(f"{path}/_delta_log/") if k.endswith(".crc")])
    spark.sparkContext._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()  # its copy too
    rows = spark.createDataFrame([(3, "c")], SCHEMA)
    assert _jobs_of(spark, lambda: lake.commit(path, rows, {}, dt=D1)) > 1
    assert ids(P.rows(store, path, D1)) == [3] and ids(P.rows(store, path, D2)) == [2]
    wider = spark.createDataFrame([(4, "d", 1)], SCHEMA + ", n int")
    lake.commit(path, wider, {}, dt=D2)
    assert [(r["id"], r["n"]) for r in P.rows(store, path, D2)] == [(4, 1)]
    assert [(r["id"], r["n"]) for r in P.rows(store, path, D1)] == [(3, None)]


def test_a_merge_by_key_replaces_adds_and_deletes_rows_in_one_commit(store, spark):
    """``Lake.merge``: rows replace their key's row or are added, a ``_drop`` row deletes
    it; one commit through deletion vectors (no row of the table's file is copied), read
    the same by delta-spark, delta-rs and DuckDB."""
    from delta.tables import DeltaTable

    lake, path = Lake(store, spark=spark), "published/t/snapshot"
    start = spark.createDataFrame([(i, str(i)) for i in range(5)], SCHEMA).repartition(1)
    lake.commit(path, start, {"run_id": "r1"})
    rows = spark.createDataFrame(
        [(1, "one", False), (3, None, True), (9, "nine", False), (8, None, True)],
        "id long, v string, _drop boolean",
    )
    assert lake.merge(path, rows, ["id"], {"run_id": "r2"}).version == 1
    want = [(0, "0"), (1, "one"), (2, "2"), (4, "4"), (9, "nine")]
    assert sorted((r["id"], r["v"]) for r in P.rows(store, path)) == want
    assert sorted((r["id"], r["v"]) for r in P.duckdb_rows(store, path)) == want
    assert sorted((r.id, r.v) for r in lake.frame(path).collect()) == want
    assert "_drop" not in lake.frame(path).columns
    commit = DeltaTable.forPath(spark, lake.spark_uri(path)).history(1).collect()[0]
    assert commit.operation == "MERGE"
    assert commit.operationMetrics["numTargetDeletionVectorsAdded"] == "1"
    assert commit.operationMetrics["numTargetRowsCopied"] == "0"
    assert P.commit_meta(lake.history(path, 1)[0]).get("run_id") == "r2"
    none = spark.createDataFrame([(7, "seven", None)], "id long, v string, _drop boolean")
    assert lake.merge(path, none, ["id"], {"run_id": "r3"}).version == 2  # null: not a drop
    assert ids(P.rows(store, path)) == [0, 1, 2, 4, 7, 9]
    same = spark.createDataFrame([(8, None, True)], "id long, v string, _drop boolean")
    assert lake.merge(path, same, ["id"], {"run_id": "r4"}).version == 2  # nothing changed


def test_a_merge_of_a_run_that_lost_its_lease_commits_nothing(file_store, spark, monkeypatch):
    from pipeline.core.errors import LockedError
    from pipeline.storage import lease

    held = lease.acquire(file_store, "run-a", 600)
    lake = Lake(file_store, spark=spark, fence=lease.Fence(file_store, "run-a", held.epoch))
    path = "published/t/snapshot"
    lake.commit(path, spark.createDataFrame([(1, "x")], SCHEMA), {})
    lease.unlock(file_store, force=True)
    lease.acquire(file_store, "run-b", 600)  # another run took the store over
    monkeypatch.setattr(lease.Fence, "before", lambda self, table: None)  # paused past it
    rows = spark.createDataFrame([(1, "late", False)], "id long, v string, _drop boolean")
    with pytest.raises(LockedError, match=f"{path}: another writer.*held by run run-b"):
        lake.merge(path, rows, ["id"], {})
    assert Lake(file_store).version(path) == 0
    assert [r["v"] for r in P.rows(file_store, path)] == ["x"]


def test_an_undated_commit_over_a_table_partitioned_by_date_changes_its_layout(store, spark):
    """A store of the layout before the state was updated in place: the first run that
    commits the state whole turns it into a table without date partitions, in one
    commit; the version before still reads as it was."""
    lake, path = Lake(store, spark=spark), "published/t/state"
    lake.commit(path, spark.createDataFrame([(1, "a")], SCHEMA), {"run_id": "r1"}, dt=D1)
    lake.commit(path, spark.createDataFrame([(3, "c")], SCHEMA), {"run_id": "r1"}, dt=D2)
    assert (
        lake.commit(path, spark.createDataFrame([(2, "b")], SCHEMA), {"run_id": "r2"}).version == 2
    )
    assert lake.table(path).metadata().partition_columns == []
    assert ids(P.rows(store, path)) == [2] and ids(P.duckdb_rows(store, path)) == [2]
    assert lake.frame(path).columns == ["id", "v"]
    assert ids(P.table(store, path, version=1) or []) == [1, 3]
    assert P.commit_meta(lake.history(path, 1)[0]).get("run_id") == "r2"
    empty = "published/u/state"  # a table of the old layout that never held a row
    lake.commit(empty, spark.createDataFrame([], SCHEMA), {"run_id": "r1"}, dt=D1)
    lake.commit(empty, spark.createDataFrame([(5, "e")], SCHEMA), {"run_id": "r2"})
    assert lake.table(empty).metadata().partition_columns == []
    assert ids(P.rows(store, empty)) == [5] and lake.frame(empty).columns == ["id", "v"]
