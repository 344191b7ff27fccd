"""``cdr``: the command line for everything the DAGs do (docs/operations.md).

Exit status 0 on success; 1 with a one-line reason when the run fails (bad export, error
resolver, failed gate); 2 for a usage or config mistake. ``--log-format json`` writes
log lines and the final result as JSON for machines. The stages' progress lines go to
stderr (:mod:`pipeline.core.progress`); ``--quiet`` silences them and the info lines.

The parser is :mod:`pipeline.app.cli_args`; the commands are grouped by concern:
:mod:`~pipeline.app.cli_run` (a run and its stages), :mod:`~pipeline.app.cli_store` (a
store's care), :mod:`~pipeline.app.cli_review` (acting on a run's outcome) and
:mod:`~pipeline.app.cli_setup` (a place to try it). Each defers what it needs until it
runs, so that ``cdr --help`` stays fast.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from pipeline.app.cli_args import build_parser
from pipeline.app.cli_check import cmd_check_export
from pipeline.app.cli_inputs import cmd_schema
from pipeline.app.cli_review import (
    cmd_decide,
    cmd_quarantine,
    cmd_repair,
    cmd_report,
    cmd_whatif,
)
from pipeline.app.cli_run import cmd_stage
from pipeline.app.cli_seal import cmd_manifest
from pipeline.app.cli_setup import cmd_demo, cmd_generate, cmd_init, cmd_jars, cmd_jvm_archive
from pipeline.app.cli_store import cmd_doctor, cmd_unlock, cmd_vacuum, cmd_verify
from pipeline.core.errors import CdrError, ConfigError
from pipeline.core.progress import Progress, installed


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(
            {
                "ts": round(record.created, 3),
                "level": record.levelname.lower(),
                "logger": record.name,
                "message": record.getMessage(),
            }
        )


def _setup_logging(fmt: str, verbose: bool, quiet: bool = False) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO)
    for noisy in (
        "py4j",
        "botocore",
        "boto3",
        "urllib3",
        "s3transfer",
        "great_expectations",
        "werkzeug",
        "moto",
    ):
        logging.getLogger(noisy).setLevel(logging.WARNING)


#: the commands that are not a stage of a run
COMMANDS = {
    "generate": cmd_generate,
    "demo": cmd_demo,
    "unlock": cmd_unlock,
    "doctor": cmd_doctor,
    "vacuum": cmd_vacuum,
    "verify": cmd_verify,
    "check-export": cmd_check_export,
    "quarantine": cmd_quarantine,
    "decide": cmd_decide,
    "repair": cmd_repair,
    "whatif": cmd_whatif,
    "report": cmd_report,
    "jars": cmd_jars,
    "jvm-archive": cmd_jvm_archive,
    "manifest": cmd_manifest,
    "init": cmd_init,
    "schema": cmd_schema,
}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _setup_logging(args.log_format, args.verbose, args.quiet)
    try:
        with installed(None if args.quiet else _progress()):
            return COMMANDS.get(args.command, cmd_stage)(args)
    except ConfigError as e:
        _fail(args, e, 2)
        return 2
    except CdrError as e:
        _fail(args, e, 1)
        return 1


def _progress() -> Progress:
    """The progress lines of a command (docs/operations.md#progress): log lines of the
    logger ``cdr.progress`` (JSON lines with ``--log-format json``), throttled with Spark's
    tasks on a terminal, one per step elsewhere (Airflow's log)."""
    return Progress(logging.getLogger("cdr.progress").info, terminal=sys.stderr.isatty())


def _fail(args: argparse.Namespace, e: Exception, code: int) -> None:
    if args.log_format == "json":
        print(json.dumps({"error": type(e).__name__, "message": str(e), "exit": code}))
    else:
        print(f"cdr {args.command}: {type(e).__name__}: {e}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
