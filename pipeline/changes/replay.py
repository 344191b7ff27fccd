"""Replaying a table's CDC log on Spark, as a consumer would, to check it against the
snapshot (docs/cdc.md#entries; the ``cdc_replay`` suite).

The consumer's rules (README "The CDC log"): start from the previous snapshot; in
``(cdc$time, cdc$batch_seq_no)`` order, an insert (2) writes the row marker and the
columns it lists, an update (1) only the columns, a row or partition delete (3, 4) removes
the row; a column is listed when it holds a value or ``cdc$deleted_<col>`` is true. A
value, and the marker of an insert, written with ``cdc$ttl`` expires ``ttl`` seconds
after its write time; a row is seen while its marker or one of its values lives.

The previous snapshot is taken from the prior state, which also says when its TTL cells
expire (a cell table) and which rows have a marker. So the replay is a fold per key:
after the last delete, each column's last write and the last marker write win.
"""

from __future__ import annotations

from functools import reduce

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from pipeline.core.columns import CELLS, DEAD, EXPIRY, KEY, MARKER, OP, SEQ, STATE_DELETED, TTL
from pipeline.core.config import Table
from pipeline.core.policy import Granularity

UUID_EPOCH_OFFSET = 0x01B21DD213814000


def entry_micros(timeuuid: Column) -> Column:
    """The time (µs since the epoch) of a version-1 timeuuid in its text form."""
    ticks = F.conv(
        F.concat(timeuuid.substr(16, 3), timeuuid.substr(10, 4), timeuuid.substr(1, 8)), 16, 10
    )
    return F.floor((ticks.cast("decimal(20,0)") - F.lit(UUID_EPOCH_OFFSET)) / 10).cast("long")


def _seed(prior: DataFrame, table: Table) -> DataFrame:
    """The prior state as writes before every log entry: each live value with its expiry
    (seconds, null: none) and the row marker."""
    cell = table.granularity is Granularity.CELL
    keyed = reduce(lambda a, b: a & b, [F.col(c).isNotNull() for c in table.key])
    rows = prior.where(keyed)
    if not cell:
        rows = rows.where(~F.col(STATE_DELETED))
    values = []
    for c in table.value_columns:
        if cell:  # the cell as written; a base row has none: its value, no expiry
            x = F.col(f"_cells.{c}")
            live = F.when(x.isNotNull(), ~x[DEAD]).otherwise(F.col(c).isNotNull())
            value = F.when(x.isNotNull(), x["value"]).otherwise(F.col(c))
            expiry = F.when(x.isNotNull() & x[TTL].isNotNull(), x[EXPIRY])
        else:
            live, value, expiry = F.col(c).isNotNull(), F.col(c), F.lit(None)
        values.append(F.when(live, F.struct(value.alias("v"), expiry.cast("long").alias("exp"))))
    if cell:
        m = F.col(MARKER)
        marker = F.when(F.col(CELLS).isNull(), F.struct(F.lit(None).cast("long").alias("exp")))
        marker = marker.otherwise(
            F.when(m.isNotNull(), F.struct(F.when(m[TTL].isNotNull(), m[EXPIRY]).alias("exp")))
        )
    else:
        marker = F.struct(F.lit(None).cast("long").alias("exp"))
    return rows.select(
        F.struct(*[F.col(c) for c in table.key]).alias(KEY),
        F.lit(0).alias("is_entry"),
        F.lit(None).cast("long").alias("t"),
        F.lit(None).cast("string").alias("lsb"),
        F.lit(None).cast("int").alias(SEQ),
        F.lit(1).cast("byte").alias(OP),
        marker.alias("marker"),
        *[v.alias(f"w_{c}") for v, c in zip(values, table.value_columns, strict=True)],
    )


def _entries(log: DataFrame, table: Table) -> DataFrame:
    """The log's change rows (images left out) as writes."""
    t = entry_micros(F.col("`cdc$time`"))
    ttl = F.col("`cdc$ttl`")
    expiry = F.when(ttl.isNotNull(), F.floor(t / 1_000_000) + ttl)
    op = F.col("`cdc$operation`")
    values = []
    for c in table.value_columns:
        listed = F.col(c).isNotNull() | F.coalesce(F.col(f"`cdc$deleted_{c}`"), F.lit(False))
        written = F.struct(F.col(c).alias("v"), F.when(F.col(c).isNotNull(), expiry).alias("exp"))
        values.append(F.when(op.isin(1, 2) & listed, written).alias(f"w_{c}"))
    return log.where(op.isin(1, 2, 3, 4)).select(
        F.struct(*[F.col(c) for c in table.key]).alias(KEY),
        F.lit(1).alias("is_entry"),
        t.alias("t"),
        F.col("`cdc$time`").substr(20, 17).alias("lsb"),  # orders like the bytes (cdc.py)
        F.col("`cdc$batch_seq_no`").alias(SEQ),
        op.cast("byte").alias(OP),
        F.when(op == 2, F.struct(expiry.cast("long").alias("exp"))).alias("marker"),
        *values,
    )


def replayed(prior: DataFrame, log: DataFrame, table: Table, now_us: int) -> DataFrame:
    """The rows a reader sees at ``now_us`` after replaying ``log`` over ``prior``: the
    table's columns, by key."""
    writes = _seed(prior, table).unionByName(_entries(log, table))
    order = Window.partitionBy(KEY).orderBy("is_entry", "t", "lsb", SEQ)
    whole = Window.partitionBy(KEY)
    writes = writes.withColumn("rn", F.row_number().over(order))
    writes = writes.withColumn(
        "reset",
        F.coalesce(F.max(F.when(F.col(OP).isin(3, 4), F.col("rn"))).over(whole), F.lit(0)),
    )
    after = F.col("rn") > F.col("reset")

    def last(col: str) -> Column:  # the last write after the last delete
        x = F.col(col)
        return F.max(F.when(after & x.isNotNull(), F.struct(F.col("rn"), x.alias("w"))))["w"]

    now_s = now_us // 1_000_000
    state = writes.groupBy(KEY).agg(
        last("marker").alias("marker"), *[last(f"w_{c}").alias(c) for c in table.value_columns]
    )

    def alive(x: Column) -> Column:
        return x.isNotNull() & (x["exp"].isNull() | (x["exp"] > now_s))

    cells = {
        c: F.when(alive(F.col(c)) & F.col(c)["v"].isNotNull(), F.col(c)["v"])
        for c in table.value_columns
    }
    seen = reduce(
        lambda a, b: a | b, [v.isNotNull() for v in cells.values()], alive(F.col("marker"))
    )
    return state.where(seen).select(
        *[F.col(f"key.{c}").alias(c) for c in table.key],
        *[v.alias(c) for c, v in cells.items()],
    )


def replay_differences(
    prior: DataFrame, log: DataFrame, snapshot: DataFrame, table: Table, now_us: int
) -> DataFrame:
    """The keys where replaying the log over the prior state does not give the snapshot:
    ``key``, ``replayed`` and ``published`` (JSON, null when the row is absent)."""
    cols = list(table.column_names)
    mine = replayed(prior, log, table, now_us).select(
        *[F.col(c) for c in table.key], F.struct(*cols).alias("r")
    )
    theirs = snapshot.select(*[F.col(c) for c in table.key], F.struct(*cols).alias("s"))
    joined = mine.join(theirs, list(table.key), "full_outer")
    differs = ~F.col("r").eqNullSafe(F.col("s"))
    return joined.where(differs).select(
        F.to_json(F.struct(*[F.col(c) for c in table.key])).alias(KEY),
        F.to_json("r").alias("replayed"),
        F.to_json("s").alias("published"),
    )
