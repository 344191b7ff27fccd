"""The quality gate without Spark: every suite template of ``expectations/`` renders each
placeholder, and a template with a severity GX does not have, or mixing row checks with
other expectations, is refused; the severities follow ``on_divergence`` and
``on_fk_violation``; the gate of a run's summary. (Great Expectations on Spark:
tests/spark/test_validation.py.)"""

from __future__ import annotations

import json

import pytest

from pipeline.core.config_load import parse_config
from pipeline.core.summary import CdcSection, RunSummary, Stopped, TableSummary
from pipeline.validate.stage import Verdict, gate_from_summary
from pipeline.validate.suites import (
    EXPECTATIONS_DIR,
    SUITES,
    load_template,
    render_suite,
    severities,
)
from tests.helpers import configs
from tests.helpers.fold_helpers import make_config

CONFIG = parse_config(
    configs.config(
        {
            "products": configs.products(),
            "orders": configs.orders("bigint", not_null=["qty"], unique=[["qty"]]),
        }
    )
)
ORDERS = CONFIG.tables["orders"]


def test_templates_are_valid_and_render_every_placeholder():
    names = [p.name for p in EXPECTATIONS_DIR.iterdir() if p.name.endswith(".json")]
    assert sorted(n.removesuffix(".json") for n in names) == sorted(SUITES)
    for name in SUITES:
        template = load_template(name)
        for table in CONFIG.tables.values():
            suite = render_suite(template, table)
            assert "${" not in json.dumps(suite), (name, table.name)
            assert all(e["meta"]["check"] for e in suite["expectations"])
    assert (
        render_suite(load_template("foreign_keys"), CONFIG.tables["products"])["expectations"] == []
    )


def test_a_template_with_a_severity_gx_does_not_have_is_refused(tmp_path, monkeypatch):
    import pipeline.validate.suites as suites

    bad = load_template("snapshot")
    bad["expectations"][0]["severity"] = "${on_schema_change}"
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    monkeypatch.setattr(suites, "EXPECTATIONS_DIR", tmp_path)
    with pytest.raises(
        ValueError,
        match=r"bad\.json: not_null has severity '\$\{on_schema_change\}'; "
        r"one of critical, warning, info, \$\{on_divergence\}",
    ):
        load_template("bad")


def test_a_template_mixing_row_checks_with_other_expectations_is_refused(tmp_path, monkeypatch):
    """Row checks run together in one Spark query and other expectations on the frame
    itself, so one suite holds one kind."""
    import pipeline.validate.suites as suites

    mixed = load_template("schema")
    mixed["expectations"] += load_template("snapshot")["expectations"]
    (tmp_path / "mixed.json").write_text(json.dumps(mixed))
    monkeypatch.setattr(suites, "EXPECTATIONS_DIR", tmp_path)
    with pytest.raises(ValueError, match=r"mixed\.json: a suite's expectations are all"):
        load_template("mixed")


# ---------------------------------------------------------------------- the gate


def test_severities_follow_the_config():
    """GX's severity of each rendered expectation: critical, except the convergence and
    foreign-key checks when their setting only warns."""
    warn = make_config(on_divergence="warn", on_fk_violation="warn")
    fail = make_config(on_divergence="fail")
    assert (
        severities(make_config())
        == severities(None)
        == {
            "on_divergence": "warning",  # the default: a divergence does not withhold the night
            "on_fk_violation": "critical",
            "on_alert": "warning",  # an alert's default: on: warn (tests/unit/test_alerts.py)
        }
    )
    assert severities(fail)["on_divergence"] == "critical"
    assert severities(warn) == {
        "on_divergence": "warning",
        "on_fk_violation": "warning",
        "on_alert": "warning",
    }
    assert severities(make_config(on_fk_violation="quarantine"))["on_fk_violation"] == "critical"
    for config, follows in ((fail, "critical"), (warn, "warning")):
        for name in SUITES:
            expected = follows if name in ("convergence", "foreign_keys") else "critical"
            expected = "warning" if name == "alerts" else expected
            for e in render_suite(load_template(name), ORDERS, config)["expectations"]:
                check = e["meta"]["check"]
                # a manual decision's divergence is by design (docs/rules.md#manual-decisions);
                # a share quarantined warns first (docs/operations.md#a-loud-quarantine)
                by_design = ("divergence_by_decision", "quarantine_share_warn")
                wanted = "warning" if check in by_design else expected
                assert e["severity"] == wanted, (name, check)


def test_gate_from_the_summary():
    stop = Stopped("t", '{"id":1}', "insert_exists", "e1", "r")
    tables = {"t": TableSummary(stopped=stop), "u": TableSummary()}
    cdc = CdcSection(warning="the topology change waits")
    config = make_config({"resolvers": {"insert_exists": "error"}})
    v = gate_from_summary(RunSummary("r", "x", "2026-11-21", 0, tables, cdc), config)
    assert len(v.failures) == 1 and "e1" in v.failures[0] and not v.passed
    assert "tables.t.resolvers" in v.failures[0] and "cdr run --date 2026-11-21" in v.failures[0]
    assert v.warnings == ["the topology change waits"]  # t has no foreign key
    both = v + Verdict(["f2"], ["w2"], {"s": {"success": False}})
    assert (both.failures[1:], both.warnings[1:], list(both.suites)) == (["f2"], ["w2"], ["s"])
    assert len(v.failures) == 1  # the sum is a new verdict


def test_after_an_error_no_foreign_key_is_checked():
    """docs/rules.md#fine-points: a table an error stopped is not validated, and no
    foreign-key suite runs (its orphans would be a second failure of the same error)."""
    from pipeline.validate.stage import FK_NOT_CHECKED, _suite_runs

    stop = Stopped("products", '{"product_no":1}', "multiple_unique_conflicts", "e1", "r")
    ok = {t: TableSummary() for t in CONFIG.tables}
    summary = RunSummary("r", "x", "2026-11-21", 0, ok)
    assert ("orders", "foreign_keys.orders") in {
        (t, suite["name"]) for t, _, suite in _suite_runs(CONFIG, summary)
    }
    stopped = RunSummary("r", "x", "2026-11-21", 0, {**ok, "products": TableSummary(stopped=stop)})
    runs = {(t, suite["meta"]["template"]) for t, _, suite in _suite_runs(CONFIG, stopped)}
    assert not {t for t, _ in runs} & {"products"}
    assert ("orders", "foreign_keys") not in runs and ("orders", "snapshot") in runs
    verdict = gate_from_summary(stopped, CONFIG)
    assert len(verdict.failures) == 1 and verdict.warnings == [FK_NOT_CHECKED]
