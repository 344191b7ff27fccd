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

from pipeline.core.errors import StageError
from pipeline.core.summary import RunSummary
from pipeline.storage.context import RunContext
from pipeline.validate.stage import load_verdict
from tests.helpers.fold_helpers import make_config
from tests.helpers.snapshots import SUB, setup


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
    code = f"from pipeline import load_config; print(load_config({str(cfg)!r}).digest())"
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
