"""``cdr demo``: the whole product on one machine, with nothing to set up.

Starts an S3-compatible server on loopback, generates two days of exports for three
replicas and the tables ``products``, ``orders`` and ``accounts``, runs the pipeline for
both days (the second starts from the first one's state), prints what happened and where
the outputs are, and copies the store to ``<dir>/store`` for a look after the server stops.
"""

from __future__ import annotations

import logging
import time
from copy import deepcopy
from dataclasses import replace
from datetime import date
from pathlib import Path
from typing import Any

import yaml

from pipeline.app.generate import GenerateOptions, generate
from pipeline.app.report_page import DOCS_KEY, conflicts_page
from pipeline.app.report_text import format_report
from pipeline.core import layout
from pipeline.core.config import Config
from pipeline.core.config_load import load_config
from pipeline.core.errors import GateError
from pipeline.core.instants import instant_micros
from pipeline.core.report import RunReport
from pipeline.stages import RunOptions, run
from pipeline.storage.lake import Lake
from pipeline.storage.s3server import create_bucket, restore_env, s3_server, use_endpoint
from pipeline.storage.store import FileStore, open_store

log = logging.getLogger(__name__)

BUCKET = "cdr-demo"
DATES = (date(2026, 11, 20), date(2026, 11, 21))

DEMO_CONFIG = {
    "store": f"s3://{BUCKET}/prod",
    "replicas": [
        {"id": "us-east", "system_id": 7301},
        {"id": "eu-west", "system_id": 7302},
        {"id": "ap-south", "system_id": 7303},
    ],
    "defaults": {"policy": "postgres"},
    "max_clock_skew_seconds": 300,
    "gc_grace_seconds": 864000,
    "on_divergence": "warn",
    "on_fk_violation": "warn",
    "tables": {
        "products": {
            "key": ["product_no"],
            "columns": {"product_no": "int", "name": "string", "price": "decimal(10,2)"},
        },
        "orders": {
            "key": ["order_id"],
            "columns": {"order_id": "bigint", "product_no": "int", "quantity": "int"},
            "not_null": ["product_no"],
            "foreign_keys": [{"columns": ["product_no"], "references": "products"}],
        },
        "accounts": {
            "key": ["id"],
            "columns": {"id": "bigint", "owner": "string", "balance": "bigint"},
            "unique": [["owner"]],
            "delta": ["balance"],
            "resolvers": {"update_deleted": "latest_timestamp_wins"},
            "defaults": {"owner": "unknown"},
        },
    },
    "cdc": {"enabled": True, "vnodes": 16, "shards": 4, "preimage": True, "postimage": True},
}


def _mirror(src_uri: str, dest: Path) -> None:
    src = open_store(src_uri)
    out = FileStore(dest)
    for key in src.list("published") + src.list("exports") + src.list("base"):
        out.write_bytes(key, src.read_bytes(key))


#: what the demo's exports look like: a production night, mostly updates of recent rows
#: (each with its whole row, as PostgreSQL's logical replication sends it),
#: about 2% of the keys written by several replicas, one replica's clock 20 s behind
WORKLOAD = GenerateOptions(
    update_share=0.9,
    full_rows=True,
    skew=0.8,
    conflict_rate=0.02,
    delete_rate=0.02,
    late_rate=0.01,
    clock_offsets={"ap-south": -20},
)
#: how many resolved conflicts the demo shows, each of another type
EXAMPLES = 3


def demo_config() -> dict[str, Any]:
    """The demo's config: :data:`DEMO_CONFIG` with the resolvers under which every
    replica's order converges on the demo's workload. PostgreSQL's default for an UPDATE
    of a deleted row, ``update_deleted: skip``, does not: in the canonical order a later
    UPDATE that meets the deletion is skipped, while the replica that applied the UPDATE
    first keeps its row (the older DELETE loses to it). And a product deleted while orders
    still name it leaves orphans, which the demo quarantines (offered again, ``retry``)
    instead of publishing them."""
    config = deepcopy(DEMO_CONFIG)
    tables: dict[str, dict[str, Any]] = config["tables"]  # type: ignore[assignment]
    for table in tables.values():
        table.setdefault("resolvers", {})["update_deleted"] = "latest_timestamp_wins"
    config["on_fk_violation"] = "quarantine"
    config["retry"] = {"fk_violation": 3}
    return config


def demo(workdir: Path, events: int = 30_000, seed: int = 7, serve: bool = False) -> int:
    workdir.mkdir(parents=True, exist_ok=True)
    cfg_path = workdir / "cdr.yaml"
    cfg_path.write_text(yaml.safe_dump(demo_config(), sort_keys=False))
    config = load_config(cfg_path)
    assert config.store
    with s3_server() as endpoint:
        previous = use_endpoint(endpoint)
        try:
            print(f"S3-compatible server (moto) on {endpoint}, bucket s3://{BUCKET}")
            create_bucket(BUCKET)
            reports = _nights(config, workdir, events, seed)
            copy = workdir / "store"
            _mirror(config.store, copy)
            if len(reports) == len(DATES):
                print(_resolved(Lake(FileStore(copy)), config, DATES[-1]))
                print("\n" + format_report(reports[-1]))
            page = _conflicts_page(copy)
            print(_where(config.store, copy, cfg_path, reports, page))
            if serve:
                print(f"\nserving {endpoint} (AWS_ENDPOINT_URL_S3={endpoint}); Ctrl-C to stop")
                _wait_forever()
            return 0 if len(reports) == len(DATES) else 1
        finally:
            restore_env(previous)


def _nights(config: Config, workdir: Path, events: int, seed: int) -> list[RunReport]:
    """Each night generated and run, with one line about it; the reports of the nights
    that published (a night that fails its gate ends the demo)."""
    store = open_store(config.store or "")
    reports = []
    for i, dt in enumerate(DATES):
        base = events // 20 if i == 0 else None
        opts = replace(WORKLOAD, events=events, seed=seed + i, base_rows=base)
        stats = generate(config, store, dt, opts)
        try:
            report = run(config, dt, RunOptions(work_dir=workdir / "work"))
        except GateError as e:
            print(f"run for {dt} failed its gate: {e}")
            break
        print(
            f"night {dt}: {stats['records']} event records from {len(config.replicas)} replicas; "
            + _verdict(report)
        )
        for suite in _failed(report):
            print(f"  {suite}: {_advice(suite)}")
        reports.append(report)
    return reports


#: why a suite can warn on the demo's workload, and what to do, in one line each
ADVICE = {
    "convergence": (
        "some keys end otherwise in a replica's own order (a delta column under concurrent"
        " inserts and deletes does); the keys and their repairs are in"
        " published/<table>/divergence (docs/rules.md#convergence)"
    ),
    "foreign_keys": (
        "rows whose parent is gone after resolution: on_fk_violation: quarantine sets them"
        " aside until the parent is back (docs/rules.md#foreign-keys)"
    ),
}


def _failed(report: RunReport) -> list[str]:
    return sorted(name for name, ok in report.validation.suites.items() if not ok)


def _advice(suite: str) -> str:
    return ADVICE.get(suite.split(".")[0], "see the run's Data Docs for the failed checks")


def _verdict(report: RunReport) -> str:
    conflicts = sum(s.totals().conflicts for s in report.tables.values())
    suites = report.validation.suites
    failed = _failed(report)
    checked = (
        f"{len(suites)} suites passed"
        if not failed
        else f"{len(suites) - len(failed)} of {len(suites)} suites passed, warnings: "
        + ", ".join(failed)
    )
    totals = [s.totals() for s in report.tables.values()]
    lost, concurrent = sum(t.lost_writes for t in totals), sum(t.concurrent for t in totals)
    return (
        f"{lost} writes lost in {concurrent} concurrent conflicts "
        f"({conflicts} conflicts resolved by the origin rule), {checked}"
    )


def _resolved(lake: Lake, config: Config, dt: date) -> str:
    """A few of the night's conflicts, each of another type: the key, both versions with
    their origin and time, the rule that decided and why."""
    lines = [f"\nWhat was resolved on {dt}, and why (a few of the night's conflicts):"]
    seen: set[str] = set()
    for table in config.tables:
        got = lake.read(f"{layout.PUBLISHED}/{table}/conflicts", dt=dt)
        rows = [] if got is None else got.to_pylist()  # the writes lost first
        for row in sorted(rows, key=lambda r: r.get("concurrency") != "concurrent"):
            if row["conflict_type"] in seen or len(seen) == EXAMPLES:
                continue
            seen.add(row["conflict_type"])
            lines += [
                f"\n  {table} {row['key']}: {row['conflict_type']}, "
                f"{row['resolver']} -> {row['outcome']}",
                f"    here   {_version(row['local_origin'], row['local_ts'], row['local_row'])}",
                f"    remote {_version(row['remote_origin'], row['remote_ts'], row['remote_row'])}",
                f"    why    {row['reason']}",
                f"    seen   {_seen(row)}",
            ]
    return "\n".join(lines)


def _seen(row: dict[str, Any]) -> str:
    """docs/rules.md#lost-writes: whether the writers had seen each other's write."""
    label = row.get("concurrency") or "unknown"
    if label == "concurrent":
        return f"concurrent: neither writer had seen the other's; {row['lost_event_id']} lost"
    why = row.get("concurrency_why")
    return f"{label}{f' ({why})' if why else ''}"


def _version(origin: str | None, ts: int | None, row: str | None) -> str:
    when = instant_micros(ts) if ts is not None else "-"
    return f"{origin or 'base'} at {when}: {row if row is not None else '(no row)'}"


def _conflicts_page(copy: Path) -> Path:
    """The Conflicts page the Airflow plugin serves, written beside the store's copy (its
    Data Docs links lead into the copy)."""
    page = copy / "conflicts.html"
    page.write_text(conflicts_page(FileStore(copy), None, DOCS_KEY, run_href=None))
    return page


def _where(
    uri: str | None, copy: Path, cfg_path: Path, reports: list[RunReport], page: Path
) -> str:
    snapshot = f"{copy}/published/orders/snapshot"
    conflicts = f"{copy}/published/orders/conflicts"
    lines = [
        f"\nWhere to look (the store {uri}, copied to {copy}):",
        "  the snapshot and the conflict log, with DuckDB (LOAD delta; offline, its Python "
        "package: docs/outputs.md#reading-the-tables):",
        f"    SELECT * FROM delta_scan('{snapshot}') LIMIT 5;",
        f"    SELECT conflict_type, outcome, count(*) FROM delta_scan('{conflicts}') GROUP BY ALL;",
    ]
    if reports:
        last = reports[-1]
        docs = layout.validation_dir(date.fromisoformat(last.dt), last.run_id)
        lines.append(f"  the Data Docs: {copy}/{docs}/data_docs/index.html")
    lines += [
        f"  the run report: {copy}/{layout.date_report(DATES[-1])}",
        f"  the CDC log: {copy}/published/cdc/<table>/log/",
        f"  the Conflicts page: {page} (served by the Airflow plugin: docs/airflow.md)",
        f"  a summary to paste: cdr report --config {cfg_path} --store {copy.as_uri()} "
        f"--date {DATES[-1]}",
        f"  the config it used: {cfg_path}",
    ]
    return "\n".join(lines)


def _wait_forever() -> None:

    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
