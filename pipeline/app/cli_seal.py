"""``cdr manifest``: seal a night's exports from the objects a CDC tool wrote
(docs/sealing.md)."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

from pipeline.app.cli_args import config_of, emit
from pipeline.core.errors import StageError


def _now(text: str | None) -> datetime:
    if text is None:
        return datetime.now(UTC)
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise StageError(f"--now {text!r} is not an RFC 3339 time") from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def cmd_manifest(args: argparse.Namespace) -> int:
    """Seal each export and print a line for it; exit 1 when one is still waiting."""
    from pipeline.ingest.seal import seal_date  # deferred: cdr --help stays fast
    from pipeline.storage.store import open_store  # deferred: cdr --help stays fast

    config = config_of(args)
    assert config.store
    done = seal_date(
        config,
        open_store(config.store),
        args.date,
        _now(args.now),
        (args.replica,) if args.replica else (),
        (args.table,) if args.table else (),
        late=args.late,
        by_hand=args.seal,
        dry_run=args.dry_run,
    )
    if not done:
        raise StageError(
            f"no replica of {args.config} has a source: nothing to seal (docs/sealing.md)"
        )
    result: dict[str, Any] = {
        "date": args.date,
        "exports": [
            {**{k: v for k, v in vars(s).items() if k != "dt"}, "files": list(s.files)}
            for s in done
        ],
    }
    emit(args, result, "\n".join(s.line() for s in done))
    return 1 if any(s.status == "waiting" for s in done) else 0
