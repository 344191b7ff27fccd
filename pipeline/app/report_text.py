"""The run report as people read it: one table of counts per table (the writes lost to
concurrent conflicts first, docs/rules.md#lost-writes), then conflicts by type and outcome,
then the gate."""

from __future__ import annotations

from collections.abc import Mapping

from pipeline.core.columns import REPLICA
from pipeline.core.instants import micros_to_iso
from pipeline.core.report import RunReport
from pipeline.core.summary import TableSummary


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for j, r in enumerate(rows):
        out.append(
            "  ".join(
                c.rjust(w) if i else c.ljust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=True))
            ).rstrip()
        )
        if j == 0:
            out.append("  ".join("-" * w for w in widths))
    return out


#: the columns of the counts table, one row per table
#: (docs/rules.md#lost-writes: the writes lost and the concurrent conflicts lead; the
#: conflicts are the origin rule's; a header is one word)
COUNTS = [
    *("table", "events", "distinct", "lost", "concurrent", "conflicts", "applied"),
    *("discarded", "quarantined", "divergent", "orphans", "rows"),
]
#: the ``TableTotals`` field of each column of :data:`COUNTS` after the table's name
COUNT_FIELDS = (
    *("events", "distinct", "lost_writes", "concurrent", "conflicts", "applied"),
    *("discarded", "quarantined", "divergent_keys", "orphans", "rows"),
)


def format_report(report: RunReport) -> str:
    lines = [f"run {report.run_id} for {report.dt}: {report.status.upper()}", ""]
    lines += _table([COUNTS, *(_counts(t, s) for t, s in report.tables.items())])
    lines += _breakdowns(report.tables)
    suites = report.validation.suites
    if suites:
        failed = sorted(name for name, ok in suites.items() if not ok)
        lines += [
            "",
            f"validation: {len(suites)} suite(s), "
            + (f"{len(failed)} failed: {', '.join(failed)}" if failed else "all passed"),
        ]
    cdc = report.cdc
    if cdc is not None:
        rows_by_table = ", ".join(f"{t} {c.log_rows}" for t, c in cdc.tables.items())
        lines += [
            "",
            f"CDC log rows: {rows_by_table}; generation of {micros_to_iso(cdc.generation)} "
            f"({cdc.streams} streams{', new' if cdc.new_generation else ''})",
        ]
    lines += [f"warning: {w}" for w in report.warnings]
    lines += [f"FAILED: {f}" for f in report.failures]
    return "\n".join(lines)


def _counts(t: str, s: TableSummary) -> list[str]:
    """One table's row of :data:`COUNTS`: its ``TableSummary.totals`` (an ``error``
    resolver's events count as discarded)."""
    totals = s.totals()
    return [t, *(str(getattr(totals, f)) for f in COUNT_FIELDS)]


_BY_TYPE = ["table", "conflict type", "outcome"]


def _labels(tables: Mapping[str, TableSummary]) -> list[list[str]]:
    """docs/rules.md#lost-writes: the conflicts per label."""
    return [[t, x, str(n)] for t, s in tables.items() for x, n in sorted(s.concurrency.items())]


def _breakdowns(tables: Mapping[str, TableSummary]) -> list[str]:
    """Conflicts by type and outcome, quarantine reasons, duplicates, divergent keys by
    replica and by cause, repairs and late arrivals: each section only when it has a
    row."""
    conflicts = [
        [t, ctype, outcome, str(n)]
        for t, s in tables.items()
        for ctype, outcomes in sorted(s.conflicts.items())
        for outcome, n in sorted(outcomes.items())
    ]
    quarantined = [
        [t, reason, str(n)]
        for t, s in tables.items()
        for reason, n in sorted(s.quarantined.items())
    ]
    duplicates = [[t, str(s.duplicates)] for t, s in tables.items() if s.duplicates]
    retried = [  # retry: events of earlier nights' quarantine, apart from the night's own
        [t, what, str(n)] for t, s in tables.items() for what, n in sorted(s.retried.items())
    ]
    still_open = [[t, str(s.quarantine_open)] for t, s in tables.items() if s.quarantine_open]
    divergent = []
    for t, s in tables.items():
        per, snap = s.divergent_keys, s.snapshot_divergent_keys
        for replica in sorted(set(per) | {r for r, n in snap.items() if n}):
            divergent.append([t, replica, str(per.get(replica, 0)), str(snap.get(replica, "-"))])
    causes = [
        [t, replica, source, cause, str(n)]
        for t, s in tables.items()
        for source, by in (
            ("perspective", s.divergent_causes),
            ("snapshot", s.snapshot_divergent_causes),
        )
        for replica, counted in sorted(by.items())
        for cause, n in sorted(counted.items())
    ]
    seen_again = [[t, "repaired", "-", str(s.repaired)] for t, s in tables.items() if s.repaired]
    seen_again += [
        [t, "arrived_late", replica, str(n)]
        for t, s in tables.items()
        for replica, n in sorted(s.arrived_late.items())
    ]
    sections = [
        ("conflicts by what the writers had seen:", ["table", "label", "count"], _labels(tables)),
        ("conflicts by type and outcome (origin rule):", [*_BY_TYPE, "count"], conflicts),
        ("quarantined:", ["table", "quarantine reason", "count"], quarantined),
        ("retried from the quarantine:", ["table", "became", "events"], retried),
        ("quarantined events open:", ["table", "events"], still_open),
        ("duplicates (resolved on an earlier night, not again):", ["table", "events"], duplicates),
        ("divergent keys by replica:", ["table", REPLICA, "perspective", "snapshot"], divergent),
        ("divergent keys by cause:", ["table", REPLICA, "source", "cause", "keys"], causes),
        ("copies seen again:", ["table", "as", REPLICA, "copies"], seen_again),
    ]
    lines: list[str] = []
    for title, header, rows in sections:
        if rows:
            lines += ["", title, *_table([header, *rows])]
    return lines
