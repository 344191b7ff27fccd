"""The Spark engine of cell tables (``pipeline.resolve.cells``) against the pure-Python reference
(``pipeline.rules.cellfold``): the rule-4 value order of every column type against the
serialized bytes, and whole runs of generated events (ties on ts, TTLs, nulls, deletes,
a TRUNCATE, late events, copies in several exports, two runs with a purge between them)
through ``cdr run``, compared on the snapshot, the conflict log and every event's fate.
"""

from __future__ import annotations

import json
import random
import uuid
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipeline.core.config_load import parse_config
from pipeline.core.kinds import ColumnType, Kind
from pipeline.core.report import RunReport
from pipeline.resolve.cells import stage as cell_stage
from pipeline.resolve.cells import value_order
from pipeline.rules.cellfold import Cell, CellEvent, CellFold, CellRow, purge, serialize
from pipeline.spark.schema import spark_type
from tests.helpers import GOLDEN, configs
from tests.helpers import published as P
from tests.helpers import scenarios as S
from tests.helpers.sparkjobs import codegen_modes, settled_disputes


def _values(kind: ColumnType, rnd: random.Random) -> list[Any]:
    k = kind.kind
    if k is Kind.INT:
        return [
            rnd.choice([-1, 0, 1, -(2**31), 2**31 - 1, rnd.randint(-(2**31), 2**31 - 1)])
            for _ in range(60)
        ]
    if k is Kind.BIGINT:
        return [
            rnd.choice([-1, 0, 2**63 - 1, -(2**63), rnd.randint(-(2**63), 2**63 - 1)])
            for _ in range(60)
        ]
    if k is Kind.DOUBLE:
        return [
            rnd.choice([0.0, -0.0, 1.5, -1.5, 1e300, -1e-300, rnd.uniform(-1e9, 1e9)])
            for _ in range(60)
        ]
    if k is Kind.DECIMAL:
        lim = 10**kind.precision - 1
        unscaled = [rnd.randint(-lim, lim) for _ in range(60)] + [0, 128, -128, 255, -129]
        unscaled += [
            rnd.randint(-(10 ** rnd.randint(1, 6)), 10 ** rnd.randint(1, 6)) for _ in range(40)
        ]
        return [Decimal(u).scaleb(-kind.scale) for u in unscaled]
    if k is Kind.STRING:
        alphabet = ["a", "b", "z", "é", "😀", "\x7f", ""]
        return ["".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 4))) for _ in range(60)]
    if k is Kind.BOOLEAN:
        return [rnd.random() < 0.5 for _ in range(10)]
    if k is Kind.DATE:
        return [date(1970, 1, 1) + timedelta(days=rnd.randint(-40000, 40000)) for _ in range(60)]
    if k is Kind.TIMESTAMP:
        base = datetime(1970, 1, 1, tzinfo=UTC)
        return [base + timedelta(microseconds=rnd.randint(-(10**15), 10**15)) for _ in range(60)]
    if k is Kind.BINARY:
        return [bytes(rnd.randint(0, 255) for _ in range(rnd.randint(0, 3))) for _ in range(60)]
    return [str(uuid.UUID(int=rnd.getrandbits(128))) for _ in range(60)]


TYPES = [
    ColumnType(Kind.INT),
    ColumnType(Kind.BIGINT),
    ColumnType(Kind.DOUBLE),
    ColumnType(Kind.DECIMAL, 10, 2),
    ColumnType(Kind.DECIMAL, 30, 4),
    ColumnType(Kind.STRING),
    ColumnType(Kind.BOOLEAN),
    ColumnType(Kind.DATE),
    ColumnType(Kind.TIMESTAMP),
    ColumnType(Kind.BINARY),
    ColumnType(Kind.UUID),
]


@pytest.mark.parametrize("ct", TYPES, ids=str)
def test_value_order_is_the_order_of_the_serialized_bytes(spark, ct):
    rnd = random.Random(str(ct))
    values = _values(ct, rnd)
    schema = T.StructType([T.StructField("v", spark_type(ct))])
    df = spark.createDataFrame([(v,) for v in values], schema)
    got = [r.v for r in df.orderBy(value_order(F.col("v"), ct)).collect()]
    ser = [serialize(v, ct) for v in got]
    assert ser == sorted(ser), f"{ct}: Spark's order is not the bytes' order"
    assert sorted(ser) == sorted(serialize(v, ct) for v in values)  # the same values came back


# ---------------------------------------------------------------------- Spark = reference

REPLICAS = ("A", "B", "C")
RANK = {"A": 0, "B": 1, "C": 2}
COLUMNS = {"k": "bigint", "s": "string", "n": "int", "price": "decimal(10,2)", "x": "double"}
GRACE = 43200  # 12 h: the first run's tombstones are purged by the second
D1, D2 = date(2026, 11, 20), date(2026, 11, 21)


def _us(d: date, hours: float) -> int:
    return int(datetime(d.year, d.month, d.day, tzinfo=UTC).timestamp() * 1_000_000 + hours * 3.6e9)


def _events(rnd: random.Random, d: date, n: int, prefix: str) -> list[CellEvent]:
    stamps = [_us(d, h) for h in (13, 14, 14, 15, 20)]  # few: ties
    out = []
    for i in range(n):
        origin = rnd.choice(list(RANK))
        op = rnd.choices(["INSERT", "UPDATE", "DELETE", "TRUNCATE"], [30, 55, 14, 1])[0]
        after: dict[str, Any] = {}
        if op in ("INSERT", "UPDATE"):
            for c in ("s", "n", "price", "x"):
                if rnd.random() < 0.5:
                    after[c] = rnd.choice(
                        {
                            "s": [None, "a", "b", "é"],
                            "n": [None, -1, 1, 2],
                            "price": [None, Decimal("1.50"), Decimal("-2.00")],
                            "x": [None, -0.5, 2.0],
                        }[c]
                    )
        ttl = rnd.choice([None, None, None, 3600, 86400 * 30])
        key = None if op == "TRUNCATE" else (rnd.randint(1, 12),)
        out.append(
            CellEvent(
                f"{origin}-{prefix}{i:03d}",
                op,
                key,
                rnd.choice(stamps),
                origin,
                RANK[origin],
                after,
                ttl,
            )
        )
    return out


def _record(e: CellEvent, seq: int) -> dict[str, Any]:
    r: dict[str, Any] = {
        "op": e.op,
        "ts": e.ts,
        "origin": e.origin,
        "event_id": e.event_id,
        "seq": seq,
    }
    if e.key is not None:
        r["key"] = {"k": e.key[0]}
    if e.after or e.op == "INSERT":
        r["after"] = {c: (str(v) if isinstance(v, Decimal) else v) for c, v in e.after.items()}
    if e.ttl:
        r["ttl"] = e.ttl
    return r


def _exports(rnd: random.Random, evs: list[CellEvent]) -> dict[str, Any]:
    """Each event in its origin's export and in a random subset of the others, each
    export in its own order."""
    out: dict[str, list[CellEvent]] = {r: [] for r in RANK}
    for e in evs:
        for r in RANK:
            if r == e.origin or rnd.random() < 0.6:
                out[r].append(e)
    for r in out:
        rnd.shuffle(out[r])
    return {r: {"t": [_record(e, i) for i, e in enumerate(es)]} for r, es in out.items()}


def _spark_rows(root: Path, d: date) -> tuple[dict, list[dict], dict[str, str]]:
    snap = {(r["k"],): r for r in P.snapshot(root, "t")}
    conflicts = P.log(root, "t", "conflicts", d)
    return snap, conflicts, {}


def test_spark_equals_the_reference_over_two_runs(tmp_path: Path, spark, monkeypatch):
    # compiled plans, as a large run has them (the shared scenarios run small: interpreted)
    monkeypatch.setenv("CDR_CODEGEN", "on")
    modes = codegen_modes(monkeypatch)
    rnd = random.Random(20261122)
    cfg = configs.config(
        configs.table(COLUMNS, ["k"], policy="scylla"), replicas=REPLICAS, gc_grace_seconds=GRACE
    )
    table = parse_config(cfg).tables["t"]
    base_ts = _us(D1, 12)
    prior_rows = [
        {
            "k": k,
            "s": "base",
            "n": k,
            "price": "9.99",
            "x": 1.0,
            "_ts": base_ts + (k % 3) * 3_600_000_000 * 4,
            "_origin": "A",
        }
        for k in range(1, 9)
    ]
    run1 = _events(rnd, D1, 160, "1")
    run2 = _events(rnd, D2, 160, "2")
    stale = [
        CellEvent("C-stale", "UPDATE", (1,), _us(D2, 11), "C", 2, {"s": "stale"})
    ]  # < now - grace
    s = {
        "config": cfg,
        "prior_state": {"t": prior_rows},
        "history": [{"date": str(D1), "now": f"{D2}T00:00:00Z", "exports": _exports(rnd, run1)}],
        "date": str(D2),
        "now": "2026-11-22T00:00:00Z",
        "exports": _exports(rnd, run2 + stale),
    }
    got, failed = S.run_scenario(s, tmp_path)
    assert not failed
    assert modes and all(modes), modes

    # the reference: base rows are cells and a marker written at _ts
    types = {c: ct for c, ct in ((c.name, c.type) for c in table.columns) if c != "k"}
    rows = {}
    for r in prior_rows:
        meta = {"origin": "A", "rank": 0}
        vals = {"s": r["s"], "n": r["n"], "price": Decimal(r["price"]), "x": r["x"]}
        rows[(r["k"],)] = CellRow(
            {c: Cell(r["_ts"], v, **meta) for c, v in vals.items()}, Cell(r["_ts"], **meta)
        )
    now1, now2 = _us(D2, 0), _us(date(2026, 11, 22), 0)
    f1 = CellFold(table, now1, rows).run(run1)
    rows2, tt = purge(f1.state(), f1.table_tomb, now2, GRACE)
    f2 = CellFold(table, now2, rows2, tt).run(run2)
    del types

    snap, conflicts, _ = _spark_rows(tmp_path / "store", D2)
    want = f2.snapshot()
    assert set(snap) == set(want)
    for k, w in want.items():
        g = snap[k]
        for c in ("s", "n", "price", "x", "_ts", "_origin"):
            assert g[c] == w.get(c), (k, c, g, w)

    def key(c: dict) -> tuple:
        k = json.loads(c["key"])["k"]
        return (k, c["remote_event_id"], c["conflict_type"], c["outcome"], c["local_ts"])

    assert sorted(map(key, conflicts)) == sorted(
        (c.key[0], c.event_id, c.conflict_type, c.outcome, c.local_ts) for c in f2.conflicts
    )
    assert f2.conflicts, "the generated run has no conflict: the comparison proves little"
    assert any(c.outcome == "discarded" for c in f2.conflicts)
    assert got["quarantine"] == {"t": [{"event_id": "C-stale", "reason": "stale_beyond_gc_grace"}]}

    report = RunReport.from_json(
        (tmp_path / "store/published/reports/dt=2026-11-21/run_report.json").read_text()
    )
    t = report.tables["t"]
    fates = f2.fates
    assert t.applied == sum(1 for f in fates.values() if f == "applied")
    assert t.discarded == sum(1 for f in fates.values() if f == "discarded")
    assert t.divergent_keys == {}


def test_copies_under_different_keys_resolve_as_if_exported_under_the_standing_key(
    tmp_path: Path, spark, monkeypatch
):
    """docs/rules.md#what-is-quarantined across keys, in the cell engine: the golden
    ``differing_copies``
    exports (B-002's and C-002's copies sit under different keys) under ``scylla``
    publish what the same exports publish with every copy already under the key and
    record of its event's standing copy (the origin's own). The first run takes the
    second resolution (``_settled``'s disputes), the second does not need it."""
    s = json.loads((GOLDEN / "differing_copies.json").read_text())
    s["config"]["defaults"] = {"policy": "scylla"}
    order = [r["id"] for r in s["config"]["replicas"] if r["id"] in s["exports"]]
    exports = {replica: s["exports"][replica]["t"] for replica in order}
    standing: dict[str, dict] = {}  # each event's: its origin's copy, else the first replica's
    for rows in reversed(exports.values()):
        standing.update({r["event_id"]: r for r in rows})
    for replica, rows in exports.items():
        standing.update({r["event_id"]: r for r in rows if r["origin"] == replica})
    moved = json.loads(json.dumps(s))
    for rows in (moved["exports"][replica]["t"] for replica in exports):
        rows[:] = [{**standing[r["event_id"]], "seq": r["seq"]} for r in rows]
    assert moved["exports"] != s["exports"]  # some copies did move

    settled = settled_disputes(monkeypatch, cell_stage)
    runs = {}
    for name, scenario in (("as exported", s), ("moved", moved)):
        (tmp_path / name).mkdir()
        got, failed = S.run_scenario(scenario, tmp_path / name)
        assert not failed and got["status"] == "published", got
        runs[name] = got
    assert settled == [["B-002", "C-002"]]  # the first run's, once
    assert runs["as exported"]["snapshot"]["t"] and runs["as exported"] == runs["moved"]


def test_snapshot_reads_seed_an_empty_cell_table_and_never_write_later(tmp_path: Path, spark):
    """docs/adapters.md#snapshot-reads on a cell table: the first night starts from the
    reads; on the second, a stale read of B's (a re-snapshot) is counted and never
    written, even against a newer cell of A's, and the report names it."""
    store = tmp_path / "store"
    cfg = configs.config(
        configs.table({"id": "int", "v": "string"}, policy="scylla"), replicas=("A", "B")
    )
    configs.write(tmp_path / "cdr.yaml", cfg, store=store)

    def ev(r: str, i: int, op: str, v: str, ts: str) -> dict[str, Any]:
        return {"op": op, "key": {"id": i}, "after": {"id": i, "v": v}, "ts": ts,
                "origin": r, "event_id": f"{r}-{op}-{i}-{ts}", "seq": 1}  # fmt: skip

    d1, d2 = "2026-11-20", "2026-11-21"
    S.write_exports(store, d1, {
        "A": {"t": [ev("A", 1, "READ", "a1", "2026-11-20T01:00:00Z"),
                    ev("A", 2, "READ", "a2", "2026-11-20T01:00:00Z")]},
        "B": {"t": [ev("B", 1, "READ", "b1", "2026-11-20T01:00:00Z"),
                    ev("B", 1, "UPDATE", "new", "2026-11-20T02:00:00Z")]},
    })  # fmt: skip
    S.write_exports(store, d2, {
        "A": {"t": [ev("A", 2, "UPDATE", "newer", "2026-11-21T02:00:00Z")]},
        "B": {"t": [ev("B", 2, "READ", "stale", "2026-11-21T03:00:00Z")]},
    })  # fmt: skip
    args = ["run", "--config", str(tmp_path / "cdr.yaml"), "--no-data-docs"]
    from pipeline.app.cli import main

    for d in (d1, d2):
        assert main([*args, "--date", d, "--work-dir", str(tmp_path / "work")]) == 0
        if d == d1:
            assert {r["id"]: r["v"] for r in P.snapshot(store, "t")} == {1: "new", 2: "a2"}
    assert {r["id"]: r["v"] for r in P.snapshot(store, "t")} == {1: "new", 2: "newer"}
    report = P.report(store, d2)
    assert report.tables["t"].replicas["B"].get("read") == 1
    assert any("replica B's export holds 1 snapshot read" in w for w in report.warnings)
