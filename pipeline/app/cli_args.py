"""The arguments of ``cdr``: its parser, and what a command makes of them (the config, a
run's options) and says back (a line for people, JSON for machines).

At its top this imports only the standard library and the package's errors: ``cdr --help``
builds the parser and nothing more.
"""

from __future__ import annotations

import argparse
import json
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.core.errors import CdrError

if TYPE_CHECKING:
    from pipeline.core.config import Config
    from pipeline.stages import RunOptions
    from pipeline.storage.workpath import WorkPath

#: the parser's description, the command line's first line
DESCRIPTION = "``cdr``: the command line for everything the DAGs do (docs/operations.md)."
#: every command's ``--config``: the file ``cdr init`` writes, where the user works
CONFIG_HELP = "the config file (default: cdr.yaml in the current folder)"


def _date(text: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a date (YYYY-MM-DD)") from None


def _work(text: str) -> WorkPath:
    """``--work-dir``: a local folder (made absolute: the stages' processes agree on it),
    a ``file://`` or an ``s3://`` URI."""
    from pipeline.storage.workpath import WorkPath  # deferred: cdr --help stays fast

    try:
        return WorkPath.of(text)
    except CdrError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, default=Path("cdr.yaml"), help=CONFIG_HELP)
    p.add_argument("--date", required=True, type=_date, help="the logical date D (YYYY-MM-DD)")
    p.add_argument("--store", help="override the config's store (s3://B/P or file:///P)")
    p.add_argument("--now", help="the run's clock, RFC 3339 (default: D+1T00:00:00Z; env CDR_NOW)")
    p.add_argument(
        "--work-dir",
        type=_work,
        default=".cdr-work",
        help="where the stages of a run hand data to each other: a local folder (default "
        ".cdr-work; on a cluster, one every node mounts) or s3://BUCKET/PREFIX",
    )
    p.add_argument(
        "--run-id",
        help="the run's id: a new one for ingest or run (default: date and clock); the "
        "run a later stage continues (default: the date's latest ingested run)",
    )
    p.add_argument(
        "--allow-missing-exports",
        action="store_true",
        help="run even when a configured replica has no export for a table",
    )
    p.add_argument(
        "--accept-late-exports",
        action="store_true",
        help="go on when an earlier date's export arrived or changed after its run "
        "(without its events; the run records it as accepted)",
    )
    p.add_argument("--master", help="Spark master (default local[*]; env CDR_SPARK_MASTER)")


def _plan_options(p: argparse.ArgumentParser) -> None:
    """Options fixed at ingest for the whole run (the later stages read them back)."""
    p.add_argument(
        "--tables",
        type=lambda s: tuple(t.strip() for t in s.split(",") if t.strip()),
        help="comma-separated subset of the config's tables (the tables their foreign keys "
        "reference are added); default: all",
    )
    p.add_argument(
        "--on-divergence", choices=("fail", "warn"), help="override the config's on_divergence"
    )
    p.add_argument(
        "--accept-alert",
        action="store_true",
        help="publish past a fired alert whose config says on: fail (it is reported as a warning)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="ingest, resolve and validate, and publish nothing",
    )
    p.add_argument(
        "--no-data-docs",
        dest="data_docs",
        action="store_false",
        help="keep the validation results but build no Data Docs pages (faster)",
    )
    p.add_argument(
        "--backfill",
        action="store_true",
        help="one date of a backfill: the published dates after it run next, in order "
        "(else a date with later published dates is refused; the DAG's backfill runs)",
    )


def _stage_commands(sub: Any) -> None:
    """``cdr run`` and the stages it is made of (the DAG's tasks)."""
    for name, help_ in (
        ("run", "ingest, resolve, validate and publish one date"),
        ("ingest", "find, verify and stage the exports of one date"),
        ("resolve", "resolve the staged events on Spark"),
        ("validate", "run the quality suites and gates on the resolved run"),
        ("publish", "publish the validated run (or only its logs if it failed)"),
        ("finish", "end the run, published or failed: release its lease on the store"),
    ):
        stage = sub.add_parser(name, help=help_)
        _run_options(stage)
        if name in ("run", "ingest"):
            _plan_options(stage)
        if name == "run":
            stage.add_argument(
                "--then-later",
                action="store_true",
                help="then run every later published date again, in order (a rerun or "
                "backfill of a date that later dates were built on)",
            )


def _global_options(parser: argparse.ArgumentParser) -> None:
    """Before the command: how it logs (docs/operations.md#progress)."""
    parser.add_argument("--log-format", choices=("text", "json"), default="text")
    loud = parser.add_mutually_exclusive_group()
    loud.add_argument("-v", "--verbose", action="store_true")
    loud.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no progress lines and no info lines on stderr: warnings, errors and the "
        "result only (docs/operations.md#progress)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cdr", description=DESCRIPTION)
    _global_options(parser)
    sub = parser.add_subparsers(dest="command", required=True)
    _stage_commands(sub)
    _store_commands(sub)
    _check_export_options(
        sub.add_parser(
            "check-export",
            help="check every manifest of a date as a run does, without Spark, in seconds",
        )
    )
    _schema_options(sub)
    q = sub.add_parser("quarantine", help="list, retry or dismiss quarantined events")
    q.add_argument("action", choices=("list", "retry", "dismiss"))
    q.add_argument("--config", type=Path, default=Path("cdr.yaml"), help=CONFIG_HELP)
    q.add_argument("--store", help="override the config's store")
    q.add_argument("--table", required=True)
    q.add_argument("--event-id", help="the event (retry and dismiss need it)")
    q.add_argument("--status", choices=("open", "resolved", "expired", "dismissed"))
    _decide_options(
        sub.add_parser("decide", help="decide one conflict by hand (or withdraw a decision)")
    )
    _repair_options(
        sub.add_parser(
            "repair", help="the statements that bring one replica to a date's converged state"
        )
    )
    _whatif_options(sub)
    _report_options(sub)
    _generate_options(
        sub.add_parser("generate", help="write seeded synthetic exports to the store")
    )
    _demo_options(
        sub.add_parser("demo", help="embedded S3 server + generated exports + a full run")
    )
    _init_options(sub.add_parser("init", help="write a first cdr.yaml from a PostgreSQL schema"))
    sub.add_parser(
        "jvm-archive",
        help="build the class-data archive that starts Spark's JVM faster (make does it)",
    )
    j = sub.add_parser(
        "jars", help="the locked JVM packages (Delta Lake, s3a): fetch them, or print their paths"
    )
    j.add_argument(
        "action",
        choices=("fetch", "path", "list"),
        help="fetch: with Maven, checked against jars.lock (make does it); path: the class "
        "path (for --driver-class-path); list: comma-separated (for --jars, spark.jars)",
    )
    _manifest_options(
        sub.add_parser("manifest", help="seal a date's exports from what a CDC tool wrote")
    )
    return parser


def _check_export_options(c: argparse.ArgumentParser) -> None:
    """``cdr check-export`` (docs/operations.md#checking-an-export)."""
    c.add_argument("--config", type=Path, default=Path("cdr.yaml"), help=CONFIG_HELP)
    c.add_argument("--store", help="override the config's store")
    c.add_argument("--date", required=True, type=_date)
    c.add_argument(
        "--records",
        type=int,
        default=100,
        metavar="N",
        help="the records of each file typed by the run's guards (default 100); every "
        "file's lines are counted and hashed whole",
    )


def _manifest_options(p: argparse.ArgumentParser) -> None:
    """docs/sealing.md"""
    p.add_argument("--config", type=Path, default=Path("cdr.yaml"), help=CONFIG_HELP)
    p.add_argument("--store", help="override the config's store")
    p.add_argument("--date", required=True, type=_date, help="the date D (YYYY-MM-DD)")
    p.add_argument("--replica", help="one replica (default: every replica with a source)")
    p.add_argument("--table", help="one table (default: every table)")
    p.add_argument(
        "--late",
        action="store_true",
        help="add objects that arrived after D was sealed (never drops a listed file)",
    )
    p.add_argument("--seal", action="store_true", help="seal D now, whatever its layout's rule")
    p.add_argument("--dry-run", action="store_true", help="say what would be sealed; write nothing")
    p.add_argument("--now", help="the clock of grace_hours, RFC 3339 (default: now)")


def _store_commands(sub: Any) -> None:
    """The commands that look after a store: vacuum, doctor, unlock."""
    v = sub.add_parser(
        "vacuum",
        help="remove the published tables' files that no version within the retention needs",
    )
    v.add_argument("--config", type=Path, default=Path("cdr.yaml"), help=CONFIG_HELP)
    v.add_argument("--store", help="override the config's store")
    v.add_argument(
        "--retain-days",
        type=int,
        metavar="N",
        help="a window shorter than the config's retention_days (the default)",
    )
    v.add_argument("--dry-run", action="store_true", help="list the files; remove nothing")
    c = sub.add_parser(
        "verify",
        help="recompute every whole-table check of a published date (counts, keys, "
        "snapshot = live state, unique, foreign keys) at the versions its runs row names",
    )
    c.add_argument("--config", type=Path, default=Path("cdr.yaml"), help=CONFIG_HELP)
    c.add_argument("--store", help="override the config's store")
    c.add_argument("--date", required=True, type=date.fromisoformat)
    # every check reads the whole tables (the one mode): --full is taken, for the scripts
    # that once had to name it, and shown nowhere
    c.add_argument("--full", action="store_true", help=argparse.SUPPRESS)
    d = sub.add_parser(
        "doctor", help="check a store: credentials, atomic create, the tables' log retention"
    )
    d.add_argument("--config", type=Path, default=Path("cdr.yaml"), help=CONFIG_HELP)
    d.add_argument("--store", help="override the config's store")
    u = sub.add_parser("unlock", help="break the store's lease (a run that is gone holds it)")
    u.add_argument("--config", type=Path, default=Path("cdr.yaml"), help=CONFIG_HELP)
    u.add_argument("--store", help="override the config's store")
    u.add_argument(
        "--force",
        action="store_true",
        help="break a lease that has not expired (its run is known to be gone); that run, "
        "if it still runs, stops at its next commit",
    )


def _schema_options(sub: Any) -> None:
    """docs/exports.md#cdr-schema"""
    s = sub.add_parser(
        "schema", help="the JSON Schema of each table's event records, typed by its columns"
    )
    s.add_argument("--config", type=Path, default=Path("cdr.yaml"), help=CONFIG_HELP)
    s.add_argument(
        "--table", action="append", default=[], help="only this table (repeatable; default: all)"
    )
    s.add_argument(
        "--out",
        type=Path,
        help="write DIR/<table>.schema.json (default: print one table's; several tables go "
        "to schemas/ beside the config)",
    )


def _whatif_options(sub: Any) -> None:
    """docs/operations.md#what-if"""
    w = sub.add_parser("whatif", help="D's published inputs under another config, compared")
    w.add_argument("--config", required=True, type=Path, help="the other configuration")
    w.add_argument("--date", required=True, type=_date)
    w.add_argument("--store", help="override the config's store")
    w.add_argument("--name", help="the comparison's name (default: the config file's stem)")
    w.add_argument("--work-dir", type=_work, default=".cdr-work")
    w.add_argument("--master", help="Spark master (default local[*]; env CDR_SPARK_MASTER)")


def _report_options(sub: Any) -> None:
    """docs/operations.md#cdr-report"""
    r = sub.add_parser(
        "report", help="a date's published run: a Markdown summary, the Conflicts page"
    )
    r.add_argument("--config", type=Path, default=Path("cdr.yaml"), help=CONFIG_HELP)
    r.add_argument("--store", help="override the config's store")
    r.add_argument("--date", required=True, type=_date, help="the published date D (YYYY-MM-DD)")
    r.add_argument(
        "--html",
        type=Path,
        metavar="FILE",
        help="write the Conflicts page to FILE (one file: it opens offline)",
    )
    r.add_argument(
        "--markdown",
        action="store_true",
        help="print the Markdown summary (the default without --html)",
    )


def _decide_options(d: argparse.ArgumentParser) -> None:
    """docs/rules.md#manual-decisions"""
    d.add_argument("--config", type=Path, default=Path("cdr.yaml"), help=CONFIG_HELP)
    d.add_argument("--store", help="override the config's store")
    d.add_argument("--conflict-id", help="the conflict, from the conflict log's conflict_id")
    d.add_argument("--take", choices=("local", "remote"), help="the version that wins")
    d.add_argument("--row", help="the row to write instead, a JSON object of the table's columns")
    d.add_argument("--why", help="the reason, kept with the decision (required to decide)")
    d.add_argument("--by", default=None, help="who decides (default: the user running it)")
    d.add_argument("--withdraw", metavar="DECISION_ID", help="withdraw a decision")
    d.add_argument(
        "--rerun",
        action="store_true",
        help="run the decision's date again, then every later published date, in order",
    )
    d.add_argument("--work-dir", type=_work, default=".cdr-work")
    d.add_argument("--master", help="Spark master (default local[*]; env CDR_SPARK_MASTER)")


def _repair_options(r: argparse.ArgumentParser) -> None:
    """docs/operations.md#repair"""
    from pipeline.app.statements import DIALECTS  # deferred: loaded with the parser, not the CLI

    r.add_argument("--config", type=Path, default=Path("cdr.yaml"), help=CONFIG_HELP)
    r.add_argument("--store", help="override the config's store")
    r.add_argument("--date", required=True, type=_date, help="a published date")
    r.add_argument("--replica", required=True, help="the replica to repair")
    r.add_argument("--dialect", required=True, choices=DIALECTS)
    r.add_argument("--table", action="append", default=[], help="only this table (repeatable)")
    r.add_argument("--keyspace", help="cql: the keyspace of the replica's tables")
    out = r.add_mutually_exclusive_group()
    out.add_argument("--out", type=Path, help="write the statements to this file")
    out.add_argument("--apply", action="store_true", help="run them on the replica (--dsn)")
    r.add_argument(
        "--dsn",
        help="with --apply: a libpq connection string (postgres), or host[:port],... (cql)",
    )
    r.add_argument(
        "--dry-run",
        action="store_true",
        help="write nothing: print the statements, or with --apply run them and roll back "
        "(cql: read the rows back), naming the rows that changed since the report",
    )


def _generate_options(g: argparse.ArgumentParser) -> None:
    g.add_argument("--config", type=Path, default=Path("cdr.yaml"), help=CONFIG_HELP)
    g.add_argument("--date", required=True, type=_date)
    g.add_argument("--store")
    g.add_argument(
        "--events",
        type=int,
        default=10_000,
        help="event records across all exports (each event is exported by its "
        "origin and by the replicas that applied it)",
    )
    g.add_argument(
        "--conflict-rate",
        type=_share,
        default=None,
        help="share of keys written by several replicas (default 0.02)",
    )
    g.add_argument(
        "--skew",
        type=_share,
        default=None,
        help="share of the changes to existing keys that go to the newest tenth of the keys, "
        "the rest spread over all of them; 0 is uniform (default 0.5)",
    )
    g.add_argument(
        "--late-rate",
        type=float,
        default=0.02,
        help="share of events made the day before and exported late",
    )
    g.add_argument("--delete-rate", type=float, default=0.1, help="share of DELETEs")
    g.add_argument(
        "--update-share",
        type=_share,
        default=0.5,
        help="share of the touched keys that exist as the day starts (default 0.5)",
    )
    g.add_argument(
        "--full-rows",
        action="store_true",
        help="an UPDATE carries its whole row, as PostgreSQL's logical replication sends it",
    )
    g.add_argument(
        "--clock-offset",
        action="append",
        default=[],
        metavar="REPLICA=SECONDS",
        help="a replica whose clock is off (e.g. r1=-90: 90 s behind); repeatable",
    )
    g.add_argument(
        "--base-rows",
        type=int,
        default=None,
        help="rows of a base snapshot to write first (default: none)",
    )
    g.add_argument("--format", choices=("jsonl", "parquet"), default="jsonl")
    g.add_argument("--files", type=int, default=1, help="files per export")
    g.add_argument("--seed", type=int, default=1)


def _init_options(i: argparse.ArgumentParser) -> None:
    """docs/configuration.md#starting-from-a-postgresql-schema-cdr-init"""
    i.add_argument(
        "--from-postgres",
        required=True,
        metavar="DSN",
        help="a libpq connection string or URI of one replica (read in a read-only transaction)",
    )
    i.add_argument(
        "--tables",
        action="append",
        default=[],
        help="the tables to write, comma-separated or repeated (default: every table of --schema)",
    )
    i.add_argument("--schema", default="public", help="the schema the tables are in (public)")
    i.add_argument("--out", type=Path, default=Path("cdr.yaml"), help="the file to write")
    i.add_argument("--force", action="store_true", help="replace --out if it exists")
    i.add_argument("--store", help="the store to write in the file (s3://B/P or file:///P)")
    i.add_argument(
        "--replicas",
        help="the replicas' ids, comma-separated (system ids 1..n in that order); "
        "default: placeholders to rename",
    )
    i.add_argument(
        "--skip-unsupported",
        action="store_true",
        help="leave out (in a comment) the columns of a type the config cannot hold, "
        "rather than refuse",
    )


def _share(text: str) -> float:
    """A share, from 0 to 1."""
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text} is not a share between 0 and 1")
    return value


def _demo_options(d: argparse.ArgumentParser) -> None:
    d.add_argument(
        "--dir",
        type=Path,
        default=Path(".cdr-demo"),
        help="where the demo keeps its config, work folder and a copy of the store",
    )
    d.add_argument("--events", type=int, default=30_000)
    d.add_argument("--seed", type=int, default=7)
    d.add_argument(
        "--serve",
        action="store_true",
        help="keep the S3 server running after the run, until Ctrl-C",
    )


def config_of(args: argparse.Namespace) -> Config:
    """The config ``--config`` names, with ``--store`` over its store."""
    from pipeline.core.config_load import load_config  # deferred: cdr --help stays fast

    return load_config(args.config, args.store)


def run_options(args: argparse.Namespace) -> RunOptions:
    """A run's options, from a stage command's arguments."""
    from pipeline.stages import RunOptions  # deferred: cdr --help stays fast

    return RunOptions(
        work_dir=args.work_dir,
        now=args.now,
        run_id=args.run_id,
        allow_missing_exports=args.allow_missing_exports,
        accept_late_exports=args.accept_late_exports,
        master=args.master,
        tables=getattr(args, "tables", None),
        on_divergence=getattr(args, "on_divergence", None),
        accept_alert=getattr(args, "accept_alert", False),
        dry_run=getattr(args, "dry_run", False),
        data_docs=getattr(args, "data_docs", True),
        backfill=getattr(args, "backfill", False),
    )


def emit(args: argparse.Namespace, result: dict[str, Any], text: str) -> None:
    """A command's result: ``text`` for people, or ``result`` as JSON (``--log-format json``)."""
    if args.log_format == "json":
        print(json.dumps(result, default=str))
    else:
        print(text)
