"""The policy extensions (the extensions (docs/rules.md, docs/outputs.md#history)) through
``cdr generate`` and ``cdr run``,
over two nights; the rules themselves are held by the golden scenarios, the fold's unit
tests and the property tests."""

from __future__ import annotations

import gzip
import json
from datetime import UTC, datetime
from pathlib import Path

import yaml

from pipeline.app.cli import main
from pipeline.core.report import RunReport
from tests.helpers import configs
from tests.helpers import published as P
from tests.helpers.reports import date_report
from tests.unit.test_extensions import CONFIG


def _events(store: Path, day: str) -> list[dict]:
    """Every event of a night, once (the origin's own copy)."""
    out = []
    for f in sorted(store.glob(f"exports/replica=*/table=items/dt={day}/*.jsonl.gz")):
        replica = f.parent.parent.parent.name.removeprefix("replica=")
        for line in gzip.decompress(f.read_bytes()).splitlines():
            e = json.loads(line)
            if e["origin"] == replica:
                out.append(e)
    return out


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)


#: a scylla table beside the order_by one, for the history (history) of a cell table
CELLS = configs.table(configs.ITEMS, policy="scylla", history=True)
DAYS = ("2026-11-21", "2026-11-22")


def test_generated_nights_under_order_by_with_history(tmp_path: Path, spark):
    """``cdr generate`` gives every event of an ``order_by`` table its order value (the
    application's time), so nothing is quarantined. Replica r1's clock runs 90 s behind
    (``--clock-offset``), so its commit ts disagree with the order values of the others'
    concurrent writes; a key no DELETE touched still ends with the largest order value
    its INSERTs and UPDATEs carried, where the largest ts would pick another write. The
    run report gives the clock-skew evidence (clock skew): r1 behind the others, by less than
    90 s, and a warning past ``max_clock_skew_seconds`` (20).
    The same nights keep the ``history`` of that table and of a scylla table (history): see
    :func:`check_history`; then a backfill of the first night, the second published,
    replaces the first night's versions and keeps the second's as they are."""
    store = tmp_path / "store"
    tables = {"items": {**CONFIG["tables"]["items"], "history": True}, "cells": CELLS}
    cfg = configs.write(
        tmp_path / "cdr.yaml", CONFIG, max_clock_skew_seconds=20, store=store, tables=tables
    )

    def run(day: str, *more: str) -> None:
        args = ["run", "--config", str(cfg), "--date", day, "--now", f"{day}T23:59:59Z"]
        assert main([*args, "--work-dir", str(tmp_path / "work"), "--no-data-docs", *more]) == 0

    for i, day in enumerate(DAYS):
        gen = ["generate", "--config", str(cfg), "--date", day, "--events", "1800"]
        gen += ["--conflict-rate", "0.2"]  # contended keys: the evidence is in their copies
        assert main([*gen, "--seed", str(i), "--clock-offset", "r1=-90"]) == 0
        run(day)
        report = date_report(store, day)
        assert report is not None and report.status == "published"
        assert report.tables["items"].quarantined == {}, report.tables["items"]
        check_skew(report)
        # the fold's tasks find what the cell engine's window would, on these copies
        assert (
            _spark_evidence(spark, cfg, tmp_path / "work", day) == report.tables["items"].clock_skew
        )
    writes: dict[int, list[tuple[datetime, int]]] = {}  # (order value, ts) of each write
    deleted: set[int] = set()
    inserted: dict[int, int] = {}  # each key's first INSERT's ts
    for day in DAYS:
        for e in _events(store, day):
            k = e["key"]["id"]
            if e["op"] == "DELETE":
                deleted.add(k)
            else:
                writes.setdefault(k, []).append((_at(e["after"]["at"]), e["ts"]))
            if e["op"] == "INSERT":
                inserted[k] = min(inserted.get(k, e["ts"]), e["ts"])
    snapshot = {r["id"]: r for r in P.snapshot(store, "items")}
    # r1's clock can stamp an UPDATE before the INSERT it follows: applied in ts order it
    # finds no row (update_missing, skipped), whatever its order value
    checked = [
        k for k in writes if k not in deleted and min(t for _, t in writes[k]) >= inserted.get(k, 0)
    ]
    assert len(checked) > 100
    for k in checked:
        assert snapshot[k]["at"].astimezone(UTC) == max(writes[k])[0], k
    # the data can tell order_by from ts: for some keys the latest ts is not the winner
    drifted = [k for k in checked if max(writes[k], key=lambda w: w[1]) != max(writes[k])]
    assert drifted, "no key where the clock offset reorders the writes"

    for t, spec in tables.items():
        check_history(store, t, list(spec["columns"]))
    before = _versions(store, "items")
    run(DAYS[0], "--backfill")  # a backfill of the first night, the second published
    after = _versions(store, "items")
    assert after.keys() == before.keys()
    for k, r in before.items():
        diff = {c for c, v in r.items() if after[k][c] != v}
        assert diff == ({"_run_id"} if r["dt"].isoformat() == DAYS[0] else set()), (k, diff)


def check_skew(report: RunReport) -> None:
    """clock skew on a night where r1's clock runs 90 s behind: every pair says r1 is behind
    (no other replica is), by less than 90 s, and the largest lag is a warning."""
    skew = report.tables["items"].clock_skew
    assert set(skew) == {"r1"}, skew
    assert set(skew["r1"]) <= {"r2", "r3"} and skew["r1"]
    lags = [p["max_seconds"] for p in skew["r1"].values()]
    assert all(p["events"] > 0 for p in skew["r1"].values())
    assert 20 < max(lags) < 90, skew
    assert any("the clock of replica r1 runs behind" in w for w in report.warnings)
    assert report.tables["cells"].clock_skew == {}  # its UPDATEs carry no before


def _spark_evidence(spark, cfg: Path, work: Path, day: str) -> dict:
    """clock skew by the cell engine's window (``skew.with_evidence``) over the typed copies the
    run staged."""
    from datetime import date

    from pipeline.core.config_load import load_config
    from pipeline.resolve.skew import tally, with_evidence
    from pipeline.spark.frames import copy_schema
    from pipeline.storage.context import RunContext

    table = load_config(cfg).tables["items"]
    staged = RunContext.load(work, date.fromisoformat(day)).staged / "items"
    files = sorted(str(p) for p in staged.glob("replica=*/copies/*.parquet"))
    copies = spark.read.schema(copy_schema(table)).parquet(*files)
    return tally(with_evidence(copies, table))


def _versions(store: Path, table: str) -> dict[tuple, dict]:
    """A table's history by (key, version), each row once."""
    rows = P.rows(store, f"published/{table}/history")
    out = {(r["id"], r["_version"]): r for r in rows}
    assert len(out) == len(rows), "a version published twice"
    return out


def check_history(store: Path, table: str, columns: list[str]) -> None:
    """Each key's current version is its snapshot row (the deleted keys' a deletion); the
    versions carry the dates of both nights; the run report counts them; DuckDB reads
    the table, and its current versions are the snapshot's keys."""
    versions = _versions(store, table)
    current = {k: r for (k, _), r in versions.items() if r["_valid_to"] is None}
    live = {k: {c: r[c] for c in columns} for k, r in current.items() if not r["_deleted"]}
    snapshot = {r["id"]: {c: r[c] for c in columns} for r in P.snapshot(store, table)}
    assert live == snapshot, table
    assert {r["dt"].isoformat() for r in versions.values()} == set(DAYS), table
    report = date_report(store, DAYS[1])
    assert report is not None and report.tables[table].history["rows"] == len(versions)
    sql = P.duckdb_rows(store, f"published/{table}/history")
    assert len(sql) == len(versions), table
    assert {r["id"] for r in sql if r["_valid_to"] is None and not r["_deleted"]} == set(snapshot)


def test_column_groups_turned_on_between_two_nights(tmp_path: Path):
    """A table's state gains its ``_groups`` column the night ``column_groups`` is turned
    on: that night reads the state written without it (every group at the row's stamp)
    and publishes the new schema. (The engine's test reads ``_groups`` back the night
    after.) These nights' clocks agree: no clock-skew evidence (clock skew)."""
    store = tmp_path / "store"
    cfg = tmp_path / "cdr.yaml"
    plain = {**CONFIG, "store": store.as_uri(), "priority": None}
    plain["tables"] = {"items": {**CONFIG["tables"]["items"]}}
    del plain["tables"]["items"]["order_by"]
    grouped = {**plain, "tables": {"items": {**plain["tables"]["items"]}}}
    grouped["tables"]["items"]["column_groups"] = {"stock": ["qty"], "label": ["name"]}
    for i, (day, config) in enumerate((("2026-11-21", plain), ("2026-11-22", grouped))):
        cfg.write_text(yaml.safe_dump({k: v for k, v in config.items() if v is not None}))
        gen = ["generate", "--config", str(cfg), "--date", day, "--events", "600"]
        assert main([*gen, "--seed", str(i)]) == 0
        run = ["run", "--config", str(cfg), "--date", day, "--now", f"{day}T23:59:59Z"]
        assert main([*run, "--work-dir", str(tmp_path / "work"), "--no-data-docs"]) == 0
        report = date_report(store, day)
        assert report is not None and report.status == "published"
        # clock skew: clocks that agree leave no evidence (UPDATEs that saw another replica's
        # version, as generated ones do, are stamped after it)
        assert report.tables["items"].clock_skew == {}
    state = P.state(store, "items", "2026-11-22")
    assert state and "_groups" in state[0]
    assert any(r["_groups"] for r in state)  # some rows' groups differ
