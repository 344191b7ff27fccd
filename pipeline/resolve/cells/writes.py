"""The writes of each slot of a cell row (a column's cell, the row marker, the row
tombstone) as Spark structs that order by the cell rules: from the prior state row and
from each event (docs/rules.md#cell-rules, docs/rules.md#fine-points)."""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F

from pipeline.core.columns import (
    CELLS,
    DEAD,
    DELETED_AT,
    EVENT_ID,
    EXPIRY,
    MARKER,
    OP,
    ORIGIN,
    RANK,
    STATE_EVENT_ID,
    STATE_ORIGIN,
    STATE_TS,
    TOMB,
    TS,
    TTL,
)
from pipeline.core.config import Table
from pipeline.core.kinds import ColumnType
from pipeline.resolve.cells.order import keeps_value, value_of_order, value_order
from pipeline.spark.schema import spark_type


def value_columns(table: Table) -> list[tuple[str, ColumnType]]:
    return [(c.name, c.type) for c in table.columns if c.name not in table.key]


def greatest(cols: list[Column]) -> Column:
    return cols[0] if len(cols) == 1 else F.greatest(*cols)


def _cell_struct(
    ts: Column,
    dead: Column,
    deleted_at: Column,
    ttl: Column,
    expiry: Column,
    value: Column,
    is_event: int,
    rank: Column,
    event_id: Column,
    origin: Column,
    ct: ColumnType | None,
) -> Column:
    """One write in the order of ``cellfold.Cell.order_key``: rules 1-4, then the
    canonical order; then its origin, and its value where ``vkey`` loses it. Nothing
    else: every field is sorted, compared and copied by each window, so what can be
    read back from the others (:func:`ttl`, :func:`expiry`, :func:`deleted_at`,
    :func:`value`) is not carried."""
    L = "long"
    ts, deleted_at, ttl, expiry = ts.cast(L), deleted_at.cast(L), ttl.cast(L), expiry.cast(L)
    rank, event_id, origin = rank.cast("int"), event_id.cast("string"), origin.cast("string")
    if ct is not None:
        value = value.cast(spark_type(ct))
    exp = ~dead & ttl.isNotNull()
    fields = [
        ts.alias(TS),
        dead.alias(DEAD),
        F.when(dead, deleted_at).otherwise(F.lit(0).cast(L)).alias("del"),
        exp.alias("exp"),
        F.when(exp, expiry).otherwise(F.lit(0).cast(L)).alias(EXPIRY),
        F.when(exp, expiry - ttl).otherwise(F.lit(0).cast(L)).alias("wtime"),
    ]
    if ct is not None:
        fields.append(F.when(~dead, value_order(value, ct)).alias("vkey"))
    fields += [
        F.lit(is_event).alias("is_event"),
        rank.alias(RANK),
        event_id.alias(EVENT_ID),
        origin.alias(ORIGIN),
    ]
    if ct is not None and not keeps_value(ct):
        fields.append(value.alias("value"))
    return F.struct(*fields)


def ttl(x: Column) -> Column:
    """A write's TTL (seconds): a live write's expiry less its write time."""
    return F.when(x["exp"], x[EXPIRY] - x["wtime"])


def expiry(x: Column) -> Column:
    """A TTL write's expiry (epoch seconds)."""
    return F.when(x["exp"], x[EXPIRY])


def deleted_at(x: Column) -> Column:
    """A cell tombstone's deletion time (µs)."""
    return F.when(x[DEAD], x["del"])


def value(x: Column, ct: ColumnType) -> Column:
    """A cell write's value (null for a tombstone)."""
    return value_of_order(x["vkey"], ct) if keeps_value(ct) else x["value"]


def _tomb_struct(
    ts: Column, deleted_at: Column, is_event: int, rank: Column, event_id: Column, origin: Column
) -> Column:
    return F.struct(
        ts.cast("long").alias(TS),
        deleted_at.cast("long").alias(DELETED_AT),
        F.lit(is_event).alias("is_event"),
        rank.cast("int").alias(RANK),
        event_id.cast("string").alias(EVENT_ID),
        origin.cast("string").alias(ORIGIN),
    )


def prior_writes(table: Table, ranks: Column) -> list[Column]:
    """The prior state row's slots. A row without cell metadata (a base snapshot row, or
    state written by a row-granularity policy) is cells and a marker written at ``_ts``."""
    cells = [_prior_cell(c, ct, ranks).alias(f"w_{c}") for c, ct in value_columns(table)]
    return [*cells, _prior_marker(ranks).alias("w__marker"), _prior_tomb(ranks).alias("w__tomb")]


def _as_written(value: Column | None) -> Column:
    """A base row's cell (its ``value``) or, given ``None``, its marker: written at
    ``_ts`` by ``_origin``, without a ttl, not deleted."""
    no_long = F.lit(None).cast("long")
    when = [F.col(STATE_TS).alias(TS), no_long.alias(TTL), no_long.alias(EXPIRY)]
    by = [F.col(STATE_ORIGIN).alias(ORIGIN), F.col(STATE_EVENT_ID).alias(EVENT_ID)]
    if value is None:
        return F.struct(*when, *by)
    dead = [F.lit(False).alias(DEAD), no_long.alias(DELETED_AT)]
    return F.struct(value.alias("value"), *when, *dead, *by)


def _prior_cell(c: str, ct: ColumnType, ranks: Column) -> Column:
    base = F.col(CELLS).isNull()
    value = F.col(f"row.{c}")
    src = F.when(base, F.when(value.isNotNull(), _as_written(value))).otherwise(
        F.col(f"_cells.{c}")
    )
    return F.when(
        src.isNotNull(),
        _cell_struct(
            src[TS],
            src[DEAD],
            src[DELETED_AT],
            src[TTL],
            src[EXPIRY],
            src["value"],
            0,
            F.coalesce(ranks[src[ORIGIN]], F.lit(-1)),
            src[EVENT_ID],
            src[ORIGIN],
            ct,
        ),
    )


def _prior_marker(ranks: Column) -> Column:
    base = F.col(CELLS).isNull()
    m = F.when(base, _as_written(None)).otherwise(F.col(MARKER))
    return F.when(
        m.isNotNull(),
        _cell_struct(
            m[TS],
            F.lit(False),
            F.lit(None).cast("long"),
            m[TTL],
            m[EXPIRY],
            F.lit(None),
            0,
            F.coalesce(ranks[m[ORIGIN]], F.lit(-1)),
            m[EVENT_ID],
            m[ORIGIN],
            None,
        ),
    )


def _prior_tomb(ranks: Column) -> Column:
    t = F.col(TOMB)
    return F.when(
        t.isNotNull(),
        _tomb_struct(
            t[TS],
            t[DELETED_AT],
            0,
            F.coalesce(ranks[t[ORIGIN]], F.lit(-1)),
            t[EVENT_ID],
            t[ORIGIN],
        ),
    )


def event_writes(table: Table, now_us: int) -> list[Column]:
    """docs/rules.md#cell-rules: an INSERT writes the marker and the cells it sets, an
    UPDATE the cells it sets (a null: a cell tombstone, deletion time ``now``), a DELETE the
    row tombstone."""
    good = F.col("good")
    op = F.col(OP)
    ts, rank, eid, origin = F.col(TS), F.col(RANK), F.col(EVENT_ID), F.col(ORIGIN)
    ttl, expiry = F.col(TTL), F.col(EXPIRY)
    now = F.lit(now_us)
    names = table.column_names
    out = []
    for c, ct in value_columns(table):
        v = F.col(f"after.{c}")
        written = good & op.isin("INSERT", "UPDATE") & F.col("after_has")[names.index(c)]
        dead = v.isNull()
        out.append(
            F.when(
                written,
                _cell_struct(
                    ts,
                    dead,
                    F.when(dead, now),
                    F.when(~dead, ttl),
                    expiry,
                    v,
                    1,
                    rank,
                    eid,
                    origin,
                    ct,
                ),
            ).alias(f"w_{c}")
        )
    out.append(
        F.when(
            good & (op == "INSERT"),
            _cell_struct(
                ts, F.lit(False), F.lit(None), ttl, expiry, F.lit(None), 1, rank, eid, origin, None
            ),
        ).alias("w__marker")
    )
    out.append(
        F.when(good & (op == "DELETE"), _tomb_struct(ts, now, 1, rank, eid, origin)).alias(
            "w__tomb"
        )
    )
    return out
