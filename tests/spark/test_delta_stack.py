"""The Spark stack users run: delta-spark in the session (the locked jars on the class
path), a MERGE that updates and deletes through deletion vectors, on ``file://`` and on
the S3 test server through ``s3a://``; what delta-spark wrote, delta-rs and DuckDB read."""

from __future__ import annotations

import boto3
import pytest

from pipeline.spark import jars

BASE = "SELECT id AS k, CAST(id AS STRING) AS v FROM range(0, 100)"


def _merge(spark, uri: str) -> dict[str, str]:
    from delta.tables import DeltaTable

    spark.sql(BASE).repartition(2).write.format("delta").option(
        "delta.enableDeletionVectors", "true"
    ).mode("overwrite").save(uri)
    changes = spark.sql("SELECT id * 7 AS k, 'new' AS v, id % 2 = 0 AS gone FROM range(0, 5)")
    (
        DeltaTable.forPath(spark, uri)
        .alias("t")
        .merge(changes.alias("s"), "t.k = s.k")
        .whenMatchedDelete("s.gone")
        .whenMatchedUpdate(set={"v": "s.v"})
        .execute()
    )
    last = DeltaTable.forPath(spark, uri).history(1).collect()[0]
    return {
        k: last.operationMetrics[k]
        for k in ("numTargetRowsUpdated", "numTargetRowsDeleted", "numTargetDeletionVectorsAdded")
    }


def _expected() -> list[tuple[int, str]]:
    deleted = {0, 14, 28}
    updated = {7, 21}
    return [(k, "new" if k in updated else str(k)) for k in range(100) if k not in deleted]


def test_the_session_runs_the_locked_delta_release(spark):
    (delta,) = [j for j in jars.locked() if j.artifact.startswith("delta-spark_")]
    cls = spark._jvm.java.lang.Class.forName("org.apache.spark.sql.delta.DeltaLog")
    assert str(cls.getProtectionDomain().getCodeSource().getLocation()).endswith(delta.file_name)


def test_merge_with_deletion_vectors_on_local_files(spark, tmp_path):
    import duckdb_extension_delta  # noqa: F401
    from deltalake import DeltaTable, QueryBuilder

    uri = (tmp_path / "t").as_uri()
    metrics = _merge(spark, uri)
    assert metrics == {
        "numTargetRowsUpdated": "2",
        "numTargetRowsDeleted": "3",
        "numTargetDeletionVectorsAdded": "2",
    }
    got = sorted(tuple(r) for r in spark.read.format("delta").load(uri).collect())
    assert got == _expected()
    # delta-rs reads deletion vectors through its query engine (its pyarrow reader refuses
    # the table: it does not support them)
    dt = DeltaTable(str(tmp_path / "t"))
    assert "deletionVectors" in (dt.protocol().reader_features or [])
    rs = QueryBuilder().register("t", dt).execute("SELECT k, v FROM t ORDER BY k").read_all()
    assert list(zip(rs["k"].to_pylist(), rs["v"].to_pylist(), strict=True)) == _expected()
    from tests.helpers.published import duckdb_rows

    rows = duckdb_rows(tmp_path, "t")
    assert sorted((r["k"], r["v"]) for r in rows) == _expected()


@pytest.mark.usefixtures("s3_endpoint")
def test_merge_with_deletion_vectors_through_s3a(spark):
    import uuid

    from pipeline.spark.session import use_s3a

    bucket = f"cdr-s3a-{uuid.uuid4().hex[:8]}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    use_s3a(spark, bucket)
    metrics = _merge(spark, f"s3a://{bucket}/t")
    assert metrics["numTargetDeletionVectorsAdded"] == "2"
    got = sorted(tuple(r) for r in spark.read.format("delta").load(f"s3a://{bucket}/t").collect())
    assert got == _expected()
    keys = [o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket=bucket)["Contents"]]
    assert any(k.startswith("t/deletion_vector_") for k in keys)


def test_local_files_get_their_permissions_without_a_child_process(spark, tmp_path):
    """``file://`` is the project's local file system
    (``pipeline/spark/java/LocalFileSystem.java``): the JDK sets the bits chmod would; a
    Delta commit still writes its checksum file (renamed into place by Spark's
    file-system-based manager, not FileContext's readlink)."""
    import os
    import stat

    from deltalake import DeltaTable

    jvm = spark._jvm
    conf = spark._jsc.hadoopConfiguration()
    fs = jvm.org.apache.hadoop.fs.FileSystem.get(jvm.java.net.URI("file:///"), conf)
    assert fs.getClass().getName() == "cdr.fs.LocalFileSystem"
    f = tmp_path / "f"
    f.write_text("x")
    for mode in (0o640, 0o755, 0o600, 0o000, 0o777, 0o1777):  # the sticky bit: by chmod
        fs.setPermission(
            jvm.org.apache.hadoop.fs.Path(f.as_uri()),
            jvm.org.apache.hadoop.fs.permission.FsPermission(mode),
        )
        assert stat.S_IMODE(os.stat(f).st_mode) == mode
    table = tmp_path / "t"
    spark.sql(BASE).write.format("delta").save(table.as_uri())
    assert (table / "_delta_log" / "00000000000000000000.crc").is_file()
    assert DeltaTable(str(table)).to_pyarrow_table().num_rows == 100
