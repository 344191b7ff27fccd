"""``cdr check-export``: a date's exports checked without Spark, one line per manifest, then
a summary; exit 1 when one has a problem (docs/operations.md#checking-an-export).
"""

from __future__ import annotations

import argparse
import time

from pipeline.app.cli_args import config_of, emit


def cmd_check_export(args: argparse.Namespace) -> int:
    """Every manifest of ``--date``, checked as the run checks it (``pipeline.ingest.check``)."""
    from pipeline.ingest.check import check_date  # deferred: cdr --help stays fast
    from pipeline.storage.store import open_store  # deferred: cdr --help stays fast

    started = time.monotonic()
    config = config_of(args)
    assert config.store
    checks = check_date(config, open_store(config.store), args.date, args.records)
    bad = [c for c in checks if c.problem is not None]
    seconds = time.monotonic() - started
    summary = (
        f"{args.date}: {len(checks)} manifest(s) checked in {seconds:.1f}s, "
        f"{len(bad)} with a problem"
    )
    result = {
        "date": args.date.isoformat(),
        "store": config.store,
        "ok": not bad,
        "seconds": round(seconds, 3),
        "exports": [c.to_dict() for c in checks],
    }
    emit(args, result, "\n".join([*(c.line() for c in checks), summary]))
    return 1 if bad else 0
