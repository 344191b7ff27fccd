"""Debezium as it really runs (docs/adapters.md#debezium): the embedded engine and the
PostgreSQL connector (``pgoutput``, tests/helpers/debezium.py) capture the three real
PostgreSQL 15 servers of the real-source test (tests/e2e/test_real_sources.py: its base
rows, scripted conflicts and concurrent workloads), writing each change event as an S3
sink connector names and rotates its objects, in both of Kafka Connect's JsonConverter
modes from one capture, with and without ``provide.transaction.metadata`` in one JVM.

- **Night 1**: every connector starts on a new slot (``snapshot.mode=initial``): its
  snapshot reads the base rows (``op: r``), which seed the tables (docs/adapters.md#
  snapshot-reads); then the workload streams. The snapshot equals the last writer by
  commit timestamp, key by key and column by column (the SQL over the servers' audit
  tables), and the conflict log holds the conflicts the script made.
- **Night 2**: pg1's and pg3's connectors resume from their offsets. pg1 and pg3 write
  newer values and delete rows first (product 61, which every server inserted at the end
  of night 1; order 3); then pg2's connector re-snapshots on a new slot (a lost slot): its
  reads are the stale rows pg2 holds. No converged value changes for
  them and no deleted key comes back; the reads are counted and named.
- **Without schemas, decimals as bytes** (``decimal.handling.mode=precise``): the
  records whose decimals cannot be read are quarantined with a message naming the
  setting, and the night says so loudly (docs/operations.md#a-loud-quarantine);
  with ``decimal.handling.mode=string`` the same capture converges.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import pytest

from pipeline.app.cli import main
from pipeline.storage.store import open_store
from tests.e2e import test_real_sources as real
from tests.helpers import REPO
from tests.helpers import debezium as dbz
from tests.helpers import pg_replicas as pgr
from tests.helpers import published as P
from tests.helpers import sources as src

pytestmark = [pytest.mark.slow]

REPLICAS = ("pg1", "pg2", "pg3")
#: night 2's writes of pg1 and pg3 before pg2's connector re-snapshots: newer values of
#: rows pg2 holds too, and deletions of rows pg2 still holds
#: night 1's last write, on every server: a product no workload touches, which pg1 then
#: deletes on night 2
SIXTY_ONE = "insert into products values (61, 'sixty-one', 61.00);"
BEFORE_RESNAPSHOT = {
    "pg1": "update products set name = 'twelve, newer on pg1', price = 12.12 where product_no = 12;"
    "delete from products where product_no = 61;",
    "pg3": "update products set name = 'fourteen, newer on pg3' where product_no = 14;"
    "delete from orders where order_id = 3;",
}
#: what the script must show in the conflict log (the real-source test's), but for the
#: key changes: Debezium's PostgreSQL connector writes a primary key's change as a
#: delete of the old key and a create of the new one (docs/adapters.md#debezium), so pg2's
#: update of product 9 meets a deleted row, and pg1's move of 10 to 95 an insert onto it
SCRIPTED_CONFLICTS = [
    ("products", 9, "update_deleted", "converted_to_insert")
    if key == 9
    else ("products", 95, "insert_exists", "converted_to_update")
    if key == 95
    else (t, key, ctype, outcome)
    for t, key, ctype, outcome in real.SCRIPTED_CONFLICTS
]
#: pg2's own writes of night 2, after its connector started again
AFTER_RESNAPSHOT = "update products set price = 15.15 where product_no = 15;"


def _missing() -> None:
    for why in (pgr.missing(), dbz.missing()):
        if why is not None:
            if why == pgr.missing() and os.geteuid() == 0:
                pgr.install()
                continue
            (pytest.fail if os.environ.get("CI") else pytest.skip)(why)


def _engines(servers: dict[str, pgr.Server], out: Path, night: int) -> dict[str, dict[str, str]]:
    """Per server, two connectors: ``<server>`` with transaction metadata and decimals as
    bytes (``precise``, the default), ``<server>s`` without and decimals as text; on
    night 2, pg2's first connector on a new slot with new offsets (a re-snapshot)."""
    engines = {}
    for n, s in servers.items():
        fresh = night == 2 and n == "pg2"
        slot = f"dbz_{n}_again" if fresh else f"dbz_{n}"
        engines[n] = dbz.properties(
            n, s.port, out / f"{slot}.offsets", slot=slot, tables=pgr.TABLES,
            transaction_metadata=True, time_zone_db="app",
        )  # fmt: skip
        engines[f"{n}s"] = dbz.properties(
            f"{n}s", s.port, out / f"dbzs_{n}.offsets", slot=f"dbzs_{n}", tables=pgr.TABLES,
            decimals="string", time_zone_db="app",
        )  # fmt: skip
    return engines


@pytest.fixture(scope="module")
def capture(tmp_path_factory) -> Any:
    """Two nights captured: each engine's objects per night, the system ids, and what the
    snapshot must be after each night (the SQL over the audit tables)."""
    _missing()
    out = tmp_path_factory.mktemp("debezium")
    with pgr.Cluster(REPLICAS) as cluster:
        servers = cluster.servers
        for s in servers.values():
            s.setup(real.BASE_SQL, slots=False)
            s.sql(dbz.MARKER_SQL)
        with dbz.Capture(out / "night1", _engines(servers, out, 1)) as cap:
            cap.wait_for_slots()
            cap.wait_for("snapshot")
            for name, sql in real.SCRIPT:
                servers[name].sql(sql + ";")
            threads = [
                threading.Thread(
                    target=s.sql, args=(real.random_workload(n, i),), kwargs={"check": False}
                )
                for i, (n, s) in enumerate(servers.items())
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            for s in servers.values():
                s.sql(SIXTY_ONE)
            cap.stop(servers.values())
        system_ids = {n: s.system_id for n, s in servers.items()}
        night1 = _changes(servers, system_ids)
        want1 = pgr.expected(cluster.verify, real.base_changes() + night1)
        for n, sql in BEFORE_RESNAPSHOT.items():
            servers[n].sql(sql)
        stale = {t: servers["pg2"].table_rows(t) for t in pgr.TABLES}
        with dbz.Capture(out / "night2", _engines(servers, out, 2)) as cap:
            cap.wait_for_slots()
            cap.wait_for("snapshot", {"pg2"})
            servers["pg2"].sql(AFTER_RESNAPSHOT)
            cap.stop(servers.values())
        changes = _changes(servers, system_ids)
        want2 = pgr.expected(cluster.verify, real.base_changes() + changes)
        d1 = real.run_date(night1)
        yield {
            "out": out,
            "system_ids": system_ids,
            "want": {1: want1, 2: want2},
            "stale": stale,
            "dsn": servers["pg1"].dsn,
            "dates": {1: d1, 2: (date.fromisoformat(d1) + timedelta(days=1)).isoformat()},
        }


def _changes(servers: dict[str, pgr.Server], system_ids: dict[str, int]) -> list[dict[str, Any]]:
    return [
        {**c, "server": n, "system_id": system_ids[n]}
        for n, s in servers.items()
        for c in s.audit()
    ]


def _put(store: Any, capture: Any, night: int, suffix: str, mode: str, **options: Any) -> None:
    """Each replica's objects of a night (engine ``<replica><suffix>``, JsonConverter
    ``mode``) as its exports of the night's date, one per table."""
    out, dt = capture["out"] / f"night{night}", capture["dates"][night]
    for rep in REPLICAS:
        for t in pgr.TABLES:
            objects = dbz.records(out, f"{rep}{suffix}", mode, f"{rep}{suffix}.public.{t}")
            files = {name: (data, data.count(b"\n")) for name, data in objects}
            src.put_export(store, rep, t, dt, "debezium", files, options or None)


def test_two_nights_with_schemas_and_transaction_metadata(tmp_path: Path, s3_store, capture):
    """Night 1 seeds each table from its snapshot reads and converges to the last writer;
    night 2's re-snapshot of pg2 changes no converged value and resurrects no key, and is
    counted and named."""
    tables = pgr.TABLES
    for night in (1, 2):
        _put(s3_store, capture, night, "", "schemas", transaction_metadata=True)
        dt = capture["dates"][night]
        assert real.run_pipeline(tmp_path, s3_store, capture["system_ids"], tables, dt) == 0
        report = real.check_run(s3_store, dt, tables, capture["want"][night])
        reads = {t: report.tables[t].replicas for t in tables}
        if night == 1:  # every base row read by every replica's connector, none applied
            for t in tables:
                assert report.tables[t].start.startswith("the snapshot reads"), report.tables[t]
                assert {r: reads[t][r].get("read") for r in REPLICAS} == dict.fromkeys(
                    REPLICAS, len(real.BASE[t])
                )
            got = {(r["table"], r["key"], r["conflict_type"], r["outcome"]) for t in tables
                   for r in _logged(s3_store, dt, t)}  # fmt: skip
            for t, key, ctype, outcome in SCRIPTED_CONFLICTS:
                near = sorted(g for g in got if g[:2] == (t, key))
                assert (t, key, ctype, outcome) in got, (t, key, ctype, outcome, near)
        else:  # pg2's re-snapshot: its stale rows read, counted, named, never applied
            for t in tables:
                assert reads[t]["pg2"].get("read") == len(capture["stale"][t]), (t, reads[t])
                assert "read" not in reads[t]["pg1"] and "read" not in reads[t]["pg3"]
            assert any("replica pg2" in w and "snapshot read" in w for w in report.warnings)
            snap = {r["product_no"]: r for r in P.snapshot(s3_store, "products")}
            assert 61 not in snap and snap[12]["name"] == "twelve, newer on pg1"
            assert snap[14]["name"] == "fourteen, newer on pg3"
            assert 3 not in {r["order_id"] for r in P.snapshot(s3_store, "orders")}


def _logged(store: Any, dt: str, table: str) -> list[dict[str, Any]]:
    import json

    key = pgr.KEYS[table]
    return [
        {**r, "table": table, "key": json.loads(r["key"])[key]}
        for r in real.conflicts(store, dt, table)
    ]


def test_plain_json_with_decimals_as_text_converges(tmp_path: Path, s3_store, capture):
    """The same capture through the connectors without transaction metadata, decimals as
    text (``decimal.handling.mode=string``), JsonConverter without schemas: night 1
    converges to the same last writer."""
    _put(s3_store, capture, 1, "s", "plain")
    dt = capture["dates"][1]
    assert real.run_pipeline(tmp_path, s3_store, capture["system_ids"], pgr.TABLES, dt) == 0
    real.check_run(s3_store, dt, pgr.TABLES, capture["want"][1])


def test_decimals_as_bytes_without_schemas_are_named_and_loud(tmp_path: Path, s3_store, capture):
    """The first connectors' records without schemas: a decimal as Debezium's bytes
    cannot be read; every such record is quarantined with a message that names
    ``decimal.handling.mode``, and the night fails on the share quarantined, naming the
    file, the first reason and the setting."""
    _put(s3_store, capture, 1, "", "plain", transaction_metadata=True)
    dt = capture["dates"][1]
    assert real.run_pipeline(tmp_path, s3_store, capture["system_ids"], pgr.TABLES, dt) == 1
    (run,) = P.runs(s3_store)
    assert run["status"] == "failed"
    rows = P.rows(s3_store, f"published/_failed/run={run['run_id']}/products/quarantine")
    assert rows and all("decimal.handling.mode=string" in r["detail"] for r in rows)
    report = P.report(s3_store, dt, run["run_id"])
    assert report is not None
    said = " ".join(report.failures)
    assert "accounting.products/quarantine_share" in said and "decimal.handling" in said
    assert "pg1.public.products+0+" in said  # the file, its first reason and the count


# --------------------------------------------------------------------------- a new user


def _cdr(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``cdr ARGS`` as a user runs it: a process of its own, in the user's folder."""
    return subprocess.run(
        [sys.executable, "-m", "pipeline.app.cli", *args],
        capture_output=True, text=True, cwd=cwd, timeout=300, check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip


def _run(home: Path, *args: str) -> int:
    """``cdr run`` in the test's process (its Spark session is the suite's: a JVM start
    saved per night); the other commands of the user's way start no Spark, as processes."""
    work = str(home / "work")
    return main(
        ["run", "--config", str(home / "cdr.yaml"), "--work-dir", work, "--no-data-docs", *args]
    )


def _sink(store: Any, capture: Any, night: int, day: str, hour: int = 12) -> None:
    """Each replica's objects of a night where Kafka Connect's S3 sink writes them with
    the TimeBasedPartitioner (docs/sealing.md): ``cdc/<replica>/<topic>/year=/month=/day=/
    hour=/<topic>+<partition>+<offset>.json``."""
    out = capture["out"] / f"night{night}"
    y, m, d = day.split("-")
    for rep in REPLICAS:
        for t in pgr.TABLES:
            topic = f"{rep}.public.{t}"
            for name, data in dbz.records(out, rep, "schemas", topic):
                path = f"year={y}/month={m}/day={d}/hour={hour:02d}"
                store.write_bytes(f"cdc/{rep}/{topic}/{path}/{name}", data)


def _source(rep: str) -> str:
    """The ``source`` a user writes for a replica in the file ``cdr init`` wrote."""
    tables = ", ".join(f"{t}: {rep}.public.{t}" for t in pgr.TABLES)
    return (
        f"source: {{prefix: cdc/{rep}, layout: debezium-s3-time, grace_hours: 1,\n"
        f"             tables: {{{tables}}}, options: {{transaction_metadata: true}}}}"
    )


def _edit(config: Path, system_ids: dict[str, int]) -> None:
    """What a user changes in the file ``cdr init`` wrote, following the docs: each
    replica's system identifier and where its connector writes; the resolvers they chose;
    the delta column the file suggests for the table with REPLICA IDENTITY FULL."""
    text = config.read_text()
    for i, rep in enumerate(REPLICAS, start=1):
        text = text.replace(
            f"id: {rep}\n    system_id: {i}\n", f"id: {rep}\n    system_id: {system_ids[rep]}\n", 1
        )
        hint = f"# source: {{prefix: cdc/{rep}, layout: debezium-s3-time}}"
        assert hint in text, text
        text = text.replace(hint, _source(rep), 1)
    assert "# delta: [balance]" in text  # REPLICA IDENTITY FULL: the old balance is there
    text = text.replace("# delta: [balance]", "delta: [balance]")
    resolvers = ", ".join(f"{k}: {v}" for k, v in real.LWW.items())
    text += f"defaults: {{policy: postgres, resolvers: {{{resolvers}}}}}\n"
    text += "on_divergence: warn\non_fk_violation: warn\n"
    config.write_text(text)


def test_a_new_user_from_an_empty_folder_to_three_nights(tmp_path: Path, capture):
    """docs/exports.md#from-an-empty-folder-to-a-first-night, as a new user follows it:
    `cdr init` from pg1's schema, the file edited as the docs say, Debezium's objects where
    its S3 sink writes them, `cdr manifest` (waiting while the tool is not past the date,
    then sealed), `cdr check-export`, `cdr run`, the snapshot read back; night 2 the same;
    then a late object of night 1: refused without --late, added with it, and the dates
    to rerun said; the rerun converges to the same rows."""
    home = tmp_path / "newuser"
    home.mkdir()
    uri = (home / "store").as_uri()
    d1, d2 = capture["dates"][1], capture["dates"][2]
    dsn = capture["dsn"]
    made = _cdr("init", "--from-postgres", dsn, "--tables", ",".join(pgr.TABLES),
                "--replicas", ",".join(REPLICAS), "--store", uri, cwd=home)  # fmt: skip
    assert made.returncode == 0, made.stderr
    _edit(home / "cdr.yaml", capture["system_ids"])
    store = open_store(uri)
    _sink(store, capture, 1, d1)

    def night(day: str, want: dict[str, Any]) -> None:
        early = _cdr("manifest", "--date", day, "--now", f"{day}T23:00:00Z", cwd=home)
        assert early.returncode == 1 and "waiting" in early.stdout, early.stdout + early.stderr
        after = (date.fromisoformat(day) + timedelta(days=1)).isoformat()
        sealed = _cdr("manifest", "--date", day, "--now", f"{after}T02:00:00Z", cwd=home)
        assert sealed.returncode == 0, sealed.stdout + sealed.stderr
        assert sealed.stdout.count("sealed") == len(REPLICAS) * len(pgr.TABLES), sealed.stdout
        checked = _cdr("check-export", "--date", day, cwd=home)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert _run(home, "--date", day) == 0
        real.check_run(store, day, pgr.TABLES, want)

    night(d1, capture["want"][1])
    _sink(store, capture, 2, d2, hour=1)
    night(d2, capture["want"][2])
    # a late object of night 1 (the sink retried a flush: the same changes again)
    topic = "pg1.public.products"
    _, data = dbz.records(capture["out"] / "night1", "pg1", "schemas", topic)[0]
    y, m, d = d1.split("-")
    store.write_bytes(
        f"cdc/pg1/{topic}/year={y}/month={m}/day={d}/hour=23/{topic}+0+9999999999.json", data
    )
    again = _cdr("manifest", "--date", d1, "--replica", "pg1", "--table", "products", cwd=home)
    assert again.returncode == 1 and "--late" in again.stdout + again.stderr
    late = _cdr("manifest", "--date", d1, "--replica", "pg1", "--table", "products", "--late",
                cwd=home)  # fmt: skip
    assert late.returncode == 0 and "late" in late.stdout, late.stdout + late.stderr
    assert d1 in late.stdout and d2 in late.stdout  # the dates to rerun, in order
    assert _run(home, "--date", d2) == 1  # d1's export changed after its run
    assert _run(home, "--date", d1, "--then-later") == 0
    real.check_run(store, d2, pgr.TABLES, capture["want"][2])
    report = P.report(store, d1)
    assert report is not None and report.tables["products"].duplicates > 0  # counted, not applied
