"""The pipeline on exports that real PostgreSQL servers produced (issue 8).

Three PostgreSQL 15 servers on loopback are three replicas of one schema (products;
orders with a foreign key to products; accounts with a unique owner and a delta
balance). They load the same base rows, then take conflicting writes: first a scripted
sequence, one step per server in turn, that creates each conflict type once; then
concurrent random workloads on all three at once. Each server's changes are exported
through one logical replication slot per table, decoded by wal2json, uploaded with
manifests to the S3 server on loopback, and the pipeline runs on them (last writer
wins).

The checks: the scripted conflicts are in the conflict log with their types and
outcomes; the converged snapshot equals the latest version of every key computed
independently, in SQL, over audit tables that a trigger keeps on each server (commit
times from ``pg_xact_commit_timestamp``, ``track_commit_timestamp = on``); and the orphan
made on purpose (an order for a product deleted on another replica) is reported.

The same changes, taken from the audit tables, are also written as a Debezium
PostgreSQL connector and an AWS DMS task would have written them, and go through the
same checks. (DMS keeps no before image: its sample leaves out accounts, whose delta
needs the old balance, and key changes, which DMS writes as updates of the new key.)

``make test-postgres`` runs this module alone; it installs Debian's packages when they
are missing.
"""

from __future__ import annotations

import hashlib
import json
import random
import threading
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from pipeline.app.cli import main
from pipeline.core.report import RunReport
from pipeline.storage.store import Store
from tests.helpers import configs
from tests.helpers import pg_replicas as pgr
from tests.helpers import published as P
from tests.helpers import sources as src
from tests.helpers.cli import cdr_json

pytestmark = [pytest.mark.slow]

R1 = [1, 2, 3, 4, *range(12, 21)]  # products with orders: never deleted, keys never change
CHURN = range(21, 41)  # products that come and go (no orders point at them)
NEW_ORDERS = range(1000, 1041)  # order ids that several replicas insert

TOASTED = (1, 2, 3, 4)  # products whose note is over 8 kB, stored out of line


def long_note(i: int) -> str:
    """9,600 characters that do not compress much (PostgreSQL keeps them out of line)."""
    return "".join(hashlib.sha256(f"{i}-{n}".encode()).hexdigest() for n in range(150))


BASE = {
    "products": [
        {
            "product_no": i,
            "name": f"p{i}",
            "price": f"{i}.50",
            "note": long_note(i) if i in TOASTED else None,
        }
        for i in range(1, 41)
    ],
    "orders": [{"order_id": i, "product_no": R1[i % len(R1)], "quantity": i} for i in range(1, 31)],
    "accounts": [{"id": i, "owner": f"o{i}", "balance": 100} for i in range(1, 11)],
}
BASE_SQL = "".join(
    f"insert into {t} values ({', '.join('null' if v is None else repr(v) for v in r.values())});\n"
    for t, rows in BASE.items()
    for r in rows
)

#: one step after the other, each on one server: every conflict type once
SCRIPT = [
    ("pg1", "insert into products values (50, 'fifty from pg1', 50.10)"),
    ("pg2", "insert into products values (50, 'fifty from pg2', 50.20)"),
    ("pg1", "update products set price = 5.55 where product_no = 5"),
    ("pg2", "update products set name = 'five from pg2' where product_no = 5"),
    ("pg1", "delete from products where product_no = 6"),
    ("pg2", "update products set price = 6.66 where product_no = 6"),
    ("pg2", "update products set price = 7.77 where product_no = 7"),
    ("pg1", "delete from products where product_no = 7"),
    ("pg1", "delete from products where product_no = 8"),
    ("pg3", "delete from products where product_no = 8"),
    ("pg1", "update products set product_no = 90 where product_no = 9"),
    ("pg2", "update products set price = 9.99 where product_no = 9"),
    ("pg3", "insert into products values (95, 'ninety-five from pg3', 95.00)"),
    ("pg1", "update products set product_no = 95 where product_no = 10"),
    ("pg1", "delete from products where product_no = 11"),
    ("pg2", "insert into orders values (500, 11, 1)"),  # the orphan, on purpose
    ("pg1", "insert into accounts values (100, 'zoe', 10)"),
    ("pg2", "insert into accounts values (200, 'zoe', 20)"),
    ("pg1", "update accounts set balance = balance + 10 where id = 1"),
    ("pg2", "update accounts set balance = balance + 20 where id = 1"),
]
#: what the script must show in the conflict log: (table, key, type, outcome)
SCRIPTED_CONFLICTS = [
    ("products", 50, "insert_exists", "converted_to_update"),
    ("products", 5, "update_differ", "applied"),
    ("products", 6, "update_deleted", "converted_to_insert"),
    ("products", 7, "delete_differ", "applied"),
    ("products", 8, "delete_missing", "skipped"),
    ("products", 9, "update_missing", "converted_to_insert"),
    ("products", 95, "pkey_exists", "applied"),  # logged under the key it collides on
    ("accounts", 200, "multiple_unique_conflicts", "applied"),
    ("accounts", 1, "update_differ", "applied"),
]

LWW = {
    "insert_exists": "latest_timestamp_wins",
    "update_differ": "latest_timestamp_wins",
    "delete_differ": "latest_timestamp_wins",
    "pkey_exists": "latest_timestamp_wins",
    "update_deleted": "latest_timestamp_wins",
    "update_missing": "apply_or_skip",
    "delete_missing": "skip",
    "multiple_unique_conflicts": "apply",
}
TABLES: dict[str, dict[str, Any]] = {
    "products": configs.table(
        {"product_no": "int", "name": "string", "price": "decimal(10,2)", "note": "string"},
        ["product_no"],
        not_null=["name"],
    ),
    "orders": configs.table(
        {"order_id": "int", "product_no": "int", "quantity": "int"},
        ["order_id"],
        not_null=["product_no", "quantity"],
        foreign_keys=[{"columns": ["product_no"], "references": "products"}],
    ),
    "accounts": configs.table(
        {"id": "bigint", "owner": "string", "balance": "bigint"},
        not_null=["owner"],
        unique=[["owner"]],
        delta=["balance"],
    ),
}


def random_workload(server: str, seed: int, n: int = 80) -> str:
    """Statements for one server: price and name updates, products that come and go,
    orders inserted under ids the other servers use too, quantity updates, credits to
    the accounts; some grouped in transactions."""
    rng = random.Random(seed)

    def op() -> str:
        k = rng.random()
        if k < 0.2:
            p = rng.choice(R1)
            price = f"{rng.randint(1, 999)}.{rng.randint(0, 99):02d}"
            return (
                f"update products set price = {price}, name = 'p{p} by {server}' "
                f"where product_no = {p};"
            )
        if k < 0.45:
            p = rng.choice(CHURN)
            return rng.choice(
                [
                    f"insert into products values ({p}, 'p{p} again by {server}', "
                    f"{rng.randint(1, 99)}) on conflict do nothing;",
                    f"update products set name = 'p{p} renamed by {server}' "
                    f"where product_no = {p};",
                    f"delete from products where product_no = {p};",
                ]
            )
        if k < 0.7:
            o = rng.choice(NEW_ORDERS)
            return rng.choice(
                [
                    f"insert into orders values ({o}, {rng.choice(R1)}, {rng.randint(1, 9)}) "
                    "on conflict do nothing;",
                    f"delete from orders where order_id = {o};",
                ]
            )
        if k < 0.85:
            o = rng.choice([*range(1, 31), *NEW_ORDERS])
            return f"update orders set quantity = {rng.randint(1, 99)} where order_id = {o};"
        a = rng.randint(1, 10)
        return f"update accounts set balance = balance + {rng.randint(-50, 50)} where id = {a};"

    out = []
    while len(out) < n:
        if rng.random() < 0.2:
            out.append("begin;\n" + "\n".join(op() for _ in range(rng.randint(2, 4))) + "\ncommit;")
        else:
            out.append(op())
    return "\n".join(out) + "\n"


@pytest.fixture(scope="module")
def sources() -> Any:
    """Run the workload on three real servers; return their exports, audit trails and
    system ids, and the server that computes the expectations (running until the end of
    the module)."""
    pgr.require()
    with pgr.Cluster() as cluster:
        servers = cluster.servers
        for s in servers.values():
            s.setup(BASE_SQL)
        for name, sql in SCRIPT:
            servers[name].sql(sql + ";")
        threads = [
            threading.Thread(target=s.sql, args=(random_workload(n, i),), kwargs={"check": False})
            for i, (n, s) in enumerate(servers.items())
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        exports = {n: {t: s.wal2json(t) for t in pgr.TABLES} for n, s in servers.items()}
        system_ids = {n: s.system_id for n, s in servers.items()}
        changes = [
            {**c, "server": n, "system_id": system_ids[n]}
            for n, s in servers.items()
            for c in s.audit()
        ]
        yield {
            "exports": exports,
            "changes": changes,
            "system_ids": system_ids,
            "verify": cluster.verify,
            "servers": servers,  # as the workload left them (the repair test, last, changes them)
        }


def base_changes() -> list[dict[str, Any]]:
    return [
        {"server": "base", "system_id": -1, "seq": 0, "tbl": t, "op": "B", "old": None,
         "new": r, "ts_us": 0}
        for t, rows in BASE.items()
        for r in rows
    ]  # fmt: skip


def run_date(changes: list[dict[str, Any]]) -> str:
    first = min(c["ts_us"] for c in changes)
    return datetime.fromtimestamp(first / 1e6, UTC).date().isoformat()


def put_base(store: Store, tables: tuple[str, ...]) -> None:
    for t in tables:
        data, rows = src.lines(BASE[t])
        store.write_bytes(f"base/table={t}/part-0.jsonl", data)
        sha = hashlib.sha256(data).hexdigest()
        manifest = {"table": t, "format": "jsonl", "files": [
            {"path": "part-0.jsonl", "rows": rows, "sha256": sha}]}  # fmt: skip
        store.write_bytes(f"base/table={t}/_manifest.json", json.dumps(manifest).encode())


def run_pipeline(tmp_path: Path, store: Store, system_ids: dict[str, int], tables, dt) -> int:
    cfg = configs.config(
        {t: TABLES[t] for t in tables},
        replicas=configs.replicas(**system_ids),
        store=store.uri,
        defaults={"policy": "postgres", "resolvers": LWW},
        # last writer wins with these resolvers can diverge (docs/rules.md#convergence)
        on_divergence="warn",
        on_fk_violation="warn",  # keep the orphan in the snapshot, and report it
    )
    configs.write(tmp_path / "cdr.yaml", cfg)
    work = str(tmp_path / "work")
    args = ["--date", dt, "--work-dir", work, "--no-data-docs"]
    return main(["run", "--config", str(tmp_path / "cdr.yaml"), *args])


def norm(table: str, row: dict[str, Any]) -> tuple:
    out = []
    for c, t in TABLES[table]["columns"].items():
        v = row.get(c)
        out.append(
            Decimal(str(v)).quantize(Decimal("0.01"))
            if t.startswith("decimal") and v is not None
            else v
        )
    return (*out, int(row["_ts"]))


def check_run(
    store: Store, dt: str, tables: tuple[str, ...], want: dict[str, dict[Any, dict[str, Any]]]
) -> RunReport:
    """The converged snapshot is the SQL's, key by key (with each row's commit time);
    the orphans are the SQL's; returns the run report."""
    for t in tables:
        snap = P.snapshot(store, t)
        key = TABLES[t]["key"][0]
        got = {r[key]: norm(t, r) for r in snap}
        expect = {k: norm(t, r) for k, r in want[t].items()}
        diff = sorted(set(got) ^ set(expect)) + sorted(
            k for k in set(got) & set(expect) if got[k] != expect[k]
        )
        assert not diff, (t, [(k, got.get(k), expect.get(k)) for k in diff[:10]])
    # §TOAST: the long notes that UPDATEs of other columns did not decode are kept
    notes = {r["product_no"]: r["note"] for r in P.snapshot(store, "products")}
    assert {i: notes[i] for i in TOASTED} == {i: long_note(i) for i in TOASTED}
    live_products = set(want["products"])
    orphans = {k for k, r in want["orders"].items() if r["product_no"] not in live_products}
    assert 500 in orphans  # the one made on purpose
    published = P.log(store, "orders", "orphans", dt)
    assert {json.loads(r["key"])["order_id"] for r in published} == orphans
    report = RunReport.from_json(store.read_bytes(f"published/reports/dt={dt}/run_report.json"))
    assert report.tables["orders"].orphans == len(orphans)
    for t in tables:
        counts = report.tables[t]
        assert sum(counts.quarantined.values()) == 0, counts.quarantined
    return report


def conflicts(store: Store, dt: str, table: str) -> list[dict[str, Any]]:
    return P.log(store, table, "conflicts", dt)


def test_wal2json_exports_of_three_real_servers(tmp_path: Path, s3_store: Store, sources):
    """wal2json through logical replication slots: conflicts, snapshot, orphan."""
    dt = run_date(sources["changes"])
    put_base(s3_store, pgr.TABLES)
    for rep, tables in sources["exports"].items():
        for t, lines in tables.items():
            # the slot gave every change the audit trigger saw on that server
            changes = [x for x in lines if '"action":"B"' not in x and '"action":"C"' not in x]
            audited = [c for c in sources["changes"] if c["server"] == rep and c["tbl"] == t]
            assert len(changes) == len(audited), (rep, t)
            if t == "products":  # wal2json left the unchanged long notes out of UPDATEs
                assert any(unchanged_toast(json.loads(x)) for x in changes), rep
            src.put_export(s3_store, rep, t, dt, "wal2json", {"slot.json": src.lines(lines)})
    assert run_pipeline(tmp_path, s3_store, sources["system_ids"], pgr.TABLES, dt) == 0
    want = pgr.expected(sources["verify"], base_changes() + sources["changes"])
    report = check_run(s3_store, dt, pgr.TABLES, want)
    for table, key, ctype, outcome in SCRIPTED_CONFLICTS:
        rows = [
            r for r in conflicts(s3_store, dt, table)
            if json.loads(r["key"])[TABLES[table]["key"][0]] == key
        ]  # fmt: skip
        assert (ctype, outcome) in {(r["conflict_type"], r["outcome"]) for r in rows}, (
            table, key, ctype, [(r["conflict_type"], r["outcome"]) for r in rows])  # fmt: skip
    # docs/rules.md#lost-writes: no server replicated another's changes, so no writer saw
    # another's write (each export holds its own server's only): every conflict between two
    # servers' writes of the night is concurrent, and one over a base row sequential
    for t in pgr.TABLES:
        for r in conflicts(s3_store, dt, t):
            if r["concurrency"] == "n/a":
                continue
            tonight = r["local_event_id"] is not None and r["local_origin"] != r["remote_origin"]
            assert r["concurrency"] == ("concurrent" if tonight else "sequential"), r
    # every record of every export is accounted for, and the framing lines are counted
    for t in pgr.TABLES:
        replicas = report.tables[t].replicas
        for rep, tables in sources["exports"].items():
            lines = tables[t]
            framing = sum('"action":"B"' in x or '"action":"C"' in x for x in lines)
            assert framing > 0
            assert replicas[rep]["framing"] == framing
            assert replicas[rep]["records"] == len(lines) - framing


def unchanged_toast(change: dict[str, Any]) -> bool:
    """A wal2json UPDATE of a product with a long note that leaves the note out."""
    key = {c["name"]: c["value"] for c in change.get("identity", change.get("columns", []))}
    given = {c["name"] for c in change.get("columns", [])}
    return change["action"] == "U" and key.get("product_no") in TOASTED and "note" not in given


def audit_changes(sources: Any, server: str, table: str, drop_key_changes: bool = False):
    key = TABLES[table]["key"][0]
    out = []
    for c in sources["changes"]:
        if c["server"] != server or c["tbl"] != table:
            continue
        if drop_key_changes and c["op"] == "U" and c["old"][key] != c["new"][key]:
            continue
        out.append(src.Change(table, c["op"], c["old"], c["new"], c["ts_us"], c["xid"], c["seq"]))
    return out


def test_debezium_sample_of_the_same_changes(tmp_path: Path, s3_store: Store, sources):
    """The servers' changes as the Debezium PostgreSQL connector writes them through an
    S3 sink (schema-wrapped envelopes; a key change is a delete, a tombstone and a
    create): the same snapshot and orphan."""
    dt = run_date(sources["changes"])
    put_base(s3_store, pgr.TABLES)
    for rep in sources["exports"]:
        for t in pgr.TABLES:
            dbz = src.Debezium(
                t, TABLES[t]["key"], TABLES[t]["columns"], full_identity=t == "accounts",
                server=rep, toasted=8000,
            )  # fmt: skip
            records = dbz.records(audit_changes(sources, rep, t))
            if t == "products":  # the unchanged long notes came as the placeholder
                assert any(src.Debezium.PLACEHOLDER in json.dumps(r) for r in records)
            src.put_export(s3_store, rep, t, dt, "debezium", {"topic+0+0.json": src.lines(records)})
    assert run_pipeline(tmp_path, s3_store, sources["system_ids"], pgr.TABLES, dt) == 0
    want = pgr.expected(sources["verify"], base_changes() + sources["changes"])
    check_run(s3_store, dt, pgr.TABLES, want)
    types = {r["conflict_type"] for r in conflicts(s3_store, dt, "products")}
    assert {"insert_exists", "update_differ", "update_deleted", "delete_differ"} <= types


def test_dms_sample_of_the_same_changes(tmp_path: Path, s3_store: Store, sources):
    """The servers' changes as DMS writes them to S3 (CSV, Op and a commit-timestamp
    column, no before image), for products and orders, key changes left out."""
    dt = run_date(sources["changes"])
    tables = ("products", "orders")
    put_base(s3_store, tables)
    for rep in sources["exports"]:
        for t in tables:
            cols = list(TABLES[t]["columns"])
            rows = src.dms_rows(audit_changes(sources, rep, t, drop_key_changes=True), cols)
            data = src.dms_csv(rows, ["Op", "commit_ts", *cols])
            src.put_export(s3_store, rep, t, dt, "dms", {"20261121-120000000.csv": data},
                           {"timestamp_column": "commit_ts"})  # fmt: skip
    assert run_pipeline(tmp_path, s3_store, sources["system_ids"], tables, dt) == 0
    kept = [
        c for c in base_changes() + sources["changes"]
        if not (c["op"] == "U" and c["old"][pgr.KEYS[c["tbl"]]] != c["new"][pgr.KEYS[c["tbl"]]])
    ]  # fmt: skip
    want = pgr.expected(sources["verify"], kept, tables)
    check_run(s3_store, dt, tables, {**want, "accounts": {}})
    types = {r["conflict_type"] for r in conflicts(s3_store, dt, "products")}
    assert {"insert_exists", "update_differ", "update_deleted", "delete_differ"} <= types


# ------------------------------------------------------------------------- repair


def _held(server: pgr.Server, table: str) -> dict[Any, tuple]:
    key = TABLES[table]["key"][0]
    return {r[key]: norm(table, {**r, "_ts": 0}) for r in server.table_rows(table)}


def _converged(store: Store, table: str) -> dict[Any, tuple]:
    key = TABLES[table]["key"][0]
    return {r[key]: norm(table, {**r, "_ts": 0}) for r in P.snapshot(store, table)}


def test_repair_brings_every_server_to_the_converged_state(
    tmp_path: Path, s3_store: Store, sources
):
    """docs/operations.md#repair on the three servers: night 1 exports their changes and
    their full copies; every divergent row of a copy has a cause. One row changes on pg2
    after its export. Each server gets its repair (pg1 from a file run by psql, the others
    with --apply, after a dry run that changes nothing): then every server holds the
    converged snapshot but that row, which its repair skipped and kept. Night 2 exports
    the servers' changes since: the repairs come back as ``repaired`` (origin
    cdr_repair), and the night has no divergence and no quarantine."""
    servers: dict[str, pgr.Server] = sources["servers"]
    dt = run_date(sources["changes"])
    put_base(s3_store, pgr.TABLES)
    for rep, tables in sources["exports"].items():
        for t, lines in tables.items():
            src.put_export(s3_store, rep, t, dt, "wal2json", {"slot.json": src.lines(lines)})
            rows = src.lines(servers[rep].table_rows(t))  # its copy, as its export left it
            src.put_export(s3_store, rep, t, dt, "jsonl", {"copy.jsonl": rows}, snapshot=True)
    cfg = configs.config(
        TABLES,
        replicas=configs.replicas(**sources["system_ids"]),
        store=s3_store.uri,
        defaults={"policy": "postgres", "resolvers": LWW},
        on_divergence="warn",
        # the orphan leaves the converged state: a PostgreSQL table with the key refuses it
        on_fk_violation="quarantine",
    )
    configs.write(tmp_path / "cdr.yaml", cfg)
    conf = ["--config", str(tmp_path / "cdr.yaml")]
    work = ["--work-dir", str(tmp_path / "work"), "--no-data-docs"]
    assert main(["run", *conf, "--date", dt, *work]) == 0
    report = RunReport.from_json(s3_store.read_bytes(f"published/reports/dt={dt}/run_report.json"))
    for t in pgr.TABLES:
        div = [r for r in P.log(s3_store, t, "divergence", dt) if r["source"] == "snapshot"]
        assert div, t  # no replica replicates here: each lacks the others' changes
        causes = {json.loads(r["evidence"])["causes"][0] for r in div}
        assert "missing_events" in causes and "undetermined" not in causes, (t, causes)
        assert sum(report.tables[t].snapshot_divergent_causes["pg2"].values()) == len(
            [r for r in div if r["replica"] == "pg2"]
        )

    # one row changes on pg2 after its export: its repair must skip it
    products = [r for r in P.log(s3_store, "products", "divergence", dt)
                if r["source"] == "snapshot" and r["replica"] == "pg2"
                and r["replica_row"] and r["converged_row"]]  # fmt: skip
    changed = json.loads(products[0]["key"])["product_no"]
    servers["pg2"].sql(f"update products set name = 'changed after the export' "
                       f"where product_no = {changed};")  # fmt: skip
    before = {t: _held(servers["pg2"], t) for t in pgr.TABLES}
    repair = ["repair", *conf, "--date", dt, "--dialect", "postgres"]

    rc, dry = cdr_json(*repair, "--replica", "pg2", "--apply", "--dsn", servers["pg2"].dsn,
                        "--dry-run")  # fmt: skip
    assert rc == 0 and dry["applied"] is False
    assert dry["skipped"] == [
        {"row": f'products {{"product_no":{changed}}}', "why": "it changed since the report"}
    ]
    assert {t: _held(servers["pg2"], t) for t in pgr.TABLES} == before  # rolled back

    script = tmp_path / "pg1.sql"
    rc, out = cdr_json(*repair, "--replica", "pg1", "--out", str(script))
    assert rc == 0 and out["statements"] >= out["rows"] > 0 and out["left_out"] == []
    servers["pg1"].sql(script.read_text())
    for rep in ("pg2", "pg3"):
        rc, out = cdr_json(*repair, "--replica", rep, "--apply", "--dsn", servers[rep].dsn)
        assert rc == 0 and out["applied"] is True and out["left_out"] == []
        assert out["skipped"] == (dry["skipped"] if rep == "pg2" else []), out

    for t in pgr.TABLES:
        want = _converged(s3_store, t)
        for rep, server in servers.items():
            held = _held(server, t)
            if rep == "pg2" and t == "products":
                assert held[changed][1] == "changed after the export"  # kept, not repaired
                held[changed] = want[changed]
            assert held == want, (rep, t, sorted(set(held) ^ set(want))[:5])

    # night 2: the changes since night 1, the repairs among them (origin cdr_repair)
    dt2 = (datetime.fromisoformat(dt) + timedelta(days=1)).date().isoformat()
    repaired: dict[str, int] = {}
    for rep, server in servers.items():
        origins = server.origins()
        ids = [k for k, name in origins.items() if name == "cdr_repair"]
        assert len(ids) == 1, origins  # the repair set its origin up
        for t in pgr.TABLES:
            lines = server.wal2json(t)
            made = [json.loads(x) for x in lines if f'"origin":{ids[0]},' in x]
            repaired[rep] = repaired.get(rep, 0) + sum(c["action"] in "IUD" for c in made)
            src.put_export(s3_store, rep, t, dt2, "wal2json", {"slot.json": src.lines(lines)},
                           {"origins": origins})  # fmt: skip
    assert all(repaired.values()), repaired
    assert main(["run", *conf, "--date", dt2, *work]) == 0
    night2 = RunReport.from_json(s3_store.read_bytes(f"published/reports/dt={dt2}/run_report.json"))
    for t in pgr.TABLES:
        s = night2.tables[t]
        assert sum(s.quarantined.values()) == 0 and sum(s.divergent_keys.values()) == 0, (t, s)
        assert P.log(s3_store, t, "divergence", dt2) == []
    assert {
        rep: sum(night2.tables[t].replicas.get(rep, {}).get("repaired", 0) for t in pgr.TABLES)
        for rep in servers
    } == repaired
    assert sum(night2.tables[t].repaired for t in pgr.TABLES) == sum(repaired.values())
    # the changed row is pg2's own change: an event, applied
    assert {r["product_no"]: r["name"] for r in P.snapshot(s3_store, "products")}[changed] == (
        "changed after the export"
    )
