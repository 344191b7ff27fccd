"""The resolve stage: staged exports in, the run's results out, in the work folder.

Per table: read the typed copies of its exports (``pipeline.ingest.copies``), dedupe them and
resolve the events against the prior state (``resolve.engine``, ``resolve.cells``), then
check foreign keys across tables (docs/rules.md#foreign-keys). Writes ``resolved/<table>/{state_pre
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
from functools import partial, reduce
from typing import Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.window import Window

from pipeline.core import layout
from pipeline.core.columns import (
    CAUSE,
    CONFLICT_ID,
    DT,
    EVENT_ID,
    FATE,
    KEY,
    ORIGIN,
    REPLICA,
    RUN_ID,
    STATE_DELETED,
    STATE_EVENT_ID,
    STATE_ORIGIN,
    STATE_TS,
)
from pipeline.core.config import Config, FkPolicy, Table
from pipeline.core.policy import ASYMMETRIC_NOTE, Fate, Granularity, Outcome, QuarantineReason
from pipeline.core.summary import RunSummary, Stopped, TableSummary
from pipeline.ingest import decisions, lacked, retry
from pipeline.ingest.exports import StagedTable, load_inputs
from pipeline.ingest.inplace import InPlace, staged_record
from pipeline.publish import stats
from pipeline.publish.targets import STATE_PRE, final_state
from pipeline.resolve.cells import resolve_cells
from pipeline.resolve.cells.conflicts import with_conflict_id
from pipeline.resolve.cells.state import due as cells_due
from pipeline.resolve.engine import RowRun, resolve_rows
from pipeline.resolve.facts import FATE_COLUMNS, Facts, count_outputs, write_ledger
from pipeline.resolve.inplace import narrowed, touch, whole_state
from pipeline.resolve.ledger import changed_copies, legacy_ids, read_ledger, set_aside
from pipeline.resolve.read import (
    DIFFERING_SCHEMA,
    Adapting,
    differing_copies,
    read_copies,
    special_free,
)
from pipeline.resolve.skew import skew_warnings
from pipeline.resolve.snapshots import RunEvidence, snapshot_divergence
from pipeline.resolve.state import (
    columns_held,
    from_reads,
    published_held,
    read_base,
    read_prior,
)
from pipeline.rules import custom
from pipeline.rules.decisions import Decisions
from pipeline.spark.frames import (
    CONFLICT_FIELDS,
    DIVERGENCE_FIELDS,
    POSITION,
    QUARANTINE_FIELDS,
    RUN_COLUMNS,
)
from pipeline.spark.schema import snapshot_columns, state_schema
from pipeline.storage.context import RunContext
from pipeline.storage.lake import Lake
from pipeline.storage.outputs import output_info, read_known, read_output, replace_output
from pipeline.storage.outputs import write_output as _write
from pipeline.storage.store import open_store
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


def _run_cols(ctx: RunContext, table: str) -> list[Column]:
    """``frames.RUN_COLUMNS``: this run's id and the table."""
    return [F.lit(v).alias(n) for n, v in zip(RUN_COLUMNS, (ctx.run_id, table), strict=True)]


def resolve_table(
    spark: SparkSession, config: Config, table: Table, ctx: RunContext, staged: StagedTable
) -> tuple[TableSummary, Facts]:
    """One table's outputs into ``resolved/<table>``; returns its counts for the run
    report, and what they were counted from."""
    for path in table.custom.values():  # docs/rules.md#custom-resolvers: on the driver first
        custom.load(path)
    out = ctx.resolved / table.name
    ledger = read_ledger(spark, ctx.staged / table.name)
    legacy = legacy_ids(ledger) if staged.legacy_ids else None
    adapting = Adapting(
        ctx.dt, ctx.run_id, out, config.gc_grace_seconds, config.replica_ids, legacy
    )
    copies, waits = read_copies(
        spark, config, table, ctx.staged / table.name, staged.exports, ctx.now_us, adapting
    )
    prior = read_prior(spark, ctx.staged / table.name, table)
    if staged.prior is None and staged.base_rows is None:  # the table starts empty
        prior = from_reads(copies, table, config.replica_ids)  # docs/adapters.md#snapshot-reads
        staged = replace(staged, start=f"{SEEDED}; {staged.start}")
    any_special = not special_free(staged.exports, ctx.staged / table.name)
    in_place = None if staged.snapshots else staged_record(staged.prior)
    chosen: Decisions | None = None  # docs/rules.md#manual-decisions: a row table's
    if table.granularity is Granularity.CELL:
        clock_skew = _resolve_cells(
            spark, config, table, ctx, copies, prior, ledger, any_special, in_place
        )
        tally = write_ledger(spark, out, ctx.run_id, table.name)
        facts = Facts.of([*count_outputs(spark, out), *tally.counts])
    else:
        chosen = decisions.load(ctx.staged / table.name, table, ctx.dt)
        run = RowRun(ctx.now_us, ctx.dt, ctx.run_id, out, ledger, any_special, in_place, chosen)
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
    staged_table = ctx.staged / table.name
    settled = retry.settle(retry.offers_of(staged_table), out)
    retry.start_outcomes(staged_table, out, ctx.run_id, table.name, settled)
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
        arrived_late=lacked.arrived_late(spark, copies, ctx.staged / table.name),
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
        with_conflict_id(res.conflicts, ctx.dt, table.name)
        .coalesce(1)
        .sortWithinPartitions(*POSITION)
        .select(*_run_cols(ctx, table.name), *CONFLICT_FIELDS),
        out / "conflicts",
    )
    quarantine = res.quarantine.withColumnRenamed("raw", "event")
    _write(quarantine.select(*_run_cols(ctx, table.name), *QUARANTINE_FIELDS), out / "quarantine")
    _write(
        res.divergence.select(
            *_run_cols(ctx, table.name), F.lit("perspective").alias("source"), *DIVERGENCE_FIELDS
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
    return Stopped(table.name, e[KEY], e["conflict_type"], e["remote_event_id"], e["reason"])


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


# ---------------------------------------------------------------------- foreign keys


def _key_json(cols: list[str]) -> Column:
    return F.to_json(F.struct(*[F.col(c) for c in cols]))


def check_foreign_keys(
    spark: SparkSession, config: Config, ctx: RunContext, summary: RunSummary
) -> RunSummary:
    """docs/rules.md#foreign-keys: orphans after resolution; with ``quarantine`` they leave
    state and snapshot,
    repeatedly, until none is left. Writes ``orphans``, the final ``state`` and the
    ``snapshot`` of every table; returns the summary with their counts."""
    states = {
        t: read_known(spark, ctx.resolved / t / STATE_PRE, state_schema(table))
        for t, table in config.tables.items()
    }
    for t in _in_foreign_keys(config):  # merged in place: the fold's rows over the table's
        whole = whole_state(spark, ctx.staged / t, ctx.resolved / t, config.tables[t])
        states[t] = states[t] if whole is None else whole
    found: dict[str, list[DataFrame]] = {t: [] for t in config.tables}
    removed: dict[str, list[DataFrame]] = {t: [] for t in config.tables}
    restored: dict[str, DataFrame] = {}
    # docs/rules.md#fine-points: not checked after an error
    if not any(s.stopped for s in summary.tables.values()):
        states, restored, summary = _put_back(spark, config, ctx, states, summary)
        states, found, removed = _find_orphans(config, states)
    for t in config.tables:
        counts = _write_fk_outputs(
            spark, config, ctx, t, states[t], found[t], removed[t], restored.get(t)
        )
        if counts.get("orphans") and config.on_fk_violation is FkPolicy.QUARANTINE:
            fk = {QuarantineReason.FK_VIOLATION.value: counts["orphans"]}
            counts["quarantined"] = {**summary.tables[t].quarantined, **fk}
        summary = summary.with_table(t, **counts)
    return summary


def _in_foreign_keys(config: Config) -> set[str]:
    """The tables a foreign key joins, as child or parent."""
    return {
        n for t in config.tables.values() for fk in t.foreign_keys for n in (t.name, fk.references)
    }


def _put_back(
    spark: SparkSession,
    config: Config,
    ctx: RunContext,
    states: dict[str, DataFrame],
    summary: RunSummary,
) -> tuple[dict[str, DataFrame], dict[str, DataFrame], RunSummary]:
    """docs/operations.md#a-quarantine-that-heals: the orphan rows offered again
    (``retry.fk_violation``) go back
    into their table's state when every parent they reference is live after resolution
    and their key was not written since. Returns the states, the rows put back per table
    and the summary with their outcomes."""
    states, restored = dict(states), {}
    for t, table in config.tables.items():
        offers = [o for o in retry.offers_of(ctx.staged / t) if o["reason"] == retry.FK]
        if not offers:
            continue
        rows = _offered_rows(spark, table, offers)
        # a key orphaned on two nights: its latest row may come back, the other cannot
        latest = Window.partitionBy(*table.key).orderBy(F.desc(STATE_TS), F.desc(STATE_EVENT_ID))
        rows = rows.withColumn("_n", F.row_number().over(latest)).persist()
        keys = states[t].select(*table.key)
        taken = rows.where(F.col("_n") > 1).unionByName(
            rows.join(keys, list(table.key), "left_semi")
        )
        written = {r[0] for r in taken.select(STATE_EVENT_ID).collect()}
        free = rows.where(F.col("_n") == 1).drop("_n").join(keys, list(table.key), "left_anti")
        for fk in table.foreign_keys:
            parent = config.tables[fk.references]
            live = states[parent.name].where(~F.col(STATE_DELETED))
            pairs = list(zip(fk.columns, parent.key, strict=True))
            parents = live.select(*[F.col(pk).alias(c) for c, pk in pairs]).distinct()
            has = parents.withColumn("_parent", F.lit(True))
            null = reduce(lambda a, b: a | b, [F.col(c).isNull() for c in fk.columns])
            free = (
                free.join(has, list(fk.columns), "left")
                .where(null | F.col("_parent"))
                .drop("_parent")
            )
        free = free.persist()
        back = {r[0] for r in free.select(STATE_EVENT_ID).collect()}
        if back:
            restored[t] = free
            states[t] = states[t].unionByName(free)
        settled = retry.fk_outcomes(offers, back, written)
        retry.add_outcomes(ctx.resolved / t, ctx.run_id, t, settled)
        summary = summary.with_table(t, retried=_merged(summary.tables[t].retried, settled.retried))
    return states, restored, summary


def _offered_rows(spark: SparkSession, table: Table, offers: list[dict[str, Any]]) -> DataFrame:
    """The orphan rows as their quarantine kept them (the table's columns, ``_ts`` and
    ``_origin``, as JSON), as live state rows."""
    schema = state_schema(table)
    kept = T.StructType([schema[c] for c in (*table.column_names, STATE_TS, STATE_ORIGIN)])
    given = spark.createDataFrame(
        [(o[EVENT_ID], o["event"]) for o in offers], "event_id string, row string"
    )
    parsed = given.select(EVENT_ID, F.from_json("row", kept).alias("r"))
    cols = []
    for f in schema.fields:
        if f.name in kept.names:
            cols.append(F.col(f"r.{f.name}").alias(f.name))
        elif f.name == STATE_EVENT_ID:
            cols.append(F.col(EVENT_ID).alias(f.name))
        elif f.name == STATE_DELETED:
            cols.append(F.lit(False).alias(f.name))
        else:
            cols.append(F.lit(None).cast(f.dataType).alias(f.name))
    return parsed.select(*cols)


def _merged(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
    return {k: a.get(k, 0) + b.get(k, 0) for k in sorted({*a, *b})}


def _find_orphans(
    config: Config, states: dict[str, DataFrame]
) -> tuple[dict[str, DataFrame], dict[str, list[DataFrame]], dict[str, list[DataFrame]]]:
    """Every foreign key's orphans, round after round while a quarantine removes rows (a
    removed parent can orphan its children). Returns the states after the quarantine, the
    orphans found and the rows removed, per table."""
    states = dict(states)
    quarantine = config.on_fk_violation is FkPolicy.QUARANTINE
    found: dict[str, list[DataFrame]] = {t: [] for t in config.tables}
    removed: dict[str, list[DataFrame]] = {t: [] for t in config.tables}
    for _round in range(100):
        new_orphans = False
        for child_name, child in config.tables.items():
            for fk in child.foreign_keys:
                parent = config.tables[fk.references]
                live_child = states[child_name].where(~F.col(STATE_DELETED))
                for c in fk.columns:
                    live_child = live_child.where(F.col(c).isNotNull())
                pairs = list(zip(fk.columns, parent.key, strict=True))
                parents = (
                    states[parent.name]
                    .where(~F.col(STATE_DELETED))
                    .select(*[F.col(pk).alias(c) for c, pk in pairs])
                    .distinct()
                )
                orphans = live_child.join(parents, list(fk.columns), "left_anti").persist()
                if orphans.isEmpty():
                    continue
                ref = F.to_json(
                    F.struct(
                        F.lit(parent.name).alias("references"),
                        *[F.col(c).alias(pk) for c, pk in pairs],
                    )
                )
                found[child_name].append(
                    orphans.select(
                        _key_json(list(child.key)).alias(KEY),
                        ref.alias("reference"),
                        F.col(STATE_EVENT_ID).alias(EVENT_ID),
                        F.to_json(F.struct(*child.column_names, STATE_TS, STATE_ORIGIN)).alias(
                            "row"
                        ),
                        F.col(STATE_ORIGIN).alias(ORIGIN),
                    )
                )
                if quarantine:
                    removed[child_name].append(orphans.select(*child.column_names))
                    states[child_name] = states[child_name].join(
                        orphans.select(*child.key), list(child.key), "left_anti"
                    )
                    new_orphans = True
        if not new_orphans:
            break
    return states, found, removed


def _write_fk_outputs(
    spark: SparkSession,
    config: Config,
    ctx: RunContext,
    t: str,
    state: DataFrame,
    found: list[DataFrame],
    removed: list[DataFrame],
    restored: DataFrame | None,
) -> dict[str, Any]:
    """One table's orphans (and their quarantine), the rows the quarantine removed and
    those a retry put back (for the CDC log and the history), its final state and its
    snapshot. Returns their counts."""
    table = config.tables[t]
    out = ctx.resolved / t
    counts: dict[str, Any] = {}
    if found:
        unique_orphans = reduce(DataFrame.unionByName, found).dropDuplicates([KEY]).persist()
        counts["orphans"] = _write(
            unique_orphans.select(*_run_cols(ctx, t), KEY, "reference", EVENT_ID),
            out / "orphans",
        )
        if config.on_fk_violation is FkPolicy.QUARANTINE:
            _write(
                unique_orphans.select(
                    *_run_cols(ctx, t),
                    F.col(ORIGIN).alias(REPLICA),
                    EVENT_ID,
                    F.lit(QuarantineReason.FK_VIOLATION.value).alias("reason"),
                    F.concat(F.lit("no live parent for "), F.col("reference")).alias("detail"),
                    F.col("row").alias("event"),
                ),
                out / "quarantine",
                mode="append",
            )
    if removed and config.captures(table):  # the CDC log and the history: row deletes
        gone = reduce(DataFrame.unionByName, removed).dropDuplicates(list(table.key))
        _write(gone, out / "fk_removed")
    if restored is not None and config.captures(table):
        _write(restored.select(*table.column_names), out / "fk_restored")
    if removed or restored is not None:
        if InPlace.load(out) is not None:  # merged in place: the touched rows, changed
            state = _changed_rows(spark, table, out, removed, restored)
        _write(state, out / layout.STATE)
        (out / STATE_PRE).rmtree()
    elif (folded := _folded_snapshot(out)) is not None:  # the fold's state is final, and
        return {**counts, **folded}  # its tasks wrote the snapshot beside it
    # else the fold's state is the final one, where it is (on S3 a move is a copy)
    final = read_known(spark, final_state(out), state_schema(table))
    seen = Observation()
    final = final.observe(seen, F.count(F.lit(1)).alias("state_rows"))
    live = final.where(~F.col(STATE_DELETED))
    counts["rows"] = _write(live.select(*snapshot_columns(table)), out / layout.SNAPSHOT)
    counts["state_rows"] = int(seen.get["state_rows"])  # the next run checks it
    record = InPlace.load(out)
    if record is not None:  # the tables' rows after the merge
        record = record.carried(counts["state_rows"], counts["rows"])
        record.save(out)
        counts |= {"rows": record.rows, "state_rows": record.state_rows}
    return counts


def _changed_rows(
    spark: SparkSession,
    table: Table,
    out: WorkPath,
    removed: list[DataFrame],
    restored: DataFrame | None,
) -> DataFrame:
    """A table merged in place, after the foreign-key step: the fold's rows but those it
    removed, and the rows it put back; the keys of the removed rows the fold did not
    write (published rows no event touched) join ``touched``: the merge deletes them."""
    rows = read_known(spark, out / STATE_PRE, state_schema(table))
    if removed:
        key = list(table.key)
        gone = reduce(DataFrame.unionByName, removed).select(*key).distinct()
        touch(out, gone.join(rows.select(*key), key, "left_anti"), table)  # published rows
        rows = rows.join(gone, key, "left_anti")
    if restored is not None:
        rows = rows.unionByName(restored.select(*rows.columns))
    return rows


def _folded_snapshot(out: WorkPath) -> dict[str, Any] | None:
    """The snapshot's and the state's rows when the row engine's fold tasks wrote the
    snapshot beside the state (its live rows), which is then final; else None."""
    snapshot, state = output_info(out / layout.SNAPSHOT), output_info(out / STATE_PRE)
    if snapshot is None or state is None:
        return None
    record = InPlace.load(out)
    if record is None or snapshot[1] is None or state[1] is None:
        return {"rows": snapshot[1], "state_rows": state[1]}
    record = record.carried(state[1], snapshot[1])  # the tables' rows after the merge
    record.save(out)
    return {"rows": record.rows, "state_rows": record.state_rows}


def compare_snapshots(
    spark: SparkSession,
    config: Config,
    ctx: RunContext,
    inputs: dict[str, StagedTable],
    summary: RunSummary,
) -> RunSummary:
    """docs/rules.md#convergence against what the replicas hold: each replica snapshot
    export of the date is
    compared with the converged snapshot; differences are appended to the divergence.
    Returns the summary with the divergent keys per replica."""
    for t, table in config.tables.items():
        counts: dict[str, int] = {}
        # docs/rules.md#fine-points: not compared after an error
        if inputs[t].snapshots and not summary.stopped(t):
            out = ctx.resolved / t
            converged = read_output(spark, out / "snapshot")
            evidence = _run_evidence(spark, config, ctx, table, inputs[t])
            for replica in inputs[t].snapshots:
                label = f"exports/replica={replica}/table={t}/snapshot/dt={ctx.dt}"
                where = ctx.staged / t / f"snapshot={replica}"
                mine = read_base(spark, where, table, label)
                run = replace(evidence, columns=published_held(table, columns_held(spark, where)))
                diff = snapshot_divergence(converged, mine, table, replica, ctx.dt, ctx.now_us, run)
                counts[replica] = _write(  # published with the rest of the divergence
                    diff.select(
                        *_run_cols(ctx, t), F.lit("snapshot").alias("source"), *DIVERGENCE_FIELDS
                    ),
                    out / "divergence",
                    mode="append",
                )
        causes = _snapshot_causes(spark, ctx.resolved / t) if any(counts.values()) else {}
        summary = summary.with_table(
            t, snapshot_divergent_keys=counts, snapshot_divergent_causes=causes
        )
    return summary


def _snapshot_causes(spark: SparkSession, out: WorkPath) -> dict[str, dict[str, int]]:
    """The snapshot comparisons' divergent keys per replica by cause, read back (the
    divergent rows only)."""
    rows = read_output(spark, out / "divergence").where(F.col("source") == "snapshot")
    causes: dict[str, dict[str, int]] = {}
    for r in rows.groupBy(REPLICA, CAUSE).count().collect():
        causes.setdefault(r[REPLICA], {})[r[CAUSE]] = r["count"]
    return causes


def _run_evidence(
    spark: SparkSession, config: Config, ctx: RunContext, table: Table, staged: StagedTable
) -> RunEvidence:
    """What the run knows that explains a snapshot's divergent rows (read lazily: only
    the differing keys are joined with it)."""
    out = ctx.resolved / table.name
    copies, _ = read_copies(
        spark, config, table, ctx.staged / table.name, staged.exports, ctx.now_us
    )
    return RunEvidence(
        state=read_known(spark, final_state(out), state_schema(table)),
        copies=copies,
        conflicts=read_output(spark, out / "conflicts"),
        perspectives=read_output(spark, out / "divergence"),
        columns=frozenset(),
        orphans=_quarantined_orphans(spark, config, table, out),
    )


def _quarantined_orphans(
    spark: SparkSession, config: Config, table: Table, out: WorkPath
) -> DataFrame | None:
    """The key columns of the orphans ``on_fk_violation: quarantine`` took out of the
    table's converged state (None: another rule, or a table without foreign keys)."""
    if config.on_fk_violation is not FkPolicy.QUARANTINE or not table.foreign_keys:
        return None
    schema = T.StructType([state_schema(table)[c] for c in table.key])
    orphans = read_known(spark, out / "orphans", f"{KEY} string")
    return orphans.select(F.from_json(KEY, schema).alias("_k")).select("_k.*").distinct()


def resolve_stage(spark: SparkSession, config: Config, ctx: RunContext) -> RunSummary:
    inputs = load_inputs(ctx)
    ctx.resolved.rmtree()
    tables: dict[str, TableSummary] = {}
    conflicts: dict[str, Mapping[tuple[str, str, str], int]] = {}
    for name, table in config.tables.items():
        log.info("resolve %s ...", name)
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
    try:
        summary = check_foreign_keys(spark, config, ctx, summary)
        summary = compare_snapshots(spark, config, ctx, inputs, summary)
    finally:
        spark.catalog.clearCache()
    for name in summary.tables:  # retry
        still = retry.open_after(spark, ctx.staged / name, ctx.resolved / name)
        summary = summary.with_table(
            name, quarantine_open=sum(still.values()), quarantine_open_reasons=still
        )
    assert config.store
    others = stats.kept_rows(Lake(open_store(config.store)), ctx.dt, config.tables)
    stats.write_stats(ctx.resolved, summary, conflicts, others)  # conflict stats
    for w in skew_warnings(summary.tables, config.max_clock_skew_seconds):
        log.warning("resolve: %s", w)
    save_summary(ctx, summary)
    return summary


def save_summary(ctx: RunContext, summary: RunSummary) -> None:
    (ctx.resolved / "summary.json").write_text(summary.to_json())


def load_summary(ctx: RunContext) -> RunSummary:
    p = ctx.resolved / "summary.json"
    if not p.exists():
        from pipeline.core.errors import StageError

        raise StageError(f"no resolved run for {ctx.dt}: run `cdr resolve` first")
    return RunSummary.from_json(p.read_text())
