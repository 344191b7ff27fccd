"""The project's Delta log store (``pipeline/spark/java/FencedLogStore.java``), on a file store
and on the loopback S3 server through s3a: a commit file is created only if absent, by
whichever process or JVM comes second too, and a commit is put only while the writer's
run holds the store's lease with its epoch."""

from __future__ import annotations

from datetime import date

import pytest

from pipeline.core.errors import LockedError
from pipeline.storage import lease
from pipeline.storage.lake import Lake
from tests.helpers import published as P

D1, D2 = date(2026, 11, 20), date(2026, 11, 21)
SCHEMA = "id long, v string"


@pytest.fixture(params=["file", "s3"])
def store(request):
    return request.getfixturevalue(f"{request.param}_store")


def _put(spark, lake: Lake, path: str, version: int, line: str) -> None:
    """Write one commit file through a new instance of the log store (nothing it could
    remember of an earlier write)."""
    jvm = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    store = jvm.cdr.delta.FencedLogStore(conf)
    lines = jvm.java.util.ArrayList()
    lines.add(line)
    target = jvm.org.apache.hadoop.fs.Path(f"{lake.spark_uri(path)}/_delta_log/{version:020d}.json")
    store.write(target, lines.iterator(), False, conf)


def test_a_commit_file_is_created_only_if_absent(store, spark):
    lake, path = Lake(store, spark=spark), "published/t/conflicts"
    lake.commit(path, spark.createDataFrame([(1, "x")], SCHEMA), {"run_id": "r1"}, dt=D1)
    before = store.read_bytes(f"{path}/_delta_log/00000000000000000000.json")
    with pytest.raises(Exception, match="FileAlreadyExistsException"):
        _put(spark, lake, path, 0, '{"commitInfo":{"who":"the second writer"}}')
    assert store.read_bytes(f"{path}/_delta_log/00000000000000000000.json") == before
    _put(spark, lake, path, 1, '{"commitInfo":{"who":"the next version"}}')  # a new name: made
    assert b"the next version" in store.read_bytes(f"{path}/_delta_log/00000000000000000001.json")


def test_a_commit_of_a_run_that_lost_its_lease_is_refused_at_the_log(store, spark, monkeypatch):
    """The fence's own check passes (as for a writer paused just after it): the log store
    reads the lease again before it puts the commit file, and refuses."""
    held = lease.acquire(store, "run-a", 600)
    lake = Lake(store, spark=spark, fence=lease.Fence(store, "run-a", held.epoch))
    path = "published/t/conflicts"
    assert lake.commit(path, spark.createDataFrame([(1, "x")], SCHEMA), {}, dt=D1).version == 0
    lease.unlock(store, force=True)
    lease.acquire(store, "run-b", 600)  # another run took the store over
    monkeypatch.setattr(lease.Fence, "before", lambda self, table: None)
    late = spark.createDataFrame([(2, "y")], SCHEMA)
    with pytest.raises(LockedError, match=f"{path}: another writer.*held by run run-b"):
        lake.commit(path, late, {}, dt=D2)  # an append (a new partition)
    with pytest.raises(LockedError, match=f"{path}: another writer.*held by run run-b"):
        lake.commit(path, late, {}, dt=D1)  # a replace (pipeline/spark/java/Replace.java)
    assert Lake(store).version(path) == 0  # no commit of the late writer
    assert sorted(r["id"] for r in P.rows(store, path)) == [1]


def test_a_writer_without_a_fence_is_not_checked(store, spark):
    lease.acquire(store, "someone-else", 600)
    lake, path = Lake(store, spark=spark), "published/t/snapshot"
    assert lake.commit(path, spark.createDataFrame([(1, "x")], SCHEMA), {}).version == 0
