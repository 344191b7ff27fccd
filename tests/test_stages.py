"""The stages of one run, run as separate commands (as the DAG runs them), agree on what
they publish (issue 14, item 4): a config edited between stages is refused, and so is a
verdict reached on an earlier resolve of the run (a stale verdict)."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

import pytest
import yaml
from fold_helpers import make_config
from test_snapshots import SUB, D, setup

from pipeline.cli import main
from pipeline.context import RunContext
from pipeline.errors import StageError
from pipeline.validation import load_verdict


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
    assert load_verdict(ctx, {"resolve_id": "a"}).passed
    with pytest.raises(StageError, match=r"are for another resolve .* run `cdr validate` again"):
        load_verdict(ctx, {"resolve_id": "b"})
    ctx.results.write_text(json.dumps({**verdict, "run_id": "r0"}))
    with pytest.raises(StageError, match=r"\(run r0, resolve a\)"):
        load_verdict(ctx, {"resolve_id": "a"})


def test_stage_commands_refuse_an_edited_config_and_a_stale_verdict(tmp_path: Path, spark, capsys):
    cfg = setup(tmp_path, "warn", SUB)
    store = tmp_path / "store"
    argv = ["--config", str(cfg), "--date", D, "--work-dir", str(tmp_path / "work")]
    for stage in ("ingest", "resolve", "validate"):
        assert main([stage, *argv, "--no-data-docs"] if stage == "ingest" else [stage, *argv]) == 0
    original = cfg.read_text()
    edited = yaml.safe_load(original)
    edited["tables"]["t"]["columns"]["v"] = "bigint"
    cfg.write_text(yaml.safe_dump(edited, sort_keys=False))
    assert main(["publish", *argv]) == 1
    assert "the config changed since the run of 2026-11-21" in capsys.readouterr().err
    cfg.write_text(original)
    assert main(["resolve", *argv]) == 0  # a new resolve after the validation
    assert main(["publish", *argv]) == 1
    assert "are for another resolve" in capsys.readouterr().err
    assert not (store / "published/t/_latest.json").exists()  # nothing of it published
    assert main(["validate", *argv]) == 0
    assert main(["publish", *argv]) == 0
    assert (store / "published/t/_latest.json").exists()
