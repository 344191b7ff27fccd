"""The history stage (docs/outputs.md#history): each ``history`` table's SCD type 2 table, one row
per version of a key as the pipeline published it.

Input: the changes the resolve stage recorded (``resolved/<table>/changes``, the CDC log's
input too: what each applied event did to the row a reader sees), the rows the foreign-key
quarantine removed, the history as published before the run (staged at ingest) and, the
first time, the state the run starts from. Output: ``resolved/<table>/history``, the whole
table, which publish commits like the snapshot (one Delta version, readers see whole runs);
for a night merged in place (``pipeline.ingest.inplace``), every version of the keys it touched
(the closed ones with their ``_valid_to`` set, and the new ones), which publish merges by
key, date and version number.

- **Versions.** A change that changed the row a reader sees opens a version: its values
  (for a deletion, the row it deleted, with ``_deleted``), its ``_ts``, ``_origin`` and
  ``_event_id``. Changes of one key come in canonical order; ``_version`` numbers a key's
  versions from 1.
- **Intervals.** ``_valid_from`` is the running maximum of the versions' ts, so a late
  change (older than the version before it) starts where that one started and says so in
  ``_late``; ``_valid_to`` is the next version's ``_valid_from`` (null while current).
- **Track.** With ``track``, an UPDATE that wrote none of those columns is merged into the
  key's current version (type 1): its values change, its interval does not.
- **Cell tables.** A TTL expiry that changes what a reader sees is a version of its own,
  at the instant it expires, with no origin or event.
- **Reruns.** The versions a run appends carry its ``dt``; a run of D drops those of an
  earlier run of D and continues each key from its last version of an earlier date; a
  backfill keeps the versions of later dates as they are.
- **The first run** with ``history`` (or a rerun of it) starts each live row of the prior
  state as a version (its ``_ts``, ``_origin`` and ``_event_id``), so that every key's
  last version is its snapshot row from the first night on.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from functools import reduce

import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, SparkSession, Window, WindowSpec
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipeline.changes.cdc import run_changes
from pipeline.core import layout
from pipeline.core.columns import (
    DT,
    EVENT_ID,
    EXPIRY,
    HISTORY_RUN_ID,
    LATE,
    MARKER,
    ORIGIN,
    POS,
    RANK,
    RUN_ID,
    STATE_DELETED,
    STATE_EVENT_ID,
    STATE_ORIGIN,
    STATE_TS,
    TS,
    VALID_FROM,
    VALID_TO,
    VERSION,
)
from pipeline.core.config import Config, Table
from pipeline.core.layout import HISTORY
from pipeline.core.policy import ChangeKind, Granularity
from pipeline.core.summary import RunSummary
from pipeline.ingest.inplace import InPlace
from pipeline.ingest.prior import HISTORY_PIN
from pipeline.resolve.inplace import history_keys
from pipeline.resolve.state import read_prior
from pipeline.spark.schema import row_struct_type
from pipeline.storage.context import RunContext
from pipeline.storage.lake_read import Pin, read_pinned
from pipeline.storage.outputs import write_output
from pipeline.storage.workpath import WorkPath, read_folder

log = logging.getLogger(__name__)

#: the columns after the table's own (docs/outputs.md#history), then ``_version`` and ``dt``
META = (
    (VALID_FROM, T.TimestampType()),
    (VALID_TO, T.TimestampType()),
    (STATE_DELETED, T.BooleanType()),
    (STATE_TS, T.TimestampType()),
    (STATE_ORIGIN, T.StringType()),
    (STATE_EVENT_ID, T.StringType()),
    (HISTORY_RUN_ID, T.StringType()),
    (LATE, T.BooleanType()),
    (VERSION, T.LongType()),
    (DT, T.DateType()),
)


def history_schema(table: Table) -> T.StructType:
    meta = [T.StructField(n, t) for n, t in META]
    return T.StructType(list(row_struct_type(table).fields) + meta)


def _instant(micros: Column) -> Column:
    return F.timestamp_micros(micros)


# ---------------------------------------------------------------------- this run's versions


def _opens(table: Table) -> Column:
    """Whether a change opens a version: anything but an UPDATE that wrote no tracked
    column (``track``)."""
    track = table.history.track if table.history is not None else None
    if track is None:
        return F.lit(True)
    tracked = F.array(*[F.lit(c) for c in sorted(track)])
    return (F.col("kind") != ChangeKind.UPDATE.value) | F.arrays_overlap("cols", tracked)


def _visible(changes: DataFrame, table: Table, origins: Column) -> DataFrame:
    """The changes that changed the row a reader sees, flat: the key's columns, the row
    (for a deletion, the row deleted), the order and what a version records."""
    row = F.coalesce(F.col("post"), F.col("pre"))
    return changes.where(~F.col("pre").eqNullSafe(F.col("post"))).select(
        *[F.col(f"key.{c}").alias(c) for c in table.key],
        TS,
        RANK,
        POS,
        EVENT_ID,
        row.alias("row"),
        F.col("post").isNull().alias("deleted"),
        origins[F.col(RANK)].alias(ORIGIN),
        _opens(table).alias("opens"),
    )


# ---------------------------------------------------------------------- TTL expiry (cells)


def _slot(setting: Column, expiry: Column) -> Column:
    """Whether an observation sets a slot's expiry (s), and the expiry (null: none)."""
    return F.struct(setting.alias("set"), expiry.cast("long").alias("exp"))


def _after_changes(changes: DataFrame, table: Table) -> DataFrame:
    """The row a reader saw after each change: a column's expiry is set by a change that
    wrote it, the marker's by an INSERT (on) and a deletion (off)."""
    post = F.col("post")
    inserted = F.col("kind") == ChangeKind.INSERT.value
    gone = F.col("kind").isin(ChangeKind.ROW_DELETE.value, ChangeKind.PARTITION_DELETE.value)
    exp = F.col(EXPIRY)
    return changes.select(
        *[F.col(f"key.{c}").alias(c) for c in table.key],
        TS,
        RANK,
        EVENT_ID,
        post.alias("row"),
        *[
            _slot(F.array_contains("cols", c), F.when(post[c].isNotNull(), exp)).alias(c)
            for c in table.value_columns
        ],
        F.struct((inserted | gone).alias("set"), inserted.alias("on"), exp.alias("exp")).alias(
            MARKER
        ),
    )


def _prior_rows(prior: DataFrame, after: DataFrame, table: Table) -> DataFrame:
    """The prior state's live rows that may expire or that a change starts from, as the
    first observation of their key (every slot set from ``_cells`` and ``_marker``)."""

    def ttl_expiry(slot: str) -> Column:
        return F.when(F.col(f"{slot}.ttl").isNotNull(), F.col(f"{slot}.expiry"))

    values = table.value_columns
    expiring = [F.col(f"_cells.{c}.ttl").isNotNull() for c in values]
    changed = after.select(*table.key, F.lit(True).alias("_changed")).distinct()
    watched = prior.where(~F.col(STATE_DELETED)).join(changed, list(table.key), "left")
    keep = reduce(
        lambda a, b: a | b, expiring, F.col("_marker.ttl").isNotNull() | F.col("_changed")
    )
    return watched.where(keep).select(
        *table.key,
        F.lit(-1).cast("long").alias(TS),
        F.lit(-1).alias(RANK),
        F.lit("").alias(EVENT_ID),
        F.struct(*table.column_names).alias("row"),
        *[_slot(F.lit(True), ttl_expiry(f"_cells.{c}")).alias(c) for c in values],
        F.struct(
            F.lit(True).alias("set"),
            F.col(MARKER).isNotNull().alias("on"),
            ttl_expiry(MARKER).alias("exp"),
        ).alias(MARKER),
    )


def _view_at(t: Column, table: Table) -> tuple[Column, Column]:
    """Whether a reader sees an observation's row at instant ``t`` (µs), and the row:
    a value or the marker is seen until its expiry (``x_<col>``, ``m``)."""
    values = table.value_columns
    seen = {
        c: F.col(f"row.{c}").isNotNull() & F.coalesce(F.col(f"x_{c}") * 1_000_000 > t, F.lit(True))
        for c in values
    }
    marker = F.col("m.on") & F.coalesce(F.col("m.exp") * 1_000_000 > t, F.lit(True))
    visible = reduce(lambda a, b: a | b, seen.values(), marker)
    row = F.struct(
        *[
            F.col(f"row.{c}") if c in table.key else F.when(seen[c], F.col(f"row.{c}")).alias(c)
            for c in table.column_names
        ]
    )
    return visible, row


def _expirations(changes: DataFrame, prior: DataFrame, table: Table, now_us: int) -> DataFrame:
    """The versions a cell table's TTL expiry makes (in ``_visible``'s shape): between two
    observations of a key's row, at each instant a visible value or the row marker
    expires, the row a reader sees from then on, when it differs from the one before (a
    deletion when nothing of it is left). Such a version has no origin or event; it sorts
    before an event of the same microsecond, which no longer sees what expired."""
    values = table.value_columns
    by_key = Window.partitionBy(*table.key).orderBy(TS, RANK, EVENT_ID)
    running = by_key.rowsBetween(Window.unboundedPreceding, Window.currentRow)

    def standing(c: str) -> Column:
        return F.last(F.when(F.col(f"{c}.set"), F.col(c)), ignorenulls=True).over(running)

    after = _after_changes(changes, table)
    obs = (
        _prior_rows(prior, after, table)
        .unionByName(after)
        .select(
            *table.key,
            TS,
            "row",
            *[standing(c)["exp"].alias(f"x_{c}") for c in values],
            standing(MARKER).alias("m"),
            F.coalesce(F.lead(TS).over(by_key), F.lit(now_us)).alias("until"),
        )
    )
    ends = [F.col(f"x_{c}") for c in values] + [F.when(F.col("m.on"), F.col("m.exp"))]
    instants = F.array_distinct(
        F.filter(
            F.array(*[e * 1_000_000 for e in ends]),
            lambda e: e.isNotNull() & (e > F.col(TS)) & (e <= F.col("until")),
        )
    )
    at = obs.where(F.col("row").isNotNull()).select("*", F.explode(instants).alias("at"))

    was, row_before = _view_at(F.col("at") - 1, table)
    now, row_after = _view_at(F.col("at"), table)
    changed = (was != now) | (now & ~row_before.eqNullSafe(row_after))
    return at.where(was & changed).select(
        *table.key,
        F.col("at").alias(TS),
        F.lit(-1).alias(RANK),
        F.lit(None).cast("long").alias(POS),
        F.lit("").alias(EVENT_ID),
        F.when(now, row_after).otherwise(row_before).alias("row"),
        (~now).alias("deleted"),
        F.lit(None).cast("string").alias(ORIGIN),
        F.lit(True).alias("opens"),
    )


def _in_order(table: Table) -> WindowSpec:
    """A key's versions in order: by the date of the run that appended them, then number."""
    return Window.partitionBy(*table.key).orderBy(DT, "_version")


def _as_rows(versions: DataFrame, table: Table) -> DataFrame:
    """Published versions in the shape of :func:`_visible`'s rows (each opens itself)."""
    return versions.select(
        *table.key,
        F.struct(*table.column_names).alias("row"),
        F.col(STATE_DELETED).alias("deleted"),
        F.unix_micros(STATE_TS).alias(TS),
        F.lit(None).cast("int").alias(RANK),
        F.lit(None).cast("long").alias(POS),
        F.col(STATE_EVENT_ID).alias(EVENT_ID),
        F.col(STATE_ORIGIN).alias(ORIGIN),
        F.lit(True).alias("opens"),
        F.unix_micros("_valid_from").alias("vf"),
        F.col("_run_id").alias(RUN_ID),
        F.col("_late").alias("late"),
        F.col("_version").alias("version"),
        DT,
        F.lit(False).alias("new"),
    )


def _versions(rows: DataFrame, table: Table, ctx: RunContext) -> DataFrame:
    """Every key's versions from its published ones and this run's changes (``new``),
    in one pass over the rows partitioned by key: a change opens a version (numbered
    after the key's earlier ones) or joins the one before it (type 1: the version takes
    its row); an opened version starts at its ts, or where the version before it started
    when that is later (``_late``); each version ends where the next one starts."""
    key = list(table.key)
    position = [F.col(c) for c in (DT, "version", TS, RANK, POS, EVENT_ID)]
    position[1] = position[1].asc_nulls_last()
    order = Window.partitionBy(*key).orderBy(*position)
    before = order.rowsBetween(Window.unboundedPreceding, -1)
    first = F.row_number().over(order) == 1  # a key's first change opens, whatever it is
    opens = F.col("opens") | first
    started = F.max(F.when(opens, F.coalesce("vf", TS))).over(before)
    df = rows.select(
        "*",
        opens.alias("opens_"),
        started.alias("started"),
        F.sum(F.col("opens").cast("long")).over(order).alias("grp"),
        F.when(~F.first("opens").over(order), F.lit(1)).otherwise(F.lit(0)).alias("shift"),
    ).withColumn("grp", F.col("grp") + F.col("shift"))
    if table.history is not None and table.history.track is not None:
        joined = Window.partitionBy(*key, "grp").orderBy(*position)
        whole = joined.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
        df = df.withColumn("row", F.last("row").over(whole))
    new = F.col("new")
    ts, start = F.col(TS), F.col("started")
    df = df.where("opens_").select(
        *[F.col(f"row.{c}").alias(c) for c in table.column_names],
        F.when(new, F.greatest(ts, start)).otherwise(F.col("vf")).alias("vf"),
        F.col("deleted").alias(STATE_DELETED),
        _instant(ts).alias(STATE_TS),
        F.col(ORIGIN).alias(STATE_ORIGIN),
        F.when(F.col(EVENT_ID) != "", F.col(EVENT_ID)).alias(STATE_EVENT_ID),
        F.when(new, F.lit(ctx.run_id)).otherwise(F.col(RUN_ID)).alias("_run_id"),
        F.when(new, F.coalesce(ts < start, F.lit(False))).otherwise(F.col("late")).alias("_late"),
        F.when(new, F.col("grp")).otherwise(F.col("version")).alias("_version"),
        DT,
    )
    return df.select(
        *table.column_names,
        _instant(F.col("vf")).alias("_valid_from"),
        _instant(F.lead("vf").over(_in_order(table))).alias("_valid_to"),
        *[n for n, _ in META[2:]],
    )


def as_of_run(history: DataFrame, table: Table, ctx: RunContext) -> DataFrame:
    """The history as the run's date left it: without the versions of later dates that a
    backfill keeps (what the ``history`` suite checks against the run's snapshot)."""
    closed = F.lead("_valid_from").over(_in_order(table))
    return history.where(F.col(DT) <= F.lit(ctx.dt)).withColumn("_valid_to", closed)


# ---------------------------------------------------------------------- inputs


def _staged_history(spark: SparkSession, ctx: RunContext, table: Table) -> DataFrame | None:
    """The published history ingest pinned, read by the executors through Delta."""

    pin = Pin.load(ctx.staged / table.name / HISTORY_PIN)
    if pin is None:
        return None
    df = read_pinned(spark, pin)
    schema = history_schema(table)
    return df.select(
        *[
            (F.col(f"`{f.name}`") if f.name in df.columns else F.lit(None))
            .cast(f.dataType)
            .alias(f.name)
            for f in schema.fields
        ]
    )


def _continues(spark: SparkSession, ctx: RunContext, table: Table) -> bool:
    """Whether the published history holds versions of an earlier date than the run's:
    if not, the run starts it from the prior state."""
    history = _staged_history(spark, ctx, table)
    return history is not None and bool(history.where(F.col(DT) < F.lit(ctx.dt)).take(1))


def _seed(spark: SparkSession, ctx: RunContext, table: Table) -> DataFrame:
    """The prior state's live rows as the first versions of their keys (a row without a
    ``_ts`` as valid since the epoch)."""
    prior = read_prior(spark, ctx.staged / table.name, table, check=False)
    since = _instant(F.coalesce(F.col(STATE_TS), F.lit(0)))
    return prior.where(~F.col(STATE_DELETED)).select(
        *table.column_names,
        since.alias("_valid_from"),
        F.lit(None).cast("timestamp").alias("_valid_to"),
        F.lit(False).alias(STATE_DELETED),
        since.alias(STATE_TS),
        STATE_ORIGIN,
        STATE_EVENT_ID,
        F.lit(ctx.run_id).alias("_run_id"),
        F.lit(False).alias("_late"),
        F.lit(1).cast("long").alias("_version"),
        F.lit(ctx.dt).alias(DT),
    )


def build_history(
    spark: SparkSession,
    changes: DataFrame,
    table: Table,
    ctx: RunContext,
    origins: dict[int, str],
) -> DataFrame:
    """The table's whole history after this run (module docstring): the versions of
    earlier dates (or, the first time, the prior state's rows), this run's changes, and
    the versions of later dates a backfill keeps as they are."""
    staged = _staged_history(spark, ctx, table)
    kept = None if staged is None else staged.where(F.col(DT) != F.lit(ctx.dt))
    if kept is None or not _continues(spark, ctx, table):
        seed = _seed(spark, ctx, table)
        kept = seed if kept is None else seed.unionByName(kept)
    if merged_in_place(ctx, table):  # only the touched keys' versions, merged by publish
        kept = kept.join(
            history_keys(spark, ctx.resolved / table.name, table), list(table.key), "left_semi"
        )
    ranks = F.create_map(*[x for r, o in sorted(origins.items()) for x in (F.lit(r), F.lit(o))])
    visible = _visible(changes, table, ranks)
    if table.granularity is Granularity.CELL:
        prior = read_prior(spark, ctx.staged / table.name, table, check=False)
        visible = visible.unionByName(_expirations(changes, prior, table, ctx.now_us))
    new = {"vf": "long", RUN_ID: "string", "late": "boolean", "version": "long"}
    fields = [F.lit(None).cast(t).alias(n) for n, t in new.items()]
    fields += [F.lit(ctx.dt).alias(DT), F.lit(True).alias("new")]
    rows = _as_rows(kept, table).unionByName(visible.select("*", *fields))
    return _versions(rows, table, ctx).select(*history_schema(table).fieldNames())


def merged_in_place(ctx: RunContext, table: Table) -> bool:
    """Whether the run merges the table's history in place (``pipeline.ingest.inplace``)."""
    record = InPlace.load(ctx.resolved / table.name)
    return record is not None and layout.table_path(table.name, HISTORY) in record.versions


def history_stage(
    spark: SparkSession, config: Config, ctx: RunContext, summary: RunSummary
) -> RunSummary:
    """Write ``resolved/<table>/history`` for every table with ``history``."""
    removed_at = ctx.now_us + config.max_clock_skew_seconds * 1_000_000
    tables = {}
    for name, table in config.tables.items():
        if table.history is None or summary.stopped(name):
            continue
        origins = {r: o for o, r in config.tie_ranks(table.tie_break).items()}
        src = ctx.resolved / name
        changes = run_changes(spark, src, table, removed_at)
        dest = src / HISTORY
        try:
            write_output(build_history(spark, changes, table, ctx, origins), dest)
        finally:
            spark.catalog.clearCache()
        counts = _counts(dest, ctx)
        if merged_in_place(ctx, table):  # the history's rows after the merge
            record = InPlace.load(src)
            assert record is not None
            record = replace(record, history_rows=record.prior_history + counts[1])
            record.save(src)
            counts = (record.history_rows, counts[1], counts[2])
        log.info("history %s: %d versions, %d new (%d late)", name, *counts)
        tables[name] = replace(summary.tables[name], history=dict(zip(COUNTS, counts, strict=True)))
    return replace(summary, tables={**summary.tables, **tables})


#: the history's counts in the run report: its versions, those this run appended, late ones
COUNTS = ("rows", "new", "late")


def _counts(dest: WorkPath, ctx: RunContext) -> tuple[int, int, int]:
    """The history's versions, those this run appended, and those of them that are late."""
    t = read_folder(dest, ["_run_id", "_late"])
    if t is None:
        return 0, 0, 0
    mine = pc.equal(t["_run_id"], ctx.run_id)
    late = pc.and_(mine, t["_late"])
    return t.num_rows, pc.sum(mine).as_py() or 0, pc.sum(late).as_py() or 0
