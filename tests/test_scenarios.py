"""Every acceptance scenario of shared/scenarios/ through ``cdr run`` on a ``file://``
store laid out as the scenarios' README says (base snapshot, history runs, exports with
manifests), compared with its ``expect``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import scenarios as S

from pipeline.cli import main

PENDING: dict[str, str] = {}  # scenario name prefix -> why it is expected to fail


def _params():
    out = []
    for f in S.scenario_files():
        marks = [
            pytest.mark.xfail(reason=why, strict=True)
            for prefix, why in PENDING.items()
            if f.stem.startswith(prefix)
        ]
        out.append(pytest.param(f, id=f.stem, marks=marks))
    return out


def run_scenario(s: dict, tmp: Path, gz: bool = False, cli=None) -> tuple[dict, bool]:
    store = tmp / "store"
    store.mkdir()
    S.layout_store(s, store, gz=gz)
    cfg = S.config_file(s, store, tmp / "cdr.yaml")
    runs = [*s.get("history", []), {"date": s["date"], "now": s["now"], "exports": s["exports"]}]
    failed = False
    for r in runs:
        args = [
            "run",
            "--config",
            str(cfg),
            "--date",
            r["date"],
            "--now",
            r["now"],
            "--work-dir",
            str(tmp / "work"),
        ]
        if S.missing_exports(s, r["exports"]):
            args.append("--allow-missing-exports")  # the scenario's replica exported nothing
        failed = (cli or main)(args) != 0
    return S.published(store, s), failed


@pytest.mark.skipif(not S.scenario_files(), reason="shared/scenarios not found")
@pytest.mark.parametrize("path", _params())
def test_scenario(path: Path, tmp_path: Path, spark):
    s = json.loads(path.read_text())
    got, failed = run_scenario(s, tmp_path)
    assert S.differences(s, got, failed) == []
    if s["expect"].get("fails"):
        assert got.get("status") == "failed"
        assert got["snapshot"] == {}  # nothing of a failed run is visible through _latest.json


def test_scenario_through_the_console_script_with_gzip(tmp_path: Path):
    """The installed ``cdr`` command, in its own process, on gzipped exports."""
    path = S.SCENARIOS / "pg_update_deleted_apply_or_skip.json"
    if not path.exists():
        pytest.skip("shared/scenarios not found")
    s = json.loads(path.read_text())
    cdr = Path(sys.executable).with_name("cdr")

    def cli(args):
        env = {**os.environ, "CDR_SHUFFLE_PARTITIONS": "2"}
        p = subprocess.run([str(cdr), *args], capture_output=True, text=True, env=env)
        assert "Traceback" not in p.stderr, p.stderr
        return p.returncode

    got, failed = run_scenario(s, tmp_path, gz=True, cli=cli)
    assert S.differences(s, got, failed) == []
