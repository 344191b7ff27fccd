"""A Delta commit that fails part way leaves readers the table as it was: every PUT of a
commit on S3, in turn, is made to fail (tests/helpers/faults.py), and deltalake and DuckDB then
read either the old table whole or, once the fault is lifted, the new one whole."""

from __future__ import annotations

import uuid
from datetime import date
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.errors import StoreError
from pipeline.lake import Lake
from pipeline.s3server import create_bucket, restore_env, use_endpoint
from pipeline.store import open_store
from tests.helpers import published as P
from tests.helpers.faults import faulty_proxy

D1, D2 = date(2026, 11, 20), date(2026, 11, 21)
SCHEMA = pa.schema([("id", pa.int64())])


def parquet(tmp: Path, name: str, ids: list[int]) -> Path:
    p = tmp / f"{name}.parquet"
    pq.write_table(pa.table({"id": ids}, schema=SCHEMA), p)
    return p


def ids(store, path: str) -> list[int]:
    return sorted(r["id"] for r in P.rows(store, path))


def test_every_put_of_a_commit_can_fail_and_readers_see_whole_versions(s3_endpoint, tmp_path):
    bucket = f"cdr-faults-{uuid.uuid4().hex[:8]}"
    create_bucket(bucket)
    with faulty_proxy(s3_endpoint) as (endpoint, proxy):
        previous = use_endpoint(endpoint)
        try:
            store = open_store(f"s3://{bucket}/prod")
            lake, path = Lake(store), "published/t/conflicts"
            lake.commit(path, [parquet(tmp_path, "old", [1, 2, 3])], SCHEMA, {"run_id": "r1"},
                        dt=D1)  # fmt: skip
            new = [parquet(tmp_path, "a", [4]), parquet(tmp_path, "b", [5])]
            proxy.arm(None)
            lake.commit("published/probe", new, SCHEMA, {"run_id": "probe"}, dt=D1)
            puts = proxy.puts  # the PUTs one commit of two files makes
            assert puts >= 3
            for k in range(1, puts + 1):
                proxy.arm(k)
                with pytest.raises(StoreError):
                    lake.commit(path, new, SCHEMA, {"run_id": f"r-fail-{k}"}, dt=D1)
                assert proxy.failed >= 1
                proxy.arm(None)
                assert ids(store, path) == [1, 2, 3], k  # the old version, whole
                assert sorted(r["id"] for r in P.duckdb_rows(store, path)) == [1, 2, 3], k
                assert Lake(store).version(path) == 0, k
            lake.commit(path, new, SCHEMA, {"run_id": "r2"}, dt=D1)
            assert ids(store, path) == [4, 5]
            assert sorted(r["id"] for r in P.duckdb_rows(store, path)) == [4, 5]
        finally:
            restore_env(previous)
