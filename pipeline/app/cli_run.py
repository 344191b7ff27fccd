"""``cdr run`` and the stages it is made of (the DAG's tasks), and what they print: the
report of a run, where it published, or how far a failed run got.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from dataclasses import replace
from datetime import date
from typing import TYPE_CHECKING, Any

from pipeline.app.cli_args import config_of, emit, run_options
from pipeline.core.errors import CdrError

if TYPE_CHECKING:
    from pipeline.core.report import RunReport

log = logging.getLogger("cdr")


def cmd_stage(args: argparse.Namespace) -> int:
    """``cdr run``, ``ingest``, ``resolve``, ``validate``, ``publish`` or ``finish``."""
    from pipeline import stages  # deferred: cdr --help stays fast
    from pipeline.app.report_text import format_report  # deferred: cdr --help stays fast
    from pipeline.core.report import Status  # deferred: cdr --help stays fast
    from pipeline.storage.context import RunContext, new_run_id  # deferred: cdr --help stays fast

    config = config_of(args)
    opts = run_options(args)
    started = time.monotonic()
    if args.command == "run":
        run_id = opts.run_id or new_run_id(args.date)
        opts = replace(opts, run_id=run_id)
        try:
            if args.then_later:
                *before, report = stages.run_then_later(config, args.date, opts)
                for r in before:
                    print(f"{r.dt}: {r.status} (run {r.run_id})", file=sys.stderr)
            else:
                report = stages.run(config, args.date, opts)
        except CdrError:
            if not opts.dry_run:
                _print_failed_report(args, config, run_id)
            raise
        if report.status == Status.DRY_RUN:
            ctx = RunContext.load(opts.work_dir, args.date, report.run_id)
            where = "\ndry run: nothing published"
            if ctx.data_docs:
                where += f"\n  Data Docs: {(ctx.validation / 'data_docs/index.html').as_uri()}"
            emit(args, report.to_dict(), format_report(report) + where)
        else:
            emit(args, report.to_dict(), format_report(report) + _where(config, report))
    elif args.command == "ingest":
        ctx = stages.ingest(config, args.date, opts)
        stages.hand_off(config, ctx)  # to the run's next task
        emit(
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
    from pipeline import stages  # deferred: cdr --help stays fast
    from pipeline.app.report_text import format_report  # deferred: cdr --help stays fast
    from pipeline.spark.session import get_spark  # deferred: cdr --help stays fast

    opts = run_options(args)
    if args.command == "resolve":
        spark = get_spark(opts.master, small=stages.small_run(ctx))
        with stages.naming_a_lost_lease(config, ctx):
            summary = stages.resolve(config, ctx, spark)
        emit(args, summary.to_dict(), f"resolved {args.date}: {ctx.resolved}")
    elif args.command == "finish":
        stages.finish(config, ctx)
        emit(args, {"run_id": ctx.run_id}, f"finished run {ctx.run_id} of {args.date}")
    elif args.command == "validate":  # Spark only for a run resolved without measures
        verdict = stages.validate(config, ctx, lambda: get_spark(opts.master))
        if ctx.data_docs:
            docs = ctx.validation / "data_docs" / "index.html"
            print(f"Data Docs: {docs.as_uri()}", file=sys.stderr)
        if not verdict.passed:
            raise CdrError("; ".join(verdict.failures))
        emit(args, {"passed": True}, f"validated {args.date}: passed")
    else:
        with stages.naming_a_lost_lease(config, ctx):
            report = stages.publish(config, ctx, lambda: get_spark(opts.master, small=True))
        emit(args, report.to_dict(), format_report(report) + _where(config, report))


def _print_failed_report(args: argparse.Namespace, config: Any, run_id: str) -> None:
    """After a failed ``cdr run``, show the counts the run got to, if any."""
    from pipeline.app.report_text import format_report  # deferred: cdr --help stays fast
    from pipeline.core import layout  # deferred: cdr --help stays fast
    from pipeline.core.report import RunReport, Status  # deferred: cdr --help stays fast
    from pipeline.storage.store import open_store  # deferred: cdr --help stays fast

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
    from pipeline.core import layout  # deferred: cdr --help stays fast

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
