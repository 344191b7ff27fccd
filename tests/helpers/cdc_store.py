"""A store with a rerun, for the tests that read what a run published as a user would
(the CDC log, and every example of the README and docs/): two ``cdr run``s on generated
exports of a row table (unique constraint, delta column) and a cell table (composite
key, TTLs, nulls), with a topology change between them and late events, then a rerun of
the second date. ``tests/spark/conftest.py`` builds it once per session."""

from __future__ import annotations

import gzip
import json
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from pipeline.app.cli import main
from pipeline.app.generate import GenerateOptions, generate
from pipeline.changes.cdc import generations
from pipeline.core.config_load import parse_config
from pipeline.storage.context import to_micros
from pipeline.storage.store import open_store
from tests.helpers import configs
from tests.helpers import published as P

D1, D2 = date(2026, 11, 20), date(2026, 11, 21)
CONFIG = configs.config(
    {
        "accounts": configs.table(
            {"id": "bigint", "owner": "string", "balance": "bigint", "note": "string"},
            unique=[["owner"]],
            delta=["balance"],
        ),
        "sessions": configs.table(
            {"user_id": "bigint", "device": "string", "token": "string", "hits": "int"},
            ["user_id", "device"],
            policy="scylla",
        ),
    },
    replicas=("r1", "r2", "r3"),
    on_divergence="warn",
    cdc={"enabled": True, "vnodes": 8, "shards": 2, "sharding_ignore_msb": 0},
)
TOPOLOGY_2 = {"vnodes": 12, "shards": 3, "sharding_ignore_msb": 12}


def start_of(d: date) -> int:
    return to_micros(datetime(d.year, d.month, d.day, tzinfo=UTC))


def write_config(path: Path, store: Path, cdc: dict[str, Any]) -> Path:
    return configs.write(path, CONFIG, store=store, cdc={**CONFIG["cdc"], **cdc})


def run(cfg: Path, d: date, work: Path) -> None:
    assert (
        main(
            [
                "run",
                "--config",
                str(cfg),
                "--date",
                d.isoformat(),
                "--work-dir",
                str(work),
                "--no-data-docs",
            ]
        )
        == 0
    )


def snapshot_of(root: Path, table: str, d: date) -> list[dict[str, Any]]:
    """The snapshot as the run of ``d`` published it (the version its runs row names)."""
    (run,) = P.run_rows(root, d)
    return P.as_of(root, f"published/{table}/snapshot", run)


def jsonl_rows(folder: Path) -> list[dict[str, Any]]:
    """The rows of a base snapshot (``cdr generate`` writes JSON lines), typed as the
    snapshot reads them."""
    return [
        json.loads(line) for f in sorted(folder.glob("*.jsonl*")) for line in gzip.open(f, "rt")
    ]


def keyed(rows: list[dict[str, Any]], key: list[str], columns: list[str]) -> dict:
    return {tuple(r[k] for k in key): {c: r[c] for c in columns} for r in rows}


def build(tmp: Path) -> dict[str, Any]:
    """The store under ``tmp``, and what the tests compare against, read as the runs
    went."""
    root = tmp / "store"
    root.mkdir()
    cfg1 = write_config(tmp / "day1.yaml", root, {})
    cfg2 = write_config(
        tmp / "day2.yaml", root, {**TOPOLOGY_2, "preimage": True, "postimage": True}
    )
    config = parse_config({**CONFIG, "store": root.as_uri()})
    store = open_store(root.as_uri())
    generate(config, store, D1, GenerateOptions(events=900, base_rows=40, late_rate=0.0, seed=3))
    generate(config, store, D2, GenerateOptions(events=900, late_rate=0.25, seed=4))
    run(cfg1, D1, tmp / "work")
    day1_logs = {t: P.cdc_log(root, t, D1) for t in CONFIG["tables"]}
    run(cfg2, D2, tmp / "work")
    logs = {t: P.cdc_log(root, t, D2) for t in CONFIG["tables"]}
    gens = generations(P.rows(root, "published/cdc/cdc_generation_descriptions"))
    report = json.loads((root / f"published/reports/dt={D2}/run_report.json").read_text())
    snapshots = {t: {d: snapshot_of(root, t, d) for d in (D1, D2)} for t in CONFIG["tables"]}
    run(cfg2, D2, tmp / "rerun")  # the same date again: new run= folders
    return {
        "root": root,
        "day1": day1_logs,
        "day2": logs,
        "rerun": {t: P.cdc_log(root, t, D2) for t in CONFIG["tables"]},
        "gens": gens,
        "gens_after_rerun": generations(P.rows(root, "published/cdc/cdc_generation_descriptions")),
        "report": report,
        "snapshots": snapshots,
        "base": {t: jsonl_rows(root / f"base/table={t}") for t in CONFIG["tables"]},
    }
