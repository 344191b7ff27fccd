"""The stages of one run agree on their input without Spark (issue 14, item 4): a config
edited after ingest is refused, its digest is the same in every process, a verdict of
another resolve is refused, and one run at a time holds the store's lease. (The stage
commands through Spark: tests/spark/test_stages.py.)"""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

import pytest
import yaml

from pipeline.cli import main
from pipeline.context import RunContext
from pipeline.errors import StageError
from pipeline.summary import RunSummary
from pipeline.validation import load_verdict
from tests.helpers import published as P
from tests.helpers.fold_helpers import make_config
from tests.helpers.snapshots import SUB, D, setup


def test_a_config_edit_after_ingest_is_refused_by_the_next_stage(tmp_path: Path):
    config = make_config()
    ctx = RunContext.create(tmp_path, date(2026, 11, 21), 0, "r1", config_digest=config.digest())
    assert ctx.config(config).tables.keys() == config.tables.keys()
    from dataclasses import replace

    edited = replace(config, gc_grace_seconds=config.gc_grace_seconds + 1)
    with pytest.raises(StageError, match=r"the config changed since the run of 2026-11-21 \(r1\)"):
        ctx.config(edited)
    assert ctx.config(replace(config, schedule="@hourly"))  # the DAG's schedule is no input


def test_the_config_digest_is_the_same_in_every_process(tmp_path: Path):
    """Each stage may run in its own process (the DAG's tasks, spark-submit), each with its
    own string hash seed: the digest must not depend on a set's iteration order."""
    import os
    import subprocess
    import sys

    cfg = setup(tmp_path, "warn", SUB)
    spec = yaml.safe_load(cfg.read_text())
    spec["tables"]["t"]["columns"].update({f"c{i}": "bigint" for i in range(8)})
    spec["tables"]["t"]["not_null"] = [f"c{i}" for i in range(8)]
    spec["tables"]["t"]["delta"] = [f"c{i}" for i in range(8)]
    cfg.write_text(yaml.safe_dump(spec, sort_keys=False))
    code = f"from pipeline.config import load_config; print(load_config({str(cfg)!r}).digest())"
    digests = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": str(seed)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for seed in range(1, 6)
    }
    assert len(digests) == 1, digests


def test_a_verdict_of_another_resolve_is_refused(tmp_path: Path):
    ctx = RunContext.create(tmp_path, date(2026, 11, 21), 0, "r1")
    ctx.validation.mkdir(parents=True)
    verdict = {"run_id": "r1", "resolve_id": "a", "failures": [], "warnings": [], "suites": {}}
    ctx.results.write_text(json.dumps(verdict))
    resolved = {x: RunSummary("r1", x, "2026-11-21", 0, {}) for x in "ab"}
    assert load_verdict(ctx, resolved["a"]).passed
    with pytest.raises(StageError, match=r"are for another resolve .* run `cdr validate` again"):
        load_verdict(ctx, resolved["b"])
    ctx.results.write_text(json.dumps({**verdict, "run_id": "r0"}))
    with pytest.raises(StageError, match=r"\(run r0, resolve a\)"):
        load_verdict(ctx, resolved["a"])


def test_one_writer_per_store_and_a_run_re_enters_its_own_lease(tmp_path: Path, capsys):
    """No Spark: the lease is taken at ingest. Another run, of the same date or another,
    is refused naming the holder; the holder's retry re-enters; finish releases; a dry run
    needs no lease; ``cdr unlock`` breaks a live one only with ``--force``."""
    cfg = setup(tmp_path, "warn", SUB)
    lock = tmp_path / "store/published/_lock"
    argv = ["--config", str(cfg), "--work-dir", str(tmp_path / "work")]
    a, b = ["--date", D, "--run-id", "night-a"], ["--date", D, "--run-id", "night-b"]
    assert main(["ingest", *argv, *a]) == 0 and json.loads(lock.read_text())["run_id"] == "night-a"
    capsys.readouterr()
    for other in (b, ["--date", "2026-11-22", "--run-id", "night-c"]):
        assert main(["ingest", *argv, *other]) == 1
        assert "is being written by run night-a on" in capsys.readouterr().err
    assert main(["ingest", *argv, *a]) == 0  # an Airflow retry of the same run
    dry = ["--date", D, "--run-id", "look", "--dry-run"]
    assert main(["ingest", *argv, *dry]) == 0  # writes nothing to the store: no lease
    assert json.loads(lock.read_text())["run_id"] == "night-a"
    work = tmp_path / "work"
    assert {p.name for p in work.iterdir()} == {"run=night-a", "run=look"}  # one each
    assert main(["finish", *argv, *a]) == 0 and not lock.exists()
    # a run that stopped before publish is in the runs table, as failed
    assert [(r["run_id"], r["status"]) for r in P.runs(tmp_path / "store")] == [
        ("night-a", "failed")
    ]
    assert main(["ingest", *argv, *b]) == 0 and json.loads(lock.read_text())["run_id"] == "night-b"
    # the date's earlier real run is over (b holds the lease): its folder goes; the dry
    # run's stays until the next dry run of the date
    assert {p.name for p in work.iterdir()} == {"run=night-b", "run=look"}
    assert main(["ingest", *argv, "--date", D, "--run-id", "look-2", "--dry-run"]) == 0
    assert {p.name for p in work.iterdir()} == {"run=night-b", "run=look-2"}
    capsys.readouterr()
    assert main(["unlock", "--config", str(cfg)]) == 1 and lock.exists()  # live: kept
    assert "`cdr unlock --force` breaks it" in capsys.readouterr().err
    assert main(["unlock", "--config", str(cfg), "--force"]) == 0 and not lock.exists()
    assert "unlocked" in capsys.readouterr().out
