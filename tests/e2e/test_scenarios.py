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

from pipeline.core import layout
from tests.helpers import published as P
from tests.helpers import scenarios as S

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


@pytest.mark.skipif(not S.scenario_files(), reason="shared/scenarios not found")
@pytest.mark.parametrize("path", _params())
def test_scenario(path: Path, tmp_path_factory, spark):
    ran = S.scenario_run(path, tmp_path_factory)
    s, got, failed, root = ran["s"], ran["got"], ran["failed"], ran["root"]
    assert S.differences(s, got, failed) == []
    if s["expect"].get("fails"):
        assert got.get("status") == "failed"
        assert got["snapshot"] == {}  # nothing of a failed run is in the snapshot
        for t in s["config"]["tables"]:  # nor in the CDC log
            assert P.cdc_log(root / "store", t, s["date"]) == []
        (row,) = P.run_rows(root / "store", s["date"], "failed")
        logs = [p for p in row["versions"] if p != layout.RUNS]  # and the row's own commit
        assert logs and all("/_failed/" in p for p in logs), row["versions"]
    assert S.cdc_replay_problems(s, root / "store") == []


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

    got, failed = S.run_scenario(s, tmp_path, gz=True, cli=cli)
    assert S.differences(s, got, failed) == []


def test_a_losing_update_that_raises_a_max_column_is_logged_and_in_the_cdc_log(tmp_path_factory):
    """docs/rules.md#merge-functions, on the published tables of the golden scenario (its
    run is the one ``test_scenario`` compared): the conflict log's reason names the column
    the losing version raised, and the CDC log holds that change as an update of the
    column, with the event's stamp; the lower losing value changed nothing."""
    from tests.helpers.reports import date_report, log_rows

    ran = S.scenario_run(S.GOLDEN / "merge_losing_update_raises_the_max.json", tmp_path_factory)
    store, s = ran["root"] / "store", ran["s"]
    report = date_report(store, s["date"])
    rows = log_rows(store, report, "scores", "conflicts")
    reasons = {json.loads(r["key"])["id"]: r["reason"] for r in rows}
    assert reasons[1].endswith("; merge took the remote value of high_score (max)")
    assert "merge" not in reasons[2]
    log = P.cdc_log(store, "scores", s["date"])
    updates = [(r["id"], r["name"], r["high_score"]) for r in log if r["cdc$operation"] == 1]
    assert updates == [(1, None, 180)]  # only the merged column is written
    assert all(r["id"] != 2 for r in log)
