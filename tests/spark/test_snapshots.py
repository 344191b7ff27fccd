"""Replica snapshot exports (``exports/replica=R/table=T/snapshot/dt=D/``) compared with
the converged snapshot through ``cdr run`` (docs/rules.md#convergence): every key that differs is
reported with both versions and a repair, under ``on_divergence``."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.app.cli import main
from pipeline.core.report import RunReport
from tests.helpers import published as P
from tests.helpers.snapshots import SUB, D, setup


def run(cfg: Path, tmp: Path) -> int:
    return main(["run", "--config", str(cfg), "--date", D, "--work-dir", str(tmp / "work")])


def test_snapshot_differences_are_reported_with_repairs(tmp_path: Path, spark):
    cfg = setup(tmp_path, "warn", SUB)
    assert run(cfg, tmp_path) == 0
    store = tmp_path / "store"
    rows = P.log(store, "t", "divergence", D)
    snap = {json.loads(r["key"])["id"]: r for r in rows if r["source"] == "snapshot"}
    assert {r["replica"] for r in snap.values()} == {"sub"}
    assert set(snap) == {1, 2, 9}
    repairs = {k: json.loads(r["repair"]) for k, r in snap.items()}
    assert repairs[1]["op"] == "INSERT" and repairs[1]["after"] == {"id": 1, "v": "v1"}
    assert repairs[2]["op"] == "UPDATE" and repairs[2]["after"] == {"v": "v2"}
    assert repairs[2]["before"] == {"v": "stale"}
    assert repairs[9]["op"] == "DELETE" and repairs[9]["key"] == {"id": 9}
    assert json.loads(snap[2]["replica_row"]) == {"id": 2, "v": "stale"}
    assert json.loads(snap[2]["converged_row"]) == {"id": 2, "v": "v2"}
    assert snap[1]["replica_row"] is None and snap[9]["converged_row"] is None
    report = RunReport.from_json((store / f"published/reports/dt={D}/run_report.json").read_text())
    t = report.tables["t"]
    assert t.snapshot_divergent_keys == {"pub": 0, "sub": 3}
    assert t.divergent_keys == {}  # every perspective converges: only the snapshot differs
    assert any(
        "convergence.t/no_divergent_snapshot_export failed" in w and '"replica":"sub"' in w
        for w in report.warnings
    )


def test_a_differing_snapshot_fails_the_run_under_on_divergence_fail(tmp_path: Path, spark):
    cfg = setup(tmp_path, "fail", SUB)
    assert run(cfg, tmp_path) == 1
    assert P.snapshot_date(tmp_path / "store", "t") is None


def test_equal_snapshots_pass_under_on_divergence_fail(tmp_path: Path, spark):
    cfg = setup(tmp_path, "fail", [{"id": k, "v": f"v{k}"} for k in (3, 2, 1)])
    assert run(cfg, tmp_path) == 0
    rows = P.log(tmp_path / "store", "t", "divergence", D)
    assert rows == []


def test_a_dry_run_validates_and_publishes_nothing(tmp_path: Path, spark, capsys):
    """``--dry-run`` with ``--on-divergence warn`` over a config that says fail: the run
    passes with a warning and writes nothing to the store; a publish of it is refused.
    Without the override, the same dry run fails its gate."""
    cfg = setup(tmp_path, "fail", SUB)
    store = tmp_path / "store"
    before = sorted(p for p in store.rglob("*") if p.is_file())
    argv = ["--config", str(cfg), "--date", D, "--work-dir", str(tmp_path / "work")]
    assert main(["run", *argv, "--dry-run", "--on-divergence", "warn"]) == 0
    out = capsys.readouterr()
    assert "dry run: nothing published" in out.out and "data_docs/index.html" in out.out
    assert sorted(p for p in store.rglob("*") if p.is_file()) == before
    assert main(["publish", *argv]) == 1
    assert "is a dry run: it publishes nothing" in capsys.readouterr().err
    assert main(["run", *argv, "--dry-run"]) == 1
    assert "no_divergent_snapshot_export" in capsys.readouterr().err
    assert sorted(p for p in store.rglob("*") if p.is_file()) == before
