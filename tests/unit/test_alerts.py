"""docs/operations.md#alerts without a run: the ``alerts`` keys checked at load, the
suite's severity from ``on`` (and ``--accept-alert``), its batch, and the alert read back
from a verdict. The check on Spark and GX, with 30 seeded runs: tests/spark/test_alerts.py."""

from __future__ import annotations

from datetime import date

import pytest

from pipeline.app.dag_notes import notes_line, operator_notes
from pipeline.core.config import AlertSeverity
from pipeline.core.errors import ConfigError
from pipeline.core.summary import TableSummary
from pipeline.validate import alerts
from pipeline.validate.suites import load_template, render_suite
from tests.helpers.fold_helpers import make_config


def _alert(**settings):
    return make_config(alerts={"conflict_rate": settings})


def test_an_alert_takes_the_documented_defaults():
    a = _alert().conflict_rate_alert
    assert (a.window, a.factor, a.min_runs, a.min_conflicts, a.on) == (
        30,
        3.0,
        7,
        20,
        AlertSeverity.WARN,
    )
    assert make_config().conflict_rate_alert is None  # no alerts: no check


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        ({"on": "page"}, r"alerts\.conflict_rate\.on: Input should be 'warn' or 'fail'"),
        ({"factor": 0}, r"alerts\.conflict_rate\.factor: Input should be greater than 0"),
        ({"factor": "inf"}, r"alerts\.conflict_rate\.factor: "),
        (
            {"window": 0},
            r"alerts\.conflict_rate\.window: Input should be greater than or equal to 1",
        ),
        ({"min_runs": 0}, r"alerts\.conflict_rate\.min_runs: "),
        ({"min_conflicts": -1}, r"alerts\.conflict_rate\.min_conflicts: "),
        ({"median": 2}, r"alerts\.conflict_rate\.median: unknown key"),
    ],
)
def test_the_alert_keys_are_checked_at_load(settings, problem):
    with pytest.raises(ConfigError, match=problem):
        _alert(**settings)
    with pytest.raises(ConfigError, match=r"alerts\.p99: unknown key"):
        make_config(alerts={"p99": {}})


def _check(config):
    (e,) = render_suite(load_template("alerts"), config.tables["t"], config)["expectations"]
    return e


def test_the_check_follows_on_and_accept_alert():
    warn, fail = _alert(on="warn"), _alert(on="fail", factor=2.5, min_runs=3)
    assert _check(warn)["severity"] == "warning"
    e = _check(fail)
    assert e["severity"] == "critical"
    query = e["kwargs"]["unexpected_rows_query"]
    assert "p.runs >= 3" in query and "> 2.5 * p.median_rate" in query
    accepted = fail.select(accept_alert=True)
    assert _check(accepted)["severity"] == "warning"
    assert "accepted with --accept-alert" in _check(accepted)["kwargs"]["description"]


def test_the_batch_holds_the_past_runs_and_tonight():
    tonight = TableSummary(distinct_events=40, conflicts={"update_differ": {"applied": 25}})
    past = [("2026-11-19", 100, 1), ("2026-11-20", 0, 0)]
    assert alerts.rates_batch(past, date(2026, 11, 21), tonight) == [
        ("2026-11-19", 100, 1, False),
        ("2026-11-20", 0, 0, False),
        ("2026-11-21", 40, 25, True),
    ]


def _suites(severity: str, success: bool) -> dict:
    found = {"conflicts": 25, "events": 40, "rate": 0.625, "median_rate": 0.01, "runs": 30}
    check = {
        "check": "conflict_rate",
        "severity": severity,
        "success": success,
        "sample": [{**found, "factor": 3.0}],
    }
    return {"alerts.t": {"success": success, "checks": [check]}, "snapshot.t": {"checks": []}}


def test_a_fired_alert_is_read_back_from_the_verdict_and_named_in_the_log_line():
    assert alerts.fired(_suites("critical", True)) == {}
    (fired,) = alerts.fired(_suites("critical", False)).items()
    assert fired == (
        "t",
        {
            "alert": "conflict_rate",
            "severity": "fail",
            "conflicts": 25,
            "events": 40,
            "rate": 0.625,
            "median_rate": 0.01,
            "runs": 30,
            "factor": 3.0,
        },
    )
    assert alerts.fired(_suites("warning", False))["t"]["severity"] == "warn"
    config = make_config()
    notes = operator_notes(config, {"t": TableSummary()}, dict([fired]))
    assert notes["t"]["alert"]["rate"] == 0.625
    line = notes_line(notes)
    assert line.endswith(
        "alerts: t conflict_rate (fail): 0.625 conflicts per event, over 3.0x the median "
        "0.01 of 30 runs"
    )
    assert notes_line(operator_notes(config, {"t": TableSummary()})).endswith("alerts: none")


def test_the_dags_last_log_line_names_the_alert_the_verdict_fired(tmp_path):
    """``run_notes``: what the DAG logs after publish (and on a failure) reads the run's
    summary and its verdict in the work folder."""
    import json

    from pipeline.app.dag_notes import run_notes
    from pipeline.core.summary import RunSummary
    from pipeline.resolve.stage import save_summary
    from pipeline.storage.context import RunContext

    config = make_config()
    ctx = RunContext.create(tmp_path, date(2026, 11, 21), 0, "r1", config_digest=config.digest())
    save_summary(ctx, RunSummary("r1", "x", "2026-11-21", 0, {"t": TableSummary()}))
    assert run_notes(config, ctx).endswith("alerts: none")  # not validated yet
    verdict = {"run_id": "r1", "failures": [], "warnings": [], "suites": _suites("warning", False)}
    ctx.results.write_text(json.dumps(verdict))
    assert run_notes(config, ctx).endswith(
        "alerts: t conflict_rate (warn): 0.625 conflicts per event, over 3.0x the median "
        "0.01 of 30 runs"
    )


def test_on_written_bare_in_yaml_is_the_key_on(tmp_path):
    """YAML 1.1 reads a bare ``on`` as true; the docs' examples write it bare."""
    from pipeline.core.config_load import load_config
    from tests.helpers import configs

    cfg = configs.write(tmp_path / "cdr.yaml", configs.config(replicas=("A", "B")), store=tmp_path)
    text = cfg.read_text() + "alerts:\n  conflict_rate: {min_runs: 3, on: fail}\n"
    cfg.write_text(text)
    alert = load_config(cfg).conflict_rate_alert
    assert alert is not None and (alert.on, alert.min_runs) == (AlertSeverity.FAIL, 3)
