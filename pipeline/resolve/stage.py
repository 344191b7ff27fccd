"""The resolve stage: staged exports in, the run's results out, in the work folder.

Per table: read the typed copies of its exports (``pipeline.ingest.copies``), dedupe them and
resolve the events against the prior state (``resolve.engine``, ``resolve.cells``), then
check foreign keys across tables (docs/rules.md#foreign-keys, ``resolve.foreign_keys``) and
compare the replicas' snapshots (``resolve.snapshots``). Writes ``resolved/<table>/{state_pre
(and state, when the foreign keys change it: ``outputs.final_state``), snapshot,
conflicts,quarantine,divergence,orphans,fates,ledger}`` and ``resolved/summary.json``
with the counts of the run report. The executors write every output and count its rows
(``Facts``); the driver gets the counts. Gates (divergence, FK, error resolvers) are
decided by the validate stage.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from dataclasses import replace
from functools import partial
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from pipeline.core.columns import CONFLICT_ID, DT, EVENT_ID, FATE, KEY, REPLICA, RUN_ID
from pipeline.core.config import Config, Table
from pipeline.core.errors import StageError
from pipeline.core.policy import ASYMMETRIC_NOTE, Fate, Granularity, Outcome
from pipeline.core.progress import current as progress
from pipeline.core.summary import RunSummary, Stopped, TableSummary
from pipeline.ingest import decisions, missing_events
from pipeline.ingest.adapters.options import seq_order
from pipeline.ingest.inplace import InPlace, staged_record
from pipeline.ingest.inputs import StagedTable, load_inputs
from pipeline.ingest.missing_events import lacked_by_event
from pipeline.resolve.cells import resolve_cells
from pipeline.resolve.cells.conflicts import with_conflict_id
from pipeline.resolve.cells.state import due as cells_due
from pipeline.resolve.engine import RowRun, resolve_rows
from pipeline.resolve.foreign_keys import check_foreign_keys
from pipeline.resolve.inplace import narrowed
from pipeline.resolve.ledger import changed_copies, legacy_ids, read_ledger, set_aside
from pipeline.resolve.read import (
    DIFFERING_SCHEMA,
    Adapting,
    differing_copies,
    read_copies,
    special_free,
)
from pipeline.resolve.report_counts import FATE_COLUMNS, Facts, count_outputs, write_ledger
from pipeline.resolve.retry import offers_of, open_after, settle, start_outcomes
from pipeline.resolve.skew import skew_warnings
from pipeline.resolve.snapshots import compare_snapshots
from pipeline.resolve.state import from_reads, read_prior
from pipeline.rules import custom
from pipeline.rules.decisions import Decisions
from pipeline.rules.lost import Witness
from pipeline.spark.frames import (
    CONFLICT_FIELDS,
    DIVERGENCE_FIELDS,
    POSITION,
    QUARANTINE_FIELDS,
    run_columns,
    with_instants,
)
from pipeline.storage import stats
from pipeline.storage.context import RunContext
from pipeline.storage.lake import Lake
from pipeline.storage.outputs import read_known, read_output, replace_output
from pipeline.storage.outputs import write_output as _write
from pipeline.storage.store import open_store
from pipeline.storage.targets import STATE_PRE
from pipeline.storage.workpath import WorkPath, read_table, write_table

log = logging.getLogger(__name__)

DUPLICATE = Fate.DUPLICATE.value
REPAIRED, READ = Fate.REPAIRED.value, Fate.READ.value
#: what a table that starts empty starts from (docs/adapters.md#snapshot-reads): the
#: night's snapshot reads, if its exports hold any
SEEDED = "the snapshot reads of its exports, if any (the first replica's of each key)"


def read_warnings(tables: Mapping[str, TableSummary]) -> list[str]:
    """docs/adapters.md#snapshot-reads: a warning per replica whose export of a table that
    did not start from its reads holds some (its connector snapshotted it again)."""
    out = []
    for t, st in tables.items():
        if st.start.startswith(SEEDED):
            continue
        for replica, fates in sorted(st.replicas.items()):
            if fates.get(READ):
                out.append(
                    f"table {t}: replica {replica}'s export holds {fates[READ]} snapshot "
                    "read(s) (a connector that snapshotted the table: a new connector, a "
                    "lost slot or offsets, Debezium's snapshot.mode, a re-snapshot asked "
                    "for): counted, never applied (docs/adapters.md#snapshot-reads)"
                )
    return out


#: a cell table's resolution, in the table's folder until its outputs are written
RESOLUTION = "_resolution"


def resolve_table(
    spark: SparkSession, config: Config, table: Table, ctx: RunContext, staged: StagedTable
) -> tuple[TableSummary, Facts]:
    """One table's outputs into ``resolved/<table>``; returns its counts for the run
    report, and what they were counted from."""
    for path in table.custom.values():  # docs/rules.md#custom-resolvers: on the driver first
        custom.load(path)
    out, folder = ctx.resolved / table.name, ctx.staged / table.name
    ledger = read_ledger(spark, folder)
    legacy = legacy_ids(ledger) if staged.legacy_ids else None
    adapting = Adapting(
        ctx.dt, ctx.run_id, out, config.gc_grace_seconds, config.replica_ids, legacy
    )
    copies, waits = read_copies(spark, config, table, folder, staged.exports, ctx.now_us, adapting)
    prior = read_prior(spark, folder, table)
    if staged.prior is None and staged.base_rows is None:  # the table starts empty
        prior = from_reads(copies, table, config.replica_ids)  # docs/adapters.md#snapshot-reads
        staged = replace(staged, start=f"{SEEDED}; {staged.start}")
    any_special = not special_free(staged.exports, folder)
    in_place = None if staged.snapshots else staged_record(staged.prior)
    chosen: Decisions | None = None  # docs/rules.md#manual-decisions: a row table's
    if table.granularity is Granularity.CELL:
        clock_skew = _resolve_cells(
            spark, config, table, ctx, copies, prior, ledger, any_special, in_place
        )
        tally = write_ledger(spark, out, ctx.run_id, table.name)
        facts = Facts.of([*count_outputs(spark, out), *tally.counts])
    else:
        chosen = decisions.load(folder, table, ctx.dt)
        run = RowRun(ctx.now_us, ctx.dt, ctx.run_id, out, ledger, any_special, in_place, chosen)
        run = replace(run, witness=witness(staged, folder))
        facts = _resolve_rows(spark, config, table, copies, prior, run)
        clock_skew = facts.clock_skew  # counted by the fold's tasks
    stopped = _cut_at_error(out, table, config) if facts.events.get(Fate.ERRORED) else None
    if stopped is not None:  # docs/rules.md#fine-points: divergence is not checked after an error
        replace_output(out / "divergence", None)  # its record kept
    differing, found = 0, []
    if facts.repeated:  # some replica exported an event twice: were its copies the same?
        fates = read_known(spark, out / "fates", FATE_COLUMNS)
        found = differing_copies(copies, fates, table)
        differing = len({r[EVENT_ID] for r in found})
    if facts.changed and ledger is not None:  # an earlier night's event, other content
        found += changed_copies(copies, ledger, table)
    _write_differing(found, out, ctx, table.name)
    settled = settle(offers_of(folder), out)
    start_outcomes(folder, out, ctx.run_id, table.name, settled)
    if stopped is not None or settled.rewrote:  # the logs were cut, the fates rewritten
        facts = Facts.counted(spark, out)
    counts = _table_counts(table, facts, staged, stopped, differing, waits)
    return replace(
        counts,
        clock_skew=clock_skew,
        retried=settled.retried,
        changed_copies=facts.changed,
        asymmetric=_asymmetric(spark, out) if table.custom else {},
        decisions=_decided(spark, out, chosen),
        arrived_late=missing_events.arrived_late(spark, copies, folder),
    ), facts


def _resolve_rows(
    spark: SparkSession,
    config: Config,
    table: Table,
    copies: DataFrame,
    prior: DataFrame,
    run: RowRun,
) -> Facts:
    """The row engine; a fold whose tasks fail with a custom resolver in them names the
    function (docs/rules.md#custom-resolvers)."""
    try:
        return resolve_rows(spark, config, table, copies, prior, run)
    except Exception as e:
        if not table.custom:
            raise
        raise custom.FoldFailed(table, e) from e


def _decided(spark: SparkSession, out: WorkPath, chosen: Decisions | None) -> dict[str, str]:
    """docs/rules.md#manual-decisions: per decision of the date, ``applied`` or why it is
    stale, from the run's conflict-log rows of their conflicts (one small job, only when
    the date has decisions)."""
    if chosen is None or not (chosen.by_conflict or chosen.unfit):
        return {}
    logged = (
        read_output(spark, out / "conflicts")
        .where(F.col(CONFLICT_ID).isin(list(chosen.by_conflict)))
        .select(CONFLICT_ID, "resolver")
        .collect()
    )
    return decisions.statuses(chosen, [r.asDict() for r in logged])


def _asymmetric(spark: SparkSession, out: WorkPath) -> dict[str, int]:
    """docs/rules.md#custom-resolvers: per custom resolver, its conflicts whose reason says
    that it answers another row with the sides swapped."""
    log_ = read_output(spark, out / "conflicts")
    if "reason" not in log_.columns:
        return {}
    rows = (
        log_.filter(F.col("reason").contains(ASYMMETRIC_NOTE)).groupBy("resolver").count().collect()
    )
    return {r["resolver"]: r["count"] for r in rows}


def _resolve_cells(
    spark: SparkSession,
    config: Config,
    table: Table,
    ctx: RunContext,
    copies: DataFrame,
    prior: DataFrame,
    ledger: DataFrame | None,
    any_special: bool,
    in_place: InPlace | None,
) -> dict[str, dict[str, dict[str, Any]]]:
    """The cell engine's outputs, written by Spark into the table's folder; returns the
    table's clock-skew evidence (clock skew). ``any_special`` False: no copy is special
    (``read.special_free``); ``in_place``: the table is merged in place from there."""
    out = ctx.resolved / table.name
    copies, duplicates = set_aside(copies, ledger, DUPLICATE)
    narrowing = None
    if in_place is not None:
        due = cells_due(table, ctx.now_us, config.gc_grace_seconds, in_place.prior_now_us)
        narrowing = partial(narrowed, table=table, due=due, out=out, record=in_place)
    res = resolve_cells(
        spark,
        config,
        table,
        copies,
        prior,
        ctx.now_us,
        out / RESOLUTION,
        any_special=any_special,
        narrow=narrowing,
    )
    fates = res.fates
    if duplicates is not None:
        fates = fates.unionByName(duplicates, allowMissingColumns=True)
    _write(res.state, out / STATE_PRE)
    _write(repeats_as_duplicates(fates), out / "fates")
    _write(
        with_instants(with_conflict_id(res.conflicts, ctx.dt, table.name))
        .coalesce(1)
        .sortWithinPartitions(*POSITION)
        .select(*run_columns(ctx.run_id, table.name), *CONFLICT_FIELDS),
        out / "conflicts",
    )
    quarantine = res.quarantine.withColumnRenamed("raw", "event")
    _write(
        quarantine.select(*run_columns(ctx.run_id, table.name), *QUARANTINE_FIELDS),
        out / "quarantine",
    )
    _write(
        res.divergence.select(
            *run_columns(ctx.run_id, table.name),
            F.lit("perspective").alias("source"),
            *DIVERGENCE_FIELDS,
        ),
        out / "divergence",
    )
    if res.changes is not None:
        _write(res.changes, out / "changes")
    (out / RESOLUTION).rmtree()  # read by the writes above, no further
    return res.clock_skew


def repeats_as_duplicates(fates: DataFrame) -> DataFrame:
    """A replica that exported one event more than once (export files that overlap): the
    event is resolved once, and that replica's copies after the first are duplicates."""
    n = F.row_number().over(Window.partitionBy(EVENT_ID, REPLICA).orderBy(FATE))
    again = F.col(EVENT_ID).isNotNull() & (n > 1)
    return fates.withColumn(FATE, F.when(again, F.lit(DUPLICATE)).otherwise(F.col(FATE)))


def _write_differing(
    rows: list[dict[str, Any]], out: WorkPath, ctx: RunContext, table: str
) -> None:
    """The ``differing_copies`` log of the table (only when it has rows)."""
    if not rows:
        return
    run = {RUN_ID: ctx.run_id, "table": table}
    folder = out / "differing_copies"
    data = pa.Table.from_pylist([{**run, **r} for r in rows], DIFFERING_SCHEMA)
    write_table(data, folder / "part-00000.parquet", compression="zstd")


def witness(staged: StagedTable, folder: WorkPath) -> Witness:
    """docs/rules.md#lost-writes: what tonight's exports of the table say of who saw what."""
    exports = staged.exports.values()
    unordered = {e.replica: why for e in exports if (why := seq_order(e.format, e.options))}
    return Witness(frozenset(e.replica for e in exports), unordered, lacked_by_event(folder))


def _cut_at_error(out: WorkPath, table: Table, config: Config) -> Stopped:
    """docs/rules.md#fine-points: the fold stopped at an ``error``; the conflict log
    keeps the conflicts up to
    the first errored one in canonical order (every table's key was folded on its own).
    Returns that conflict."""
    files = (out / "conflicts").parquet_files()
    log_ = pa.concat_tables([read_table(f) for f in files])
    ranks = config.tie_ranks(table.tie_break)

    def position(r: dict[str, Any]) -> tuple[int, int, str]:
        return (r["remote_ts"], ranks.get(r["remote_origin"], -1), r["remote_event_id"])

    rows = log_.to_pylist()
    e = min((r for r in rows if r["outcome"] == Outcome.ERRORED.value), key=position)
    kept = pa.Table.from_pylist([r for r in rows if position(r) <= position(e)], schema=log_.schema)
    replace_output(out / "conflicts", kept)
    return Stopped(
        table.name,
        e[KEY],
        e["conflict_type"],
        e["remote_event_id"],
        e["reason"],
        e.get(CONFLICT_ID) or "",
    )


def _by_type(conflicts: Mapping[tuple[str, str, str], int]) -> dict[str, dict[str, int]]:
    """The run report's conflicts: per conflict type and outcome, every resolver's."""
    out: dict[str, dict[str, int]] = {}
    for (kind, _, outcome), n in conflicts.items():
        out.setdefault(kind, {})[outcome] = out.get(kind, {}).get(outcome, 0) + n
    return out


def _table_counts(
    table: Table,
    facts: Facts,
    staged: StagedTable,
    stopped: Stopped | None,
    differing: int,
    waits: Mapping[str, Mapping[str, int]],
) -> TableSummary:
    by_fate = facts.events
    per_replica: dict[str, dict[str, int]] = {
        r: {"records": e.records, "framing": e.framing} for r, e in staged.exports.items()
    }
    for replica, fates in facts.replicas.items():
        per_replica.setdefault(replica, {"records": 0}).update(fates)
    for replica, lines in waits.items():  # ``pipeline.ingest.pending``
        per_replica.setdefault(replica, {"records": 0}).update(lines)
    base = "base" if staged.base_rows is not None else None
    return TableSummary(
        policy=table.preset.value,
        events=sum(e.records for e in staged.exports.values()),
        distinct_events=sum(n for fate, n in by_fate.items() if fate not in (REPAIRED, READ)),
        applied=by_fate.get("applied", 0),
        discarded=by_fate.get("discarded", 0),
        duplicates=sum(f.get(DUPLICATE, 0) for f in facts.replicas.values()),
        differing_copies=differing,
        errored=by_fate.get("errored", 0),
        not_reached=by_fate.get("not_reached", 0),
        quarantined=dict(facts.quarantined),
        conflicts=_by_type(facts.conflicts),
        concurrency=dict(facts.concurrency),
        lost_writes=facts.lost_writes,
        divergent_keys=dict(facts.divergent),
        divergent_causes={r: dict(c) for r, c in facts.divergent_causes.items()},
        replicas=per_replica,
        missing_exports=staged.missing,
        late_exports=staged.late_exports,
        prior=staged.prior[DT] if staged.prior else base,
        prior_run_id=staged.prior[RUN_ID] if staged.prior else None,
        start=staged.start,
        stopped=stopped,
        repaired=by_fate.get(REPAIRED, 0),
        ledger_digests=True,
    )


def resolve_stage(spark: SparkSession, config: Config, ctx: RunContext) -> RunSummary:
    inputs = load_inputs(ctx)
    ctx.resolved.rmtree()
    tables: dict[str, TableSummary] = {}
    conflicts: dict[str, Mapping[tuple[str, str, str], int]] = {}
    for i, (name, table) in enumerate(config.tables.items(), 1):
        progress().step(name, i, len(config.tables), "tables")
        try:
            t, facts = resolve_table(spark, config, table, ctx, inputs[name])
            tables[name], conflicts[name] = t, facts.conflicts
        finally:
            spark.catalog.clearCache()  # a table's persisted fold output is written by now
        log.info(
            "resolve %s: %d events, %d applied, %d discarded, %d quarantined",
            name,
            t.distinct_events,
            t.applied,
            t.discarded,
            sum(t.quarantined.values()),
        )
    summary = RunSummary(ctx.run_id, uuid.uuid4().hex, ctx.dt.isoformat(), ctx.now_us, tables)
    progress().step("foreign keys, snapshots and retries")
    try:
        summary = check_foreign_keys(spark, config, ctx, summary)
        summary = compare_snapshots(spark, config, ctx, inputs, summary)
    finally:
        spark.catalog.clearCache()
    for name in summary.tables:  # retry
        still = open_after(spark, ctx.staged / name, ctx.resolved / name)
        summary = summary.with_table(
            name, quarantine_open=sum(still.values()), quarantine_open_reasons=still
        )
    assert config.store
    lake = Lake(open_store(config.store))
    others = stats.kept_rows(lake, ctx.dt, config.tables)
    stats.write_stats(ctx.resolved, summary, conflicts, others)  # conflict stats
    stats.note_replaced(ctx.resolved, lake, ctx.dt, config.tables)  # for the counters
    for w in skew_warnings(summary.tables, config.max_clock_skew_seconds):
        log.warning("resolve: %s", w)
    save_summary(ctx, summary)
    return summary


def save_summary(ctx: RunContext, summary: RunSummary) -> None:
    (ctx.resolved / "summary.json").write_text(summary.to_json())


def load_summary(ctx: RunContext) -> RunSummary:
    p = ctx.resolved / "summary.json"
    if not p.exists():
        raise StageError(f"no resolved run for {ctx.dt}: run `cdr resolve` first")
    return RunSummary.from_json(p.read_text())
