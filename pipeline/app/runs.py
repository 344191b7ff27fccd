"""What the published runs say, for people: per run and table, the conflicts by
type and outcome, quarantined events, divergent keys and orphans, as rows and as a page
(the Airflow plugin's view, ``plugins/cdr_plugin.py``). Pure: a store in, data or HTML out.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from pipeline.core import layout
from pipeline.core.columns import DT, RUN_ID
from pipeline.core.report import RunReport, status_of, tables_of
from pipeline.core.summary import MalformedReport, TableSummary, TableTotals
from pipeline.ingest import decisions
from pipeline.storage.lake import Lake
from pipeline.storage.runs_table import RunRow, published_by_date, read_runs
from pipeline.storage.stats import Point
from pipeline.storage.store import Store

_DATE_REPORT_RE = re.compile(r"reports/dt=(\d{4}-\d{2}-\d{2})/run_report\.json$")


def list_reports(store: Store) -> list[RunReport]:
    """One report per date, newest date first, chosen by the ``runs`` table (a run is
    visible once its row is in): the run published last for the date, or, for a date
    that no run published, its latest failed run. Each is that run's own report; a run
    that stopped before it wrote one shows as its row says. Dates of a store published
    by the earlier layout (no ``runs`` row) show their report copy."""
    rows = read_runs(Lake(store))
    chosen = {r.dt: r for r in rows}  # the last run of each date...
    chosen.update(published_by_date(rows))  # ...unless one of them published
    reports = {dt.isoformat(): _report_of(store, row) for dt, row in chosen.items()}
    for k in store.list(layout.reports_root()):
        if (m := _DATE_REPORT_RE.search(k)) and m.group(1) not in reports:
            reports[m.group(1)] = _read_report(store, k, {DT: m.group(1)})
    return sorted(reports.values(), key=lambda r: r.dt, reverse=True)


def _read_report(store: Store, key: str, given: Mapping[str, str]) -> RunReport:
    """A report file as it is in the bucket, with the ``given`` date (and run id); one
    that is not a report is shown as a failure of its run (the page shows the other
    runs)."""
    try:
        report = json.loads(store.read_bytes(key))
    except ValueError as e:
        return _unreadable(given, f"{key} is not JSON: {e}")
    if not isinstance(report, dict):
        return _unreadable(given, f"{key} is not a JSON object")
    try:
        return RunReport.from_dict({**report, **given})
    except MalformedReport as e:
        return _unreadable({**report, **given}, f"{key} cannot be read: {e}")


def _unreadable(head: Mapping[str, Any], failure: str) -> RunReport:
    """A run whose report file is not one: its date, and its run id and status if the
    file or the ``runs`` row says them, failing with ``failure``."""
    return RunReport(
        str(head.get(RUN_ID, "")),
        str(head[DT]),
        status_of(head.get("status", "")),
        failures=(failure,),
    )


def _report_of(store: Store, row: RunRow) -> RunReport:
    key = layout.run_report(row.dt, row.run_id)
    if store.exists(key):  # its date and run id are the runs row's
        return _read_report(store, key, {DT: row.dt.isoformat(), RUN_ID: row.run_id})
    failures = row.verdict.get("failures") or ["the run stopped before it published"]
    try:
        tables = tables_of(row.tables())
    except MalformedReport as e:
        tables, failures = {}, [*failures, f"its runs row's counts cannot be read: {e}"]
    return RunReport(  # stopped before publish (an error, a kill): no report, only its row
        run_id=row.run_id,
        dt=row.dt.isoformat(),
        status=status_of(row.status),
        started=row.started_at.isoformat(),
        failures=tuple(failures),
        tables=tables,
    )


@dataclass(frozen=True)
class TableRun:
    """One table in one run, in the numbers the page shows: its counts are the table's
    ``TableSummary.totals`` (``events``: the distinct events), the breakdowns its
    summary's."""

    dt: str
    run_id: str
    status: str
    table: str
    events: int
    applied: int
    discarded: int  # with the events an ``error`` resolver stopped
    conflicts: dict[str, dict[str, int]] = field(default_factory=dict)  # type -> outcome -> n
    quarantined: dict[str, int] = field(default_factory=dict)  # reason -> n
    #: replica -> n, and the snapshot comparison's as ``<replica> (snapshot)``
    divergent_keys: dict[str, int] = field(default_factory=dict)
    #: the same replicas -> cause -> n (docs/rules.md#divergence-causes; ``unclassified``
    #: in a report of a release before causes)
    divergent_causes: dict[str, dict[str, int]] = field(default_factory=dict)
    orphans: int = 0
    repaired: int = 0  # docs/operations.md#repair: changes cdr repair made, seen again
    arrived_late: dict[str, int] = field(default_factory=dict)  # replica -> copies
    #: clock skew: (replica behind, replica ahead, events, largest difference in seconds)
    clock_skew: tuple[tuple[str, str, int, float], ...] = ()
    totals: TableTotals = field(default_factory=TableTotals)

    @property
    def conflict_total(self) -> int:
        return self.totals.conflicts

    @property
    def quarantined_total(self) -> int:
        return self.totals.quarantined

    @property
    def divergent_total(self) -> int:
        """The replicas' perspectives' divergent keys (the snapshot's are listed apart)."""
        return self.totals.divergent_keys

    def by_outcome(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for outcomes in self.conflicts.values():
            for outcome, n in outcomes.items():
                out[outcome] = out.get(outcome, 0) + n
        return out


def _count(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise MalformedReport(f"{v!r} is not a count")
    return v


def _counts(m: Any) -> dict[str, int]:
    if not isinstance(m, Mapping):
        raise MalformedReport(f"{m!r} is not a mapping of counts")
    return {str(k): _count(v) for k, v in m.items()}


def _skew(m: Any) -> tuple[tuple[str, str, int, float], ...]:
    """A table's clock-skew evidence (``pipeline.resolve.skew``), pair by pair."""
    if not isinstance(m, Mapping) or not all(isinstance(a, Mapping) for a in m.values()):
        raise MalformedReport(f"{m!r} is not a mapping of replica pairs")
    out = []
    for behind, ahead in sorted(m.items()):
        for other, ev in sorted(ahead.items()):
            lag = ev.get("max_seconds") if isinstance(ev, Mapping) else None
            if isinstance(lag, bool) or not isinstance(lag, int | float) or lag < 0:
                raise MalformedReport(f"{ev!r} is not a clock-skew evidence")
            out.append((str(behind), str(other), _count(ev.get("events")), float(lag)))
    return tuple(out)


def _by_cause(m: Any) -> dict[str, dict[str, int]]:
    if not isinstance(m, Mapping):
        raise MalformedReport(f"{m!r} is not a mapping of replicas")
    return {str(k): _counts(v) for k, v in m.items()}


def _divergent(s: TableSummary) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
    """Per replica its divergent keys, and by cause; a replica's snapshot comparison as
    ``<replica> (snapshot)``."""
    keys: dict[str, int] = {}
    causes: dict[str, dict[str, int]] = {}
    for suffix, counted, by_cause in (
        ("", s.divergent_keys, s.divergent_causes),
        (" (snapshot)", s.snapshot_divergent_keys, s.snapshot_divergent_causes),
    ):
        for replica, n in counted.items():
            if n or not suffix:
                keys[replica + suffix] = n
            if n:
                causes[replica + suffix] = dict(by_cause.get(replica) or {"unclassified": n})
    return keys, causes


def _checked(t: TableSummary) -> TableSummary:
    """The table's summary with every number the page shows checked: a count, a mapping
    of counts (the file may be anyone's), :class:`MalformedReport` if not."""
    conflicts = t.conflicts or {}
    if not isinstance(conflicts, Mapping):
        raise MalformedReport(f"{conflicts!r} is not a mapping of conflict types")
    return replace(
        t,
        events=_count(t.events or 0),
        distinct_events=_count(t.distinct_events),
        applied=_count(t.applied),
        discarded=_count(t.discarded),
        errored=_count(t.errored or 0),
        duplicates=_count(t.duplicates or 0),
        conflicts={str(k): _counts(v) for k, v in conflicts.items()},
        quarantined=_counts(t.quarantined or {}),
        divergent_keys=_counts(t.divergent_keys or {}),
        snapshot_divergent_keys=_counts(t.snapshot_divergent_keys or {}),
        divergent_causes=_by_cause(t.divergent_causes),
        snapshot_divergent_causes=_by_cause(t.snapshot_divergent_causes),
        repaired=_count(t.repaired or 0),
        arrived_late=_counts(t.arrived_late or {}),
        orphans=_count(t.orphans or 0),
        rows=_count(t.rows or 0),
    )


def table_runs(report: RunReport) -> list[TableRun]:
    """The numbers of each table of a report; :class:`MalformedReport` if one is not a
    count (a report written by hand, or damaged)."""
    out = []
    for name, t in sorted(report.tables.items()):
        s = _checked(t)
        divergent, causes = _divergent(s)
        totals = s.totals()
        out.append(
            TableRun(
                dt=report.dt,
                run_id=report.run_id,
                status=str(report.status),
                table=str(name),
                events=totals.distinct,
                applied=totals.applied,
                discarded=totals.discarded,
                conflicts={k: dict(v) for k, v in s.conflicts.items()},
                quarantined=dict(s.quarantined),
                divergent_keys=divergent,
                divergent_causes=causes,
                orphans=totals.orphans,
                repaired=s.repaired,
                arrived_late=dict(s.arrived_late),
                clock_skew=_skew(t.clock_skew or {}),
                totals=totals,
            )
        )
    return out


# --------------------------------------------------------------------------- the page

_OUTCOME_COLORS = {
    "applied": "#2b7bb9",
    "converted_to_update": "#5aa469",
    "converted_to_insert": "#8cc084",
    "skipped": "#b0b0b0",
    "discarded": "#e08a3c",
    "errored": "#c0392b",
}
_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5rem;color:#1d2733}
h1{font-size:1.4rem} h2{font-size:1.1rem;margin-top:2rem}
table{border-collapse:collapse;margin:.5rem 0}
td,th{padding:.3rem .7rem;border-bottom:1px solid #dde}
th{text-align:left;background:#f3f5f8} td.n{text-align:right;font-variant-numeric:tabular-nums}
.published{color:#1e7b34}.failed{color:#b42318}.dry_run{color:#8a6d00}
nav a{margin-right:.8rem} .muted{color:#667}
"""


def _e(v: Any) -> str:
    return html.escape(str(v))


def _chart(rows: list[TableRun]) -> str:
    """Horizontal stacked bars: each table's conflicts by outcome (inline SVG, no script)."""
    outcomes = sorted({o for r in rows for o in r.by_outcome()})
    top = max((r.conflict_total for r in rows), default=0) or 1
    bar_w, label_w, h = 520, 140, 26
    parts = []
    for i, r in enumerate(rows):
        y, x = i * h + 4, float(label_w)
        parts.append(f'<text x="0" y="{y + 15}" font-size="13">{_e(r.table)}</text>')
        for o in outcomes:
            n = r.by_outcome().get(o, 0)
            if n:
                w = bar_w * n / top
                color = _OUTCOME_COLORS.get(o, "#7a5195")
                parts.append(
                    f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="18" fill="{color}">'
                    f"<title>{_e(r.table)}: {_e(o)} {n}</title></rect>"
                )
                x += w
        parts.append(f'<text x="{x + 6:.1f}" y="{y + 15}" font-size="12">{r.conflict_total}</text>')
    legend_y = len(rows) * h + 22
    lx = label_w
    for o in outcomes:
        parts.append(
            f'<rect x="{lx}" y="{legend_y - 11}" width="12" height="12" '
            f'fill="{_OUTCOME_COLORS.get(o, "#7a5195")}"/>'
            f'<text x="{lx + 16}" y="{legend_y}" font-size="12">{_e(o)}</text>'
        )
        lx += 24 + 8 * len(o)
    height = legend_y + 10
    return (
        f'<svg id="conflicts-chart" role="img" aria-label="conflicts by outcome per table" '
        f'width="{label_w + bar_w + 80}" height="{height}">{"".join(parts)}</svg>'
    )


#: the trend chart's series (``stats.TREND_KINDS``) and their colors
_TREND_COLORS = {"conflicts": "#2b7bb9", "quarantined": "#d1495b", "divergent_keys": "#edae49"}


def _trend(table: str, points: list[Point]) -> str:
    """One table's last runs (conflict stats): a line per series over the runs, oldest on the left
    (inline SVG, no script); each point names its date and count."""
    w, h, left, top_pad, bottom = 640, 160, 40, 10, 30
    top = max((getattr(p, k) for p in points for k in _TREND_COLORS), default=0) or 1
    step = (w - left - 10) / max(len(points) - 1, 1)

    def xy(i: int, n: int) -> tuple[float, float]:
        return left + i * step, top_pad + (h - top_pad - bottom) * (1 - n / top)

    parts = [
        f'<line x1="{left}" y1="{h - bottom}" x2="{w - 10}" y2="{h - bottom}" stroke="#999"/>',
        f'<text x="0" y="{top_pad + 10}" font-size="11">{top}</text>',
        f'<text x="{left}" y="{h - 10}" font-size="11">{_e(points[0].dt)}</text>',
        f'<text x="{w - 10}" y="{h - 10}" font-size="11" text-anchor="end">'
        f"{_e(points[-1].dt)}</text>",
    ]
    for kind, color in _TREND_COLORS.items():
        coords = [xy(i, getattr(p, kind)) for i, p in enumerate(points)]
        line = " ".join(f"{x:.1f},{y:.1f}" for x, y in coords)
        parts.append(f'<polyline class="{kind}" points="{line}" fill="none" stroke="{color}"/>')
        for (x, y), p in zip(coords, points, strict=True):
            parts.append(
                f'<circle class="{kind}" cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{color}">'
                f"<title>{_e(p.dt)} {kind}: {getattr(p, kind)}</title></circle>"
            )
    legend = " ".join(
        f"<span style='color:{c}'>&#9632; {k.replace('_', ' ')}</span>"
        for k, c in _TREND_COLORS.items()
    )
    return (
        f"<h3>{_e(table)}</h3><svg class='trend' id='trend-{_e(table)}' role='img' "
        f"aria-label='{_e(table)}: the last {len(points)} runs' width='{w}' height='{h}'>"
        f"{''.join(parts)}</svg><p class='muted'>{legend}</p>"
    )


def _trends(trends: dict[str, list[Point]] | None) -> str:
    if not trends:
        return ""
    charts = "".join(_trend(t, points) for t, points in sorted(trends.items()) if points)
    return f"<h2>Trends: the last runs of each table</h2><div id='trends'>{charts}</div>"


@dataclass(frozen=True)
class DecideForm:
    """The decision form (docs/rules.md#manual-decisions), for a user who may trigger
    ``replica_cdr_decide``: where it posts, and the request's anti-forgery token."""

    action: str
    token: str


def list_decisions(lake: Lake, reports: list[RunReport]) -> list[dict[str, Any]]:
    """Every decision, newest first, with its status: ``withdrawn``, what the published
    run of its date made of it (``applied``, or why it is stale), or ``pending`` until
    that date runs again."""

    published = {r.dt: r for r in reports if r.published}
    out = []
    for d in decisions.read(lake):
        report = published.get(str(d[DT]))
        said = report.tables.get(d["table"]) if report is not None else None
        status = said.decisions.get(d["decision_id"]) if said is not None else None
        if d["withdrawn_at"] is not None:
            status = "withdrawn"
        out.append({**d, "status": status or f"pending: run {d[DT]} again"})
    return sorted(out, key=lambda d: d["at"], reverse=True)


def _decisions(rows: list[dict[str, Any]], form: DecideForm | None) -> str:
    """The decisions, and the form to record one."""
    body = "".join(
        "<tr>"
        + "".join(
            f"<td>{_e(d[c])}</td>"
            for c in ("decision_id", "dt", "table", "key", "take", "why", "by", "status")
        )
        + f"<td><code>{_e(d['conflict_id'])}</code></td></tr>"
        for d in rows
    )
    head = "".join(
        f"<th>{c}</th>"
        for c in ("decision", "dt", "table", "key", "take", "why", "by", "status", "conflict")
    )
    out = "<h2>Decisions</h2>"
    out += (
        f"<table id='decisions'><tr>{head}</tr>{body}</table>"
        if rows
        else "<p id='decisions'>No decision recorded.</p>"
    )
    if form is not None:
        out += (
            f"<form id='decide' method='post' action='{_e(form.action)}'>"
            f"<input type='hidden' name='token' value='{_e(form.token)}'>"
            "<label>conflict_id <input name='conflict_id' required pattern='[0-9a-f]{32}'>"
            "</label> <label>take <select name='take'><option>local</option>"
            "<option>remote</option><option>row</option></select></label> "
            "<label>row <input name='row' placeholder='{\"column\": value}'></label> "
            "<label>why <input name='why' required></label> "
            "<button>Decide (triggers replica_cdr_decide)</button></form>"
        )
    return out


def render_page(
    reports: list[RunReport],
    dt: str | None,
    docs_href: str,
    trends: dict[str, list[Point]] | None = None,
    decisions: list[dict[str, Any]] | None = None,
    form: DecideForm | None = None,
    run_href: str | None = "?dt={dt}",
) -> str:
    """The conflicts page of one run (``dt``, default the newest), with links to the
    other runs, and each table's trend over its last runs (``stats.trends``).
    ``docs_href`` is a format string with ``{dt}`` and ``{run_id}`` for the run's Data
    Docs, ``run_href`` one with ``{dt}`` for another run's page (None: a page read
    offline, which names the other runs without a link). ``decisions``
    (``list_decisions``) and, for a user who may decide, the ``form``."""
    if not reports:
        body = "<p>No run report published yet.</p>" + _decisions(decisions or [], form)
        return _page("Conflicts", body)
    report = next((r for r in reports if r.dt == dt), reports[0])
    try:
        rows, broken = table_runs(report), ""
    except MalformedReport as e:
        rows, broken = (
            [],
            f"<p class='failed' id='broken'>this run's report cannot be read: {_e(e)}</p>",
        )
    failures = "".join(f"<li>{_e(f)}</li>" for f in report.failures)
    fail_html = f"<h2>Failures</h2><ul>{failures}</ul>" if failures else ""
    body = (
        _head(report, reports, docs_href, run_href)
        + broken
        + fail_html
        + _per_table(rows)
        + _trends(trends)
        + _detail(rows)
        + _decisions(decisions or [], form)
    )
    return _page(f"Conflicts {report.dt}", body)


def _head(report: RunReport, reports: list[RunReport], docs_href: str, run_href: str | None) -> str:
    """The run's date and status, its Data Docs, and the links to the other runs."""
    nav = " ".join(
        f'<a href="{_e(run_href.format(dt=r.dt))}" class="{_e(r.status)}">{_e(r.dt)}</a>'
        if run_href is not None
        else f'<span class="{_e(r.status)}">{_e(r.dt)}</span>'
        for r in reports
    )
    status = report.status
    return (
        f"<h1>Run of {_e(report.dt)} <span class='{_e(status)}'>{_e(status)}</span></h1>"
        f"<p class='muted'>run {_e(report.run_id)} · "
        f"<a href='{_e(docs_href.format(dt=report.dt, run_id=report.run_id))}' "
        "target='_blank' rel='noopener'>Data Docs</a></p>"
        f"<nav>runs: {nav}</nav>"
    )


#: the totals the page leads with (docs/rules.md#lost-writes)
LOST_FIELDS = ("lost_writes", "concurrent")


def _per_table(rows: list[TableRun]) -> str:
    """The writes lost first (docs/rules.md#lost-writes), then each table's counts."""
    lost, concurrent = (sum(getattr(r.totals, f) for r in rows) for f in LOST_FIELDS)
    summary = [
        f"<p id='lost'><b>{lost} writes lost</b> in {concurrent} concurrent conflicts "
        "(neither writer had seen the other's write); the conflicts below are PostgreSQL's "
        "origin rule's</p>"
        "<h2>Per table</h2><table id='tables'><tr><th>table</th><th>events</th>"
        "<th>writes lost</th><th>concurrent</th><th>applied</th>"
        "<th>discarded</th><th>conflicts</th><th>quarantined</th><th>divergent keys</th>"
        "<th>orphans</th></tr>"
    ]
    for r in rows:
        summary.append(
            f"<tr><td>{_e(r.table)}</td><td class=n>{r.events}</td>"
            f"<td class=n>{r.totals.lost_writes}</td><td class=n>{r.totals.concurrent}</td>"
            f"<td class=n>{r.applied}</td>"
            f"<td class=n>{r.discarded}</td><td class=n>{r.conflict_total}</td>"
            f"<td class=n>{r.quarantined_total}</td><td class=n>{r.divergent_total}</td>"
            f"<td class=n>{r.orphans}</td></tr>"
        )
    summary.append("</table>")
    return "".join(summary)


def _detail(rows: list[TableRun]) -> str:
    """The conflicts by type and outcome (a chart and a table), then what was quarantined
    and which keys diverged."""
    detail = ["<h2>Conflicts by type and outcome</h2>", _chart(rows)]
    detail.append(
        "<table id='conflicts'><tr><th>table</th><th>conflict type</th><th>outcome</th>"
        "<th>events</th></tr>"
    )
    for r in rows:
        for ctype, outcomes in sorted(r.conflicts.items()):
            for outcome, n in sorted(outcomes.items()):
                detail.append(
                    f"<tr><td>{_e(r.table)}</td><td>{_e(ctype)}</td><td>{_e(outcome)}</td>"
                    f"<td class=n>{n}</td></tr>"
                )
    detail.append("</table><h2>Quarantined events and divergent keys</h2>")
    detail.append("<table id='issues'><tr><th>table</th><th>what</th><th>count</th></tr>")
    for r in rows:
        for reason, n in sorted(r.quarantined.items()):
            detail.append(
                f"<tr><td>{_e(r.table)}</td><td>quarantined: {_e(reason)}</td>"
                f"<td class=n>{n}</td></tr>"
            )
        for replica, causes in sorted(r.divergent_causes.items()):
            for cause, n in sorted(causes.items()):
                detail.append(
                    f"<tr><td>{_e(r.table)}</td><td>divergent keys: {_e(replica)}, "
                    f"{_e(cause)}</td><td class=n>{n}</td></tr>"
                )
        for replica, n in sorted(r.arrived_late.items()):
            detail.append(
                f"<tr><td>{_e(r.table)}</td><td>arrived late: {_e(replica)}</td>"
                f"<td class=n>{n}</td></tr>"
            )
        if r.repaired:
            detail.append(
                f"<tr><td>{_e(r.table)}</td><td>repaired (cdr repair's changes)</td>"
                f"<td class=n>{r.repaired}</td></tr>"
            )
        if r.orphans:
            detail.append(
                f"<tr><td>{_e(r.table)}</td><td>orphans</td><td class=n>{r.orphans}</td></tr>"
            )
    detail.append("</table>")
    return "".join(detail) + _clock_skew(rows)


def _clock_skew(rows: list[TableRun]) -> str:
    """clock skew: per table and ordered pair, the events that saw a version stamped later than
    themselves, and by how much at most."""
    out = [
        "<h2>Clock skew</h2><table id='clock_skew'><tr><th>table</th><th>replica behind</th>"
        "<th>behind replica</th><th>events</th><th>at least (s)</th></tr>"
    ]
    for r in rows:
        for behind, ahead, n, lag in r.clock_skew:
            out.append(
                f"<tr><td>{_e(r.table)}</td><td>{_e(behind)}</td><td>{_e(ahead)}</td>"
                f"<td class=n>{n}</td><td class=n>{lag:.1f}</td></tr>"
            )
    if not any(r.clock_skew for r in rows):
        out.append("<tr><td colspan=5 class=muted>no evidence of a clock behind</td></tr>")
    out.append("</table>")
    return "".join(out)


def _page(title: str, body: str) -> str:
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{_e(title)}</title>"
        f"<style>{_STYLE}</style></head><body>{body}</body></html>"
    )
