"""The four stages of a run, as plain functions: what the CLI and the DAG call.

``ingest`` (boto3 only) → ``resolve`` (Spark) → ``validate`` (Spark + GX) → ``publish``.
Each reads what the previous one left in the run's work folder, so that they can run as
separate processes (separate Airflow tasks) or in one (``cdr run``).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline import layout
from pipeline.config import Config
from pipeline.context import RunContext, resolve_now
from pipeline.errors import GateError, StageError
from pipeline.exports import ingest as ingest_exports
from pipeline.published import publish_cdc, publish_inspection, publish_run, replace_tree
from pipeline.store import open_store

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from pipeline.validation import Verdict

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunOptions:
    work_dir: Path
    now: str | None = None
    run_id: str | None = None
    allow_missing_exports: bool = False
    master: str | None = None
    tables: tuple[str, ...] | None = None  # a subset (with the tables they reference)
    on_divergence: str | None = None  # overrides the config's
    dry_run: bool = False  # ingest, resolve and validate; publish nothing
    data_docs: bool = True  # build the Data Docs pages of the validation results


def ingest(config: Config, dt: date, opts: RunOptions) -> RunContext:
    config.select(opts.tables, opts.on_divergence)  # refuse unknown names before any work
    ctx = RunContext.create(
        opts.work_dir,
        dt,
        resolve_now(dt, opts.now),
        opts.run_id,
        opts.tables,
        opts.on_divergence,
        opts.dry_run,
        opts.data_docs,
        config.digest(),
    )
    config = ctx.config(config)
    assert config.store
    if ctx.tables:
        log.info("ingest: tables %s", ", ".join(config.tables))
    if ctx.work.exists():
        import shutil

        shutil.rmtree(ctx.work)
    ctx.save()
    ingest_exports(config, open_store(config.store), ctx, opts.allow_missing_exports)
    return ctx


def resolve(config: Config, ctx: RunContext, spark: SparkSession) -> dict[str, Any]:
    """Resolve the run's events, then (``cdc.enabled``) write the CDC log: both on Spark,
    in one job (the DAG's resolve task)."""
    from pipeline.resolve import resolve_stage, save_summary

    config = ctx.config(config)
    summary = resolve_stage(spark, config, ctx)
    if config.cdc.enabled:
        from pipeline.cdc import cdc_stage

        summary["cdc"] = cdc_stage(spark, config, ctx, summary)
        save_summary(ctx, summary)
    return summary


def validate(config: Config, ctx: RunContext, spark: SparkSession) -> Verdict:
    from pipeline.resolve import load_summary
    from pipeline.validation import validate_stage

    config = ctx.config(config)
    verdict = validate_stage(spark, config, ctx, load_summary(ctx))
    for w in verdict.warnings:
        log.warning("validate: %s", w)
    return verdict


def run_report(
    config: Config, ctx: RunContext, summary: dict[str, Any], verdict: Verdict, status: str
) -> dict[str, Any]:
    validation = layout.validation_dir(ctx.dt)
    return {
        "run_id": ctx.run_id,
        "dt": ctx.dt.isoformat(),
        "now_us": ctx.now_us,
        "store": config.store,
        "status": status,  # published | failed | dry_run
        "failures": verdict.failures,
        "warnings": verdict.warnings,
        "tables": summary["tables"],
        "validation": {
            "results": f"{validation}/results.json",
            "data_docs": f"{validation}/data_docs/index.html" if ctx.data_docs else None,
            "suites": {name: s["success"] for name, s in verdict.suites.items()},
        },
        **({"cdc": summary["cdc"]} if "cdc" in summary else {}),
    }


def publish(config: Config, ctx: RunContext) -> dict[str, Any]:
    """Publish a validated run, or, for a failed one, only its logs and report; then raise
    :class:`GateError` naming the failures."""
    from pipeline.resolve import load_summary
    from pipeline.validation import load_verdict

    if ctx.dry_run:
        raise StageError(f"the run of {ctx.dt} is a dry run: it publishes nothing")
    config = ctx.config(config)
    assert config.store
    store = open_store(config.store)
    summary = load_summary(ctx)
    verdict = load_verdict(ctx, summary)
    tables = list(config.tables)
    publish_inspection(store, ctx.resolved, tables, ctx.dt, ctx.run_id)
    replace_tree(store, ctx.validation, layout.validation_dir(ctx.dt))  # results, Data Docs
    report = run_report(config, ctx, summary, verdict, "published" if verdict.passed else "failed")
    report_key = f"{layout.report_dir(ctx.dt)}/run_report.json"
    store.write_bytes(report_key, json.dumps(report, indent=2).encode())
    if not verdict.passed:
        raise GateError("; ".join(verdict.failures))
    if config.cdc.enabled:
        publish_cdc(store, ctx.resolved, tables, ctx.dt, ctx.run_id)
    report["pointers"] = publish_run(
        store, ctx.resolved, tables, ctx.dt, ctx.run_id, summary["tables"]
    )
    return report


def run(
    config: Config, dt: date, opts: RunOptions, spark: SparkSession | None = None
) -> dict[str, Any]:
    """``cdr run``: every stage in one process with one Spark session."""
    from pipeline.spark import get_spark

    ctx = ingest(config, dt, opts)
    spark = spark or get_spark(opts.master)
    summary = resolve(config, ctx, spark)
    verdict = validate(config, ctx, spark)
    if ctx.dry_run:
        if not verdict.passed:
            raise GateError("; ".join(verdict.failures))
        return run_report(ctx.config(config), ctx, summary, verdict, "dry_run")
    return publish(config, ctx)
