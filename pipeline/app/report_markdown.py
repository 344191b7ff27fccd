"""A run's short Markdown summary (docs/operations.md#cdr-report), for a ticket or a chat:
what a person asks first, in this order: how many conflicts and on how many keys, and how
they were resolved; what was quarantined and why; which keys diverged and why; the alerts
the run fired; then where to look. Counts carry thousands separators, times are RFC 3339.

Pure: a :class:`~pipeline.core.report.RunReport` in (with, when the caller read them,
each table's conflicting keys and the links to the store), Markdown out. ``cdr report``
and the DAG's publish task print it (``pipeline.app.report_page``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from pipeline.core.instants import micros_to_iso
from pipeline.core.policy import Concurrency
from pipeline.core.report import RunReport
from pipeline.core.summary import TableSummary
from pipeline.validate.alerts import describe

#: how many of the run's warnings the summary lists (the rest are in its report)
WARNINGS_SHOWN = 5
#: a warning or failure longer than this is cut (the report holds it whole)
LINE_CHARS = 300
#: the labels' columns, in the order a person reads them (docs/rules.md#lost-writes)
LABEL_ORDER = (Concurrency.CONCURRENT, Concurrency.SEQUENTIAL, Concurrency.UNKNOWN, Concurrency.NA)
#: the key, under a table of :attr:`Summarised.keys`, of its conflicting keys of every type
ALL_TYPES = "*"


@dataclass(frozen=True)
class Summarised:
    """What the summary says beside the report: per table its conflicting keys (by
    conflict type and :data:`ALL_TYPES`: the conflict log's distinct keys; absent: not
    read) and the links, each a title and where it leads, in order."""

    keys: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    links: tuple[tuple[str, str], ...] = ()


def n(v: int) -> str:
    """A count as people read it: ``1,892``."""
    return f"{v:,}"


def instant(text: str) -> str:
    """An ISO time of a report (``started``) as RFC 3339 in UTC, to the second; text that
    is not one, as it is."""
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        return text
    t = t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)
    return t.isoformat(timespec="seconds").replace("+00:00", "Z")


def summary_markdown(report: RunReport, extra: Summarised | None = None) -> str:
    """The run's summary: its head, then the sections in the order a person asks."""
    extra = extra or Summarised()
    parts = [
        _head(report),
        _lost(report.tables),
        _conflicts(report.tables, extra.keys),
        _quarantine(report.tables),
        _divergence(report.tables),
        _alerts(report),
        _links(extra.links),
    ]
    return "\n\n".join(p for p in parts if p) + "\n"


def _head(report: RunReport) -> str:
    lines = [f"# Run of {report.dt}: {report.status}", ""]
    said = [f"run `{report.run_id}`"]
    if report.started:
        said.append(f"started {instant(report.started)}")
    if report.now_us is not None:
        said.append(f"its clock {micros_to_iso(report.now_us)}")
    if report.seconds:
        said.append(f"took {round(sum(report.seconds.values())):,} s")
    lines.append(", ".join(said) + ".")
    lines += [f"- **failed:** {_cut(f)}" for f in report.failures]
    return "\n".join(lines)


def _table(header: list[str], rows: list[list[str]], counts: set[int]) -> list[str]:
    """A Markdown table; the columns ``counts`` are counts (right-aligned)."""
    rule = ["--:" if i in counts else "---" for i in range(len(header))]
    return [f"| {' | '.join(r)} |" for r in (header, rule, *rows)]


def _lost(tables: Mapping[str, TableSummary]) -> str:
    """The lead (docs/rules.md#lost-writes): the writes lost to concurrent conflicts, and
    how the other conflicts were judged."""
    lost = sum(s.lost_writes for s in tables.values())
    concurrent = sum(s.totals().concurrent for s in tables.values())
    head = (
        f"## Writes lost\n\n**{n(lost)} writes lost** in {n(concurrent)} concurrent "
        "conflicts (each side wrote without having seen the other's write)"
    )
    rows = [
        [t, *(n(s.concurrency.get(c.value, 0)) for c in LABEL_ORDER), n(s.lost_writes)]
        for t, s in sorted(tables.items())
        if s.concurrency
    ]
    if not rows:
        return head + "."
    header = ["table", *(c.value for c in LABEL_ORDER), "writes lost"]
    return "\n".join([head + ":", "", *_table(header, rows, set(range(1, len(header))))])


def _conflicts(tables: Mapping[str, TableSummary], keys: Mapping[str, Mapping[str, int]]) -> str:
    """The lead: how many conflicts, on how many keys, and what became of them."""
    total = sum(s.totals().conflicts for s in tables.values())
    events = sum(s.totals().distinct for s in tables.values())
    on_keys = ""
    if total and all(t in keys for t, s in tables.items() if s.conflicts):
        on_keys = f" on {n(sum(keys[t].get(ALL_TYPES, 0) for t in keys if t in tables))} keys"
    head = (
        f"## Conflicts by PostgreSQL's origin rule\n\n**{n(total)} conflicts{on_keys}** "
        f"among {n(events)} events in {n(len(tables))} table(s)"
    )
    if not total:
        return head + ": nothing to resolve."
    rows = [
        [
            t,
            ctype,
            n(sum(outcomes.values())),
            n(keys[t][ctype]) if ctype in keys.get(t, {}) else "",
            ", ".join(f"{o} {n(c)}" for o, c in sorted(outcomes.items(), key=lambda x: -x[1])),
        ]
        for t, s in sorted(tables.items())
        for ctype, outcomes in sorted(s.conflicts.items(), key=lambda x: -sum(x[1].values()))
    ]
    header = ["table", "conflict type", "conflicts", "keys", "resolved as"]
    return "\n".join([head + ", resolved:", "", *_table(header, rows, {2, 3})])


def _quarantine(tables: Mapping[str, TableSummary]) -> str:
    """What was set aside, by reason, and what is still open."""
    total = sum(s.totals().quarantined for s in tables.values())
    still = sum(s.quarantine_open for s in tables.values())
    retried = sum(sum(s.retried.values()) for s in tables.values())
    also = [f"{n(still)} still open after the run"] if still else []
    also += [f"{n(retried)} retried from earlier nights"] if retried else []
    head = f"## Quarantine\n\n**{n(total)} events quarantined**"
    head += f" ({'; '.join(also)})" if also else ""
    if not total:
        return head + "."
    rows = [
        [t, reason, n(c)]
        for t, s in sorted(tables.items())
        for reason, c in sorted(s.quarantined.items(), key=lambda x: -x[1])
        if c
    ]
    return "\n".join([head + ", by reason:", "", *_table(["table", "reason", "events"], rows, {2})])


def _divergence(tables: Mapping[str, TableSummary]) -> str:
    """Per table and replica the divergent keys, by cause (docs/rules.md#divergence-causes):
    the replicas' own orders, then their snapshot exports."""
    rows = []
    for t, s in sorted(tables.items()):
        for source, counted, causes in (
            ("own order", s.divergent_keys, s.divergent_causes),
            ("snapshot", s.snapshot_divergent_keys, s.snapshot_divergent_causes),
        ):
            for replica, c in sorted(counted.items()):
                if c:
                    why = causes.get(replica) or {"unclassified": c}
                    cause = ", ".join(f"{k} {n(v)}" for k, v in sorted(why.items()))
                    rows.append([t, replica, source, cause, n(c)])
    total = sum(s.totals().divergent_keys for s in tables.values())
    snap = sum(sum(s.snapshot_divergent_keys.values()) for s in tables.values())
    head = f"## Divergence\n\n**{n(total)} divergent keys** in the replicas' own orders"
    head += f", {n(snap)} in their snapshot exports" if snap else ""
    if not rows:
        return head + ": every replica converges."
    header = ["table", "replica", "source", "causes", "keys"]
    return "\n".join([head + ":", "", *_table(header, rows, {4})])


def _alerts(report: RunReport) -> str:
    """The alerts the run fired (docs/operations.md#alerts), then its warnings, cut."""
    fired = [f"- {_alert(t, a)}" for t, a in sorted(report.alerts.items())]
    lines = ["## Alerts", "", *(fired or ["No alert fired."])]
    if report.warnings:
        lines += ["", f"{n(len(report.warnings))} warning(s):"]
        lines += [f"- {_cut(w)}" for w in report.warnings[:WARNINGS_SHOWN]]
        more = len(report.warnings) - WARNINGS_SHOWN
        lines += [f"- and {n(more)} more in the run report"] if more > 0 else []
    return "\n".join(lines)


def _alert(table: str, a: Mapping[str, object]) -> str:
    """One alert in a few words; one a hand-written report holds otherwise, as it is."""
    try:
        return describe(table, a)
    except KeyError:
        return f"{table}: {dict(a)}"


def _links(links: tuple[tuple[str, str], ...]) -> str:
    if not links:
        return ""
    return "\n".join(["## Where to look", "", *(f"- {t}: <{to}>" for t, to in links)])


def _cut(text: str) -> str:
    one = " ".join(text.split())
    return one if len(one) <= LINE_CHARS else one[: LINE_CHARS - 1] + "…"
