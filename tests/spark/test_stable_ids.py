"""Issue 49, items 3 and 4 (docs/adapters.md, "Each event once"; docs/adapters.md):
event ids that do not move with the files and nights an export is cut into, a
transaction that waits for its commit, the ledger's content digests, and the upgrade
from the ids of before (a store published by that release)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F

from pipeline.app.cli import main
from pipeline.core.config_load import load_config
from pipeline.core.summary import TableSummary
from pipeline.ingest.adapters import FRAMING
from pipeline.ingest.adapters.debezium import debezium
from pipeline.ingest.adapters.dms import dms, read_dms
from pipeline.ingest.adapters.wal2json import wal2json
from pipeline.ingest.staging import stage_jsonl
from pipeline.storage.store import open_store
from tests.fixtures import make_store_before_stable_ids as before
from tests.helpers import configs
from tests.helpers import published as P
from tests.helpers import sources as src

D1, D2 = "2026-11-21", "2026-11-22"
T0 = 1_795_258_800_000_000  # 2026-11-21T10:00:00Z, µs
DAY = 86_400_000_000
MIDNIGHT = T0 + 14 * 3_600_000_000 - 1  # the last µs of 2026-11-21
ACCOUNTS = {"id": "bigint", "owner": "string", "balance": "bigint"}
NOTES = {"id": "int", "text": "string"}
CONFIG = configs.config(
    {
        "accounts": configs.table(ACCOUNTS, delta=["balance"]),
        "notes": configs.table(NOTES),
    },
    replicas=("pg1", "pg2"),
    on_divergence="warn",
    allow_missing_exports=True,
)
ORIGINS = {"pg1": {"1": "pg2"}, "pg2": {"1": "pg1"}}  # each replica's origin 1: the other


def _pg_ts(us: int) -> str:
    s = src.datetime.fromtimestamp(us / 1e6, src.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    return s.rstrip("0").rstrip(".") + "+00"


def _cols(row: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"name": k, "type": "text", "value": v} for k, v in row.items()]


def _tx(xid: int, ts: int, origin: int, changes: list[tuple], lsn: int) -> list[dict[str, Any]]:
    """A transaction as wal2json writes it: B, its changes (action, old row, new row), C."""
    head = {"xid": xid, "timestamp": _pg_ts(ts), "origin": origin}
    frame = {**head, "lsn": f"0/{lsn + 99:X}", "nextlsn": f"0/{lsn + 100:X}"}
    out = [{"action": "B", **frame}]
    for i, (action, old, new) in enumerate(changes):
        line = {"action": action, **head, "lsn": f"0/{lsn + i:X}"}
        line |= {"schema": "public", "table": "accounts"}
        if new is not None:
            line["columns"] = _cols(new)
        if old is not None:
            line["identity"] = _cols(old)
        out.append(line)
    return [*out, {"action": "C", **frame}]


def _put_w2j(store, replica: str, dt: str, files: list[list[dict[str, Any]]]) -> None:
    parts = {f"slot-{i}.json": src.lines(lines) for i, lines in enumerate(files)}
    options = {"origins": ORIGINS[replica]}
    src.put_export(store, replica, "accounts", dt, "wal2json", parts, options)


def _note(event_id: str, text: str, ts: int) -> dict[str, Any]:
    return {"op": "INSERT", "key": {"id": 1}, "after": {"id": 1, "text": text}, "ts": ts,
            "origin": "pg1", "event_id": event_id, "seq": 1}  # fmt: skip


def _night(tmp_path: Path, root: Path, dt: str) -> int:
    cfg = configs.write(tmp_path / "cdr.yaml", CONFIG, store=root)
    argv = ["run", "--config", str(cfg), "--date", dt, "--work-dir", str(tmp_path / "work")]
    return main([*argv, "--no-data-docs"])


A = {"id": 1, "owner": "ann"}


def _table(store: Path, dt: str, table: str) -> TableSummary:
    """A table of the date's published report."""
    report = P.report(store, dt)
    assert report is not None, dt
    return report.tables[table]


def test_a_transaction_cut_across_nights_waits_for_its_commit(tmp_path: Path):
    """pg1's transaction T2 credits 10 twice; its first UPDATE is in night 1's export, the
    second and its commit in night 2's (and night 2's export is in two files cut inside
    another transaction). pg2 applied T2 after its commit: its copy is whole in night 2.
    Night 1 maps none of T2 (its lines wait, counted); night 2 maps T2 whole, one event
    per change, from the two replicas' differently cut copies, and T1, which pg1's night-2
    export sends again, once: the balance is 120 (the issue measured 110). A copy of an
    earlier night's event with other content (notes) is not applied again, and is logged
    with both digests."""
    root = tmp_path / "store"
    store = open_store(root.as_uri())
    t1 = _tx(700, T0, 0, [("I", None, {**A, "balance": 100})], 0x1000)
    credits = [  # T2: 10, twice
        ("U", {**A, "balance": 100}, {**A, "balance": 110}),
        ("U", {**A, "balance": 110}, {**A, "balance": 120}),
    ]
    t2 = _tx(701, MIDNIGHT, 0, credits, 0x2000)
    t3 = _tx(702, T0 + DAY + 5, 0, [("U", {**A, "owner": "ann"}, {**A, "owner": "bo"})], 0x3000)
    _put_w2j(store, "pg1", D1, [t1 + t2[:2]])  # T2's B and first change
    _put_w2j(store, "pg1", D2, [t1 + t2[2:] + t3[:2], t3[2:]])  # T1 again; T3 cut by a file
    on_pg2 = [  # pg2 applied pg1's transactions under replication origin 1
        _tx(900, T0, 1, [("I", None, {**A, "balance": 100})], 0x5000),
        _tx(901, MIDNIGHT, 1, credits, 0x6000),
    ]
    _put_w2j(store, "pg2", D1, [on_pg2[0]])
    _put_w2j(store, "pg2", D2, [on_pg2[1]])
    notes = {D1: [_note("n1", "first", T0)], D2: [_note("n1", "changed", T0)]}
    for dt, records in notes.items():
        src.put_export(store, "pg1", "notes", dt, "jsonl", {"n.jsonl": src.lines(records)})

    assert _night(tmp_path, root, D1) == 0
    assert [r["balance"] for r in P.snapshot(root, "accounts")] == [100]
    t = _table(root, D1, "accounts")
    assert t.replicas["pg1"]["pending"] == 1  # T2's first UPDATE (its B: framing)
    waiting = P.log(root, "accounts", "pending", D1)
    assert sorted(json.loads(r["raw"])["action"] for r in waiting) == ["B", "U"]
    assert {r["file"] for r in waiting} == {f"dt={D1}/slot-0.json"}

    assert _night(tmp_path, root, D2) == 0
    (row,) = P.snapshot(root, "accounts")
    assert (row["balance"], row["owner"]) == (120, "bo")
    t = _table(root, D2, "accounts")
    assert t.replicas["pg1"]["pending_in"] == 1 and t.replicas["pg1"]["pending"] == 0
    assert t.distinct_events == 4  # T1 (a duplicate now), T2's two changes, T3
    assert t.replicas["pg1"]["duplicate"] == 1  # T1 sent again
    assert t.replicas["pg2"]["applied"] == 2  # its copies of T2's changes: the same events
    assert not t.quarantined
    assert P.log(root, "accounts", "pending", D2) == []
    ledger = {r["event_id"] for r in P.log(root, "accounts", "ledger", D2)}
    assert f'pg1@{MIDNIGHT}/U/{{"id":"1"}}#2' in ledger  # T2's second UPDATE of id 1

    n = _table(root, D2, "notes")
    assert n.changed_copies == 1 and n.applied == 0 and n.duplicates == 1
    assert [r["text"] for r in P.snapshot(root, "notes")] == ["first"]
    (logged,) = P.log(root, "notes", "differing_copies", D2)
    (known,) = P.log(root, "notes", "ledger", D1)
    assert logged["event_id"] == "n1" and logged["file"] == "n.jsonl" and logged["line"] == 1
    assert logged["ledger_digest"] == known["digest"] != logged["digest"]
    assert json.loads(logged["record"])["after"]["text"] == "changed"


def test_the_night_after_the_upgrade_applies_nothing_twice(tmp_path: Path):
    """A store whose first night the release before issue 49 published (its ledger holds
    the earlier ids): the next night, whose exports send that night's last transactions
    again, matches them on their earlier ids, so nothing is applied twice (the balance
    counts each credit once), and its own ledger rows carry the new ids and digests."""
    fixture = Path(__file__).resolve().parent.parent / "fixtures" / "store-before-stable-ids"
    shutil.copytree(fixture, tmp_path / "moved")
    root = tmp_path / "moved"
    cfg = configs.write(tmp_path / "cdr.yaml", before.config_for(root))
    argv = ["run", "--config", str(cfg), "--date", before.D2, "--no-data-docs"]
    assert main([*argv, "--work-dir", str(tmp_path / "work")]) == 0
    store = root / "store"
    (row,) = P.snapshot(store, "accounts")
    assert row["balance"] == before.BALANCE_AFTER_D2
    tables = {t: _table(store, before.D2, t) for t in ("accounts", "items_dbz", "items_dms")}
    assert tables["accounts"].replicas["pg1"]["duplicate"] == 2  # T2 and T3 again
    assert tables["accounts"].replicas["pg2"]["duplicate"] == 2
    for t in ("items_dbz", "items_dms"):
        assert tables[t].duplicates == 1 and tables[t].applied == 1, (t, tables[t])
        assert not tables[t].conflicts
    new = P.log(store, "accounts", "ledger", before.D2)
    assert new and all(r["digest"] is not None and "#0" not in r["event_id"] for r in new)


# ------------------------------------------------------------------ the adapters alone


def _staged(tmp_path: Path, fmt: str, records: list[Any], name: str = "in.json"):
    data, _ = src.lines(records)
    (tmp_path / name).write_bytes(data)
    dest = tmp_path / "staged" / name / "part-00000.parquet"
    stage_jsonl(tmp_path / name, dest, "pg1", name, FRAMING.get(fmt), None, fmt == "wal2json")
    return str(dest)


def _records(adapted) -> list[dict[str, Any]]:
    return [json.loads(r.raw) for r in adapted.records.orderBy("file", "line").collect()]


def _accounts(tmp_path: Path):
    cfg = configs.write(tmp_path / "cdr.yaml", CONFIG, store=tmp_path / "store")
    return load_config(cfg).tables["accounts"]


def test_wal2json_changes_without_their_start_or_past_the_grace_are_quarantined(
    tmp_path: Path, spark
):
    """A change whose transaction's B is in no export the run reads cannot be placed: it
    is quarantined, naming it; one of a transaction that waited past the grace is too."""
    table = _accounts(tmp_path)
    headless = _tx(800, T0, 0, [("U", {**A, "balance": 1}, {**A, "balance": 2})], 0x100)[1:]
    raw = spark.read.parquet(_staged(tmp_path, "wal2json", headless))
    (got,) = _records(wal2json(raw, table, {}))
    assert got["_malformed"].startswith("wal2json record at in.json:1: its transaction (xid 800)")
    waited = _tx(801, T0, 0, [("U", {**A, "balance": 2}, {**A, "balance": 3})], 0x200)[:2]
    carried = spark.read.parquet(_staged(tmp_path, "wal2json", waited, "old.json"))
    carried = carried.withColumn("exported", F.lit("2026-11-01").cast("date"))
    nothing = spark.read.parquet(_staged(tmp_path, "wal2json", [], "none.json"))
    kept = wal2json(nothing, table, {}, carried, give_up_before=src.date(2026, 11, 20))
    (given_up,) = _records(kept)
    assert "came in no export within gc_grace_seconds" in given_up["_malformed"]
    assert kept.waiting.count() == 0
    still = wal2json(nothing, table, {}, carried, give_up_before=src.date(2026, 10, 20))
    assert _records(still) == [] and still.waiting.count() == 2  # its B and its change


DBZ_COLUMNS = {"id": "int", "name": "string"}


def _dbz_table(tmp_path: Path):
    cfg = configs.config({"items": configs.table(DBZ_COLUMNS)}, replicas=("pg1", "pg2"))
    return load_config(configs.write(tmp_path / "i.yaml", cfg, store=tmp_path / "s")).tables[
        "items"
    ]


@pytest.mark.parametrize("metadata", [True, False], ids=["transaction-metadata", "without"])
def test_debezium_ids_with_and_without_transaction_metadata(tmp_path: Path, spark, metadata):
    """With ``provide.transaction.metadata`` the id is the change's position in its
    transaction; without, a digest of the change and its occurrence by LSN. Either way a
    change sent again in a later export keeps its id, and two identical changes of one
    transaction on one key are two events."""
    table = _dbz_table(tmp_path)
    dbz = src.Debezium("items", ["id"], DBZ_COLUMNS, schema=False)

    def env(after: dict, lsn: int, order: int) -> dict:
        e = dbz.envelope("u", None, after, T0, 77, lsn)
        if metadata:
            e["transaction"] = {"id": "77:999", "total_order": order,
                                "data_collection_order": order}  # fmt: skip
        return e

    same = {"id": 1, "name": "x"}
    night1 = [env(same, 500, 1), env(same, 501, 2), env({"id": 2, "name": "y"}, 502, 3)]

    def ids_of(records: list[Any], name: str) -> list[str]:
        raw = spark.read.parquet(_staged(tmp_path, "debezium", records, name))
        return [r["event_id"] for r in _records(debezium(raw, table, {}))]

    ids = ids_of(night1, "n1.json")
    assert len(set(ids)) == 3  # the identical changes apart
    assert ids_of(night1, "n2.json") == ids  # sent again: the same ids
    tail = ids_of(night1[1:], "n3.json")  # the second identical change alone, then id 2
    if metadata:
        assert tail == ids[1:]
    else:  # known, as the first one: a duplicate, not applied again (docs/adapters.md)
        assert tail == [ids[0], ids[2]]
    first = [json.loads(r.raw) for r in debezium(
        spark.read.parquet(_staged(tmp_path, "debezium", night1, "n4.json")), table, {}
    ).records.orderBy("line").collect()]  # fmt: skip
    assert [r["pos"] for r in first] == ([1, 2, 3] if metadata else [500, 501, 502])
    kind = "#p" if metadata else "~"
    assert all(kind in i for i in ids), ids


@pytest.mark.parametrize("change_seq", [True, False], ids=["change-seq", "without"])
def test_dms_ids_with_and_without_a_change_sequence(tmp_path: Path, spark, change_seq):
    """DMS: a digest of the change and its occurrence by ``$AR_H_CHANGE_SEQ``; without
    that column, identical changes of one transaction on one key are one event (the
    second a replica's repeated copy: a duplicate in the report)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = _dbz_table(tmp_path)
    ts = "2026-11-21 10:00:00.000000"
    cols: dict[str, list[Any]] = {"Op": ["U", "U", "U"], "ts": [ts, ts, ts]}
    if change_seq:
        cols["seq"] = [f"2026112110000000000000000000000000{i}" for i in (1, 2, 3)]
    cols |= {"id": pa.array([1, 1, 2], pa.int32()), "name": ["x", "x", "y"]}
    pq.write_table(pa.table(cols), tmp_path / "part-00000.parquet")
    options = {"timestamp_column": "ts"} | ({"change_seq_column": "seq"} if change_seq else {})
    rows = read_dms(spark, [], [str(tmp_path / "part-00000.parquet")])
    got = _records(dms(rows, "pg1", ["f.parquet"], table, options))
    ids = [r["event_id"] for r in got]
    assert (ids[0] != ids[1]) is change_seq  # identical changes: apart only with the sequence
    assert ids[2] not in ids[:2]
    assert all("~" in i for i in ids)
    assert [r["pos"] for r in got] == [1, 2, 3]
