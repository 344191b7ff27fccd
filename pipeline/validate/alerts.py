"""docs/operations.md#alerts: the ``conflict_rate`` alert, a check of the ``alerts`` suite.

A table's rate is its conflicts per distinct event. Tonight's (the run's summary) is
compared with the rates of the published runs of the ``window`` dates before the run's
(``published/conflict_stats``: each date holds its published run only). The alert fires
when there are at least ``min_runs`` such runs, tonight has at least ``min_conflicts``
conflicts, and tonight's rate exceeds ``factor`` times their median. A run without events
has no rate: it neither counts as a run nor fires.

The comparison is the suite's SQL (``expectations/alerts.json``) on the batch
:func:`rates_batch` builds, so that GX judges it like every other check and the Data Docs
show it; :func:`fired` reads a verdict's fired alerts back for the report, the DAG's log
line and the asset events.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import date, timedelta
from typing import Any

from pipeline.core.columns import DT
from pipeline.core.config import ConflictRateAlert
from pipeline.core.summary import TableSummary
from pipeline.storage.lake import Lake
from pipeline.storage.stats import PATH

SUITE = "alerts"  # the template's name: its suites are ``alerts.<table>``
CHECK = "conflict_rate"
#: the batch of one table's suite: one row per published run of the window, and tonight's
SCHEMA = "dt string, events long, conflicts long, tonight boolean"


def past_counts(lake: Lake, dt: date, window: int) -> dict[str, list[tuple[str, int, int]]]:
    """Per table, ``(date, events, conflicts)`` of the published runs of the ``window``
    dates before ``dt``, oldest first."""

    first = dt - timedelta(days=window)
    where = (
        f"\"{DT}\" >= DATE '{first.isoformat()}' AND \"{DT}\" < DATE '{dt.isoformat()}' "
        "AND kind IN ('events', 'conflicts')"
    )
    got = lake.read(PATH, columns=["table", "kind", "count", DT], where=where)
    sums: dict[tuple[str, str], dict[str, int]] = {}
    for r in got.to_pylist() if got is not None else []:
        counts = sums.setdefault((r["table"], str(r[DT])), {})
        counts[r["kind"]] = counts.get(r["kind"], 0) + (r["count"] or 0)
    out: dict[str, list[tuple[str, int, int]]] = {}
    for (table, day), counts in sorted(sums.items()):
        out.setdefault(table, []).append((day, counts.get("events", 0), counts.get("conflicts", 0)))
    return out


def rates_batch(
    past: list[tuple[str, int, int]], dt: date, tonight: TableSummary
) -> list[tuple[str, int, int, bool]]:
    """The rows of one table's batch (:data:`SCHEMA`): its past runs, then tonight."""
    now = (dt.isoformat(), tonight.distinct_events, tonight.totals().conflicts, True)
    return [(day, events, conflicts, False) for day, events, conflicts in past] + [now]


def placeholders(alert: ConflictRateAlert | None) -> dict[str, Any]:
    """The template's ``${alert_*}`` values (without an alert, the defaults')."""
    alert = alert or ConflictRateAlert()
    return {
        "alert_window": alert.window,
        "alert_factor": alert.factor,
        "alert_min_runs": alert.min_runs,
        "alert_min_conflicts": alert.min_conflicts,
        "alert_accepted": " (accepted with --accept-alert: reported, not failed)"
        if alert.accepted
        else "",
    }


def fired(suites: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The alerts a verdict's suites (``Verdict.suites``) fired, per table: the alert's
    name, its severity (``fail`` or ``warn``) and what the check found."""
    out: dict[str, dict[str, Any]] = {}
    for name, suite in suites.items():
        if not name.startswith(f"{SUITE}."):
            continue
        for c in suite.get("checks", []):
            if c.get("check") == CHECK and not c.get("success", True):
                found = (c.get("sample") or [{}])[0]
                severity = "fail" if c.get("severity") == "critical" else "warn"
                out[name.split(".", 1)[1]] = {"alert": CHECK, "severity": severity, **found}
    return out


def describe(table: str, a: Mapping[str, Any]) -> str:
    """One fired alert in a few words, for a log line."""
    return (
        f"{table} {a['alert']} ({a['severity']}): {a.get('rate')} conflicts per event, "
        f"over {a.get('factor')}x the median {a.get('median_rate')} of {a.get('runs')} runs"
    )
