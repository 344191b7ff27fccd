"""``cdr run`` in its own process, as Airflow's log sees it (stderr not a terminal): one
progress line per step of each stage on stderr, the report alone on stdout, and nothing
of progress with ``--quiet`` (docs/operations.md#progress)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import configs

ROOT = Path(__file__).resolve().parents[2]
D1, D2 = "2026-11-20", "2026-11-21"


def _cdr(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "pipeline.app.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=600,
    )


def test_a_run_says_its_steps_on_stderr_and_quiet_says_none(tmp_path):
    cfg = configs.write(tmp_path / "cdr.yaml", configs.config(store=tmp_path / "store"))
    for d in (D1, D2):
        p = _cdr("generate", "--config", str(cfg), "--date", d, "--events", "40")
        assert p.returncode == 0, p.stderr
    run = ["--config", str(cfg), "--work-dir", str(tmp_path / "work"), "--no-data-docs"]

    p = _cdr("run", "--date", D1, *run)
    assert p.returncode == 0, p.stderr[-3000:]
    said = [x.split(" ", 1)[1] for x in p.stderr.splitlines() if " " in x]
    for line in (
        "ingest: t 1/1 tables, ",
        "ingest: done in ",
        "resolve: fetching the exports' files, ",
        "resolve: t 1/1 tables, ",
        "resolve: measuring for validation, ",
        "resolve: done in ",
        "validate: judging the suites (Great Expectations), ",
        "validate: done in ",
        "publish: committing the snapshots (1 table), ",
        "publish: done in ",
    ):
        assert [x for x in said if x.startswith(line)], (line, p.stderr[-3000:])
    assert "Spark: " not in p.stderr  # no ticks off a terminal
    assert "ingest:" not in p.stdout and "published to" in p.stdout

    q = _cdr("--quiet", "run", "--date", D2, *run)
    assert q.returncode == 0, q.stderr[-3000:]
    assert "ingest:" not in q.stderr and "resolve:" not in q.stderr, q.stderr[-3000:]
    assert "done in" not in q.stderr
    assert "published to" in q.stdout
