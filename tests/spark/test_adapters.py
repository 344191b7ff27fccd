"""The adapters (docs/adapters.md): wal2json, Debezium and DMS records map to canonical events;
unreadable ones are quarantined as malformed with their line and the reason; the three
formats mix in one run, and one change exported in two formats is one event."""

from __future__ import annotations

import base64
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.app.cli import main
from pipeline.core.config_load import load_config
from pipeline.core.report import RunReport
from pipeline.ingest import adapters
from pipeline.ingest.adapters import FRAMING
from pipeline.ingest.adapters.debezium import debezium
from pipeline.ingest.adapters.dms import dms, read_dms
from pipeline.ingest.adapters.wal2json import wal2json
from pipeline.ingest.manifests import read_manifest
from pipeline.ingest.staging import stage_jsonl
from pipeline.storage.store import open_store
from pipeline.storage.workpath import WorkPath
from tests.helpers import configs
from tests.helpers import published as P
from tests.helpers import sources as src

DT = "2026-11-21"
T0 = 1_795_258_800_000_000  # 2026-11-21T10:00:00Z, µs
COLUMNS = {
    "id": "int",
    "name": "string",
    "price": "decimal(10,2)",
    "added": "date",
    "seen": "timestamp",
    "blob": "binary",
}
CONFIG = configs.config(
    {"items": configs.table(COLUMNS)}, replicas=("pg1", "pg2", "pg3"), on_divergence="warn"
)


def config(tmp_path: Path, store_uri: str):
    return load_config(configs.write(tmp_path / "cdr.yaml", CONFIG, store=store_uri))


def pg_ts(us: int) -> str:
    """PostgreSQL's timestamptz text, as wal2json writes it (trailing zeros cut)."""
    s = src.datetime.fromtimestamp(us / 1e6, src.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    return s.rstrip("0").rstrip(".") + "+00"


def w2j(action: str, xid: int, ts: int, lsn: str, **kw: Any) -> dict[str, Any]:
    def cols(row: dict[str, Any]) -> list[dict[str, Any]]:
        types = {"int": "integer", "string": "text", "decimal(10,2)": "numeric(10,2)"}
        return [
            {"name": k, "type": types.get(COLUMNS[k], COLUMNS[k]), "value": v}
            for k, v in row.items()
        ]

    out: dict[str, Any] = {
        "action": action,
        "xid": xid,
        "timestamp": pg_ts(ts),
        "origin": kw.pop("origin", 0),
        "lsn": lsn,
        "schema": "public",
        "table": kw.pop("table", "items"),
    }
    if "columns" in kw:
        out["columns"] = cols(kw.pop("columns"))
    if "identity" in kw:
        out["identity"] = cols(kw.pop("identity"))
    return out


def framing(action: str, xid: int, ts: int, origin: int = 0) -> dict[str, Any]:
    return {"action": action, "xid": xid, "timestamp": pg_ts(ts), "origin": origin, "lsn": "0/1"}


def canonical_rows(adapted) -> list[dict[str, Any]]:
    """An adapter's canonical records (``Adapted.records``), in the export's order."""
    return [json.loads(r.raw) for r in adapted.records.orderBy("file", "line").collect()]


def staged_lines(tmp_path: Path, fmt: str, records: list[Any]):
    data, _rows = src.lines(records)
    (tmp_path / "in.json").write_bytes(data)
    dest = tmp_path / "staged" / "part-00000.parquet"
    rows, skipped = stage_jsonl(
        tmp_path / "in.json", dest, "pg1", "in.json", FRAMING.get(fmt), None, fmt == "wal2json"
    )
    return dest, rows, skipped


# ------------------------------------------------------------------------------ wal2json


def test_wal2json_actions_map_to_canonical_events(tmp_path: Path, spark):
    cfg = config(tmp_path, (tmp_path / "store").as_uri())
    # a bytea as wal2json's format 2 writes it: its hex digits, without PostgreSQL's \x
    row = {"id": 1, "name": 'café "q"', "price": 12345678.91, "added": "2026-01-02", "blob": "00ff"}
    records = [
        framing("B", 700, T0),
        w2j("I", 700, T0, "0/153BBB8", columns={**row, "seen": None}),
        w2j(
            "I",
            700,
            T0,
            "0/153BCA0",
            columns={"id": 2, "name": "b", "price": 2.00, "blob": "\\x0102"},
        ),
        framing("C", 700, T0),
        framing("B", 701, T0 + 5),
        w2j("U", 701, T0 + 5, "0/153BD58", columns={"id": 20, "name": "b"}, identity={"id": 2}),
        w2j("D", 701, T0 + 5, "0/153BE40", identity={"id": 1}),
        w2j("T", 701, T0 + 5, "1/0000A0"),
        framing("C", 701, T0 + 5),
    ]
    dest, rows, skipped = staged_lines(tmp_path, "wal2json", records)
    assert (rows, skipped) == (9, 4)  # B and C lines are counted as framing, and staged
    got = canonical_rows(wal2json(spark.read.parquet(str(dest)), cfg.tables["items"], {}))
    assert [g["op"] for g in got] == ["INSERT", "INSERT", "UPDATE", "DELETE", "TRUNCATE"]
    ins, _, upd, dele, trunc = got
    assert ins["after"] == {
        "id": "1",
        "name": 'café "q"',
        "price": "12345678.91",  # the digits as written, not through a double
        "added": "2026-01-02",
        "blob": "AP8=",  # base64, as every export gives binary
        "seen": None,
    }
    assert got[1]["after"]["blob"] == "AQI="  # PostgreSQL's own \x form reads too
    assert ins["ts"] == T0 and ins["origin"] == "pg1" and ins["txid"] == "700"
    assert ins["seq"] == 0x153BBB8  # the LSN as a 64-bit integer
    # the id: origin, commit time, op, old key and its place among the transaction's
    # changes with that op and key; pos: its LSN, which orders the transaction's changes
    assert ins["event_id"] == f'pg1@{T0}/I/{{"id":"1"}}#1' and ins["pos"] == ins["seq"]
    assert got[1]["event_id"] == f'pg1@{T0}/I/{{"id":"2"}}#1'
    assert [g["pos"] for g in got] == [g["seq"] for g in got]
    assert upd["key"] == {"id": "2"} and upd["new_key"] == {"id": "20"}
    assert upd["before"] == {"id": "2"}
    assert dele["key"] == {"id": "1"} and "after" not in dele
    assert trunc["seq"] == (1 << 32) + 0xA0 and "key" not in trunc


def test_wal2json_replication_origins_map_to_replicas(tmp_path: Path, spark):
    cfg = config(tmp_path, (tmp_path / "store").as_uri())
    records = [
        framing("B", 9, T0, origin=3),
        w2j("I", 9, T0, "0/10", columns={"id": 1, "name": "a"}, origin=3),
        framing("C", 9, T0, origin=3),
        framing("B", 10, T0, origin=4),
        w2j("I", 10, T0, "0/20", columns={"id": 2, "name": "a"}, origin=4),
        framing("C", 10, T0, origin=4),
    ]
    dest, _, _ = staged_lines(tmp_path, "wal2json", records)
    df = wal2json(spark.read.parquet(str(dest)), cfg.tables["items"], {"origins": {"3": "pg2"}})
    mapped, unmapped = canonical_rows(df)
    assert mapped["origin"] == "pg2" and mapped["event_id"] == f'pg2@{T0}/I/{{"id":"1"}}#1'
    assert "replication origin 4 is not mapped to a replica" in unmapped["_malformed"]
    assert unmapped["_malformed"].startswith("wal2json record at in.json:5: ")


# ------------------------------------------------------------------------------ Debezium


@pytest.mark.parametrize("wrapped", [True, False], ids=["schema-wrapped", "plain"])
def test_debezium_envelopes_map_to_canonical_events(tmp_path: Path, spark, wrapped: bool):
    cfg = config(tmp_path, (tmp_path / "store").as_uri())
    dbz = src.Debezium("items", ["id"], COLUMNS, schema=wrapped, full_identity=True)
    row = {
        "id": 1,
        "name": "a",
        "price": Decimal("-1234.5"),
        "added": "2026-01-02",
        "seen": "2026-11-21T09:00:00.000001Z",
        "blob": "AQI=",
    }
    if not wrapped:  # values as the converters give them without a schema to decode with
        row = {**row, "price": "12.50"}  # not base64: a plain value is read as it is
    new = {**row, "name": "b"}
    recs = [
        dbz.envelope("r", None, dbz._row(row) if wrapped else row, T0, 5, 100),
        dbz.envelope(
            "u",
            dbz._row(row) if wrapped else row,
            dbz._row(new) if wrapped else new,
            T0 + 1,
            6,
            200,
        ),
        "null",  # a Kafka tombstone: framing
        dbz.envelope("d", {"id": 1}, None, T0 + 2, 7, 300),
        dbz.envelope("t", None, None, T0 + 3, 8, 400),
    ]
    dest, rows, skipped = staged_lines(tmp_path, "debezium", recs)
    assert (rows, skipped) == (5, 1)
    got = canonical_rows(debezium(spark.read.parquet(str(dest)), cfg.tables["items"], {}))
    # docs/adapters.md#snapshot-reads: a snapshot's read (op r) is a READ, not an INSERT
    assert [g["op"] for g in got] == ["READ", "UPDATE", "DELETE", "TRUNCATE"]
    ins, upd, dele, _ = got
    want_seen = "1795251600000001" if wrapped else "2026-11-21T09:00:00.000001Z"
    assert ins["after"] == {
        "id": "1",
        "name": "a",
        "price": "-1234.50" if wrapped else "12.50",
        "added": "2026-01-02",
        "seen": want_seen,
        "blob": "AQI=",
    }
    assert ins["ts"] == T0 and ins["seq"] == 100 and ins["txid"] == "5"
    assert upd["before"]["name"] == "a" and upd["after"]["name"] == "b"
    assert upd["key"] == {"id": "1"} and "new_key" not in upd
    assert dele["key"] == {"id": "1"}


def test_debezium_replication_origins_map_to_replicas(tmp_path: Path, spark):
    """docs/adapters.md#debezium: Debezium 3's ``source.origin`` names the replication
    origin of a change another server made and this one applied (``pg_<subscription
    oid>``; null for its own): ``options.origins`` maps it to the replica that made the
    change; an origin it does not map is malformed, naming the option."""
    cfg = config(tmp_path, (tmp_path / "store").as_uri())
    dbz = src.Debezium("items", ["id"], COLUMNS, schema=False)
    recs = []
    for i, origin in enumerate([None, "pg_16390", "pg_99"], 1):
        e = dbz.envelope("c", None, {"id": i, "name": "a"}, T0 + i, 5 + i, 100 * i)
        e["source"]["origin"] = origin
        recs.append(e)
    dest, _, _ = staged_lines(tmp_path, "debezium", recs)
    df = debezium(
        spark.read.parquet(str(dest)), cfg.tables["items"], {"origins": {"pg_16390": "pg2"}}
    )
    own, applied, unmapped = canonical_rows(df)
    assert own["origin"] == "pg1" and applied["origin"] == "pg2"
    assert applied["event_id"].startswith(f"pg2@{T0 + 2}/"), applied["event_id"]
    assert "source.origin 'pg_99' is not mapped to a replica" in unmapped["_malformed"]
    assert "options.origins" in unmapped["_malformed"]


@pytest.mark.parametrize("placeholder", [None, "<unchanged toast>"], ids=["default", "option"])
def test_debezium_unavailable_toast_values_are_not_written(tmp_path: Path, spark, placeholder):
    """Issue 16: an UPDATE's unchanged TOASTed text or bytea comes as the connector's
    placeholder (the default, or the manifest's ``unavailable_value_placeholder``): the
    column is left out of the image, so the change does not write it."""
    cfg = config(tmp_path, (tmp_path / "store").as_uri())
    mark = placeholder or adapters.UNAVAILABLE
    dbz = src.Debezium("items", ["id"], COLUMNS, schema=True)
    old = {"id": 1, "name": "a", "price": Decimal("1.00"), "added": None, "seen": None}
    new = {**dbz._row({**old, "price": Decimal("2.00")}), "name": mark}
    new["blob"] = base64.b64encode(mark.encode()).decode()
    recs = [dbz.envelope("u", None, new, T0, 6, 200)]
    dest, _, _ = staged_lines(tmp_path, "debezium", recs)
    options = {"unavailable_value_placeholder": placeholder} if placeholder else {}
    raw = spark.read.parquet(str(dest))
    [upd] = canonical_rows(debezium(raw, cfg.tables["items"], options))
    assert upd["after"] == {"id": "1", "price": "2.00", "added": None, "seen": None}


@pytest.mark.parametrize("precision", [10, 18])
def test_debezium_decimal_bytes_decode_exactly(tmp_path: Path, spark, precision: int):
    """The adapter decodes Debezium's ``Decimal`` bytes (big-endian two's complement,
    scale from the schema) to the exact digits, at the edges: zero, one byte, negative,
    a sign bit set in the first byte, and the largest values of 18 digits."""
    scale = 2
    wide = "9" * (precision - scale) + "." + "9" * scale
    values = ["0", "1.5", "-0.01", "-1.28", "1.28", "-327.68", "99999999.99", wide, "-" + wide]
    columns = {"id": "int", "amount": f"decimal({precision},{scale})"}
    cfg = load_config_for(tmp_path, {"items": configs.table(columns)})
    dbz = src.Debezium("items", ["id"], columns, schema=True, full_identity=True)
    recs = [
        dbz.envelope("c", None, dbz._row({"id": i, "amount": Decimal(v)}), T0 + i, i, i)
        for i, v in enumerate(values)
    ]
    dest, _rows, _ = staged_lines(tmp_path, "debezium", recs)
    got = canonical_rows(debezium(spark.read.parquet(str(dest)), cfg.tables["items"], {}))
    want = [str(Decimal(v).quantize(Decimal(1).scaleb(-scale))) for v in values]
    assert [g["after"]["amount"] for g in got] == want


def test_debezium_nanosecond_commit_times_keep_their_microseconds(tmp_path: Path, spark):
    """``source.ts_ns`` alone (a connector configured so): the commit time in µs is the
    floor of ns / 1000, exactly, even where a double would round it up."""
    cfg = config(tmp_path, (tmp_path / "store").as_uri())
    dbz = src.Debezium("items", ["id"], COLUMNS, schema=False, full_identity=True)
    times_ns = [T0 * 1000 + 1999, T0 * 1000 + 999_999, T0 * 1000 - 1]
    recs = []
    for i, ns in enumerate(times_ns):
        e = dbz.envelope("c", None, {"id": i}, T0, i, i)
        e["source"] = {k: v for k, v in e["source"].items() if k not in ("ts_ms", "ts_us")}
        e["source"]["ts_ns"] = ns
        recs.append(e)
    dest, _rows, _ = staged_lines(tmp_path, "debezium", recs)
    got = canonical_rows(debezium(spark.read.parquet(str(dest)), cfg.tables["items"], {}))
    assert [int(g["ts"]) for g in got] == [ns // 1000 for ns in times_ns]


def load_config_for(tmp_path: Path, tables: dict[str, Any]):
    cfg = {**CONFIG, "tables": tables}
    return load_config(configs.write(tmp_path / "cdr.yaml", cfg, store=tmp_path / "store"))


# ----------------------------------------------------------------------------------- DMS


def test_dms_csv_and_parquet_stage_and_map(tmp_path: Path, spark):
    from pipeline.ingest.fetch import fetch_files, plan_export

    store = open_store((tmp_path / "store").as_uri())
    cfg = config(tmp_path, store.uri)
    cols = ["id", "name", "price"]
    ch = [
        src.Change("items", "I", None, {"id": 1, "name": "", "price": "1.50"}, T0, 1, 1),
        src.Change("items", "U", None, {"id": 1, "name": None, "price": "2.00"}, T0 + 1, 2, 2),
    ]
    header = ["Op", "commit_ts", *cols]
    text, n = src.dms_csv(src.dms_rows(ch, cols), header)
    bad = b'I,2026-11-21 10:00:00.000002,2,"x",1.00,extra\nX,2026-11-21 10:00:00.000003,3,y,1\n'
    parquet = pa.table(
        {
            "Op": ["D"],
            "commit_ts": ["2026-11-21 10:00:01.000000"],
            "id": pa.array([1], pa.int32()),
            "name": [None],
            "price": pa.array([Decimal("2.00")], pa.decimal128(10, 2)),
        }
    )
    pq.write_table(parquet, tmp_path / "p.parquet")
    src.put_export(
        store,
        "pg1",
        "items",
        DT,
        "dms",
        {
            "20261121-0001.csv": (text + bad, n + 2),
            "20261121-0002.parquet": ((tmp_path / "p.parquet").read_bytes(), 1),
        },
        {"timestamp_column": "commit_ts"},
    )
    folder = f"exports/replica=pg1/table=items/dt={DT}"
    manifest = read_manifest(store, folder, {})
    staged, tasks = plan_export(
        store, folder, manifest, WorkPath.of(tmp_path / "staged"), "pg1", "items"
    )
    assert fetch_files(spark, tasks, {}) == [(0, 0, None), (0, 0, None)]
    assert staged.records == 5
    rows = read_dms(
        spark,
        [str(p) for p in (tmp_path / "staged/dms/csv").glob("*.parquet")],
        [str(p) for p in (tmp_path / "staged/dms/parquet").glob("*.parquet")],
    )
    got = canonical_rows(dms(rows, "pg1", staged.files, cfg.tables["items"], manifest["options"]))
    ops = [g.get("op") for g in got]
    assert ops.count("INSERT") == 1 and ops.count("UPDATE") == 1 and ops.count("DELETE") == 1
    ins = next(g for g in got if g.get("op") == "INSERT")
    upd = next(g for g in got if g.get("op") == "UPDATE")
    assert ins["after"] == {"id": "1", "name": "", "price": "1.50"}  # "" kept apart from null
    assert upd["after"]["name"] is None and upd["ts"] == T0 + 1
    malformed = sorted(g["_malformed"] for g in got if "_malformed" in g)
    assert len(malformed) == 2
    assert malformed == [
        "dms record at 20261121-0001.csv:4: not a CSV record of this export: "
        "expected 5 fields, found 6",
        "dms record at 20261121-0001.csv:5: Op 'X' is not I, U or D",
    ]


# ------------------------------------------------------------------- through the pipeline


def _run(tmp_path: Path, store_root: Path) -> int:
    configs.write(tmp_path / "cdr.yaml", CONFIG, store=store_root)
    return main(
        [
            "run",
            "--config",
            str(tmp_path / "cdr.yaml"),
            "--date",
            DT,
            "--work-dir",
            str(tmp_path / "work"),
            "--no-data-docs",
        ]
    )


def test_three_formats_in_one_run_with_malformed_records(tmp_path: Path):
    """pg1 exports wal2json, pg2 Debezium, pg3 DMS, each its own changes (Debezium and
    DMS cannot tell which replica a replicated change came from: docs/adapters.md).
    Broken records of each format are quarantined with their line and reason, kept as
    they were exported, and the accounting holds."""
    root = tmp_path / "store"
    store = open_store(root.as_uri())
    row = {"id": 1, "name": "a", "price": "1.50"}
    # pg1 inserts id 1 (and id 2); pg2 updates id 1 later; pg3 inserts id 3
    src.put_export(
        store,
        "pg1",
        "items",
        DT,
        "wal2json",
        {
            "slot.json": src.lines(
                [
                    framing("B", 700, T0),
                    w2j("I", 700, T0, "0/10", columns=row),
                    w2j("I", 700, T0, "0/20", columns={"id": 2, "name": "b", "price": "2.00"}),
                    framing("C", 700, T0),
                    "{not json",
                    w2j("X", 701, T0, "0/30"),
                    w2j("I", 702, T0, "0/40", columns={"id": 3}, table="other"),
                ]
            )
        },
    )
    dbz = src.Debezium("items", ["id"], COLUMNS)
    upd = {**row, "name": "pg2's"}
    src.put_export(
        store,
        "pg2",
        "items",
        DT,
        "debezium",
        {
            "topic+0+0.json": src.lines(
                [
                    dbz.envelope("u", None, dbz._row(upd), T0 + 10, 41, 900),
                    {"op": "c", "source": {"table": "items"}},  # no commit time
                    {"schema": {}, "payload": {"op": "q"}},
                ]
            )
        },
    )
    # pg3 inserts id 3; a DMS transformation rule adds the origin column (a constant)
    cols = ["id", "name", "price"]
    insert = src.Change("items", "I", None, {**row, "id": 3, "name": "c"}, T0 + 20, 700, 1)
    rows = [[r[0], r[1], "pg3", *r[2:]] for r in src.dms_rows([insert], cols)]
    text, n = src.dms_csv(rows)
    text += b"U,,pg3,1,a,1.00\n"  # no commit timestamp
    src.put_export(
        store,
        "pg3",
        "items",
        DT,
        "dms",
        {"LOAD.csv": (text, n + 1)},
        {
            "timestamp_column": "ts",
            "header": False,
            "columns": ["Op", "ts", "origin", *cols],
            "origin_column": "origin",
        },
    )
    assert _run(tmp_path, root) == 0
    q = P.log(root, "items", "quarantine", DT)
    details = sorted(r["detail"] for r in q)
    assert all(r["reason"] == "malformed" for r in q)
    assert len(q) == 6, details
    for want in [
        "wal2json record at slot.json:5: not JSON",
        "wal2json record at slot.json:6: unknown action 'X'",
        "wal2json record at slot.json:7: a change of table public.other in an export of "
        "table items",
        "debezium record at topic+0+0.json:2: no source.ts_ms, ts_us or ts_ns",
        "debezium record at topic+0+0.json:3: unknown op 'q'",
        "dms record at LOAD.csv:2: no commit timestamp in column 'ts'",
    ]:
        assert any(d.startswith(want) for d in details), (want, details)
    assert "{not json" in {r["event"] for r in q}  # kept as exported
    report = RunReport.from_json((root / f"published/reports/dt={DT}/run_report.json").read_text())
    t = report.tables["items"]
    assert t.replicas["pg1"]["records"] == 5 and t.replicas["pg1"]["framing"] == 2
    assert t.events == 10 and t.distinct_events == 10
    assert not t.conflicts.get("insert_exists")
    snap = P.snapshot(root, "items")
    assert {r["id"]: r["name"] for r in snap} == {1: "pg2's", 2: "b", 3: "c"}


# ------------------------------------------------------------------- hostile records


def _hostile(line: str, how: str, rng, name: str) -> str:
    """``line`` (a JSON object) made hostile ``how`` (``dup``: its field ``name`` twice)."""
    if how == "dup":
        return line[:-1] + f', "{name}": "d"}}'
    if how == "deep":
        n = rng.choice([900, 5000, 100_000])
        return line[:-1] + ', "extra": ' + "[" * n + "]" * n + "}"
    if how == "huge":
        return line.replace('"value": 1', '"value": ' + "9" * 5000, 1)
    if how == "surrogate":
        return line.replace('"a"', '"\\ud800"', 1)
    if how == "cut":
        return line[: rng.randrange(1, len(line))]
    if how == "noise":
        return "".join(chr(rng.choice([rng.randrange(32, 127), rng.randrange(160, 0xD7FF)]))
                       for _ in range(rng.randrange(1, 40)))  # fmt: skip
    return line


HOSTILE = ("dup", "deep", "huge", "surrogate", "cut", "noise", "none")


@pytest.mark.parametrize("fmt", ["wal2json", "debezium"])
def test_hostile_records_each_get_one_fate_through_the_adapters(tmp_path: Path, spark, fmt):
    """docs/adapters.md: 2,000 records of each format, hostile in every way the
    issue names (a name given twice, nested 100,000 deep, a number of 5,000 digits, a
    lone surrogate, cut, noise), through the adapter's Spark mapping and the typing: one
    copy per record, nothing raised; a name given twice is named."""
    import random

    from pipeline.ingest.copies import type_adapted
    from pipeline.rules.guards import TypingSpec
    from pipeline.spark.frames import copy_schema

    rng = random.Random(49)
    cfg = config(tmp_path, (tmp_path / "store").as_uri())
    name = "action" if fmt == "wal2json" else "op"  # the field given twice
    if fmt == "wal2json":
        good = [
            json.dumps(w2j("I", 800 + i, T0 + i, f"0/{i + 16:X}", columns={"id": 1, "name": "a"}))
            for i in range(2000)
        ]
        frames = [  # each change in its transaction (B, the change, C)
            [json.dumps(framing(a, 800 + i, T0 + i)) for a in "BC"] for i in range(len(good))
        ]
    else:
        dbz = src.Debezium("items", ["id"], COLUMNS, schema=False)
        good = [
            json.dumps(dbz.envelope("c", None, {"id": 1, "name": "a"}, T0 + i, 40 + i, 900 + i))
            for i in range(2000)
        ]
    hows = [HOSTILE[i % len(HOSTILE)] for i in range(len(good))]
    records = [
        _hostile(line, how, rng, name).replace("\n", " ")
        for line, how in zip(good, hows, strict=True)
    ]
    lines = records
    if fmt == "wal2json":
        lines = [x for (b, c), r in zip(frames, records, strict=True) for x in (b, r, c)]
    dest, rows, skipped = staged_lines(tmp_path, fmt, lines)
    assert rows == len(lines) and rows - skipped == len(records)
    raw = spark.read.parquet(str(dest))
    adapt = wal2json if fmt == "wal2json" else debezium
    mapped = adapt(raw, cfg.tables["items"], {}).records
    spec = TypingSpec.of(cfg, cfg.tables["items"], T0 + 10**9)
    typed = mapped.select("replica", "file", "line", "raw").mapInArrow(
        type_adapted(spec), copy_schema(cfg.tables["items"])
    )
    copies = typed.select("line", "reason", "detail").orderBy("line").collect()
    every = 3 if fmt == "wal2json" else 1  # a record's line: between its B and its C
    assert [c.line for c in copies] == [i * every + every // 2 + 1 for i in range(len(records))]
    for c, how in zip(copies, hows, strict=True):
        if how == "none":
            assert c.reason is None, c
        elif how in ("dup", "surrogate"):  # deep: 900 levels is JSON, the field unknown
            assert c.reason == "malformed", (how, c)
    dup = next(c for c, how in zip(copies, hows, strict=True) if how == "dup")
    assert dup.detail.endswith(f'not JSON: duplicate key "{name}"'), dup.detail
