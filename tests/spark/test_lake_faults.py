"""A Delta commit that fails part way leaves readers the table as it was: every PUT of a
commit on S3, in turn, is made to fail (tests/helpers/faults.py), and deltalake and DuckDB then
read either the old table whole or, once the fault is lifted, the new one whole. Through
s3a a commit is many requests: CI fails a few of them (the first, the last, seeded ones),
``CDR_FULL_FAULT_SWEEP=1`` every one."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import date

from pipeline.core.errors import StoreError
from pipeline.storage.lake import Lake
from pipeline.storage.s3server import create_bucket, restore_env, use_endpoint
from pipeline.storage.store import open_store
from tests.helpers import published as P
from tests.helpers.faults import fault_points, faulty_proxy

D1, D2 = date(2026, 11, 20), date(2026, 11, 21)


def ids(store, path: str) -> list[int]:
    return sorted(r["id"] for r in P.rows(store, path))


@contextmanager
def direct(endpoint: str) -> Iterator[None]:
    """Readers go to the S3 server itself, not through the proxy (whose faults are the
    writer's)."""
    previous = use_endpoint(endpoint)
    try:
        yield
    finally:
        restore_env(previous)


def test_every_put_of_a_commit_can_fail_and_readers_see_whole_versions(
    s3_endpoint, tmp_path, spark
):
    bucket = f"cdr-faults-{uuid.uuid4().hex[:8]}"
    create_bucket(bucket)
    store = open_store(f"s3://{bucket}/prod")
    path = "published/t/conflicts"

    def rows(*values: int):
        return spark.createDataFrame([(v,) for v in values], "id long").repartition(2)

    def readers_see(want: list[int], k: object) -> None:
        with direct(s3_endpoint):
            assert ids(store, path) == want, k  # one version, whole
            assert sorted(r["id"] for r in P.duckdb_rows(store, path)) == want, k

    with faulty_proxy(s3_endpoint) as (endpoint, proxy):
        previous = use_endpoint(endpoint)
        try:
            lake = Lake(store, spark=spark)
            lake.commit(path, rows(1, 2, 3), {"run_id": "r1"}, dt=D1)
            lake.commit("published/probe", rows(1, 2, 3), {"run_id": "probe"}, dt=D1)
            proxy.arm(None)
            lake.commit("published/probe", rows(4, 5), {"run_id": "probe"}, dt=D1)
            puts = proxy.puts  # the PUTs of a rerun's commit of two files
            assert puts >= 3
            failed_before_the_commit = 0
            for k in fault_points(puts):
                before = lake.version(path)
                proxy.arm(k)
                try:
                    lake.commit(path, rows(4, 5), {"run_id": f"r-fail-{k}"}, dt=D1)
                    stood = True
                except StoreError:
                    stood = False
                assert proxy.failed >= 1, k
                proxy.arm(None)
                if not stood:
                    failed_before_the_commit += 1
                    readers_see([1, 2, 3], k)  # the old version, whole
                    assert lake.version(path) == before, k
                    continue
                # a PUT after the commit's log entry (Delta's checksum file, best effort)
                # failed: the commit stands, whole; then the old rows again for the next k
                readers_see([4, 5], k)
                lake.commit(path, rows(1, 2, 3), {"run_id": f"r-back-{k}"}, dt=D1)
            assert failed_before_the_commit >= 2  # the first PUTs: the data files
            lake.commit(path, rows(4, 5), {"run_id": "r2"}, dt=D1)
            readers_see([4, 5], "after")
        finally:
            restore_env(previous)
