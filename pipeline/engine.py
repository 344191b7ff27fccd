"""Row-granularity resolution on Spark (semantics.md §2-§5, §7-§9, §12).

Design for scale: one shuffle by key brings each key's prior state row and every copy of
its events together; the copies of an event are deduplicated there (§12: the origin's own
copy wins, else the first replica in config order), so that no shuffle by ``event_id`` is
needed (copies that disagree on their content are settled first, by a narrow aggregation).
Then every key falls into one of three paths:

- **untouched**: no event; the state row passes through (a TRUNCATE of the run applies
  to it with a column expression);
- **fast**: exactly one event that no rule could make a conflict (an INSERT onto an
  absent key, an UPDATE or DELETE of a live row last written by the same origin and not
  newer, no column drift, no coupling). Done with Spark column expressions: the large
  majority of keys never reach Python. A single event converges in every replica's order,
  so it never diverges either;
- **fold**: everything else, folded in Python by ``pipeline.rowfold`` through
  ``mapInArrow`` over the key-sorted stream (no per-key ``applyInPandas``: see
  notes/performance.md). Keys *coupled* by a key change or by a shared unique value are
  folded together as one group, since their rules read each other's rows.

``tests/test_engine.py`` checks the fast path against the Python fold on generated events.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import date
from functools import reduce
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema

from pipeline.config import Config, Table
from pipeline.foldrun import GroupFolder, make_fold_function
from pipeline.frames import (
    CONFLICT_FIELDS,
    DIVERGENCE_FIELDS,
    FOLD_INPUT,
    POSITION,
    fold_output,
)
from pipeline.policy import ChangeKind, ConflictType, Detection, Resolver, Scope
from pipeline.rowfold import Event, FoldSpec
from pipeline.schema import change_schema, row_struct_type, state_schema

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Resolved:
    """The results of one table, as DataFrames over a persisted fold output."""

    state: DataFrame
    conflicts: DataFrame
    divergence: DataFrame
    fates: DataFrame  # per copy: event_id, replica, fate (applied | discarded | errored | ...)
    quarantine: DataFrame  # the quarantined events: their chosen copy
    truncates: list[Event]
    changes: DataFrame | None = None  # schema.change_schema, when the CDC log is on


def rank_map(config: Config, table: Table) -> Column:
    ranks = config.tie_ranks(table.tie_break)
    return F.create_map(*[x for r, i in ranks.items() for x in (F.lit(r), F.lit(i))])


def purge(prior: DataFrame, now_us: int, gc_grace_seconds: int) -> DataFrame:
    """§7: a tombstone is purged when ``deleted_at < now - gc_grace_seconds``."""
    horizon = now_us - gc_grace_seconds * 1_000_000
    return prior.where(~(F.col("_deleted") & (F.col("_deleted_at") < horizon)))


def key_struct(table: Table, row: str | None = None) -> Column:
    return F.struct(*[F.col(f"{row}.{c}" if row else c).alias(c) for c in table.key])


def admit_transactions(
    events: DataFrame, prior: DataFrame, config: Config, table: Table
) -> DataFrame:
    """§5/§12 ``scope: transaction``: a transaction ``(origin, txid)`` is admitted only
    when its time (its latest event ts) beats, tie-break included, every key it touches
    in the state the run started from. ``events`` are the typed copies
    (``frames.copy_schema``). Adds ``rejected``."""
    if table.scope is not Scope.TRANSACTION:
        return events.withColumn("rejected", F.lit(False))
    ranks = rank_map(config, table)
    tx = events.where(F.col("txid").isNotNull() & F.col("ts").isNotNull()).select(
        "origin", "txid", "ts", "key", "new_key"
    )
    times = tx.groupBy("origin", "txid").agg(F.max("ts").alias("tx_ts"))
    touched = tx.select(
        "origin",
        "txid",
        F.explode(F.filter(F.array("key", "new_key"), lambda k: k.isNotNull())).alias("key"),
    )
    local = prior.select(
        key_struct(table).alias("key"),
        F.col("_ts").alias("l_ts"),
        F.coalesce(ranks[F.col("_origin")], F.lit(-1)).alias("l_rank"),
    )
    beaten = (
        touched.join(local, "key")
        .join(times, ["origin", "txid"])
        .where(F.struct("tx_ts", ranks[F.col("origin")]) <= F.struct("l_ts", "l_rank"))
        .select("origin", "txid")
        .distinct()
        .withColumn("rejected", F.lit(True))
    )
    return events.join(F.broadcast(beaten), ["origin", "txid"], "left").withColumn(
        "rejected", F.coalesce("rejected", F.lit(False))
    )


def coupled_keys(events: DataFrame, prior: DataFrame, table: Table) -> DataFrame | None:
    """Keys whose fold must see other keys' rows: both ends of every key change, and every
    key that may share a unique value with another key at some point of the run (a safe
    over-approximation: each key's possible values come from its prior row and its
    events; keys touched by key changes pool their values, since rows move between them).
    ``events`` are the typed copies (``frames.copy_schema``)."""
    events = events.where(F.col("key").isNotNull())
    moves = events.where(F.col("new_key").isNotNull())
    moved = moves.select("key").union(moves.select(F.col("new_key").alias("key"))).distinct()
    if not table.unique:
        return moved
    moved_flag = moved.withColumn("moved", F.lit(True))
    unique_cols = sorted({c for u in table.unique for c in u})
    live = prior.where(~F.col("_deleted")).select(
        key_struct(table).alias("key"), *[F.col(c).alias(f"v_{c}") for c in unique_cols]
    )
    names = table.column_names
    writes = events.where(F.col("op").isin("INSERT", "UPDATE")).select(
        F.coalesce("new_key", "key").alias("key"),
        *[
            F.when(F.col("after_has")[names.index(c)], F.col(f"after.{c}")).alias(f"v_{c}")
            for c in unique_cols
        ],
    )
    values = live.unionByName(writes).join(F.broadcast(moved_flag), "key", "left")
    unit = F.when(F.col("moved"), F.lit(None)).otherwise(F.col("key"))
    values = values.withColumn(
        "unit", F.struct(F.col("moved").isNotNull().alias("m"), unit.alias("k"))
    )
    shared_units = []
    for cols in table.unique:
        sets = values.groupBy("unit").agg(*[F.collect_set(f"v_{c}").alias(f"s_{c}") for c in cols])
        tuples = sets
        for c in cols:
            tuples = tuples.withColumn(f"t_{c}", F.explode(f"s_{c}"))
        shared = (
            tuples.groupBy(*[f"t_{c}" for c in cols])
            .agg(F.collect_set("unit").alias("units"))
            .where(F.size("units") > 1)
            .select(F.explode("units").alias("unit"))
        )
        shared_units.append(shared)
    units = reduce(DataFrame.union, shared_units).distinct()
    by_unit = values.select("unit", "key").distinct().join(units, "unit").select("key")
    return by_unit.union(moved).distinct()


def build_items(copies: DataFrame, prior: DataFrame, config: Config, table: Table) -> DataFrame:
    """Event copies and prior state rows in one frame, by ``key``: ``is_event``,
    ``event_id`` and the fields of each kind (a state row's are ``row`` and ``s_*``)."""
    ev = copies.select(F.lit(1).alias("is_event"), *copies.columns)
    st = prior.select(
        key_struct(table).alias("key"),
        F.lit(0).alias("is_event"),
        F.col("_event_id").alias("event_id"),
        F.col("_ts").alias("s_ts"),
        F.coalesce(rank_map(config, table)[F.col("_origin")], F.lit(-1)).alias("s_rank"),
        F.struct(*table.column_names).alias("row"),
        F.col("_origin").alias("s_origin"),
        F.col("_deleted").alias("s_deleted"),
        F.col("_deleted_at").alias("s_deleted_at"),
    )
    return ev.unionByName(st, allowMissingColumns=True)


def fast_predicate(table: Table) -> Column:
    """True when the key's only event cannot meet a conflict (§3), given the local row
    ``l_*``; mirrors ``RowFold`` exactly (tests/test_engine.py)."""
    op = F.col("op")
    l_exists = F.col("l_exists")
    l_live = l_exists & ~F.col("l_deleted")
    same_origin = F.col("l_origin").isNull() | (F.col("l_origin") == F.col("origin"))
    not_newer = F.col("l_ts") <= F.col("ts")
    no_drift = F.size("extra_cols") == 0
    names = table.column_names
    has_all = reduce(
        lambda a, b: a & b,
        [F.col("after_has")[names.index(c)] for c in table.value_columns],
        F.lit(True),
    )
    tomb_ok = table.resolvers[ConflictType.INSERT_EXISTS] is not Resolver.DELETE_WINS
    insert = (op == "INSERT") & no_drift & has_all & (~l_exists | (F.col("l_deleted") & tomb_ok))
    no_image = (
        ~reduce(
            lambda a, b: a | b,
            [F.col("before_has")[names.index(c)] for c in names if c not in table.delta],
            F.lit(False),
        )
        if table.detection is Detection.BEFORE_IMAGE
        else F.lit(True)
    )
    update = (
        (op == "UPDATE")
        & F.col("new_key").isNull()
        & no_drift
        & l_live
        & same_origin
        & not_newer
        & no_image
    )
    delete = (op == "DELETE") & l_live & same_origin & not_newer
    return ~F.col("rejected") & (insert | update | delete)


def classify(
    items: DataFrame,
    coupled: DataFrame | None,
    has_truncate: bool,
    table: Table,
    config: Config,
    now_us: int,
) -> DataFrame:
    """The one shuffle, by key. Per copy: ``rn`` (1 for the copy that stands for its event:
    §12, the origin's own copy, else the first replica in config order) and ``ev_reason``
    (why the event is quarantined: its standing copy's guard); per key: ``n_ev`` (good
    events), the local row ``l_*``, ``coupled``, ``fast``, ``key_fast``."""
    w_key = Window.partitionBy("key")
    w_ev = Window.partitionBy("key", "is_event", "event_id").orderBy("pref", "replica")
    is_state = F.col("is_event") == 0
    df = items.withColumn("rn", F.row_number().over(w_ev))
    df = df.withColumn("ev_reason", F.first("reason").over(w_ev))
    good = (F.col("is_event") == 1) & (F.col("rn") == 1) & F.col("ev_reason").isNull()
    df = (
        df.select(
            "*",
            F.sum(good.cast("int")).over(w_key).alias("n_ev"),
            # a key has at most one state row: its fields, spread to the key's events
            F.max(F.when(is_state, F.lit(True))).over(w_key).alias("l_exists_"),
            F.max("s_ts").over(w_key).alias("l_ts"),
            F.first("s_origin", ignorenulls=True).over(w_key).alias("l_origin"),
            F.max("s_deleted").over(w_key).alias("l_deleted"),
            F.first("row", ignorenulls=True).over(w_key).alias("l_row"),
        )
        .withColumn("l_exists", F.coalesce("l_exists_", F.lit(False)))
        .drop("l_exists_")
    )
    if coupled is not None:
        df = df.join(F.broadcast(coupled.withColumn("coupled", F.lit(True))), "key", "left")
        df = df.withColumn("coupled", F.coalesce("coupled", F.lit(False)))
    else:
        df = df.withColumn("coupled", F.lit(False))
    fast = (
        good
        & (F.col("n_ev") == 1)
        & ~F.col("coupled")
        & F.lit(not has_truncate)
        & fast_predicate(table)
    )
    df = df.withColumn("fast", F.coalesce(fast, F.lit(False)))
    return df.withColumn("key_fast", F.max(F.col("fast").cast("int")).over(w_key) == 1).withColumn(
        "l_row", F.when(F.col("fast"), F.col("l_row"))
    )


def cross_key_disputes(classified: DataFrame) -> list[str]:
    """Events whose copies sit under different keys (or some under a key that does not
    parse): their copies never met in one key group, so each group chose its own copy."""
    chosen = classified.where((F.col("is_event") == 1) & (F.col("rn") == 1))
    rows = (
        chosen.groupBy("event_id")
        .agg(F.count(F.lit(1)).alias("n"))
        .where(F.col("n") > 1)
        .select("event_id")
        .collect()
    )
    return [r.event_id for r in rows]


def settle_disputes(copies: DataFrame, ids: list[str]) -> DataFrame:
    """§12 "Duplicates" across keys: the winning copy (the origin's own, else the first
    replica in config order) gives its key and record to every copy of the event, so that
    they meet in one key group, where the winner stands for the event and the others still
    count for their replica's order and accounting. Rare: the winners are broadcast."""
    w = Window.partitionBy("event_id").orderBy("pref", "replica")
    moved = [
        c for c in copies.columns if c not in ("event_id", "replica", "file", "line", "seq", "pref")
    ]
    winners = (
        copies.where(F.col("event_id").isin(ids))
        .withColumn("_rn", F.row_number().over(w))
        .where("_rn = 1")
        .select(
            "event_id", F.lit(True).alias("_disputed"), *[F.col(c).alias(f"_w_{c}") for c in moved]
        )
    )
    joined = copies.join(F.broadcast(winners), "event_id", "left")
    return joined.select(
        *[
            F.when(F.col("_disputed"), F.col(f"_w_{c}")).otherwise(F.col(c)).alias(c)
            if c in moved
            else F.col(c)
            for c in copies.columns
        ]
    )


def _num(c: Column) -> Column:
    return F.coalesce(c, F.lit(0))


def fast_row(table: Table) -> list[Column]:
    """The new row (the table's columns) of each fast event, with column expressions
    (§2-§4, §8)."""
    op = F.col("op")
    cols = []
    for i, c in enumerate(table.columns):
        n = c.name
        written = F.col("after_has")[i]
        if n in table.key:
            v = F.col(f"key.{n}")
        elif n in table.delta:
            delta = F.col(f"after.{n}") - F.col(f"before.{n}")
            v = (
                F.when(op == "INSERT", F.col(f"after.{n}"))
                .when(written, _num(F.col(f"l_row.{n}")) + delta)
                .otherwise(F.col(f"l_row.{n}"))
            )
        else:
            v = (
                F.when(op == "INSERT", F.col(f"after.{n}"))
                .when(written, F.col(f"after.{n}"))
                .otherwise(F.col(f"l_row.{n}"))
            )
        if n not in table.key:
            v = F.when(op != "DELETE", v)
        cols.append(v.cast(state_schema(table)[n].dataType).alias(n))
    return cols


def fast_state(df: DataFrame, table: Table, now_us: int) -> DataFrame:
    """The new state row of each fast event."""
    deleted = F.col("op") == "DELETE"
    return df.select(
        *fast_row(table),
        F.col("ts").alias("_ts"),
        F.col("origin").alias("_origin"),
        F.col("event_id").alias("_event_id"),
        deleted.alias("_deleted"),
        F.when(deleted, F.lit(now_us)).alias("_deleted_at"),
    )


def fast_changes(df: DataFrame, table: Table) -> DataFrame:
    """The change each fast event made (``rowfold.visible_changes``): a fast INSERT
    creates its row, a fast UPDATE writes its columns on a live row, a fast DELETE
    removes a live row."""
    op = F.col("op")
    names = table.column_names
    written = {c: (op == "INSERT") | F.col("after_has")[names.index(c)] for c in names}
    new = df.select("*", F.struct(*fast_row(table)).alias("new"))
    values = F.struct(
        *[
            (F.col(f"new.{c}") if c in table.key else F.when(written[c], F.col(f"new.{c}"))).alias(
                c
            )
            for c in names
        ]
    )
    cols = F.filter(
        F.array(*[F.when(written[c], F.lit(c)) for c in table.value_columns]),
        lambda x: x.isNotNull(),
    )
    kind = (
        F.when(op == "INSERT", F.lit(ChangeKind.INSERT.value))
        .when(op == "UPDATE", F.lit(ChangeKind.UPDATE.value))
        .otherwise(F.lit(ChangeKind.ROW_DELETE.value))
    )
    return new.select(
        "event_id",
        "ts",
        "rank",
        F.lit(0).alias("idx"),
        kind.alias("kind"),
        "key",
        F.when(op != "DELETE", values).alias("values"),
        F.when(op != "DELETE", cols).otherwise(F.array().cast("array<string>")).alias("cols"),
        F.lit(None).cast("long").alias("ttl"),
        F.when(F.col("l_exists") & ~F.col("l_deleted"), F.col("l_row")).alias("pre"),
        F.when(op != "DELETE", F.col("new")).alias("post"),
    )


def _first_truncate(
    truncates: list[Event], value: Callable[[Event], Any], default: Column
) -> Column:
    """Of the run's TRUNCATEs, the first in canonical order that covers the state row
    (live, not newer than it): ``value`` of it, else ``default``."""
    ts, deleted = F.col("s_ts"), F.col("s_deleted")
    expr: Column | None = None
    for t in sorted(truncates, key=Event.position):
        cond = ~deleted & (ts <= t.ts)
        expr = F.when(cond, F.lit(value(t))) if expr is None else expr.when(cond, F.lit(value(t)))
    return default if expr is None else expr.otherwise(default)


def _truncated(truncates: list[Event]) -> Column:
    if not truncates:
        return F.lit(False)
    return ~F.col("s_deleted") & (F.col("s_ts") <= max(t.ts for t in truncates))


def untouched_state(df: DataFrame, table: Table, truncates: list[Event], now_us: int) -> DataFrame:
    """State rows no event touched; a TRUNCATE of the run tombstones the live ones that
    are not newer than it (§12), the earliest such TRUNCATE making the tombstone."""
    ts, deleted = F.col("s_ts"), F.col("s_deleted")
    hit = _truncated(truncates)
    return df.select(
        *[
            (F.col(f"row.{c}") if c in table.key else F.when(~hit, F.col(f"row.{c}"))).alias(c)
            for c in table.column_names
        ],
        _first_truncate(truncates, lambda t: t.ts, ts).alias("_ts"),
        _first_truncate(truncates, lambda t: t.origin, F.col("s_origin")).alias("_origin"),
        _first_truncate(truncates, lambda t: t.event_id, F.col("event_id")).alias("_event_id"),
        (hit | deleted).alias("_deleted"),
        F.when(hit, F.lit(now_us)).otherwise(F.col("s_deleted_at")).alias("_deleted_at"),
    )


def untouched_changes(df: DataFrame, table: Table, truncates: list[Event]) -> DataFrame:
    """The live rows a TRUNCATE removed, as partition deletes of that TRUNCATE."""
    none = F.lit(None)
    return df.where(_truncated(truncates)).select(
        _first_truncate(truncates, lambda t: t.event_id, none.cast("string")).alias("event_id"),
        _first_truncate(truncates, lambda t: t.ts, none.cast("long")).alias("ts"),
        _first_truncate(truncates, lambda t: t.rank, none.cast("int")).alias("rank"),
        F.lit(0).alias("idx"),
        F.lit(ChangeKind.PARTITION_DELETE.value).alias("kind"),
        "key",
        F.lit(None).cast(row_struct_type(table)).alias("values"),
        F.array().cast("array<string>").alias("cols"),
        F.lit(None).cast("long").alias("ttl"),
        F.col("row").alias("pre"),
        F.lit(None).cast(row_struct_type(table)).alias("post"),
    )


def run_fold(df: DataFrame, folder: GroupFolder, single_group: bool) -> DataFrame:
    """Fold the rows in ``df`` (all rows of each of its keys) with ``mapInArrow``."""
    schema = fold_output(folder.table)
    arrow_schema = to_arrow_schema(schema, timezone="UTC")
    order = ["is_event", "event_id", "pref", "replica"]
    df = df.select(*FOLD_INPUT)
    if single_group:
        stream = df.repartition(1).sortWithinPartitions(*order)
    else:  # already partitioned by key by classify's windows
        stream = df.sortWithinPartitions("key", *order)
    fn = make_fold_function(folder, single_group, arrow_schema)
    return stream.mapInArrow(fn, schema)


@dataclass(frozen=True)
class Specials:
    """The run's TRUNCATEs and its records without an event id, settled on the driver:
    the good TRUNCATE events, the fate of every copy ``(event_id, replica, fate)`` and the
    quarantined ones ``(replica, event_id, reason, detail, raw)``."""

    truncates: list[Event]
    fates: list[tuple]
    quarantined: list[tuple]


def split_special(copies: DataFrame) -> tuple[DataFrame, Specials]:
    """The copies both engines resolve by key, and the special ones (TRUNCATEs, records
    without an event id) settled on the driver (one job; most nights have none)."""
    special = (F.col("event_id").isNull() | (F.col("op") == "TRUNCATE")).cast("boolean")
    main = copies.where(~F.coalesce(special, F.lit(False)))
    return main, special_copies(copies.where(special))


def special_copies(typed: DataFrame) -> Specials:
    """The special copies (``split_special``), settled on the driver."""
    rows = typed.select(
        "event_id", "replica", "seq", "pref", "ts", "origin", "rank", "reason", "detail", "raw"
    ).collect()
    events: list[Event] = []
    fates: list[tuple] = []
    quarantined: list[tuple] = []
    by_event: dict[str, list] = {}
    for r in rows:
        if r.event_id is None:  # cannot be deduplicated: quarantined one by one
            fates.append((None, r.replica, "quarantined"))
            quarantined.append((r.replica, None, r.reason, r.detail, r.raw))
        else:
            by_event.setdefault(r.event_id, []).append(r)
    for eid, copies in sorted(by_event.items()):
        copies.sort(key=lambda r: (r.pref, r.replica))
        c = copies[0]
        fates += [(eid, r.replica, "quarantined" if c.reason else "applied") for r in copies]
        if c.reason:
            quarantined.append((c.replica, eid, c.reason, c.detail, c.raw))
        else:
            events.append(
                Event(
                    eid,
                    "TRUNCATE",
                    None,
                    c.ts,
                    c.origin,
                    c.rank,
                    seqs={r.replica: r.seq for r in copies},
                )
            )
    return Specials(events, fates, quarantined)


def resolve_rows(
    spark: SparkSession,
    config: Config,
    table: Table,
    refs: DataFrame,
    prior: DataFrame,
    now_us: int,
    dt: date,
) -> Resolved:
    """Resolve one row-granularity table: ``refs`` are the typed copies of the staged
    exports (``frames.copy_schema``), ``prior`` the state the run starts from (already
    purged)."""
    main, specials = split_special(refs)
    truncs = specials.truncates
    main = admit_transactions(main, prior, config, table)
    df = _classified(main, prior, config, table, bool(truncs), now_us)

    is_event = F.col("is_event") == 1
    fast = df.where("fast")
    untouched = df.where(~is_event & (F.col("n_ev") == 0) & ~F.col("coupled"))
    to_fold = df.where(
        ~F.col("key_fast")
        & ((F.col("n_ev") > 0) | F.col("coupled"))
        & (~is_event | F.col("ev_reason").isNull())
    )
    trace = config.cdc.enabled
    folder = GroupFolder(FoldSpec(table, now_us), config.replica_ids, truncs, dt, trace)
    folded = (
        run_fold(to_fold.where(~F.col("coupled")), folder, False)
        .unionByName(run_fold(to_fold.where("coupled"), folder, True))
        .persist()
    )

    state = (
        fast_state(fast, table, now_us)
        .unionByName(untouched_state(untouched, table, truncs, now_us))
        .unionByName(folded_state(folded, table))
    )
    fates, quarantine = with_special_copies(spark, *_fates_and_quarantine(df, folded), specials)
    conflicts = folded.where(F.col("kind") == "conflict").select(
        *CONFLICT_FIELDS, "pos_rank", "pos_idx"
    )
    divergence = folded.where(F.col("kind") == "divergence").select(*DIVERGENCE_FIELDS)
    changes = _changes(fast, untouched, folded, table, truncs) if trace else None
    return Resolved(state, conflicts, divergence, fates, quarantine, truncs, changes)


def folded_state(folded: DataFrame, table: Table) -> DataFrame:
    """The new state rows the Python fold returned."""
    return folded.where(F.col("kind") == "state").select(
        *[F.col(f"row.{c}").alias(c) for c in table.column_names],
        "_ts",
        "_origin",
        "_event_id",
        "_deleted",
        "_deleted_at",
    )


def _fates_and_quarantine(df: DataFrame, folded: DataFrame) -> tuple[DataFrame, DataFrame]:
    """The fate of every copy (a fast key's and a quarantined copy's from the
    classification, the others' from the fold) and the quarantined events' chosen copies."""
    is_event = F.col("is_event") == 1
    copy_fates = df.where(is_event & (F.col("ev_reason").isNotNull() | F.col("key_fast"))).select(
        "event_id",
        "replica",
        F.when(F.col("ev_reason").isNotNull(), F.lit("quarantined"))
        .otherwise(F.lit("applied"))
        .alias("fate"),
    )
    fates = copy_fates.unionByName(
        folded.where(F.col("kind") == "outcome").select("event_id", "replica", "fate")
    )
    quarantine = df.where(is_event & (F.col("rn") == 1) & F.col("ev_reason").isNotNull()).select(
        "replica", "event_id", "reason", "detail", "raw"
    )
    return fates, quarantine


def _classified(
    main: DataFrame, prior: DataFrame, config: Config, table: Table, truncated: bool, now_us: int
) -> DataFrame:
    """``classify`` over the run's copies, persisted; if some event's copies sit under
    different keys, they are moved to their winner's key and classified again."""
    coupled = on_the_driver(coupled_keys(main, prior, table))
    df = classify(
        build_items(main, prior, config, table), coupled, truncated, table, config, now_us
    ).persist()
    disputed = cross_key_disputes(df)
    if disputed:  # rare: move every copy of those events to their winner's key, and redo
        log.warning(
            "table %s: %d event(s) have copies under different keys; the winning "
            "copy's key is used",
            table.name,
            len(disputed),
        )
        df.unpersist()
        main = settle_disputes(main, disputed)
        df = classify(
            build_items(main, prior, config, table), coupled, truncated, table, config, now_us
        ).persist()
    return df


def on_the_driver(keys: DataFrame | None) -> DataFrame | None:
    """The coupled keys, computed once and brought to the driver (a broadcast join brings
    them there anyway); None when no key is coupled, as on most nights. Their plan reads the
    copies a second time: inside the persisted classification's plan, it kept Spark from
    matching that plan in the unions of the outputs, which then classified every copy
    again (tests/test_plans.py)."""
    if keys is None:
        return None
    found = keys.toArrow()
    if not found.num_rows:
        return None
    return keys.sparkSession.createDataFrame(found, keys.schema)


def with_special_copies(
    spark: SparkSession,
    fates: DataFrame,
    quarantine: DataFrame,
    specials: Specials,
) -> tuple[DataFrame, DataFrame]:
    """The fates and the quarantine of the main copies, with those of the special ones
    (``split_special``: TRUNCATEs and records without an event id), for both engines."""
    if specials.fates:
        fates = fates.unionByName(
            spark.createDataFrame(specials.fates, "event_id string, replica string, fate string")
        )
    if specials.quarantined:
        quarantine = quarantine.unionByName(
            spark.createDataFrame(
                specials.quarantined,
                "replica string, event_id string, reason string, detail string, raw string",
            )
        )
    return fates, quarantine


def _changes(
    fast: DataFrame, untouched: DataFrame, folded: DataFrame, table: Table, truncs: list[Event]
) -> DataFrame:
    """What every applied event changed (the CDC log's input), in ``change_schema``."""
    parts = [
        fast_changes(fast, table),
        untouched_changes(untouched, table, truncs),
        folded_changes(folded, table),
    ]
    schema = change_schema(table)
    typed = [p.select(*[F.col(f.name).cast(f.dataType) for f in schema.fields]) for p in parts]
    return reduce(DataFrame.unionByName, typed)


def folded_changes(folded: DataFrame, table: Table) -> DataFrame:
    """The changes the Python fold recorded (``foldrun``'s ``change`` rows)."""
    rows = folded.where(F.col("kind") == "change")
    return rows.select(
        F.col("remote_event_id").alias("event_id"),
        F.col("remote_ts").alias("ts"),
        F.col("pos_rank").alias("rank"),
        F.col("pos_idx").alias("idx"),
        F.col("change").alias("kind"),
        key_struct(table, "row").alias("key"),
        F.when(
            F.col("change").isin(ChangeKind.INSERT.value, ChangeKind.UPDATE.value), F.col("row")
        ).alias("values"),
        "cols",
        F.lit(None).cast("long").alias("ttl"),
        "pre",
        "post",
    )


def position(c: Iterable[str] = POSITION) -> Column:
    return F.struct(*[F.col(x) for x in c])
