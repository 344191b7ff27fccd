"""The quality gate: each check of the snapshot suite fails on a crafted bad output and
passes on a good one; the policy gates name the table and the reason."""

from __future__ import annotations

import pytest
from fold_helpers import make_config

from pipeline.validation import Verdict, gate_from_summary, load_template, render_suite, run_suite


@pytest.fixture(scope="module")
def suite():
    cfg = make_config({"unique": [["v"]], "not_null": ["n"]})
    return render_suite(load_template("snapshot"), cfg.tables["t"])


def test_the_suite_is_rendered_for_the_table(suite):
    checks = [e["meta"]["check"] for e in suite["expectations"]]
    assert checks.count("not_null") == 2  # id (key) and n
    assert "key_unique" in checks and "unique_constraint" in checks
    assert all("${" not in str(e) for e in suite["expectations"])


def run(spark, rows, suite):
    df = spark.createDataFrame(rows, "id int, v string, n int, _ts bigint, _origin string")
    out: dict[str, bool] = {}
    for c in run_suite(df, suite)["checks"]:
        out[c["check"]] = out.get(c["check"], True) and c["success"]
    return out


def test_a_good_snapshot_passes(spark, suite):
    assert all(run(spark, [(1, "a", 1, 0, None), (2, "b", 2, 0, None)], suite).values())


@pytest.mark.parametrize(
    ("rows", "check"),
    [
        ([(1, "a", 1, 0, None), (1, "b", 2, 0, None)], "key_unique"),
        ([(None, "a", 1, 0, None)], "not_null"),
        ([(1, "a", None, 0, None)], "not_null"),
        ([(1, "a", 1, 0, None), (2, "a", 2, 0, None)], "unique_constraint"),
    ],
)
def test_each_check_fails_on_a_bad_snapshot(spark, suite, rows, check):
    assert run(spark, rows, suite)[check] is False


def _summary(**table):
    base = {"stopped": None, "divergent_keys": {}, "orphans": 0}
    return {"dt": "2026-11-21", "tables": {"t": {**base, **table}}}


def test_gates_follow_the_config():
    v = Verdict()
    gate_from_summary(make_config(), _summary(divergent_keys={"sub": 2}), v)
    assert v.failures and "replica sub diverges" in v.failures[0]
    v = Verdict()
    gate_from_summary(make_config(on_divergence="warn"), _summary(divergent_keys={"sub": 2}), v)
    assert v.passed and v.warnings
    v = Verdict()
    gate_from_summary(make_config(), _summary(orphans=3), v)
    assert "3 orphan row(s)" in v.failures[0]
    v = Verdict()
    gate_from_summary(make_config(on_fk_violation="quarantine"), _summary(orphans=3), v)
    assert v.passed
    v = Verdict()
    stop = {"conflict_type": "insert_exists", "key": '{"id":1}', "event_id": "e1", "reason": "r"}
    gate_from_summary(make_config(), _summary(stopped=stop, divergent_keys={"sub": 1}), v)
    assert len(v.failures) == 1 and "e1" in v.failures[0]
