"""Where a test finds a run's report and logs: the date's published run, or, for a date no
run published, its latest failed run (whose logs are under ``_failed/run=<id>/``)."""

from __future__ import annotations

from datetime import date
from pathlib import Path

from pipeline.app.runs import list_reports
from pipeline.core import layout
from pipeline.core.report import RunReport
from pipeline.storage.store import FileStore, Store


def _store(where: Path | Store) -> Store:
    return FileStore(where) if isinstance(where, Path) else where


def date_report(where: Path | Store, d: date | str) -> RunReport | None:
    """The report a reader sees for ``d`` (``pipeline.app.runs.list_reports``)."""
    return next((r for r in list_reports(_store(where)) if r.dt == str(d)), None)


def log_rows(where: Path | Store, report: RunReport, table: str, kind: str) -> list:
    """The rows of a log (``conflicts``, ``quarantine``, ...) of the run of ``report``: the
    date's partition of the published table, or the failed run's own table."""
    from tests.helpers import published as P

    if report.published:
        return P.rows(where, layout.table_path(table, kind), report.dt)
    return P.rows(where, layout.failed_output(report.run_id, table, kind))
