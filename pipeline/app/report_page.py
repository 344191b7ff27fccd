"""``cdr report`` (docs/operations.md#cdr-report): a store's published run of one date as
the Conflicts page and as a short Markdown summary.

The page is rendered here for everyone: the Airflow plugin serves it, ``cdr demo`` and
``cdr report --html`` write it (:func:`conflicts_page`; its HTML is
``pipeline.app.runs.render_page``: inline styles and SVG, no script, nothing fetched).
The summary (``pipeline.app.report_markdown``) is what ``cdr report`` prints and the
DAG's publish task logs (:func:`run_summary`).

What it reads, all on the driver and without a JVM (delta-rs and the store's client):
the ``runs`` table, the run's report (one object) and, per table with conflicts, the
distinct keys of its conflict log's partition of the date (one ``COUNT(DISTINCT key)``
query each). The page reads besides every date's chosen report (one object per date:
the links to the other runs), the conflict statistics (the trends) and the decisions.
"""

from __future__ import annotations

import logging
from datetime import date
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, QueryBuilder

from pipeline.app.report_markdown import ALL_TYPES, Summarised, summary_markdown
from pipeline.app.runs import DecideForm, list_decisions, list_reports, render_page
from pipeline.core import layout
from pipeline.core.columns import DT, KEY
from pipeline.core.errors import StageError, StoreError
from pipeline.core.report import RunReport
from pipeline.storage.lake import Lake
from pipeline.storage.runs_table import RunRow, published_by_date, read_runs
from pipeline.storage.stats import trends
from pipeline.storage.store import Store, open_store

log = logging.getLogger(__name__)

#: the conflict log's column of the conflict's type
CONFLICT_TYPE = "conflict_type"
#: the dates a "no published run" message names, the latest ones
DATES_NAMED = 10
#: the logs of a table the summary links to, after its snapshot
LINKED_LOGS = ("conflicts", "quarantine", "divergence")
#: where the page links a run's Data Docs, under the store (``{dt}``, ``{run_id}``)
DOCS_KEY = (
    layout.validation_dir(date(1970, 1, 1), "RUN")
    .replace("1970-01-01", "{dt}")
    .replace("RUN", "{run_id}")
    + "/data_docs/index.html"
)


def published_report(store: Store, dt: date) -> RunReport:
    """The report of the run the ``runs`` table records as published for ``dt`` (a store
    of the earlier layout, without a ``runs`` row for it: the date's report copy, when it
    says published); :class:`StageError` naming the dates that have one if none."""
    rows = read_runs(Lake(store))
    row = published_by_date(rows).get(dt)
    if row is not None:
        key = layout.run_report(dt, row.run_id)
        if not store.exists(key):
            raise StoreError(
                f"the runs table records run {row.run_id} as published for {dt.isoformat()}, "
                f"but its report {store.uri}/{key} is missing: cdr run --date {dt.isoformat()} "
                "publishes the date again"
            )
        return _read(store, key)
    key = layout.date_report(dt)  # a store of the earlier layout: no runs row for the date
    if not any(r.dt == dt for r in rows) and store.exists(key):
        report = _read(store, key)
        if report.published:
            return report
    raise StageError(_none_published(store, dt, rows))


def _read(store: Store, key: str) -> RunReport:
    try:
        return RunReport.from_json(store.read_bytes(key))
    except ValueError as e:  # not JSON, or MalformedReport
        raise StoreError(f"{store.uri}/{key} is not a run report: {e}") from None


def _none_published(store: Store, dt: date, rows: list[RunRow]) -> str:
    dates = sorted(
        {d.isoformat() for d in published_by_date(rows)}
        | {r.dt for r in list_reports(store) if r.published}
    )
    if not dates:
        return f"{store.uri} has no published run yet: cdr run --date D publishes one"
    named = ", ".join(dates[-DATES_NAMED:])
    more = f" (the latest {DATES_NAMED} of {len(dates)})" if len(dates) > DATES_NAMED else ""
    return (
        f"{store.uri} has no published run of {dt.isoformat()}; the dates with one{more}: "
        f"{named} (cdr run --date {dt.isoformat()} publishes one)"
    )


def conflict_keys(lake: Lake, report: RunReport) -> dict[str, dict[str, int]]:
    """Per table with conflicts, its conflict log's distinct keys of the report's date: by
    conflict type, and of every type (:data:`ALL_TYPES`). A table whose log cannot be read
    is left out (the summary then says no key count)."""
    out: dict[str, dict[str, int]] = {}
    where = f"\"{DT}\" = DATE '{report.dt}'"
    for table, s in report.tables.items():
        if not s.totals().conflicts:
            continue
        t = lake.table(layout.table_path(table, "conflicts"))
        if t is None:
            continue
        by_type = _query(
            t,
            f'SELECT "{CONFLICT_TYPE}" AS c, COUNT(DISTINCT "{KEY}") AS n FROM t '
            f'WHERE {where} GROUP BY "{CONFLICT_TYPE}"',
        )
        every = _query(
            t, f"SELECT '{ALL_TYPES}' AS c, COUNT(DISTINCT \"{KEY}\") AS n FROM t WHERE {where}"
        )
        out[table] = {r["c"]: int(r["n"]) for r in [*by_type, *every]}
    return out


def _query(t: DeltaTable, sql: str) -> list[dict[str, Any]]:
    """One SQL query over a Delta table (its latest version), through delta-rs."""
    try:
        batches = QueryBuilder().register("t", t).execute(sql)
    except OSError as e:
        raise StoreError(f"cannot read the conflict log ({e})") from None
    return pa.table(batches.read_all()).to_pylist()


def summary_links(store: Store, report: RunReport) -> tuple[tuple[str, str], ...]:
    """Where to look: the run's report and Data Docs, each table's snapshot and logs."""
    dt = date.fromisoformat(report.dt)
    out = [("the run report", f"{store.uri}/{layout.run_report(dt, report.run_id)}")]
    if report.validation.data_docs:
        out.append(("the Data Docs", f"{store.uri}/{report.validation.data_docs}"))
    for table in sorted(report.tables):
        for kind in (layout.SNAPSHOT, *LINKED_LOGS):
            out.append((f"{table} {kind}", f"{store.uri}/{layout.table_path(table, kind)}"))
    return tuple(out)


def run_summary(store: Store, report: RunReport) -> str:
    """The Markdown summary of a run's report, with its conflicting keys and links."""
    keys = conflict_keys(Lake(store), report)
    return summary_markdown(report, Summarised(keys, summary_links(store, report)))


def report_summary(uri: str, dt: date, run_id: str | None = None) -> str:
    """The Markdown summary of the run ``run_id`` of ``dt`` (default: the run published
    for ``dt``) in the store at ``uri``: what the DAG's publish task logs."""
    store = open_store(uri)
    if run_id is None:
        return run_summary(store, published_report(store, dt))
    return run_summary(store, _read(store, layout.run_report(dt, run_id)))


def conflicts_page(
    store: Store,
    dt: str | None,
    docs_href: str,
    form: DecideForm | None = None,
    run_href: str | None = "?dt={dt}",
) -> str:
    """The Conflicts page of a store's run of ``dt`` (default: the newest), as the plugin
    serves it: ``docs_href`` and ``run_href`` as ``render_page`` takes them. The trends
    and the decisions, when their tables cannot be read, are left out and the page shown."""
    reports = list_reports(store)
    lake = Lake(store)
    try:
        last = trends(lake)
    except StoreError as e:  # the page still shows the runs
        log.warning("conflicts page: cannot read the conflict statistics: %s", e)
        last = {}
    try:
        decided = list_decisions(lake, reports)
    except StoreError as e:
        log.warning("conflicts page: cannot read the decisions: %s", e)
        decided = []
    return render_page(reports, dt, docs_href, last, decided, form, run_href)
