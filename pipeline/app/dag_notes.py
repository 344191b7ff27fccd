"""What the DAG says of a run besides its tasks: the ``extra`` of its asset events
(:func:`asset_extras`) and the notes an operator follows night after night
(:func:`operator_notes`, one log line of them: :func:`notes_line`, :func:`run_notes`).
The DAG (``dags/replica_cdr.py``) takes them from the public face.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline.core import layout
from pipeline.core.columns import DT, RUN_ID
from pipeline.core.config import Config
from pipeline.core.report import RunReport
from pipeline.core.summary import TableSummary
from pipeline.resolve.skew import skew_warnings
from pipeline.resolve.stage import load_summary
from pipeline.storage.context import RunContext
from pipeline.storage.lake import Lake
from pipeline.storage.runs_table import version_of
from pipeline.storage.store import open_store
from pipeline.validate.alerts import describe, fired
from pipeline.validate.stage import load_verdict


def asset_extras(config: Config, ctx: RunContext) -> dict[str, dict[str, Any]]:
    """What a published run says of each table it committed, for the DAG's asset events
    (their ``extra``): the run, its date and status, the ``runs`` version that holds its
    row, the snapshot's version and the table's counts. Empty for a run that did not
    publish; a subset run names only its tables (and their foreign keys' parents)."""
    config = ctx.config(config)
    assert config.store
    store = open_store(config.store)
    report = RunReport.from_json(store.read_bytes(layout.run_report(ctx.dt, ctx.run_id)))
    if not report.published:
        return {}
    return table_extras(config, report, version_of(Lake(store), ctx.run_id))


#: the counts of an asset event's ``extra``, each a field of ``TableTotals``, in this order
ASSET_COUNTS = (
    *("rows", "events", "applied", "discarded", "duplicates", "quarantined", "conflicts"),
    "divergent_keys",
)


def table_extras(
    config: Config, report: RunReport, runs_version: int | None
) -> dict[str, dict[str, Any]]:
    """:func:`asset_extras` of a published run's report, its ``runs`` row at
    ``runs_version``; the counts are each table's ``TableSummary.totals``."""
    notes = operator_notes(config, report.tables, report.alerts)
    versions = report.versions or {}
    return {
        table: {
            RUN_ID: report.run_id,
            DT: report.dt,
            "status": str(report.status),
            "runs_version": runs_version,
            "snapshot_version": versions.get(layout.table_path(table, layout.SNAPSHOT)),
            **{k: getattr(totals, k) for k in ASSET_COUNTS},
            **notes[table],
        }
        for table, totals in ((t, s.totals()) for t, s in report.tables.items())
    }


def operator_notes(
    config: Config,
    tables: Mapping[str, TableSummary],
    alerts: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, dict[str, Any]]:
    """What an operator follows night after night, per table: the quarantined events
    still open (retry), the clock-skew warnings (clock skew) and the alert the table
    fired (``alerts``: ``RunReport.alerts``; docs/operations.md#alerts). In the asset
    events' ``extra`` and the DAG's summary and failure log lines (:func:`notes_line`)."""
    return {
        t: {
            "quarantine_open": s.quarantine_open,
            "clock_skew_warnings": skew_warnings({t: s}, config.max_clock_skew_seconds),
            "alert": dict((alerts or {})[t]) if t in (alerts or {}) else None,
        }
        for t, s in tables.items()
    }


def notes_line(notes: Mapping[str, Mapping[str, Any]]) -> str:
    """:func:`operator_notes` in one line of a log."""
    still = ", ".join(f"{t} {n['quarantine_open']}" for t, n in notes.items())
    warnings = [w for n in notes.values() for w in n["clock_skew_warnings"]]
    fired = [describe(t, n["alert"]) for t, n in notes.items() if n.get("alert")]
    return (
        f"quarantine open: {still}; clock skew: "
        + ("; ".join(warnings) or "no warning")
        + "; alerts: "
        + ("; ".join(fired) or "none")
    )


def run_notes(config: Config, ctx: RunContext) -> str:
    """:func:`notes_line` of a run that resolved (the DAG's last log line, and its
    failure's), with the alerts of its verdict when it was validated."""
    config = ctx.config(config)
    summary = load_summary(ctx)
    alerts = fired(load_verdict(ctx).suites) if ctx.results.exists() else {}
    return notes_line(operator_notes(config, summary.tables, alerts))
