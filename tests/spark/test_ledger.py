"""Each event once (docs/outputs.md#each-event-once): an event that a published run resolved
is in its table's ledger, and a run within ``gc_grace_seconds`` after it that finds the
event exported again (Debezium's at-least-once delivery) counts it as a duplicate instead
of applying its delta a second time; a replica that exports one event twice in a night
(overlapping export files) has it resolved once, the second record a duplicate. Through
``cdr run`` on a file store."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.app.cli import main
from tests.helpers import published as P
from tests.unit.test_ledger import _setup

D1, D2 = "2026-11-21", "2026-11-22"


def _run(cfg: Path, tmp: Path, d: str, run_id: str, *more: str) -> int:
    argv = ["--config", str(cfg), "--date", d, "--work-dir", str(tmp / "work")]
    return main(["run", *argv, "--run-id", run_id, "--no-data-docs", *more])


def _balance(store: Path) -> int:
    (row,) = P.snapshot(store, "accounts")
    return row["balance"]


def _report(store: Path, d: str) -> dict:
    return json.loads((store / f"published/reports/dt={d}/run_report.json").read_text())["tables"][
        "accounts"
    ]


def test_an_event_exported_again_the_next_night_is_resolved_once(tmp_path: Path, spark):
    cfg = _setup(tmp_path)
    store = tmp_path / "store"
    assert _run(cfg, tmp_path, D1, "n1") == 0
    ledger = P.log(store, "accounts", "ledger", D1)
    assert sorted((r["event_id"], r["fate"], r["run_id"]) for r in ledger) == [
        ("A-1", "applied", "n1"),
        ("A-2", "applied", "n1"),
    ]
    assert _run(cfg, tmp_path, D2, "n2") == 0
    assert _balance(store) == 115  # 100 + 10 + 5: each credit counted once
    t = _report(store, D2)
    assert t["duplicates"] == 2 and t["applied"] == 1 and t["distinct_events"] == 2
    assert t["replicas"]["A"] == {"records": 3, "framing": 0, "duplicate": 2, "applied": 1}
    conflicts = P.log(store, "accounts", "conflicts", D2)
    assert "A-2" not in {c["remote_event_id"] for c in conflicts}
    ledger2 = P.log(store, "accounts", "ledger", D2)
    assert [r["event_id"] for r in ledger2] == ["A-3"]  # a duplicate is not final again

    # a rerun of the first night (the first date of a backfill) resolves its events
    # again (its own partition is not read) and replaces that partition
    assert _run(cfg, tmp_path, D1, "n1-again", "--backfill") == 0
    assert _report(store, D1)["duplicates"] == 0
    rows = P.log(store, "accounts", "ledger", D1)
    assert sorted((r["event_id"], r["run_id"]) for r in rows) == [
        ("A-1", "n1-again"),
        ("A-2", "n1-again"),
    ]
