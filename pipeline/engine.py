"""Row-granularity resolution on Spark (semantics.md §2-§5, §7-§9, §12).

Design for scale: one shuffle by key brings each key's prior state row and events
together. Then every key falls into one of three paths:

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
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date
from functools import reduce

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema

from pipeline.config import Config, Table
from pipeline.foldrun import GroupFolder, make_fold_function, output_schema
from pipeline.policy import ConflictType, Detection, Resolver, Scope
from pipeline.rowfold import Event, FoldSpec
from pipeline.schema import state_schema

log = logging.getLogger(__name__)

EVENT_ITEM_COLS = [
    "op", "origin", "new_key", "after", "after_cols", "before", "before_cols", "extra_cols",
    "txid", "rejected", "seqs",
]


@dataclass(frozen=True)
class Resolved:
    """The results of one table, as DataFrames over a persisted fold output."""

    state: DataFrame
    conflicts: DataFrame
    divergence: DataFrame
    fates: DataFrame  # event_id, replicas, fate (applied | discarded | errored)
    truncates: list[Event]


def rank_map(config: Config, table: Table) -> Column:
    ranks = config.tie_ranks(table.tie_break)
    return F.create_map(*[x for r, i in ranks.items() for x in (F.lit(r), F.lit(i))])


def purge(prior: DataFrame, now_us: int, gc_grace_seconds: int) -> DataFrame:
    """§7: a tombstone is purged when ``deleted_at < now - gc_grace_seconds``."""
    horizon = now_us - gc_grace_seconds * 1_000_000
    return prior.where(~(F.col("_deleted") & (F.col("_deleted_at") < horizon)))


def key_struct(table: Table, row: str | None = None) -> Column:
    return F.struct(*[F.col(f"{row}.{c}" if row else c).alias(c) for c in table.key])


def admit_transactions(events: DataFrame, prior: DataFrame, config: Config, table: Table
                       ) -> DataFrame:
    """§5/§12 ``scope: transaction``: a transaction ``(origin, txid)`` is admitted only
    when its time (its latest event ts) beats, tie-break included, every key it touches
    in the state the run started from. Adds ``rejected``."""
    if table.scope is not Scope.TRANSACTION:
        return events.withColumn("rejected", F.lit(False))
    ranks = rank_map(config, table)
    tx = events.where(F.col("txid").isNotNull() & (F.col("op") != "TRUNCATE"))
    times = tx.groupBy("origin", "txid").agg(F.max("ts").alias("tx_ts"))
    touched = tx.select("origin", "txid", F.explode(
        F.filter(F.array("key", "new_key"), lambda k: k.isNotNull())).alias("key"))
    local = prior.select(key_struct(table).alias("key"), F.col("_ts").alias("l_ts"),
                         F.coalesce(ranks[F.col("_origin")], F.lit(-1)).alias("l_rank"))
    beaten = (
        touched.join(local, "key").join(times, ["origin", "txid"])
        .where(F.struct("tx_ts", ranks[F.col("origin")]) <= F.struct("l_ts", "l_rank"))
        .select("origin", "txid").distinct().withColumn("rejected", F.lit(True))
    )
    return (events.join(F.broadcast(beaten), ["origin", "txid"], "left")
            .withColumn("rejected", F.coalesce("rejected", F.lit(False))))


def coupled_keys(events: DataFrame, prior: DataFrame, table: Table) -> DataFrame | None:
    """Keys whose fold must see other keys' rows: both ends of every key change, and every
    key that may share a unique value with another key at some point of the run (a safe
    over-approximation: each key's possible values come from its prior row and its
    events; keys touched by key changes pool their values, since rows move between them).
    None when the table can have none."""
    moves = events.where(F.col("new_key").isNotNull())
    moved = moves.select("key").union(moves.select(F.col("new_key").alias("key"))).distinct()
    if not table.unique:
        return moved
    moved_flag = moved.withColumn("moved", F.lit(True))
    live = prior.where(~F.col("_deleted")).select(
        key_struct(table).alias("key"), *[F.col(c).alias(f"v_{c}") for c in table.column_names])
    writes = events.where(F.col("op").isin("INSERT", "UPDATE")).select(
        F.coalesce("new_key", "key").alias("key"),
        *[F.when(F.array_contains("after_cols", c), F.col(f"after.{c}")).alias(f"v_{c}")
          for c in table.column_names])
    values = live.unionByName(writes).join(F.broadcast(moved_flag), "key", "left")
    unit = F.when(F.col("moved"), F.lit(None)).otherwise(F.col("key"))
    values = values.withColumn("unit", F.struct(F.col("moved").isNotNull().alias("m"),
                                                unit.alias("k")))
    shared_units = []
    for cols in table.unique:
        sets = values.groupBy("unit").agg(
            *[F.collect_set(f"v_{c}").alias(f"s_{c}") for c in cols])
        tuples = sets
        for c in cols:
            tuples = tuples.withColumn(f"t_{c}", F.explode(f"s_{c}"))
        shared = (tuples.groupBy(*[f"t_{c}" for c in cols])
                  .agg(F.collect_set("unit").alias("units"))
                  .where(F.size("units") > 1)
                  .select(F.explode("units").alias("unit")))
        shared_units.append(shared)
    units = reduce(DataFrame.union, shared_units).distinct()
    by_unit = values.select("unit", "key").distinct().join(units, "unit").select("key")
    return by_unit.union(moved).distinct()


def build_items(events: DataFrame, prior: DataFrame, config: Config, table: Table) -> DataFrame:
    """Events and prior state rows in one frame: ``key, is_event, ts, rank, event_id`` and
    the fields of each kind."""
    ev = events.select("key", F.lit(1).alias("is_event"), "ts", "rank", "event_id",
                       *EVENT_ITEM_COLS)
    st = prior.select(
        key_struct(table).alias("key"), F.lit(0).alias("is_event"), F.col("_ts").alias("ts"),
        F.coalesce(rank_map(config, table)[F.col("_origin")], F.lit(-1)).alias("rank"),
        F.col("_event_id").alias("event_id"),
        F.struct(*table.column_names).alias("row"),
        F.col("_origin").alias("s_origin"), F.col("_deleted").alias("s_deleted"),
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
    value_cols = [c for c in table.column_names if c not in table.key]
    has_all = (F.size(F.array_intersect("after_cols", F.array(*[F.lit(c) for c in value_cols])))
               == len(value_cols)) if value_cols else F.lit(True)
    tomb_ok = table.resolvers[ConflictType.INSERT_EXISTS] is not Resolver.DELETE_WINS
    insert = (op == "INSERT") & no_drift & has_all & (~l_exists | (F.col("l_deleted") & tomb_ok))
    image_cols = [c for c in table.column_names if c not in table.delta]
    no_image = (
        F.size(F.array_intersect("before_cols", F.array(*[F.lit(c) for c in image_cols]))) == 0
        if table.detection is Detection.BEFORE_IMAGE else F.lit(True)
    )
    update = ((op == "UPDATE") & F.col("new_key").isNull() & no_drift & l_live & same_origin
              & not_newer & no_image)
    delete = (op == "DELETE") & l_live & same_origin & not_newer
    return ~F.col("rejected") & (insert | update | delete)


def classify(items: DataFrame, coupled: DataFrame | None, has_truncate: bool, table: Table
             ) -> DataFrame:
    """Per key: ``n_ev``, the local row ``l_*``, ``coupled``, and ``fast``/``key_fast``."""
    w = Window.partitionBy("key")
    is_state = F.col("is_event") == 0
    df = items.select(
        "*",
        F.sum("is_event").over(w).alias("n_ev"),
        F.max(F.when(is_state, F.lit(True))).over(w).alias("l_exists_"),
        F.max(F.when(is_state, F.col("ts"))).over(w).alias("l_ts"),
        F.max("s_origin").over(w).alias("l_origin"),
        F.max("s_deleted").over(w).alias("l_deleted"),
        F.max("row").over(w).alias("l_row"),
    ).withColumn("l_exists", F.coalesce("l_exists_", F.lit(False))).drop("l_exists_")
    if coupled is not None:
        df = df.join(F.broadcast(coupled.withColumn("coupled", F.lit(True))), "key", "left")
        df = df.withColumn("coupled", F.coalesce("coupled", F.lit(False)))
    else:
        df = df.withColumn("coupled", F.lit(False))
    fast = ((F.col("is_event") == 1) & (F.col("n_ev") == 1) & ~F.col("coupled")
            & F.lit(not has_truncate) & fast_predicate(table))
    return df.withColumn("fast", F.coalesce(fast, F.lit(False))).withColumn(
        "key_fast", F.max(F.col("fast").cast("int")).over(w) == 1)


def _num(c: Column) -> Column:
    return F.coalesce(c, F.lit(0))


def fast_state(df: DataFrame, table: Table, now_us: int) -> DataFrame:
    """The new state row of each fast event, with column expressions (§2-§4, §8)."""
    op = F.col("op")
    cols = []
    for c in table.columns:
        n = c.name
        written = F.array_contains("after_cols", n)
        if n in table.key:
            v = F.col(f"key.{n}")
        elif n in table.delta:
            delta = F.col(f"after.{n}") - F.col(f"before.{n}")
            v = F.when(op == "INSERT", F.col(f"after.{n}")).when(
                written, _num(F.col(f"l_row.{n}")) + delta).otherwise(F.col(f"l_row.{n}"))
        else:
            v = F.when(op == "INSERT", F.col(f"after.{n}")).when(
                written, F.col(f"after.{n}")).otherwise(F.col(f"l_row.{n}"))
        if n not in table.key:
            v = F.when(op != "DELETE", v)
        cols.append(v.cast(state_schema(table)[n].dataType).alias(n))
    deleted = op == "DELETE"
    return df.select(
        *cols,
        F.col("ts").alias("_ts"), F.col("origin").alias("_origin"),
        F.col("event_id").alias("_event_id"), deleted.alias("_deleted"),
        F.when(deleted, F.lit(now_us)).alias("_deleted_at"),
    )


def untouched_state(df: DataFrame, table: Table, truncates: list[Event], now_us: int
                    ) -> DataFrame:
    """State rows no event touched; a TRUNCATE of the run tombstones the live ones that
    are not newer than it (§12), the earliest such TRUNCATE making the tombstone."""
    ts, deleted = F.col("ts"), F.col("s_deleted")
    ordered = sorted(truncates, key=Event.position)

    def pick(attr: str, default: Column) -> Column:
        expr: Column | None = None
        for t in ordered:
            cond = ~deleted & (ts <= t.ts)
            value = F.lit(getattr(t, attr))
            expr = F.when(cond, value) if expr is None else expr.when(cond, value)
        return default if expr is None else expr.otherwise(default)

    hit = (~deleted & (ts <= max(t.ts for t in ordered))) if ordered else F.lit(False)
    return df.select(
        *[(F.col(f"row.{c}") if c in table.key else F.when(~hit, F.col(f"row.{c}"))).alias(c)
          for c in table.column_names],
        pick("ts", ts).alias("_ts"),
        pick("origin", F.col("s_origin")).alias("_origin"),
        pick("event_id", F.col("event_id")).alias("_event_id"),
        (hit | deleted).alias("_deleted"),
        F.when(hit, F.lit(now_us)).otherwise(F.col("s_deleted_at")).alias("_deleted_at"),
    )


def run_fold(df: DataFrame, folder: GroupFolder, single_group: bool, partitions: int
             ) -> DataFrame:
    """Fold the rows in ``df`` (all rows of each of its keys) with ``mapInArrow``."""
    schema = output_schema(folder.table)
    arrow_schema = to_arrow_schema(schema)
    order = ["is_event", "ts", "rank", "event_id"]
    if single_group:
        stream = df.repartition(1).sortWithinPartitions(*order)
    else:
        stream = df.repartition(partitions, "key").sortWithinPartitions("key", *order)
    fn = make_fold_function(folder, single_group, arrow_schema)
    return stream.mapInArrow(fn, schema)


def truncate_events(events: DataFrame, table: Table) -> list[Event]:
    rows = events.where(F.col("op") == "TRUNCATE").select(
        "event_id", "ts", "origin", "rank", "seqs").collect()
    return [Event(r.event_id, "TRUNCATE", None, r.ts, r.origin, r.rank, seqs=dict(r.seqs or {}))
            for r in rows]


def resolve_rows(
    spark: SparkSession, config: Config, table: Table, good: DataFrame, prior: DataFrame,
    now_us: int, dt: date, partitions: int,
) -> Resolved:
    """Resolve one row-granularity table. ``good`` holds the typed events that passed the
    guards; ``prior`` the state the run starts from (already purged)."""
    truncs = truncate_events(good, table)
    rows_ev = admit_transactions(good.where(F.col("op") != "TRUNCATE"), prior, config, table)
    coupled = coupled_keys(rows_ev, prior, table)
    items = build_items(rows_ev, prior, config, table)
    df = classify(items, coupled, bool(truncs), table).persist()

    fast = df.where("fast")
    untouched = df.where((F.col("is_event") == 0) & (F.col("n_ev") == 0) & ~F.col("coupled"))
    to_fold = df.where(~F.col("key_fast") & ((F.col("n_ev") > 0) | F.col("coupled")))

    folder = GroupFolder(FoldSpec(table, now_us), config.replica_ids, truncs, dt)
    folded = run_fold(to_fold.where(~F.col("coupled")), folder, False, partitions).unionByName(
        run_fold(to_fold.where("coupled"), folder, True, 1)
    )
    folded = folded.persist()

    state = (
        fast_state(fast, table, now_us)
        .unionByName(untouched_state(untouched, table, truncs, now_us))
        .unionByName(folded.where(F.col("kind") == "state").select(
            *[F.col(f"row.{c}").alias(c) for c in table.column_names],
            "_ts", "_origin", "_event_id", "_deleted", "_deleted_at"))
    )
    fates = (
        fast.select("event_id", F.array_sort(F.map_keys("seqs")).alias("replicas"),
                    F.lit("applied").alias("fate"))
        .unionByName(folded.where(F.col("kind") == "outcome").select("event_id", "replicas",
                                                                      "fate"))
    )
    conflicts = folded.where(F.col("kind") == "conflict").select(
        "key", "conflict_type", "resolver", "outcome", "local_ts", "local_origin", "local_row",
        "remote_event_id", "remote_ts", "remote_origin", "remote_row", "reason", "pos_rank",
        "pos_idx")
    divergence = folded.where(F.col("kind") == "divergence").select(
        "replica", "key", "replica_row", "converged_row", "repair")
    return Resolved(state, conflicts, divergence, fates, truncs)


def position(c: Iterable[str] = ("remote_ts", "pos_rank", "remote_event_id", "pos_idx")
             ) -> Column:
    return F.struct(*[F.col(x) for x in c])

