"""The commands that act on what a run left: ``cdr quarantine`` (its quarantined events),
``decide`` (a conflict by hand), ``repair`` (a replica, to the converged state) and
``whatif`` (a date under another config) and ``report`` (a published run as the Conflicts
page and a Markdown summary) (docs/operations.md, docs/rules.md).
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import shlex
import sys
from typing import TYPE_CHECKING

from pipeline.app.cli_args import config_of, emit
from pipeline.core.errors import StageError

if TYPE_CHECKING:
    from pipeline.app.decide import Decided


def cmd_quarantine(args: argparse.Namespace) -> int:
    """List a table's quarantined events, or retry or dismiss one (the store's lease held)."""
    from pipeline.app import quarantine  # deferred: cdr --help stays fast
    from pipeline.storage import lease  # deferred: cdr --help stays fast
    from pipeline.storage.lake import Lake  # deferred: cdr --help stays fast
    from pipeline.storage.runs_table import read_runs  # deferred: cdr --help stays fast
    from pipeline.storage.store import open_store  # deferred: cdr --help stays fast

    config = config_of(args)
    assert config.store
    if args.table not in config.tables:
        raise StageError(f"no table {args.table!r} in {args.config}")
    store = open_store(config.store)
    lake = Lake(store, config.retention_days)
    if args.action == "list":
        rows = quarantine.listing(lake, args.table, args.status)
        lines = [
            f"{r['event_id']}\t{r['reason']}\t{r['quarantined_dt']}\t{r['status']}\t"
            f"{r['attempts']}\t{r['detail'] or ''}"
            for r in rows
        ]
        header = "event_id\treason\tquarantined_dt\tstatus\tattempts\tdetail"
        emit(args, {"table": args.table, "events": rows}, "\n".join([header, *lines]))
        return 0
    if not args.event_id:
        raise StageError(f"cdr quarantine {args.action} needs --event-id")
    holder = f"quarantine-{args.action}-{os.getpid()}"
    held = lease.acquire(store, holder, 600)  # no run publishes meanwhile
    lake = Lake(store, config.retention_days, lease.Fence(store, holder, held.epoch))
    try:
        runs = read_runs(lake)
        status = quarantine.act(lake, runs, args.table, args.event_id, args.action, config.retry)
    finally:
        lease.release(store, holder, held.epoch)
    text = f"{args.table} {args.event_id}: {status}"
    emit(args, {"table": args.table, "event_id": args.event_id, "status": status}, text)
    return 0


def cmd_decide(args: argparse.Namespace) -> int:
    """Decide one conflict by hand or withdraw a decision (``--rerun``: then run its dates)."""
    from pipeline.app.decide import decide_conflict  # deferred: cdr --help stays fast

    config = config_of(args)
    result = decide_conflict(
        config,
        conflict_id=args.conflict_id,
        take=args.take,
        row=args.row,
        why=args.why,
        by=args.by or getpass.getuser(),
        withdraw_id=args.withdraw,
    )
    emit(args, result.to_dict(), decided_text(args, result))
    if args.rerun:
        from pipeline.stages import RunOptions, run_then_later  # deferred: cdr --help stays fast

        opts = RunOptions(work_dir=args.work_dir, master=args.master)
        for report in run_then_later(config, result.reruns[0], opts):
            print(f"{report.dt}: {report.status}", file=sys.stderr)
    return 0


def decided_text(args: argparse.Namespace, result: Decided) -> str:
    """What ``cdr decide`` says: the decision, the dates that must run again, and (without
    ``--rerun``) the command that runs them, ready to paste."""
    row = result.row
    verb = "withdrawn" if args.withdraw else f"takes {row['take']}"
    dates = " ".join(d.isoformat() for d in result.reruns)
    text = (
        f"decision {row['decision_id']} ({row['table']} {row['key']}, {row['dt']}) {verb}; "
        f"it takes effect when these dates run again, in order: {dates}"
    )
    if args.rerun:
        return text
    command = ["cdr", "run", "--config", str(args.config)]
    command += ["--store", args.store] if args.store else []
    command += ["--date", result.reruns[0].isoformat()]
    command += ["--then-later"] if len(result.reruns) > 1 else []
    return f"{text}; to run them: {shlex.join(command)}"


def cmd_repair(args: argparse.Namespace) -> int:
    """The statements that bring a replica to a date's converged state: written, or applied."""
    from pipeline.app.repair import (  # deferred: cdr --help stays fast
        apply_cql,
        apply_postgres,
        describe,
        repair,
    )
    from pipeline.storage.lake import Lake  # deferred: cdr --help stays fast
    from pipeline.storage.store import open_store  # deferred: cdr --help stays fast

    if args.apply and not args.dsn:
        raise StageError("--apply needs --dsn (the replica's database)")
    config = config_of(args)
    assert config.store
    lake = Lake(open_store(config.store), config.retention_days)
    result = repair(config, lake, args.date, args.replica, args.dialect, args.keyspace, args.table)
    if args.apply and args.dialect == "cql":
        result = apply_cql(result, config, args.dsn, args.keyspace, args.dry_run)
    elif args.apply:
        result = apply_postgres(result, config, args.dsn, args.dry_run)
    elif args.out and not args.dry_run:
        args.out.write_text(result.text, encoding="utf-8")
    elif args.log_format != "json":
        sys.stdout.write(result.text)
    text = describe(result, config)
    if args.out and not args.dry_run:
        text += f"\nstatements: {args.out}"
    if args.log_format == "json":
        print(json.dumps(result.to_dict(config)))
    else:
        print(text, file=sys.stderr if not (args.apply or args.out) else sys.stdout)
    return 0


def cmd_whatif(args: argparse.Namespace) -> int:
    """A date's published inputs under another config, compared with what was published."""
    from pipeline.app.whatif import report_key, whatif  # deferred: cdr --help stays fast

    config = config_of(args)
    name = args.name or args.config.stem
    result = whatif(config, args.date, name, args.work_dir, args.master)
    lines = [f"what-if {name} for {args.date}: {config.store}/{report_key(args.date, name)}"]
    for t, c in result["tables"].items():
        lines.append(f"  {t}: {c['differing_rows']['count']} row(s) differ")
    emit(args, result, "\n".join(lines))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """A date's published run: its Markdown summary (printed), its Conflicts page (``--html``)."""
    from pipeline.app.report_page import (  # deferred: cdr --help stays fast
        DOCS_KEY,
        conflicts_page,
        published_report,
        run_summary,
    )
    from pipeline.storage.store import open_store  # deferred: cdr --help stays fast

    config = config_of(args)
    assert config.store
    store = open_store(config.store)
    report = published_report(store, args.date)
    result: dict[str, object] = {"dt": report.dt, "run_id": report.run_id}
    lines = []
    if args.html:
        page = conflicts_page(store, report.dt, f"{store.uri}/{DOCS_KEY}", run_href=None)
        args.html.write_text(page, encoding="utf-8")
        result["html"] = str(args.html)
        lines.append(f"the Conflicts page of {report.dt}: {args.html}")
    if args.markdown or not args.html:
        result["markdown"] = run_summary(store, report)
        lines.insert(0, str(result["markdown"]).rstrip("\n"))
    emit(args, result, "\n".join(lines))
    return 0
