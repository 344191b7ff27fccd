"""The four stages of a run, as plain functions: what the CLI and the DAG call.

``ingest`` (boto3 only) → ``resolve`` (Spark) → ``validate`` (Spark + GX) → ``publish``.
Each reads what the previous one left in the run's work folder, so that they can run as
separate processes (separate Airflow tasks) or in one (``cdr run``).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass, replace
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.changes.cdc import cdc_stage
from pipeline.changes.history import history_stage
from pipeline.core import layout
from pipeline.core.config import Config
from pipeline.core.errors import GateError, LockedError, StageError
from pipeline.core.progress import current as progress
from pipeline.core.report import ReportValidation, RunReport, Status
from pipeline.core.summary import RunSummary
from pipeline.ingest.decisions import stale_warnings
from pipeline.ingest.exports import ingest as ingest_exports
from pipeline.ingest.exports import load_notices
from pipeline.ingest.fetch import fetch
from pipeline.ingest.found import require_inputs
from pipeline.ingest.inputs import load_inputs
from pipeline.publish.commit import (
    Committer,
    commit_meta,
    has_row,
    publish_failed,
    publish_tables,
    record_run,
    run_row,
)
from pipeline.publish.doctor import require_atomic_create
from pipeline.publish.metrics import export
from pipeline.resolve.skew import skew_warnings
from pipeline.rules.custom import asymmetric_warnings
from pipeline.spark.progress import watching
from pipeline.spark.session import CODEGEN_MIN_RECORDS, get_spark, sized
from pipeline.storage import lease
from pipeline.storage.context import RunContext, new_run_id, resolve_now, runs_of
from pipeline.storage.lake import Lake
from pipeline.storage.runs_table import RunRow, later_dates, published_by_date, read_runs
from pipeline.storage.stats import run_counts
from pipeline.storage.store import Store, open_store, replace_tree
from pipeline.storage.workpath import WorkPath
from pipeline.validate.alerts import fired
from pipeline.validate.datadocs import digests

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from pipeline.validate.stage import Verdict

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunOptions:
    work_dir: WorkPath | Path  # a local folder or an S3 prefix (``pipeline.storage.workpath``)
    now: str | None = None
    run_id: str | None = None
    allow_missing_exports: bool = False
    accept_late_exports: bool = False  # go on past exports that changed after their run
    master: str | None = None
    tables: tuple[str, ...] | None = None  # a subset (with the tables they reference)
    on_divergence: str | None = None  # overrides the config's
    accept_alert: bool = False  # a fired ``on: fail`` alert only warns
    dry_run: bool = False  # ingest, resolve and validate; publish nothing
    #: one date of a backfill or a rerun with the dates after it: those run next, in order
    #: (docs/operations.md#reruns-and-backfills); else a date with later published dates
    #: is refused
    backfill: bool = False
    data_docs: bool = True  # build the Data Docs pages of the validation results


def ingest(config: Config, dt: date, opts: RunOptions) -> RunContext:
    config.select(opts.tables, opts.on_divergence)  # unknown names: before any work
    assert config.store
    # before anything is written: the date has inputs (of any table: a run of some tables
    # on a date others exported is a missing export, allowed or named by ingest)
    require_inputs(config, open_store(config.store), dt)
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
        opts.accept_alert,
    )
    config = ctx.config(config)
    assert config.store
    if ctx.tables:
        log.info("ingest: tables %s", ", ".join(config.tables))
    store = open_store(config.store)
    if not ctx.dry_run:  # a dry run writes nothing to the store: it needs no lease
        require_atomic_create(store)  # what the lease rests on, checked
        held = lease.acquire(store, ctx.run_id, config.lease_seconds, _epoch_of(ctx))
        ctx = replace(ctx, epoch=held.epoch)  # the later stages re-enter with it
        try:
            _refuse_a_published_run_id(store, config, ctx.run_id)
        except StageError:
            lease.release(store, ctx.run_id, ctx.epoch)
            raise
    _clear_work(opts.work_dir, ctx)
    ctx.save()
    try:
        with working(config, ctx), timed(ctx, "ingest"):
            ingest_exports(
                config,
                store,
                ctx,
                opts.allow_missing_exports,
                opts.accept_late_exports,
                opts.backfill,
            )
    except BaseException:
        if not ctx.dry_run:  # nothing of the run reached the store but its runs row
            try:
                _record_stopped(store, ctx, config.retention_days)
            except Exception as e:  # the ingest error is the one to report
                log.warning("ingest: could not record the stopped run %s: %s", ctx.run_id, e)
            lease.release(store, ctx.run_id, ctx.epoch)
        raise
    return ctx


#: the stages whose seconds a run's report keeps (``RunReport.seconds``), in run order
STAGES = ("ingest", "resolve", "validate", "publish")


@contextmanager
def working(config: Config, ctx: RunContext) -> Iterator[None]:
    """The run's lease renewed while this process works on it (``lease.Heartbeat``), so
    that a killed run's lapses within ``lease.seconds``; nothing for a dry run.
    ``config``: the run's (``ctx.config``)."""
    store = config.store
    if ctx.dry_run or not ctx.epoch or not store:
        yield
        return
    with lease.Heartbeat(open_store(store), ctx.run_id, ctx.epoch, config.lease_seconds):
        yield


def hand_off(config: Config, ctx: RunContext) -> None:
    """A stage that ran as a task of its own (the DAG's) and ended leaves the lease to the
    run's next task, for ``lease.handoff_seconds`` (docs/operations.md#the-lease)."""
    store = ctx.config(config).store
    if not ctx.dry_run and ctx.epoch and store:
        lease.hand_off(open_store(store), ctx.run_id, ctx.epoch, config.lease_handoff_seconds)


@contextmanager
def timed(ctx: RunContext, stage: str) -> Iterator[None]:
    """Record how long ``stage`` took, in the run's work folder: the stages may run in
    separate processes, and publish puts them all in the report. A stage that fails
    records nothing (its retry does). Its progress lines say its name
    (``pipeline.core.progress``)."""
    started = time.monotonic()
    with progress().stage(stage):
        yield
    _seconds_file(ctx, stage).write_text(json.dumps(time.monotonic() - started))


def _seconds_file(ctx: RunContext, stage: str) -> WorkPath:
    return ctx.work / "seconds" / f"{stage}.json"


def stage_seconds(ctx: RunContext) -> dict[str, float]:
    """The seconds each stage of the run recorded (:func:`timed`), in run order."""
    out = {}
    for stage in STAGES:
        p = _seconds_file(ctx, stage)
        if p.exists():
            out[stage] = round(float(json.loads(p.read_text())), 3)
    return out


def _refuse_a_published_run_id(store: Store, config: Config, run_id: str) -> None:
    """A run id names a run's commits, its ``runs`` row and report folder: a new run under
    the id of a finished one would be mistaken for it."""
    for row in read_runs(Lake(store)):
        if row.run_id == run_id:
            raise StageError(
                f"run id {run_id} has run already ({row.status}, {row.dt}; "
                f"{store.uri}/{layout.RUNS}): a new run needs a new id (under Airflow, clear "
                "the whole DAG run)"
            )


def _clear_work(work_dir: WorkPath | Path, ctx: RunContext) -> None:
    """Remove this run's work folder (a retry of its ingest) and those of the date's
    earlier runs of the same kind: a run's folder stays until the date is run again, for
    inspection. A real run holds the lease, so the runs it clears are over; a dry run
    clears earlier dry runs only."""
    for run in runs_of(work_dir, ctx.dt):
        if run.run_id != ctx.run_id and run.dry_run == ctx.dry_run:
            log.info("ingest: removing the work folder of the earlier run %s", run.run_id)
            run.work.rmtree()
    ctx.work.rmtree()


def staged_records(ctx: RunContext) -> int:
    """The run's size: the records ingest staged (what resolve reads)."""

    return sum(s.records for s in load_inputs(ctx).values())


def sized_for(spark: SparkSession, ctx: RunContext) -> AbstractContextManager[bool]:
    """The Spark settings that depend on the run's size, for one stage."""

    return sized(spark, staged_records(ctx))


def small_run(ctx: RunContext) -> bool:
    """A run small enough for a small run's JVM (:mod:`pipeline.spark.jvm`)."""

    return staged_records(ctx) < CODEGEN_MIN_RECORDS


def resolve(config: Config, ctx: RunContext, spark: SparkSession) -> RunSummary:
    """Fetch the exports ingest planned (Spark tasks), resolve the run's events, then
    write the history of the tables that keep one (history) and (``cdc.enabled``) the CDC log,
    then measure what validation judges: the run's Spark work before publish, in one
    Spark application (the DAG's resolve task)."""
    config = ctx.config(config)
    ctx.work.attach(spark)
    with working(config, ctx), timed(ctx, "resolve"), watching(spark):
        return _resolve(spark, config, ctx)


def _resolve(spark: SparkSession, config: Config, ctx: RunContext) -> RunSummary:
    from pipeline.resolve.stage import (  # deferred: loads pandas (half a second)
        resolve_stage,
        save_summary,
    )
    from pipeline.validate.stage import measure_stage  # deferred: loads pandas (half a second)

    progress().step("fetching the exports' files")
    fetch(spark, config, ctx)
    small = small_run(ctx)  # measures: fewer tasks
    with sized_for(spark, ctx):
        summary = resolve_stage(spark, config, ctx)
        if any(t.history is not None for t in config.tables.values()):
            progress().step("history")
            summary = history_stage(spark, config, ctx, summary)
            save_summary(ctx, summary)
        if config.cdc.enabled:
            progress().step("CDC log")
            summary = replace(summary, cdc=cdc_stage(spark, config, ctx, summary))
            save_summary(ctx, summary)
        progress().step("measuring for validation")
        measure_stage(spark, config, ctx, summary, one_task=small)
    return summary


def validate(
    config: Config, ctx: RunContext, spark: Callable[[], SparkSession] | None = None
) -> Verdict:
    """Judge the resolved run with Great Expectations (no Spark). A run resolved without
    its measures is measured first, with the session ``spark`` gives."""
    config = ctx.config(config)
    with working(config, ctx), timed(ctx, "validate"):
        return _validate(config, ctx, spark)


def _validate(config: Config, ctx: RunContext, spark: Callable[[], SparkSession] | None) -> Verdict:
    from pipeline.resolve.stage import load_summary  # deferred: loads pandas (half a second)
    from pipeline.validate.stage import (  # deferred: loads pandas (half a second)
        judge_stage,
        measure_stage,
        measured,
    )

    summary = load_summary(ctx)
    if not measured(ctx, summary):
        if spark is None:
            raise StageError(f"the resolved run of {ctx.dt} has no measures: resolve it again")
        session = spark()
        ctx.work.attach(session)
        progress().step("measuring for validation")
        with sized_for(session, ctx), watching(session):
            measure_stage(session, config, ctx, summary, one_task=small_run(ctx))
    progress().step("judging the suites (Great Expectations)")
    verdict = judge_stage(config, ctx, summary)
    for w in verdict.warnings:
        log.warning("validate: %s", w)
    return verdict


def run_report(
    config: Config, ctx: RunContext, summary: RunSummary, verdict: Verdict, status: Status
) -> RunReport:
    """The run's report, as far as a dry run has it: publish adds the Data Docs files and
    the versions it committed."""
    from pipeline.resolve.stage import read_warnings  # deferred: loads pandas (half a second)

    validation = layout.validation_dir(ctx.dt, ctx.run_id)
    warned = skew_warnings(summary.tables, config.max_clock_skew_seconds)
    warned += asymmetric_warnings(summary.tables)
    warned += stale_warnings(summary.tables)
    warned += read_warnings(summary.tables)
    warned += load_notices(ctx)
    return RunReport(
        run_id=ctx.run_id,
        dt=ctx.dt.isoformat(),
        status=status,
        started=ctx.started,
        now_us=ctx.now_us,
        store=config.store,
        failures=tuple(verdict.failures),
        warnings=(*verdict.warnings, *warned),
        tables=summary.tables,
        validation=ReportValidation(
            results=f"{validation}/results.json",
            data_docs=f"{validation}/data_docs/index.html" if ctx.data_docs else None,
            suites={name: s["success"] for name, s in verdict.suites.items()},
        ),
        cdc=summary.cdc,
        alerts=fired(verdict.suites),
        seconds=stage_seconds(ctx),
    )


def publish(
    config: Config, ctx: RunContext, spark: SparkSession | Callable[[], SparkSession] | None = None
) -> RunReport:
    """Publish a validated run: commit every table, then its report, then its ``runs``
    row. A failed run commits only its logs (under ``_failed/``), its report and its
    ``runs`` row, then raises :class:`GateError` naming the failures. Either way the
    run's report and validation results go to its own ``reports/dt=<D>/run=<id>/``;
    nothing a published run wrote is replaced by a failed one."""
    from pipeline.resolve.stage import load_summary  # deferred: loads pandas (half a second)
    from pipeline.validate.stage import load_verdict  # deferred: loads pandas (half a second)

    if ctx.dry_run:
        raise StageError(f"the run of {ctx.dt} is a dry run: it publishes nothing")
    started = time.monotonic()
    config = ctx.config(config)
    assert config.store
    store = open_store(config.store)
    summary = load_summary(ctx)
    verdict = load_verdict(ctx, summary)
    # still this run's, renewed; or taken again (new epoch) by a retry after a release
    held = lease.acquire(store, ctx.run_id, config.lease_seconds, ctx.epoch or None)
    ctx = replace(ctx, epoch=held.epoch)
    with working(config, ctx), progress().stage("publish"), watching(spark):
        return _publish(config, ctx, store, summary, verdict, started, spark)


def _publish(
    config: Config,
    ctx: RunContext,
    store: Store,
    summary: RunSummary,
    verdict: Verdict,
    started: float,
    spark: SparkSession | Callable[[], SparkSession] | None,
) -> RunReport:

    lake = Lake(store, config.retention_days, fence(store, ctx), spark)
    runs = read_runs(lake)
    done = [r for r in runs if r.run_id == ctx.run_id]
    if done:  # a retry after the runs row went in (the task died before it said so)
        return _published_already(store, ctx, done[-1], runs, verdict)
    inputs = {t: asdict(s) for t, s in load_inputs(ctx).items()}
    report = _validated_report(config, ctx, summary, verdict, store)
    status = report.status
    meta = commit_meta(ctx.run_id, ctx.dt, "passed" if verdict.passed else "failed")
    committer = Committer(lake, ctx.resolved, meta)
    versions = (
        publish_tables(committer, config, ctx.dt, runs)
        if verdict.passed
        else publish_failed(committer, list(config.tables), ctx.dt)
    )
    seconds = {**report.seconds, "publish": round(time.monotonic() - started, 3)}
    report = replace(report, versions=versions, seconds=seconds)
    body = report.to_json().encode()
    store.write_bytes(layout.run_report(ctx.dt, ctx.run_id), body)
    own = run_counts(ctx.resolved, ctx.run_id)  # docs/operations.md#metrics
    row = run_row(
        ctx.run_id, ctx.dt, status, ctx.started, ctx.config_digest, inputs, report, versions, own
    )
    record_run(lake, row)  # fenced: the run is now visible as a whole
    if verdict.passed:  # a copy at a fixed place, for people (its retry writes it too)
        store.write_bytes(layout.date_report(ctx.dt), body)
    # The store is free for the next run. A publish that failed on the way keeps the
    # lease for its retry; ``finish`` releases it in the end.
    lease.release(store, ctx.run_id, ctx.epoch)
    if not verdict.passed:
        raise GateError("; ".join(verdict.failures))
    _export_metrics(config, lake)
    return report


def _validated_report(
    config: Config, ctx: RunContext, summary: RunSummary, verdict: Verdict, store: Store
) -> RunReport:
    """The report of a run about to publish, once its validation results and Data Docs
    are in the store: with the Data Docs files the server may serve."""

    with ctx.validation.fetched() as validation:
        replace_tree(store, validation, layout.validation_dir(ctx.dt, ctx.run_id))
        docs = digests(validation / "data_docs")
    status = Status.PUBLISHED if verdict.passed else Status.FAILED
    report = run_report(config, ctx, summary, verdict, status)
    return replace(report, validation=replace(report.validation, data_docs_files=docs))


def _export_metrics(config: Config, lake: Lake) -> None:
    """docs/operations.md#metrics, after the run published: a failure is logged, the run
    stays published."""

    try:
        export(config.metrics, lake)
    except Exception as e:
        log.warning("metrics: not exported after the publish: %s", e)


def _published_already(
    store: Store, ctx: RunContext, row: RunRow, runs: list[RunRow], verdict: Verdict
) -> RunReport:
    """The retry of a publish whose ``runs`` row went in: its report, or its failure."""
    log.info("publish: run %s is recorded as %s already", ctx.run_id, row.status)
    if not row.published:  # its gate failed, or it stopped before publish
        lease.release(store, ctx.run_id, ctx.epoch)
        raise GateError(
            "; ".join(verdict.failures)
            or f"run {ctx.run_id} is recorded as failed already: start a new run"
        )
    body = store.read_bytes(layout.run_report(ctx.dt, ctx.run_id))
    latest = published_by_date(runs).get(ctx.dt)
    if latest is not None and latest.run_id == ctx.run_id:  # the copy may be missing
        store.write_bytes(layout.date_report(ctx.dt), body)
    lease.release(store, ctx.run_id, ctx.epoch)
    return RunReport.from_json(body)


def _epoch_of(ctx: RunContext) -> str | None:
    """The lease epoch an earlier attempt of this run's ingest recorded in its work
    folder (an Airflow retry re-enters the lease with it); None for a new run."""
    earlier = [r for r in runs_of(ctx.work.parent, ctx.dt) if r.run_id == ctx.run_id]
    return (earlier[-1].epoch or None) if earlier else None


def fence(store: Store, ctx: RunContext) -> lease.Fence | None:
    """What guards the run's commits; None for a run ingested by an older release
    (no epoch in its work folder): its commits are checked as they were."""
    return lease.Fence(store, ctx.run_id, ctx.epoch) if ctx.epoch else None


def _record_stopped(
    store: Store, ctx: RunContext, retention_days: int, spark: SparkSession | None = None
) -> None:
    """The ``runs`` row of a run that stopped before publish (an error, a kill), once
    (a Spark session to write it: the run's, or one started for it)."""
    lake = Lake(store, retention_days, fence(store, ctx), spark)
    if has_row(lake, ctx.run_id):
        return
    inputs = None
    if (ctx.staged / "inputs.json").exists():
        inputs = json.loads((ctx.staged / "inputs.json").read_text())
    row = run_row(ctx.run_id, ctx.dt, "failed", ctx.started, ctx.config_digest, inputs, None, {})
    record_run(lake, row)


def run(config: Config, dt: date, opts: RunOptions, spark: SparkSession | None = None) -> RunReport:
    """``cdr run``: every stage in one process with one Spark session."""
    from pipeline.validate.suites import GX_MODULES  # deferred: loads pandas (half a second)

    ctx = ingest(config, dt, opts)
    try:
        with naming_a_lost_lease(config, ctx):
            spark = spark or get_spark(opts.master, preload=GX_MODULES, small=small_run(ctx))
            summary = resolve(config, ctx, spark)
            verdict = validate(config, ctx)
            if ctx.dry_run:
                if not verdict.passed:
                    raise GateError("; ".join(verdict.failures))
                return run_report(ctx.config(config), ctx, summary, verdict, Status.DRY_RUN)
            return publish(config, ctx, spark)
    finally:
        finish(config, ctx, spark)


def run_then_later(
    config: Config, dt: date, opts: RunOptions, spark: SparkSession | None = None
) -> list[RunReport]:
    """``cdr run --then-later`` (and ``cdr decide --rerun``): ``dt``, then every later
    date published for the run's tables, in order, each starting from the one before
    (docs/operations.md#reruns-and-backfills); stops at the first that fails (it raises).
    ``opts.run_id`` and ``opts.now`` are the first date's; the others take their own."""

    selected = config.select(opts.tables, opts.on_divergence)
    assert selected.store
    dates = [dt, *later_dates(read_runs(Lake(open_store(selected.store))), selected.tables, dt)]
    reports = []
    for i, d in enumerate(dates):
        mine = opts if i == 0 else replace(opts, run_id=new_run_id(d), now=None)
        if len(dates) > 1:
            log.info("run %s (%d of %d: %s)", d, i + 1, len(dates), ", ".join(map(str, dates)))
        reports.append(run(config, d, replace(mine, backfill=True), spark))
    return reports


@contextmanager
def naming_a_lost_lease(config: Config, ctx: RunContext) -> Iterator[None]:
    """A run whose lease was broken (``cdr unlock --force``) or taken over while it worked
    fails naming the holder, whatever failed first: the next holder's ingest removes this
    run's work folder (``_clear_work``), so a paused run may next fail reading it. A
    failed gate is the run's own verdict, raised after publish released the lease. A
    lease that cannot be checked (the store out of reach) leaves the first error as it is."""
    try:
        yield
    except Exception as e:
        store = ctx.config(config).store
        ours = isinstance(e, LockedError | GateError)
        if ours or ctx.dry_run or not ctx.epoch or not store:
            raise
        try:
            lease.check(open_store(store), ctx.run_id, ctx.epoch)
        except LockedError as lost:
            raise LockedError(f"{lost} (what failed first: {type(e).__name__})") from e
        except Exception as unchecked:  # the run's own error stays what it fails with
            log.warning("the lease could not be checked after the run failed: %s", unchecked)
        raise


def finish(config: Config, ctx: RunContext, spark: SparkSession | None = None) -> None:
    """The run's last step, whatever happened before (the DAG's ``all_done`` task, the
    end of ``cdr run``): release its lease if it still holds it (publish releases it)."""
    if ctx.dry_run:
        return
    config = ctx.config(config)
    assert config.store
    store = open_store(config.store)
    current = lease.holder(store)
    if current is not None and current.run_id == ctx.run_id:
        # publish writes the row of a run that got that far
        _record_stopped(store, ctx, config.retention_days, spark)
    if lease.release(store, ctx.run_id, ctx.epoch):
        return
    current = lease.holder(store)
    if current is not None:
        log.warning("finish: run %s had lost the lease to %s", ctx.run_id, current.describe())
