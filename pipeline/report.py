"""The run report as people read it: one table of counts per table, then conflicts by type
and outcome, then the gate."""

from __future__ import annotations

from typing import Any

from pipeline.context import micros_to_iso


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


def format_report(report: dict[str, Any]) -> str:
    lines = [f"run {report['run_id']} for {report['dt']}: {report['status'].upper()}", ""]
    rows = [
        [
            "table",
            "events",
            "distinct",
            "applied",
            "discarded",
            "quarantined",
            "conflicts",
            "divergent",
            "orphans",
            "rows",
        ]
    ]
    for t, s in report["tables"].items():
        rows.append(
            [
                t,
                str(s["events"]),
                str(s["distinct_events"]),
                str(s["applied"]),
                str(s["discarded"] + s.get("errored", 0)),
                str(sum(s["quarantined"].values())),
                str(sum(sum(o.values()) for o in s["conflicts"].values())),
                str(sum(s["divergent_keys"].values())),
                str(s["orphans"]),
                str(s.get("rows", "-")),
            ]
        )
    lines += _table(rows)
    crow = [["table", "conflict type", "outcome", "count"]]
    for t, s in report["tables"].items():
        for ctype, outcomes in sorted(s["conflicts"].items()):
            for outcome, n in sorted(outcomes.items()):
                crow.append([t, ctype, outcome, str(n)])
    if len(crow) > 1:
        lines += ["", "conflicts by type and outcome:", *_table(crow)]
    qrow = [["table", "quarantine reason", "count"]]
    for t, s in report["tables"].items():
        for reason, n in sorted(s["quarantined"].items()):
            qrow.append([t, reason, str(n)])
    if len(qrow) > 1:
        lines += ["", "quarantined:", *_table(qrow)]
    dups = [[t, str(s["duplicates"])] for t, s in report["tables"].items() if s.get("duplicates")]
    if dups:
        lines += ["", "duplicates (resolved on an earlier night, not again):"]
        lines += _table([["table", "events"], *dups])
    drow = [["table", "replica", "perspective", "snapshot"]]
    for t, s in report["tables"].items():
        per, snap = s["divergent_keys"], s.get("snapshot_divergent_keys", {})
        for replica in sorted(set(per) | {r for r, n in snap.items() if n}):
            drow.append([t, replica, str(per.get(replica, 0)), str(snap.get(replica, "-"))])
    if len(drow) > 1:
        lines += ["", "divergent keys by replica:", *_table(drow)]
    suites = report.get("validation", {}).get("suites", {})
    if suites:
        failed = sorted(name for name, ok in suites.items() if not ok)
        lines += [
            "",
            f"validation: {len(suites)} suite(s), "
            + (f"{len(failed)} failed: {', '.join(failed)}" if failed else "all passed"),
        ]
    cdc = report.get("cdc")
    if cdc:
        rows_by_table = ", ".join(f"{t} {c['log_rows']}" for t, c in cdc["tables"].items())
        lines += [
            "",
            f"CDC log rows: {rows_by_table}; generation of {micros_to_iso(cdc['generation'])} "
            f"({cdc['streams']} streams{', new' if cdc['new_generation'] else ''})",
        ]
    for w in report.get("warnings", []):
        lines.append(f"warning: {w}")
    for f in report.get("failures", []):
        lines.append(f"FAILED: {f}")
    return "\n".join(lines)
