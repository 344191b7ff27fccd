"""``cdr``: the command line for everything the DAGs do (docs/operations.md).

Exit status 0 on success; 1 with a one-line reason when the run fails (bad export, error
resolver, failed gate); 2 for a usage or config mistake. ``--log-format json`` writes
log lines and the final result as JSON for machines.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import time
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.core.errors import CdrError, ConfigError

if TYPE_CHECKING:
    from pipeline.core.report import RunReport
    from pipeline.storage.workpath import WorkPath

log = logging.getLogger("cdr")


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


def _setup_logging(fmt: str, verbose: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
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


def _date(text: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a date (YYYY-MM-DD)") from None


def _work(text: str) -> WorkPath:
    """``--work-dir``: a local folder (made absolute: the stages' processes agree on it),
    a ``file://`` or an ``s3://`` URI."""
    from pipeline.storage.workpath import WorkPath

    try:
        return WorkPath.of(text)
    except CdrError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, type=Path, help="cdr.yaml")
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cdr", description=__doc__.split("\n")[0])
    parser.add_argument("--log-format", choices=("text", "json"), default="text")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    _stage_commands(sub)
    _store_commands(sub)
    q = sub.add_parser("quarantine", help="list, retry or dismiss quarantined events")
    q.add_argument("action", choices=("list", "retry", "dismiss"))
    q.add_argument("--config", required=True, type=Path)
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
    w = sub.add_parser("whatif", help="D's published inputs under another config, compared")
    w.add_argument("--config", required=True, type=Path, help="the other configuration")
    w.add_argument("--date", required=True, type=_date)
    w.add_argument("--store", help="override the config's store")
    w.add_argument("--name", help="the comparison's name (default: the config file's stem)")
    w.add_argument("--work-dir", type=_work, default=".cdr-work")
    w.add_argument("--master", help="Spark master (default local[*]; env CDR_SPARK_MASTER)")
    _generate_options(
        sub.add_parser("generate", help="write seeded synthetic exports to the store")
    )
    _demo_options(
        sub.add_parser("demo", help="embedded S3 server + generated exports + a full run")
    )
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
    return parser


def _store_commands(sub: Any) -> None:
    """The commands that look after a store: vacuum, doctor, unlock."""
    v = sub.add_parser(
        "vacuum",
        help="remove the published tables' files that no version within the retention needs",
    )
    v.add_argument("--config", required=True, type=Path)
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
    c.add_argument("--config", required=True, type=Path)
    c.add_argument("--store", help="override the config's store")
    c.add_argument("--date", required=True, type=date.fromisoformat)
    c.add_argument(
        "--full", action="store_true", help="over the whole tables (the only mode; the default)"
    )
    d = sub.add_parser(
        "doctor", help="check a store: credentials, atomic create, the tables' log retention"
    )
    d.add_argument("--config", required=True, type=Path)
    d.add_argument("--store", help="override the config's store")
    u = sub.add_parser("unlock", help="break the store's lease (a run that is gone holds it)")
    u.add_argument("--config", required=True, type=Path)
    u.add_argument("--store", help="override the config's store")
    u.add_argument(
        "--force",
        action="store_true",
        help="break a lease that has not expired (its run is known to be gone); that run, "
        "if it still runs, stops at its next commit",
    )


def _decide_options(d: argparse.ArgumentParser) -> None:
    """docs/rules.md#manual-decisions"""
    d.add_argument("--config", required=True, type=Path)
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
    from pipeline.app.statements import DIALECTS

    r.add_argument("--config", required=True, type=Path)
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
    g.add_argument("--config", required=True, type=Path)
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


def _load(args: argparse.Namespace) -> Any:
    from pipeline.core.config import load_config

    return load_config(args.config, args.store)


def _options(args: argparse.Namespace) -> Any:
    from pipeline.stages import RunOptions

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


def _emit(args: argparse.Namespace, result: dict[str, Any], text: str) -> None:
    if args.log_format == "json":
        print(json.dumps(result, default=str))
    else:
        print(text)


def _cmd_stage(args: argparse.Namespace) -> int:
    from pipeline import stages
    from pipeline.app.report import format_report
    from pipeline.core.report import Status
    from pipeline.storage.context import RunContext

    config = _load(args)
    opts = _options(args)
    started = time.monotonic()
    if args.command == "run":
        from dataclasses import replace

        from pipeline.storage.context import new_run_id

        opts = replace(opts, run_id=opts.run_id or new_run_id(args.date))
        try:
            if args.then_later:
                *before, report = stages.run_then_later(config, args.date, opts)
                for r in before:
                    print(f"{r.dt}: {r.status} (run {r.run_id})", file=sys.stderr)
            else:
                report = stages.run(config, args.date, opts)
        except CdrError:
            if not opts.dry_run:
                _print_failed_report(args, config, opts.run_id)
            raise
        if report.status == Status.DRY_RUN:
            ctx = RunContext.load(opts.work_dir, args.date, report.run_id)
            where = "\ndry run: nothing published"
            if ctx.data_docs:
                where += f"\n  Data Docs: {(ctx.validation / 'data_docs/index.html').as_uri()}"
            _emit(args, report.to_dict(), format_report(report) + where)
        else:
            _emit(args, report.to_dict(), format_report(report) + _where(config, report))
    elif args.command == "ingest":
        ctx = stages.ingest(config, args.date, opts)
        stages.hand_off(config, ctx)  # to the run's next task
        _emit(
            args,
            {"run_id": ctx.run_id, "work": str(ctx.work)},
            f"ingested {args.date} into {ctx.work} (run {ctx.run_id})",
        )
    else:
        ctx = RunContext.load(opts.work_dir, args.date, opts.run_id)
        try:
            _one_stage(args, config, ctx)
        finally:
            if args.command in ("resolve", "validate"):  # to the run's next task, or retry
                stages.hand_off(config, ctx)
    log.info("done in %.1fs", time.monotonic() - started)
    return 0


def _one_stage(args: argparse.Namespace, config: Any, ctx: Any) -> None:
    """``cdr resolve``, ``validate``, ``publish`` or ``finish``: one stage of a run ingest
    started (the DAG's tasks)."""
    from pipeline import stages
    from pipeline.app.report import format_report
    from pipeline.spark.session import get_spark

    opts = _options(args)
    if args.command == "resolve":
        spark = get_spark(opts.master, small=stages.small_run(ctx))
        with stages.naming_a_lost_lease(config, ctx):
            summary = stages.resolve(config, ctx, spark)
        _emit(args, summary.to_dict(), f"resolved {args.date}: {ctx.resolved}")
    elif args.command == "finish":
        stages.finish(config, ctx)
        _emit(args, {"run_id": ctx.run_id}, f"finished run {ctx.run_id} of {args.date}")
    elif args.command == "validate":  # Spark only for a run resolved without measures
        verdict = stages.validate(config, ctx, lambda: get_spark(opts.master))
        if ctx.data_docs:
            docs = ctx.validation / "data_docs" / "index.html"
            print(f"Data Docs: {docs.as_uri()}", file=sys.stderr)
        if not verdict.passed:
            raise CdrError("; ".join(verdict.failures))
        _emit(args, {"passed": True}, f"validated {args.date}: passed")
    else:
        with stages.naming_a_lost_lease(config, ctx):
            report = stages.publish(config, ctx, lambda: get_spark(opts.master, small=True))
        _emit(args, report.to_dict(), format_report(report) + _where(config, report))


def _print_failed_report(args: argparse.Namespace, config: Any, run_id: str) -> None:
    """After a failed ``cdr run``, show the counts the run got to, if any."""
    from pipeline.app.report import format_report
    from pipeline.core import layout
    from pipeline.core.report import RunReport, Status
    from pipeline.storage.store import open_store

    try:
        store = open_store(config.store)
        key = layout.run_report(args.date, run_id)
        if store.exists(key) and args.log_format == "text":
            report = RunReport.from_json(store.read_bytes(key))
            if report.status == Status.FAILED:
                print(format_report(report), file=sys.stderr)
                docs = report.validation.data_docs
                if docs:
                    print(f"Data Docs: {config.store}/{docs}", file=sys.stderr)
    except CdrError:
        pass


def _where(config: Any, report: RunReport) -> str:
    from pipeline.core import layout

    lines = ["", f"published to {config.store} (Delta tables):"]
    versions = report.versions or {}
    for t, s in report.tables.items():
        path = layout.table_path(t, layout.SNAPSHOT)
        version = versions.get(path)
        at = f"version {version}" if version is not None else "not moved: an earlier date"
        lines.append(f"  {t}: {path} ({at}, {s.totals().rows} rows)")
        if s.history:
            h, path = s.history, layout.table_path(t, layout.HISTORY)
            lines.append(
                f"  {t}: {path} (version {versions.get(path)}, {h['rows']} versions, "
                f"{h['new']} new, {h['late']} late)"
            )
    dt = date.fromisoformat(report.dt)
    key = layout.run_report(dt, report.run_id)
    lines.append(f"  report: {key} (and {layout.date_report(dt)})")
    docs = report.validation.data_docs
    if docs:
        lines.append(f"  Data Docs: {docs}")
    if report.cdc is not None:
        lines.append(f"  CDC log: {layout.cdc_log_path('<table>')} (dt={report.dt})")
    return "\n".join(lines)


def _clock_offsets(given: list[str], replicas: tuple[str, ...]) -> dict[str, int]:
    """``--clock-offset REPLICA=SECONDS``, each naming a configured replica."""
    out = {}
    for text in given:
        name, _, seconds = text.partition("=")
        if name not in replicas or not re.fullmatch(r"[+-]?\d+", seconds.strip()):
            raise ConfigError(
                "--clock-offset",
                [f"{text!r} is not REPLICA=SECONDS with one of: {', '.join(replicas)}"],
            )
        out[name] = int(seconds)
    return out


def _cmd_generate(args: argparse.Namespace) -> int:
    from pipeline.app.generate import GenerateOptions, generate
    from pipeline.core.config import load_config
    from pipeline.storage.store import open_store

    config = load_config(args.config, args.store)
    assert config.store
    given = {"conflict_rate": args.conflict_rate, "skew": args.skew}  # unset: the defaults
    opts = GenerateOptions(
        **{k: v for k, v in given.items() if v is not None},
        events=args.events,
        late_rate=args.late_rate,
        delete_rate=args.delete_rate,
        update_share=args.update_share,
        full_rows=args.full_rows,
        base_rows=args.base_rows,
        fmt=args.format,
        files=args.files,
        seed=args.seed,
        clock_offsets=_clock_offsets(args.clock_offset, config.replica_ids),
    )
    stats = generate(config, open_store(config.store), args.date, opts)
    _emit(
        args, stats, f"generated {stats['records']} event records for {args.date} in {config.store}"
    )
    return 0


def _cmd_unlock(args: argparse.Namespace) -> int:
    from pipeline.storage.lease import unlock
    from pipeline.storage.store import open_store

    config = _load(args)
    assert config.store
    was = unlock(open_store(config.store), force=args.force)
    text = f"unlocked {config.store}: " + (was.describe() if was else "it held no lease")
    _emit(args, {"store": config.store, "held_by": was.run_id if was else None}, text)
    return 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    """Every check, one line each; exit 1 when one the store cannot run with fails."""
    from dataclasses import asdict

    from pipeline.publish.doctor import examine
    from pipeline.storage.store import open_store

    config = _load(args)
    assert config.store
    found = examine(open_store(config.store), config.retention_days)
    lines = [f"store {config.store}", *(f.line() for f in found)]
    _emit(args, {"store": config.store, "checks": [asdict(f) for f in found]}, "\n".join(lines))
    return 1 if any(f.fatal and not f.ok for f in found) else 0


def _cmd_vacuum(args: argparse.Namespace) -> int:
    from pipeline.core.errors import StageError
    from pipeline.publish.vacuum import vacuum
    from pipeline.storage.store import open_store

    config = _load(args)
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
    lines = [f"{verb} {res.files} file(s) from {config.store}/published"]
    lines += [f"  {path}: {len(keys)}" for path, keys in res.removed.items()]
    _emit(
        args, {"removed": res.removed, "kept": res.kept, "dry_run": args.dry_run}, "\n".join(lines)
    )
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from pipeline.app.verify import verify
    from pipeline.storage.lake import Lake
    from pipeline.storage.store import open_store

    config = _load(args)
    assert config.store
    found = verify(config, Lake(open_store(config.store)), args.date)
    failed = [f for f in found if not f.ok]
    lines = [f"verify {args.date} (whole tables, at the versions its runs row names):"]
    for f in found:
        want = "" if f.expected is None else f" (must be {f.expected})"
        mark = "ok" if f.ok else "FAILED"
        lines.append(f"  {f.table:<16} {f.check:<24} {f.observed}{want}  {mark}")
    lines.append(f"{len(found)} check(s), {len(failed)} failed")
    _emit(args, {"date": args.date, "checks": [f.to_json() for f in found]}, "\n".join(lines))
    return 1 if failed else 0


def _cmd_quarantine(args: argparse.Namespace) -> int:
    from pipeline.core.errors import StageError
    from pipeline.ingest import retry
    from pipeline.storage import lease
    from pipeline.storage.lake import Lake
    from pipeline.storage.runs_table import read_runs
    from pipeline.storage.store import open_store

    config = _load(args)
    assert config.store
    if args.table not in config.tables:
        raise StageError(f"no table {args.table!r} in {args.config}")
    store = open_store(config.store)
    lake = Lake(store, config.retention_days)
    if args.action == "list":
        rows = retry.listing(lake, args.table, args.status)
        lines = [
            f"{r['event_id']}\t{r['reason']}\t{r['quarantined_dt']}\t{r['status']}\t"
            f"{r['attempts']}\t{r['detail'] or ''}"
            for r in rows
        ]
        header = "event_id\treason\tquarantined_dt\tstatus\tattempts\tdetail"
        _emit(args, {"table": args.table, "events": rows}, "\n".join([header, *lines]))
        return 0
    if not args.event_id:
        raise StageError(f"cdr quarantine {args.action} needs --event-id")
    holder = f"quarantine-{args.action}-{os.getpid()}"
    held = lease.acquire(store, holder, 600)  # no run publishes meanwhile
    lake = Lake(store, config.retention_days, lease.Fence(store, holder, held.epoch))
    try:
        status = retry.act(lake, read_runs(lake), args.table, args.event_id, args.action)
    finally:
        lease.release(store, holder, held.epoch)
    text = f"{args.table} {args.event_id}: {status}"
    _emit(args, {"table": args.table, "event_id": args.event_id, "status": status}, text)
    return 0


def _cmd_decide(args: argparse.Namespace) -> int:
    import getpass

    from pipeline.app.decide import decide_conflict

    config = _load(args)
    result = decide_conflict(
        config,
        conflict_id=args.conflict_id,
        take=args.take,
        row=args.row,
        why=args.why,
        by=args.by or getpass.getuser(),
        withdraw_id=args.withdraw,
    )
    row = result.row
    verb = "withdrawn" if args.withdraw else f"takes {row['take']}"
    dates = " ".join(d.isoformat() for d in result.reruns)
    text = (
        f"decision {row['decision_id']} ({row['table']} {row['key']}, {row['dt']}) {verb}; "
        f"it takes effect when these dates run again, in order: {dates}"
        + ("" if args.rerun else " (cdr decide --rerun, or cdr run --date D for each)")
    )
    _emit(args, result.to_dict(), text)
    if args.rerun:
        from pipeline.stages import RunOptions, run_then_later

        opts = RunOptions(work_dir=args.work_dir, master=args.master)
        for report in run_then_later(config, result.reruns[0], opts):
            print(f"{report.dt}: {report.status}", file=sys.stderr)
    return 0


def _cmd_repair(args: argparse.Namespace) -> int:
    from pipeline.app.repair import apply_cql, apply_postgres, describe, repair
    from pipeline.core.errors import StageError
    from pipeline.storage.lake import Lake
    from pipeline.storage.store import open_store

    if args.apply and not args.dsn:
        raise StageError("--apply needs --dsn (the replica's database)")
    config = _load(args)
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


def _cmd_whatif(args: argparse.Namespace) -> int:
    from pipeline.app.whatif import report_key, whatif

    config = _load(args)
    name = args.name or args.config.stem
    result = whatif(config, args.date, name, args.work_dir, args.master)
    lines = [f"what-if {name} for {args.date}: {config.store}/{report_key(args.date, name)}"]
    for t, c in result["tables"].items():
        lines.append(f"  {t}: {c['differing_rows']['count']} row(s) differ")
    _emit(args, result, "\n".join(lines))
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from pipeline.app.demo import demo

    return demo(args.dir.resolve(), events=args.events, seed=args.seed, serve=args.serve)


def _cmd_jars(args: argparse.Namespace) -> int:
    import os

    from pipeline.spark import jars

    if args.action == "fetch":
        print(f"jars: {len(jars.locked())} checked against {jars.LOCK_NAME} in {jars.fetch()}")
        return 0
    sep = os.pathsep if args.action == "path" else ","
    print(sep.join(str(p) for p in jars.classpath()))
    return 0


def _cmd_jvm_archive(args: argparse.Namespace) -> int:
    from pipeline.app.jvm_archive import build

    print(f"class-data archive: {build()}")
    return 0


#: the commands that are not a stage of a run
COMMANDS = {
    "generate": _cmd_generate,
    "demo": _cmd_demo,
    "unlock": _cmd_unlock,
    "doctor": _cmd_doctor,
    "vacuum": _cmd_vacuum,
    "verify": _cmd_verify,
    "quarantine": _cmd_quarantine,
    "decide": _cmd_decide,
    "repair": _cmd_repair,
    "whatif": _cmd_whatif,
    "jars": _cmd_jars,
    "jvm-archive": _cmd_jvm_archive,
}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _setup_logging(args.log_format, args.verbose)
    try:
        return COMMANDS.get(args.command, _cmd_stage)(args)
    except ConfigError as e:
        _fail(args, e, 2)
        return 2
    except CdrError as e:
        _fail(args, e, 1)
        return 1


def _fail(args: argparse.Namespace, e: Exception, code: int) -> None:
    if args.log_format == "json":
        print(json.dumps({"error": type(e).__name__, "message": str(e), "exit": code}))
    else:
        print(f"cdr {args.command}: {type(e).__name__}: {e}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
