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

from pipeline import layout, lease
from pipeline.config import Config
from pipeline.context import RunContext, resolve_now, runs_of
from pipeline.errors import GateError, StageError
from pipeline.exports import ingest as ingest_exports
from pipeline.published import (
    publish_cdc,
    publish_failed,
    publish_inspection,
    publish_run,
    replace_tree,
)
from pipeline.store import Store, open_store

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
    store = open_store(config.store)
    if not ctx.dry_run:  # a dry run writes nothing to the store: it needs no lease
        lease.acquire(store, ctx.run_id, lease.SECONDS)
        try:
            _refuse_a_published_run_id(store, config, ctx.run_id)
        except StageError:
            lease.release(store, ctx.run_id)
            raise
    _clear_work(opts.work_dir, ctx)
    ctx.save()
    try:
        ingest_exports(config, store, ctx, opts.allow_missing_exports)
    except BaseException:
        if not ctx.dry_run:
            lease.release(store, ctx.run_id)  # nothing of the run reached the store
        raise
    return ctx


def _refuse_a_published_run_id(store: Store, config: Config, run_id: str) -> None:
    """A run id names the folders a run publishes: a new run under the id of a published
    one would overwrite them, the live snapshot among them."""
    for table in config.tables:
        for folder in (layout.snapshot_dir(table, run_id), layout.state_dir(table, run_id)):
            if store.list(folder):
                raise StageError(
                    f"run id {run_id} was published already ({store.uri}/{folder}): "
                    "a new run needs a new id (under Airflow, clear the whole DAG run)"
                )


def _clear_work(work_dir: Path, ctx: RunContext) -> None:
    """Remove this run's work folder (a retry of its ingest) and those of the date's
    earlier runs of the same kind: a run's folder stays until the date is run again, for
    inspection. A real run holds the lease, so the runs it clears are over; a dry run
    clears earlier dry runs only."""
    import shutil

    for run in runs_of(work_dir, ctx.dt):
        if run.run_id != ctx.run_id and run.dry_run == ctx.dry_run:
            log.info("ingest: removing the work folder of the earlier run %s", run.run_id)
            shutil.rmtree(run.work, ignore_errors=True)
    if ctx.work.exists():
        shutil.rmtree(ctx.work)


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
    validation = layout.validation_dir(ctx.dt, ctx.run_id)
    return {
        "run_id": ctx.run_id,
        "dt": ctx.dt.isoformat(),
        "started": ctx.started,
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
    """Publish a validated run; for a failed one, only its logs (under ``_failed/``) and
    its report, then raise :class:`GateError` naming the failures. Either way the run's
    report and validation results go to its own ``reports/dt=<D>/run=<id>/``; nothing a
    published run wrote is replaced by a failed one."""
    from pipeline.resolve import load_summary
    from pipeline.validation import load_verdict

    if ctx.dry_run:
        raise StageError(f"the run of {ctx.dt} is a dry run: it publishes nothing")
    config = ctx.config(config)
    assert config.store
    store = open_store(config.store)
    summary = load_summary(ctx)
    verdict = load_verdict(ctx, summary)
    lease.acquire(store, ctx.run_id, lease.SECONDS)  # still this run's, renewed
    tables = list(config.tables)
    replace_tree(store, ctx.validation, layout.validation_dir(ctx.dt, ctx.run_id))
    report = run_report(config, ctx, summary, verdict, "published" if verdict.passed else "failed")
    body = json.dumps(report, indent=2).encode()
    if not verdict.passed:
        publish_failed(store, ctx.resolved, tables, ctx.run_id)
        store.write_bytes(layout.run_report(ctx.dt, ctx.run_id), body)
        lease.release(store, ctx.run_id)  # the run is over: its logs are out
        raise GateError("; ".join(verdict.failures))
    publish_inspection(store, ctx.resolved, tables, ctx.dt, ctx.run_id)
    if config.cdc.enabled:
        publish_cdc(store, ctx.resolved, tables, ctx.dt, ctx.run_id)
    report["pointers"] = publish_run(
        store, ctx.resolved, tables, ctx.dt, ctx.run_id, summary["tables"]
    )
    body = json.dumps(report, indent=2).encode()
    store.write_bytes(layout.run_report(ctx.dt, ctx.run_id), body)
    store.write_bytes(layout.date_report(ctx.dt), body)  # the date's published run
    # Published: the store is free for the next run. A publish that failed on the way
    # keeps the lease for its retry; ``finish`` releases it in the end.
    lease.release(store, ctx.run_id)
    return report


def run(
    config: Config, dt: date, opts: RunOptions, spark: SparkSession | None = None
) -> dict[str, Any]:
    """``cdr run``: every stage in one process with one Spark session."""
    from pipeline.spark import get_spark

    ctx = ingest(config, dt, opts)
    try:
        spark = spark or get_spark(opts.master)
        summary = resolve(config, ctx, spark)
        verdict = validate(config, ctx, spark)
        if ctx.dry_run:
            if not verdict.passed:
                raise GateError("; ".join(verdict.failures))
            return run_report(ctx.config(config), ctx, summary, verdict, "dry_run")
        return publish(config, ctx)
    finally:
        finish(config, ctx)


def finish(config: Config, ctx: RunContext) -> None:
    """The run's last step, whatever happened before (the DAG's ``all_done`` task, the
    end of ``cdr run``): release its lease if it still holds it (publish releases it)."""
    if ctx.dry_run:
        return
    config = ctx.config(config)
    assert config.store
    store = open_store(config.store)
    if lease.release(store, ctx.run_id):
        return
    current = lease.holder(store)
    if current is not None:
        log.warning("finish: run %s had lost the lease to %s", ctx.run_id, current.describe())
