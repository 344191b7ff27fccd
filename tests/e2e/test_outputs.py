"""Of runs started at the same moment in their own processes (a backfill, two runs of the
next date) one writes, the others are refused naming it, and nothing is mixed
(docs/outputs.md#backfills; the other backfill tests: tests/spark/test_outputs.py)."""

from __future__ import annotations

from pathlib import Path

from pipeline.app.cli import main
from tests.helpers import published as P
from tests.helpers.faults import started_together, told
from tests.spark.test_outputs import _config, _exports, _run

D1, D2, D3 = "2026-11-20", "2026-11-21", "2026-11-22"


def test_runs_started_at_once_in_their_own_processes_one_writes(tmp_path: Path, spark):
    """A backfill of D1 and two runs of D3, started together as three ``cdr ingest``
    processes (the DAG's first writing stage) while D2 is the newest published date: one
    takes the store, the other two stop at once naming it. The winner goes on, the others
    run again after it: the snapshot never moves back and ends on D3, and each date's
    ledger holds one run's events."""
    cfg = _config(tmp_path, ("t",))
    store = tmp_path / "store"
    for d in (D1, D2, D3):
        _exports(tmp_path, d, ("t",))
    assert _run(cfg, tmp_path, D1) == 0 and _run(cfg, tmp_path, D2) == 0
    racers = {"backfill": D1, "next-a": D3, "next-b": D3}
    argv = ["--config", str(cfg), "--work-dir", str(tmp_path / "work")]
    ingest = ["ingest", *argv, "--no-data-docs"]
    argvs = {r: [*ingest, "--date", d, "--run-id", r] for r, d in racers.items()}
    argvs["backfill"].append("--backfill")  # D2 runs after it
    codes, errors = started_together(argvs, tmp_path)
    winners = [r for r, c in codes.items() if c == 0]
    assert len(winners) == 1, told(codes, errors)
    (winner,) = winners
    for loser in set(racers) - {winner}:
        assert codes[loser] == 1, errors[loser]
        assert f"is being written by run {winner} on" in errors[loser], errors[loser]
    for stage in ("resolve", "validate", "publish"):
        assert main([stage, *argv, "--date", racers[winner], "--run-id", winner]) == 0
    assert P.snapshot_date(store, "t") == max(D2, racers[winner])
    if winner == "backfill":  # D2 was built on the D1 it replaced: D2 runs again
        assert _run(cfg, tmp_path, D2) == 0
    for loser in sorted(set(racers) - {winner}):  # their retries, once the store is free
        later = ["--then-later"] if racers[loser] == D1 else []  # the backfill with D2 (and D3)
        assert _run(cfg, tmp_path, racers[loser], "--run-id", loser, *later) == 0
    assert P.snapshot_date(store, "t") == D3
    assert sorted(r["id"] for r in P.snapshot(store, "t")) == [20, 21, 22]
    published = {(r["run_id"], r["dt"].isoformat()) for r in P.runs(store)}
    assert {(r, d) for r, d in racers.items()} <= published
    for d in (D1, D3):  # each date's ledger: one run's events, once
        ledger = P.log(store, "t", "ledger", d)
        assert len({r["run_id"] for r in ledger}) == 1 and len(ledger) == 1, (d, ledger)
