"""docs/rules.md#lost-writes on real PostgreSQL servers: pg2 subscribes to pg1 (logical
replication, one way), and each server's changes are exported through a wal2json slot
(pg2's export holds pg1's changes as it applied them, named by their replication origin).

- key 1: pg1 inserts it, pg2 applies the insert and then updates the row: pg2 had seen
  pg1's write, an origin change (`update_differ`) that lost nothing: `sequential`.
- key 2: with the subscription disabled, pg1 and then pg2 update it; pg2 applies pg1's
  update after its own once the subscription is on again: neither had seen the other's
  write, `concurrent`, and pg1's update (the earlier) is the write lost.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from pipeline.app.cli import main
from pipeline.core.report import RunReport
from pipeline.storage.store import Store
from tests.helpers import configs
from tests.helpers import pg_replicas as pgr
from tests.helpers import published as P
from tests.helpers import sources as src

SCHEMA = "create table items(id int primary key, qty int not null);"


def _wait(server: pgr.Server, query: str, want: str) -> None:
    """Until ``query`` answers ``want`` on ``server`` (the subscription applied)."""
    deadline = time.monotonic() + 60
    while server.sql(query).strip() != want:
        assert time.monotonic() < deadline, f"{server.name}: {query} never gave {want}"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def servers():
    pgr.require()
    with pgr.Cluster(("pg1", "pg2")) as cluster:
        yield cluster.servers


def _night(pg1: pgr.Server, pg2: pgr.Server) -> None:
    for s in (pg1, pg2):
        s.sql(SCHEMA)
        s.sql("select pg_create_logical_replication_slot('cdr_items', 'wal2json')")
    pg1.sql("create publication p for table items")
    pg2.sql(
        f"create subscription s connection 'host=127.0.0.1 port={pg1.port} user=postgres "
        "dbname=app' publication p with (copy_data = false)"
    )
    pg1.sql("insert into items values (1, 1)")
    _wait(pg2, "select qty from items where id = 1", "1")
    pg2.sql("update items set qty = 2 where id = 1")  # pg2 had applied pg1's insert
    pg1.sql("insert into items values (2, 1)")
    _wait(pg2, "select qty from items where id = 2", "1")
    pg2.sql("alter subscription s disable")
    pg1.sql("update items set qty = 10 where id = 2")
    pg2.sql("update items set qty = 20 where id = 2")  # neither saw the other's update
    pg2.sql("alter subscription s enable")
    _wait(pg2, "select qty from items where id = 2", "10")  # pg1's, applied after its own


def test_a_replicated_write_is_sequential_and_a_partitioned_one_concurrent(
    tmp_path: Path, s3_store: Store, servers
):
    pg1, pg2 = servers["pg1"], servers["pg2"]
    _night(pg1, pg2)
    exports = {n: s.wal2json("items") for n, s in servers.items()}
    # pg2's subscription's replication origin is pg1
    origins = {k: "pg1" for k, name in pg2.origins().items() if name.startswith("pg_")}
    assert origins, pg2.origins()
    dt = datetime.now(UTC).date().isoformat()
    for name, lines in exports.items():
        options = {"origins": origins} if name == "pg2" else None
        src.put_export(
            s3_store, name, "items", dt, "wal2json", {"s.json": src.lines(lines)}, options
        )
    cfg = configs.config(
        {"items": {"key": ["id"], "columns": {"id": "int", "qty": "int"}}},
        replicas=configs.replicas(pg1=pg1.system_id, pg2=pg2.system_id),
        store=s3_store.uri,
        defaults={"policy": "postgres", "resolvers": {"update_differ": "latest_timestamp_wins"}},
    )
    configs.write(tmp_path / "cdr.yaml", cfg)
    args = ["--date", dt, "--work-dir", str(tmp_path / "work"), "--no-data-docs"]
    assert main(["run", "--config", str(tmp_path / "cdr.yaml"), *args]) == 0
    by_key = {r["key"]: r for r in P.log(s3_store, "items", "conflicts", dt)}
    assert set(by_key) == {'{"id":1}', '{"id":2}'}, by_key
    one, two = by_key['{"id":1}'], by_key['{"id":2}']
    assert (one["conflict_type"], one["local_origin"], one["remote_origin"]) == (
        "update_differ",
        "pg1",
        "pg2",
    )
    assert (one["concurrency"], one["lost_event_id"]) == ("sequential", None)
    assert (two["conflict_type"], two["concurrency"], two["outcome"]) == (
        "update_differ",
        "concurrent",
        "applied",
    )
    assert two["lost_event_id"] == two["local_event_id"] is not None  # pg1's update
    report = RunReport.from_json(s3_store.read_bytes(f"published/reports/dt={dt}/run_report.json"))
    s = report.tables["items"]
    assert (s.lost_writes, s.concurrency) == (1, {"sequential": 1, "concurrent": 1})
    assert {r["id"]: r["qty"] for r in P.snapshot(s3_store, "items")} == {1: 2, 2: 20}
