"""The commands that look after a store: ``cdr vacuum``, ``verify``, ``doctor`` and
``unlock`` (docs/operations.md).
"""

from __future__ import annotations

import argparse
from dataclasses import asdict

from pipeline.app.cli_args import config_of, emit
from pipeline.core.errors import StageError


def cmd_unlock(args: argparse.Namespace) -> int:
    """Break the store's lease (``--force``: one that has not expired)."""
    from pipeline.storage.lease import unlock  # deferred: cdr --help stays fast
    from pipeline.storage.store import open_store  # deferred: cdr --help stays fast

    config = config_of(args)
    assert config.store
    was = unlock(open_store(config.store), force=args.force)
    text = f"unlocked {config.store}: " + (was.describe() if was else "it held no lease")
    emit(args, {"store": config.store, "held_by": was.run_id if was else None}, text)
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    """Every check, one line each; exit 1 when one the store cannot run with fails."""
    from pipeline.publish.doctor import examine  # deferred: cdr --help stays fast
    from pipeline.storage.store import open_store  # deferred: cdr --help stays fast

    config = config_of(args)
    assert config.store
    found = examine(open_store(config.store), config.retention_days)
    lines = [f"store {config.store}", *(f.line() for f in found)]
    emit(args, {"store": config.store, "checks": [asdict(f) for f in found]}, "\n".join(lines))
    return 1 if any(f.fatal and not f.ok for f in found) else 0


def cmd_vacuum(args: argparse.Namespace) -> int:
    """Remove the files no version within the retention needs (``--dry-run``: list them)."""
    from pipeline.publish.vacuum import vacuum  # deferred: cdr --help stays fast
    from pipeline.storage.store import open_store  # deferred: cdr --help stays fast

    config = config_of(args)
    assert config.store
    days = config.retention_days if args.retain_days is None else args.retain_days
    if days > config.retention_days:
        raise StageError(
            f"--retain-days {days} is longer than the retention_days of {args.config} "
            f"({config.retention_days}): the tables keep their logs only that long; "
            "raise retention_days first (the next run sets it on every table)"
        )
    res = vacuum(open_store(config.store), days, dry_run=args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    lines = [res.summary(verb, config.store), *(g.line() for g in res.groups)]
    out = {
        "removed": res.removed,
        "why": [g.to_json() for g in res.groups],
        "kept": res.kept,
        "horizon": res.horizon,
        "dry_run": args.dry_run,
    }
    emit(args, out, "\n".join(lines))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    """Every whole-table check of a published date, one line each; exit 1 when one fails."""
    from pipeline.app.verify import verify  # deferred: cdr --help stays fast
    from pipeline.storage.lake import Lake  # deferred: cdr --help stays fast
    from pipeline.storage.store import open_store  # deferred: cdr --help stays fast

    config = config_of(args)
    assert config.store
    found = verify(config, Lake(open_store(config.store)), args.date)
    failed = [f for f in found if not f.ok]
    lines = [f"verify {args.date} (whole tables, at the versions its runs row names):"]
    for f in found:
        want = "" if f.expected is None else f" (must be {f.expected})"
        mark = "ok" if f.ok else "FAILED"
        lines.append(f"  {f.table:<16} {f.check:<24} {f.observed}{want}  {mark}")
    lines.append(f"{len(found)} check(s), {len(failed)} failed")
    emit(args, {"date": args.date, "checks": [f.to_json() for f in found]}, "\n".join(lines))
    return 1 if failed else 0
