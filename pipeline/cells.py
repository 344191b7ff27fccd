"""Cell-granularity resolution on Spark: the ``scylla`` preset (semantics.md §6, §7, §12).

The rules are those of ``pipeline.cellfold`` (the pure-Python reference, which the tests
compare with this module on generated data). Each slot of a row (a column's cell, the
row marker, the row tombstone) keeps the maximum of its writes under one total order, so
the whole table is resolved by one shuffle by key and one window over each key's writes
in the canonical order, with Spark built-ins only (no Python per row):

1. the copies of each event meet in their key's partition; the first window, over
   ``(key, event_id)``, picks the copy that stands for the event (§12) and types it;
2. the second window, over the key in the canonical order ``(ts, tie_rank, event_id)``
   with the prior state row first, computes for every event the maximum of each slot
   *before* it: whether one of its writes met an equal or later write of another event
   (a conflict, §12 "Cell tables") and whether any of them won (``applied``, else
   ``discarded``); at the key's last row, the maximum including it is the new state.

Value ties (rule 4) compare the unsigned bytes of the Cassandra serialization. Rather
than build those bytes for every cell, :func:`value_order` maps each value to a Spark
value whose ordering is the same as its serialized bytes' (a signed fixed-width integer
``v`` as ``(v < 0, v)``, text as its UTF-8, ...); only ``decimal``, whose varint form does
not order like the number, is serialized, with built-ins up to 18 digits and a vectorized
UDF above. ``tests/test_cells.py`` checks every type against ``cellfold.serialize``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import date
from decimal import Decimal
from functools import reduce
from typing import Any

import pandas as pd
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipeline.cellfold import RULES, SHADOWED, TIE, TYPE_BY_OP, serialize
from pipeline.config import ColumnType, Config, Kind, Table
from pipeline.engine import (
    CONFLICT_FIELDS,
    Resolved,
    key_struct,
    rank_map,
    settle_disputes,
    special_copies,
)
from pipeline.events import type_copies
from pipeline.policy import ChangeKind, Resolver
from pipeline.rowfold import Event
from pipeline.schema import change_schema, spark_type, state_schema

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------- rule 4 order


def _decimal_udf(ct: ColumnType) -> Any:
    @F.pandas_udf(T.BinaryType())  # type: ignore[call-overload]
    def ser(v: pd.Series) -> pd.Series:
        return v.map(lambda x: None if x is None else serialize(Decimal(x), ct))

    return ser


def value_order(v: Column, ct: ColumnType) -> Column:
    """A Spark value that orders like the unsigned bytes of ``v``'s Cassandra binary
    form (a shorter prefix first), so that rule 4 is a plain comparison."""
    k = ct.kind
    if k in (Kind.INT, Kind.BIGINT):  # two's complement: negatives after positives
        return F.struct((v < 0).alias("neg"), v.alias("v"))
    if k is Kind.TIMESTAMP:  # signed milliseconds, likewise
        ms = F.unix_millis(v)
        return F.struct((ms < 0).alias("neg"), ms.alias("v"))
    if k is Kind.DOUBLE:  # IEEE 754: the sign bit first, then the magnitude's bits
        neg = (v < 0) | ((v == 0) & v.cast("string").startswith("-"))
        return F.struct(neg.alias("neg"), F.abs(v).alias("v"))
    if k is Kind.DECIMAL:
        if ct.precision > 18:
            return _decimal_udf(ct)(v)
        # 4-byte scale (constant per column), then the unscaled value as a minimal
        # big-endian two's complement: hex of the long, padded, redundant sign bytes cut
        unscaled = (v * F.lit(Decimal(10**ct.scale))).cast("long")
        h = F.lpad(F.hex(unscaled), 16, "0")
        h = F.regexp_replace(F.regexp_replace(h, "^(00)+(?=[0-7])", ""), "^(FF)+(?=[89A-F])", "")
        return F.unhex(h)
    # date: unsigned days + 2^31 orders like the date; boolean 00 < 01; text compares
    # as UTF-8 bytes; blob as bytes; a uuid's lower-case hex text orders like its bytes
    return v


# ---------------------------------------------------------------------- the writes


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
    canonical order; the rest is carried along."""
    L = "long"
    ts, deleted_at, ttl, expiry = ts.cast(L), deleted_at.cast(L), ttl.cast(L), expiry.cast(L)
    rank, event_id, origin = rank.cast("int"), event_id.cast("string"), origin.cast("string")
    if ct is not None:
        value = value.cast(spark_type(ct))
    exp = ~dead & ttl.isNotNull()
    fields = [
        ts.alias("ts"),
        dead.alias("dead"),
        F.when(dead, deleted_at).otherwise(F.lit(0).cast(L)).alias("del"),
        exp.alias("exp"),
        F.when(exp, expiry).otherwise(F.lit(0).cast(L)).alias("expiry"),
        F.when(exp, expiry - ttl).otherwise(F.lit(0).cast(L)).alias("wtime"),
    ]
    if ct is not None:
        fields.append(F.when(~dead, value_order(value, ct)).alias("vkey"))
    fields += [
        F.lit(is_event).alias("is_event"),
        rank.alias("rank"),
        event_id.alias("event_id"),
        origin.alias("origin"),
        F.when(exp, ttl).alias("ttl"),
        F.when(exp, expiry).alias("expiry_s"),
        deleted_at.alias("deleted_at"),
    ]
    if ct is not None:
        fields.append(value.alias("value"))
    return F.struct(*fields)


def _tomb_struct(
    ts: Column, deleted_at: Column, is_event: int, rank: Column, event_id: Column, origin: Column
) -> Column:
    return F.struct(
        ts.cast("long").alias("ts"),
        deleted_at.cast("long").alias("deleted_at"),
        F.lit(is_event).alias("is_event"),
        rank.cast("int").alias("rank"),
        event_id.cast("string").alias("event_id"),
        origin.cast("string").alias("origin"),
    )


def _value_columns(table: Table) -> list[tuple[str, ColumnType]]:
    return [(c.name, c.type) for c in table.columns if c.name not in table.key]


def _prior_writes(table: Table, ranks: Column) -> list[Column]:
    """The prior state row's slots. A row without cell metadata (a base snapshot row, or
    state written by a row-granularity policy) is cells and a marker written at ``_ts``."""
    base = F.col("_cells").isNull()
    origin, ts, eid = F.col("_origin"), F.col("_ts"), F.col("_event_id")
    out = []
    for c, ct in _value_columns(table):
        src = F.when(
            base,
            F.when(
                F.col(f"row.{c}").isNotNull(),
                F.struct(
                    F.col(f"row.{c}").alias("value"),
                    ts.alias("ts"),
                    F.lit(None).cast("long").alias("ttl"),
                    F.lit(None).cast("long").alias("expiry"),
                    F.lit(False).alias("dead"),
                    F.lit(None).cast("long").alias("deleted_at"),
                    origin.alias("origin"),
                    eid.alias("event_id"),
                ),
            ),
        ).otherwise(F.col(f"_cells.{c}"))
        out.append(
            F.when(
                src.isNotNull(),
                _cell_struct(
                    src["ts"],
                    src["dead"],
                    src["deleted_at"],
                    src["ttl"],
                    src["expiry"],
                    src["value"],
                    0,
                    F.coalesce(ranks[src["origin"]], F.lit(-1)),
                    src["event_id"],
                    src["origin"],
                    ct,
                ),
            ).alias(f"w_{c}")
        )
    m = F.when(
        base,
        F.struct(
            ts.alias("ts"),
            F.lit(None).cast("long").alias("ttl"),
            F.lit(None).cast("long").alias("expiry"),
            origin.alias("origin"),
            eid.alias("event_id"),
        ),
    ).otherwise(F.col("_marker"))
    out.append(
        F.when(
            m.isNotNull(),
            _cell_struct(
                m["ts"],
                F.lit(False),
                F.lit(None).cast("long"),
                m["ttl"],
                m["expiry"],
                F.lit(None),
                0,
                F.coalesce(ranks[m["origin"]], F.lit(-1)),
                m["event_id"],
                m["origin"],
                None,
            ),
        ).alias("w__marker")
    )
    t = F.col("_tomb")
    out.append(
        F.when(
            t.isNotNull(),
            _tomb_struct(
                t["ts"],
                t["deleted_at"],
                0,
                F.coalesce(ranks[t["origin"]], F.lit(-1)),
                t["event_id"],
                t["origin"],
            ),
        ).alias("w__tomb")
    )
    return out


def _event_writes(table: Table, now_us: int) -> list[Column]:
    """§6: an INSERT writes the marker and the cells it sets, an UPDATE the cells it
    sets (a null: a cell tombstone, deletion time ``now``), a DELETE the row tombstone."""
    good = F.col("good")
    op = F.col("op")
    ts, rank, eid, origin = F.col("ts"), F.col("rank"), F.col("event_id"), F.col("origin")
    ttl, expiry = F.col("ttl"), F.col("expiry")
    now = F.lit(now_us)
    names = table.column_names
    out = []
    for c, ct in _value_columns(table):
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


# ---------------------------------------------------------------------- state


def _table_tombstone(rows: list[Any], truncs: Sequence[Event], now_us: int) -> dict | None:
    """The table tombstone: the latest of the state's and the run's TRUNCATEs."""
    cands = [
        (r._tomb.ts, r._tomb.deleted_at, 0, -1, r._tomb.event_id or "", r._tomb.origin)
        for r in rows
    ]
    cands += [(t.ts, now_us, 1, t.rank, t.event_id, t.origin) for t in truncs]
    if not cands:
        return None
    ts, deleted_at, _, _, event_id, origin = max(cands)
    return {"ts": ts, "deleted_at": deleted_at, "origin": origin, "event_id": event_id or None}


def purge_cells(prior: DataFrame, table: Table, now_us: int, grace_s: int) -> DataFrame:
    """§7: drop the tombstones whose deletion time is before ``now - gc_grace``: dead
    cells, expired cells (counting from their write time ``expiry - ttl``), the row and
    table tombstones; a row left with nothing disappears."""
    horizon = now_us - grace_s * 1_000_000
    now_s = now_us // 1_000_000

    def expired_old(x: Column) -> Column:
        """An expired TTL write, a tombstone since its write time ``expiry - ttl``."""
        expired = x["ttl"].isNotNull() & (x["expiry"] <= now_s)
        return expired & ((x["expiry"] - x["ttl"]) * 1_000_000 < horizon)

    def keep(x: Column) -> Column:
        old = F.when(x["dead"], x["deleted_at"] < horizon).otherwise(expired_old(x))
        return x.isNotNull() & ~F.coalesce(old, F.lit(False))

    def keep_marker(x: Column) -> Column:  # a marker is never dead
        return x.isNotNull() & ~F.coalesce(expired_old(x), F.lit(False))

    cells = F.col("_cells")
    value_cols = [c for c, _ in _value_columns(table)]
    kept = {c: keep(cells[c]) for c in value_cols}
    new_cells = F.when(
        cells.isNotNull(), F.struct(*[F.when(kept[c], cells[c]).alias(c) for c in value_cols])
    )
    marker = F.when(keep_marker(F.col("_marker")), F.col("_marker"))
    tomb = F.when(F.col("_tomb")["deleted_at"] >= horizon, F.col("_tomb"))
    anything = reduce(lambda a, b: a | b, kept.values(), F.lit(False))
    anything = anything | marker.isNotNull() | tomb.isNotNull() | cells.isNull()
    out = prior.select(
        *[c for c in prior.columns if c not in ("_cells", "_marker", "_tomb")],
        new_cells.alias("_cells"),
        marker.alias("_marker"),
        tomb.alias("_tomb"),
    )
    return out.where(anything).select(*prior.columns)


def _greatest(cols: list[Column]) -> Column:
    return cols[0] if len(cols) == 1 else F.greatest(*cols)


def _final_state(table: Table, now_us: int, tt: dict | None) -> tuple[list[Column], Column]:
    """The state row from the slots' maxima ``f_*`` at a key's last row; and whether the
    key keeps a state row at all."""
    now_s = now_us // 1_000_000
    tt_ts = F.lit(tt["ts"] if tt else None).cast("long")
    tomb = F.col("f__tomb")
    tomb_kept = tomb.isNotNull() & F.coalesce(tomb["ts"] > tt_ts, F.lit(True))
    limit = F.greatest(F.when(tomb_kept, tomb["ts"]), tt_ts)

    def kept(x: Column) -> Column:
        return x.isNotNull() & F.coalesce(x["ts"] > limit, F.lit(True))

    def live(x: Column) -> Column:
        return (
            kept(x)
            & ~x["dead"]
            & (x["ttl"].isNull() | F.coalesce(x["expiry_s"] > now_s, F.lit(False)))
        )

    cols = _value_columns(table)
    cells = {c: F.col(f"f_{c}") for c, _ in cols}
    marker = F.col("f__marker")
    marker_live = kept(marker) & (
        marker["ttl"].isNull() | F.coalesce(marker["expiry_s"] > now_s, F.lit(False))
    )
    lives = [live(x) for x in cells.values()]
    row_live = reduce(lambda a, b: a | b, lives, marker_live)

    def last_write(x: Column, ok: Column) -> Column:
        return F.when(
            ok,
            F.struct(
                x["ts"].alias("ts"),
                x["is_event"].alias("is_event"),
                x["rank"].alias("rank"),
                x["event_id"].alias("event_id"),
                x["origin"].alias("origin"),
            ),
        )

    latest = _greatest(
        [last_write(x, ok) for x, ok in zip(cells.values(), lives, strict=True)]
        + [last_write(marker, marker_live)]
    )
    deletions = [F.when(kept(x) & x["dead"], x["deleted_at"]) for x in cells.values()]
    deletions += [
        F.when(kept(x) & ~x["dead"] & x["ttl"].isNotNull(), (x["expiry_s"] - x["ttl"]) * 1_000_000)
        for x in cells.values()
    ]
    deletions.append(F.when(tomb_kept, tomb["deleted_at"]))
    values = []
    for c, _ct in cols:
        x = cells[c]
        values.append(F.when(live(x), x["value"]).alias(c))
    schema = state_schema(table)

    def stored(c: str, x: Column) -> Column:
        return F.when(
            kept(x),
            F.struct(
                x["value"].alias("value"),
                x["ts"].alias("ts"),
                x["ttl"].alias("ttl"),
                x["expiry_s"].alias("expiry"),
                x["dead"].alias("dead"),
                F.when(x["dead"], x["deleted_at"]).alias("deleted_at"),
                x["origin"].alias("origin"),
                x["event_id"].alias("event_id"),
            ),
        ).alias(c)

    by_name = dict(zip([c for c, _ in cols], values, strict=True))
    out = []
    for f in schema.fields:
        if f.name in table.key:
            out.append(F.col(f"key.{f.name}").alias(f.name))
        elif f.name in by_name:
            out.append(by_name[f.name])
        elif f.name == "_ts":
            out.append(F.when(row_live, latest["ts"]).alias("_ts"))
        elif f.name == "_origin":
            out.append(F.when(row_live, latest["origin"]).alias("_origin"))
        elif f.name == "_event_id":
            out.append(F.when(row_live, latest["event_id"]).alias("_event_id"))
        elif f.name == "_deleted":
            out.append((~row_live).alias("_deleted"))
        elif f.name == "_deleted_at":
            out.append(F.when(~row_live, _greatest(deletions)).alias("_deleted_at"))
        elif f.name == "_cells":
            out.append(F.struct(*[stored(c, cells[c]) for c, _ in cols]).alias("_cells"))
        elif f.name == "_marker":
            out.append(
                F.when(
                    kept(marker),
                    F.struct(
                        marker["ts"].alias("ts"),
                        marker["ttl"].alias("ttl"),
                        marker["expiry_s"].alias("expiry"),
                        marker["origin"].alias("origin"),
                        marker["event_id"].alias("event_id"),
                    ),
                ).alias("_marker")
            )
        elif f.name == "_tomb":
            out.append(
                F.when(
                    tomb_kept,
                    F.struct(
                        tomb["ts"].alias("ts"),
                        tomb["deleted_at"].alias("deleted_at"),
                        tomb["origin"].alias("origin"),
                        tomb["event_id"].alias("event_id"),
                    ),
                ).alias("_tomb")
            )
    exists = reduce(lambda a, b: a | b, [kept(x) for x in cells.values()], kept(marker)) | tomb_kept
    return [
        c.cast(f.dataType).alias(f.name) for c, f in zip(out, schema.fields, strict=True)
    ], exists


def _table_tombstone_row(spark: SparkSession, table: Table, tt: dict) -> DataFrame:
    schema = state_schema(table)
    values: dict[str, Any] = {f.name: None for f in schema.fields}
    values.update(
        _deleted=True,
        _deleted_at=tt["deleted_at"],
        _ts=tt["ts"],
        _origin=tt["origin"],
        _event_id=tt["event_id"],
        _tomb=(tt["ts"], tt["deleted_at"], tt["origin"], tt["event_id"]),
    )
    return spark.createDataFrame([tuple(values[f.name] for f in schema.fields)], schema)


# ---------------------------------------------------------------------- conflicts


def _why(w: Column, p: Column, has_value: bool) -> Column:
    """The rule that decided between a write and the slot's maximum before it."""
    fields = ["ts", "dead", "del", "exp", "expiry", "wtime"] + (["vkey"] if has_value else [])
    rules = list(RULES[:6]) + ([RULES[6]] if has_value else [])
    expr = None
    for f, r in zip(fields, rules, strict=True):
        cond = ~w[f].eqNullSafe(p[f])
        expr = F.when(cond, F.lit(r)) if expr is None else expr.when(cond, F.lit(r))
    assert expr is not None
    return expr.otherwise(F.lit(TIE))


def _render(x: Column, has_value: bool) -> Column:
    fields = ([x["value"].alias("value")] if has_value else []) + [
        x["ts"].alias("ts"),
        x["ttl"].alias("ttl"),
        x["expiry_s"].alias("expiry"),
        F.when(x["dead"], F.lit(True)).alias("deleted"),
    ]
    return F.struct(*fields)


def _position_after(truncs: Sequence[Event]) -> list[tuple[Event, Column]]:
    pos = F.struct(F.col("ts"), F.col("rank"), F.col("event_id"))
    return [
        (
            t,
            pos
            > F.struct(
                F.lit(t.ts).cast("long").alias("ts"),
                F.lit(t.rank).cast("int").alias("rank"),
                F.lit(t.event_id).alias("event_id"),
            ),
        )
        for t in sorted(truncs, key=Event.position)
    ]


def _ts_origin(ts: Column, origin: Column) -> Column:
    return F.struct(ts.cast("long").alias("ts"), origin.cast("string").alias("o"))


def _table_tomb_at_event(truncs: Sequence[Event], tt_prior: dict | None) -> Column:
    """The table tombstone standing when an event row is applied: the prior one, and the
    run's TRUNCATEs before it in the canonical order (``struct<ts, o>``, or null)."""
    tts: list[Column] = []
    if tt_prior is not None:
        tts.append(_ts_origin(F.lit(tt_prior["ts"]), F.lit(tt_prior["origin"])))
    for t, after in _position_after(truncs):
        tts.append(F.when(after, _ts_origin(F.lit(t.ts), F.lit(t.origin))))
    return _greatest(tts) if tts else F.lit(None).cast("struct<ts:bigint,o:string>")


def _conflict_columns(table: Table, truncs: Sequence[Event], tt_prior: dict | None) -> list[Column]:
    """For every event row: ``conflict`` (one of its writes met an equal or later write
    of another event, or a tombstone shadowed it), ``won`` (one of its writes won), which
    of its slots won (``won_<slot>``), and the conflict log's fields (§12 "Cell tables")."""
    ts, eid = F.col("ts"), F.col("event_id")
    tt = _table_tomb_at_event(truncs, tt_prior)
    ptomb = F.col("p__tomb")
    shadow = _greatest([F.when(ptomb.isNotNull(), _ts_origin(ptomb["ts"], ptomb["origin"])), tt])
    shadowed = F.coalesce(shadow["ts"] >= ts, F.lit(False))

    def other(p: Column) -> Column:
        return F.coalesce((p["ts"] >= ts) & ~p["event_id"].eqNullSafe(eid), F.lit(False))

    slots = [(c, True) for c, _ in _value_columns(table)] + [("_marker", False)]
    met, won, reasons, local, local_row, remote_row = [], [], [], [], [], []
    for name, has_value in slots:
        w, p = F.col(f"w_{name}"), F.col(f"p_{name}")
        written = w.isNotNull()
        m = written & (other(p) | shadowed)
        wn = written & ~shadowed & (p.isNull() | (w > p))
        met.append(m)
        won.append(wn)
        label = "row marker" if name == "_marker" else name
        why = F.when(shadowed, F.lit(SHADOWED)).otherwise(_why(w, p, has_value))
        reasons.append(
            F.when(
                m,
                F.concat(
                    F.lit(f"{label}: "),
                    F.when(wn, F.lit("won")).otherwise(F.lit("lost")),
                    F.lit(" ("),
                    why,
                    F.lit(")"),
                ),
            )
        )
        local.append(F.when(m & other(p), _ts_origin(p["ts"], p["origin"])))
        local_row.append(F.when(m & p.isNotNull(), _render(p, has_value)).alias(name))
        remote_row.append(F.when(written, _render(w, has_value)).alias(name))
    local.append(F.when(shadowed & reduce(lambda a, b: a | b, met), shadow))

    # a DELETE: its row tombstone meets every equal or later write of the key
    wt = F.col("w__tomb")
    is_delete = wt.isNotNull()
    hits = [other(F.col(f"p_{n}")) for n, _ in slots] + [other(ptomb)]
    tt_hit = F.coalesce(tt["ts"] >= ts, F.lit(False))
    beaten = tt_hit | F.coalesce(ptomb >= wt, F.lit(False))
    met_t = is_delete & (reduce(lambda a, b: a | b, hits) | tt_hit)
    met.append(met_t)
    won.append(is_delete & ~beaten)
    reasons.append(
        F.when(
            met_t,
            F.when(beaten, F.lit("row tombstone: lost (an equal or later tombstone)")).otherwise(
                F.lit("row tombstone: won (writes newer than it survive)")
            ),
        )
    )
    for n, _ in slots:
        p = F.col(f"p_{n}")
        local.append(F.when(is_delete & other(p), _ts_origin(p["ts"], p["origin"])))
    local.append(F.when(is_delete & other(ptomb), _ts_origin(ptomb["ts"], ptomb["origin"])))
    local.append(F.when(met_t & tt_hit, tt))
    local_row.append(
        F.when(met_t & ptomb.isNotNull(), F.struct(ptomb["ts"].alias("ts"))).alias("_row_tombstone")
    )
    remote_row.append(F.when(is_delete, F.struct(wt["ts"].alias("ts"))).alias("_row_tombstone"))

    any_met = reduce(lambda a, b: a | b, met)
    any_won = reduce(lambda a, b: a | b, won)
    any_write = reduce(
        lambda a, b: a | b, [F.col(f"w_{n}").isNotNull() for n, _ in slots], is_delete
    )
    loc = _greatest(local)
    op = F.col("op")
    ctype = F.create_map(*[x for k, v in TYPE_BY_OP.items() for x in (F.lit(k), F.lit(v))])[op]
    return [
        *[w.alias(f"won_{n}") for (n, _), w in zip(slots, won, strict=False)],
        any_met.alias("conflict"),
        (any_won | ~any_write).alias("won"),
        F.to_json(F.col("key")).alias("key_json"),
        ctype.alias("conflict_type"),
        F.lit(Resolver.SCYLLA.value).alias("resolver"),
        F.when(any_won, F.lit("applied")).otherwise(F.lit("discarded")).alias("outcome"),
        loc["ts"].alias("local_ts"),
        loc["o"].alias("local_origin"),
        F.to_json(F.struct(*local_row)).alias("local_row"),
        F.to_json(F.struct(*remote_row)).alias("remote_row"),
        F.concat_ws("; ", *reasons).alias("conflict_reason"),
    ]


# ---------------------------------------------------------------------- changes (CDC)


def _seen(x: Column, limit: Column, at_us: Column) -> Column:
    """A slot (cell or marker) a reader sees at ``at_us``: written, not dead, newer than
    the standing tombstones (``limit``), not yet expired."""
    return (
        x.isNotNull()
        & ~x["dead"]
        & F.coalesce(x["ts"] > limit, F.lit(True))
        & (x["ttl"].isNull() | F.coalesce(x["expiry_s"] * 1_000_000 > at_us, F.lit(True)))
    )


def _reader_row(table: Table, prefix: str, limit: Column, at_us: Column) -> tuple[Column, dict]:
    """Whether a reader sees the row of slots ``<prefix>_*`` at ``at_us``, and which cells."""
    seen = {c: _seen(F.col(f"{prefix}_{c}"), limit, at_us) for c, _ in _value_columns(table)}
    row = reduce(lambda a, b: a | b, seen.values(), _seen(F.col(f"{prefix}__marker"), limit, at_us))
    return row, seen


def _row_struct(table: Table, values: dict[str, Column]) -> Column:
    return F.struct(
        *[(F.col(f"key.{c}") if c in table.key else values[c]).alias(c) for c in table.column_names]
    )


def _seen_row(table: Table, prefix: str, seen: dict[str, Column]) -> Column:
    """The row a reader sees: the values of the cells in ``seen``."""
    values = {c: F.when(v, F.col(f"{prefix}_{c}")["value"]) for c, v in seen.items()}
    return _row_struct(table, values)


def _change(
    table: Table,
    event: tuple[Column, Column, Column],
    kind: Column,
    cols: dict[str, Column],
    values: dict[str, Column],
    ttl: Column,
    pre: Column,
    post: Column,
) -> Column:
    names = F.filter(
        F.array(*[F.when(w, F.lit(c)) for c, w in cols.items()]), lambda x: x.isNotNull()
    )
    return F.struct(
        event[0].alias("event_id"),
        event[1].cast("long").alias("ts"),
        event[2].cast("int").alias("rank"),
        F.lit(0).alias("idx"),
        kind.alias("kind"),
        F.col("key").alias("key"),
        _row_struct(table, {c: F.when(cols[c], v) for c, v in values.items()}).alias("values"),
        names.alias("cols"),
        ttl.cast("long").alias("ttl"),
        pre.alias("pre"),
        post.alias("post"),
    )


def _event_change(table: Table, truncs: Sequence[Event], tt_prior: dict | None) -> Column:
    """What an applied event did to the row a reader sees, at the event's own time
    (``rowfold.visible_changes`` for cells): the cells it wrote that won, and those its
    row tombstone cleared; a row a reader no longer sees is a row delete."""
    at, tt = F.col("ts"), _table_tomb_at_event(truncs, tt_prior)
    before, seen_b = _reader_row(table, "p", _greatest([F.col("p__tomb")["ts"], tt["ts"]]), at)
    after, seen_a = _reader_row(table, "f", _greatest([F.col("f__tomb")["ts"], tt["ts"]]), at)
    gone = ~after & (before | F.col("w__tomb").isNotNull())
    won = {c: F.col(f"won_{c}") for c in seen_b}
    cols = {c: ~gone & (won[c] | (seen_b[c] & ~seen_a[c])) for c in seen_b}
    kind = (
        F.when(gone, F.lit(ChangeKind.ROW_DELETE.value))
        .when(F.col("won__marker"), F.lit(ChangeKind.INSERT.value))
        .otherwise(F.lit(ChangeKind.UPDATE.value))
    )
    return _change(
        table,
        (F.col("event_id"), F.col("ts"), F.col("rank")),
        kind,
        cols,
        {c: F.when(won[c], F.col(f"w_{c}")["value"]) for c in seen_b},
        F.when(~gone, F.col("ttl")),
        F.when(before, _seen_row(table, "p", seen_b)),
        F.when(after, _seen_row(table, "f", seen_a)),
    )


def _truncate_slots(table: Table, truncs: Sequence[Event]) -> list[Column]:
    """Per TRUNCATE ``i`` and slot, the maximum of the key's writes before it
    (``t<i>_<slot>``), over the whole key."""
    whole = Window.partitionBy("key")
    names = [c for c, _ in _value_columns(table)] + ["_marker", "_tomb"]
    out = []
    for i, (_t, after) in enumerate(_position_after(truncs)):
        earlier = (F.col("is_event") == 0) | ~after
        out += [
            F.max(F.when(earlier, F.col(f"w_{n}"))).over(whole).alias(f"t{i}_{n}") for n in names
        ]
    return out


def _truncate_changes(table: Table, truncs: Sequence[Event], tt_prior: dict | None) -> Column:
    """At a key's last row: what each TRUNCATE of the run did to the row a reader saw
    just before it (a partition delete, or an update clearing the cells it shadowed
    when newer ones survive)."""
    changes = []
    ordered = sorted(truncs, key=Event.position)
    for i, t in enumerate(ordered):
        standing = [u.ts for u in ordered[:i]] + ([tt_prior["ts"]] if tt_prior else [])
        tt_ts = F.lit(max(standing) if standing else None).cast("long")
        at = F.lit(t.ts).cast("long")
        limit = _greatest([F.col(f"t{i}__tomb")["ts"], tt_ts])
        before, seen_b = _reader_row(table, f"t{i}", limit, at)
        after, seen_a = _reader_row(table, f"t{i}", _greatest([limit, at]), at)
        cols = {c: after & seen_b[c] & ~seen_a[c] for c in seen_b}
        kind = F.when(after, F.lit(ChangeKind.UPDATE.value)).otherwise(
            F.lit(ChangeKind.PARTITION_DELETE.value)
        )
        ch = _change(
            table,
            (F.lit(t.event_id), F.lit(t.ts), F.lit(t.rank)),
            kind,
            cols,
            {c: F.lit(None) for c in seen_b},
            F.lit(None),
            _seen_row(table, f"t{i}", seen_b),
            F.when(after, _seen_row(table, f"t{i}", seen_a)),
        )
        changes.append(F.when(before, ch))
    return F.filter(F.array(*changes), lambda x: x.isNotNull())


# ---------------------------------------------------------------------- the stage


def _resolve_keys(
    main: DataFrame,
    state_rows: DataFrame,
    config: Config,
    table: Table,
    truncs: Sequence[Event],
    tt_prior: dict | None,
    tt: dict | None,
    now_us: int,
    capture: bool,
) -> DataFrame:
    """The one shuffle by key and its two windows (module docstring). One row per copy
    and per state row, with the structs ``state`` (at a key's last row), ``conflict``,
    ``fate`` and ``quarantine`` where they apply, and ``chosen_id``; with ``capture``,
    ``change`` (an applied event's) and ``tchanges`` (the run's TRUNCATEs', at a key's
    last row) for the CDC log."""
    events = main.select(
        "key",
        F.lit(1).alias("is_event"),
        "event_id",
        "replica",
        "file",
        "line",
        "raw",
        "seq",
        "pref",
    )
    items = events.unionByName(state_rows, allowMissingColumns=True).repartition("key")

    # 1. the copy that stands for each event (§12), typed and guarded
    w_ev = Window.partitionBy("key", "is_event", "event_id").orderBy("pref", "replica")
    df = items.withColumn("rn", F.row_number().over(w_ev))
    chosen = (F.col("is_event") == 1) & (F.col("rn") == 1)
    df = type_copies(df, table, config, now_us, chosen)
    df = df.select(
        "*",
        F.first("reason").over(w_ev).alias("ev_reason"),
        F.first("ts").over(w_ev).alias("c_ts"),
        F.first("rank").over(w_ev).alias("c_rank"),
    )
    df = df.withColumn("good", chosen & F.col("ev_reason").isNull())

    # 2. every slot's writes, and their maxima before each row in the canonical order
    is_state = F.col("is_event") == 0
    names = [c for c, _ in _value_columns(table)] + ["_marker", "_tomb"]
    ranks = rank_map(config, table)
    writes = [
        F.when(is_state, s).otherwise(e).alias(f"w_{n}")
        for s, e, n in zip(
            _prior_writes(table, ranks), _event_writes(table, now_us), names, strict=True
        )
    ]
    df = df.select("*", *writes)
    w = Window.partitionBy("key").orderBy("is_event", "c_ts", "c_rank", "event_id", "rn")
    before = w.rowsBetween(Window.unboundedPreceding, -1)
    df = df.select(
        "*",
        *[F.max(f"w_{n}").over(before).alias(f"p_{n}") for n in names],
        F.lead(F.lit(1)).over(w).isNull().alias("last"),
    )
    df = df.select(
        "*",
        *[F.greatest(f"p_{n}", f"w_{n}").alias(f"f_{n}") for n in names],
        *_conflict_columns(table, truncs, tt_prior),
    )
    # the fate of a copy is its event's: the standing copy comes first among them
    fate_here = F.when(
        F.col("good"), F.when(F.col("won"), F.lit("applied")).otherwise(F.lit("discarded"))
    )
    upto = w.rowsBetween(Window.unboundedPreceding, 0)
    df = df.withColumn(
        "fate",
        F.when(F.col("ev_reason").isNotNull(), F.lit("quarantined")).otherwise(
            F.last(fate_here, ignorenulls=True).over(upto)
        ),
    )
    state_cols, exists = _final_state(table, now_us, tt)
    conflict = F.struct(
        F.col("key_json").alias("key"),
        "conflict_type",
        "resolver",
        "outcome",
        "local_ts",
        "local_origin",
        "local_row",
        F.col("event_id").alias("remote_event_id"),
        F.col("ts").alias("remote_ts"),
        F.col("origin").alias("remote_origin"),
        "remote_row",
        F.col("conflict_reason").alias("reason"),
        F.col("rank").alias("pos_rank"),
        F.lit(0).alias("pos_idx"),
    )
    quarantined = chosen & F.col("ev_reason").isNotNull()
    changes = []
    if capture:
        applied = F.col("good") & F.col("won")
        changes.append(F.when(applied, _event_change(table, truncs, tt_prior)).alias("change"))
        if truncs:
            df = df.select("*", *_truncate_slots(table, truncs))
            changes.append(
                F.when(F.col("last"), _truncate_changes(table, truncs, tt_prior)).alias("tchanges")
            )
    return df.select(
        F.when(F.col("last") & exists, F.struct(*state_cols)).alias("state"),
        F.when(F.col("good") & F.col("conflict"), conflict).alias("conflict"),
        F.when(F.col("is_event") == 1, F.struct("event_id", "replica", "fate")).alias("fate"),
        F.when(quarantined, F.struct("replica", "event_id", "reason", "detail", "raw")).alias(
            "quarantine"
        ),
        F.when(chosen, F.col("event_id")).alias("chosen_id"),
        *changes,
    )


def resolve_cells(
    spark: SparkSession,
    config: Config,
    table: Table,
    refs: DataFrame,
    prior: DataFrame,
    now_us: int,
    dt: date,
) -> Resolved:
    """Resolve one cell-granularity table. ``refs``: the light copies of the staged
    exports (``events.copy_refs``); ``prior``: the state the run starts from (not yet
    purged)."""
    del dt
    prior = purge_cells(prior, table, now_us, config.gc_grace_seconds)
    special = (F.col("event_id").isNull() | (F.col("op") == "TRUNCATE")).cast("boolean")
    truncs, special_fates, special_quarantine = special_copies(
        type_copies(refs.where(special), table, config, now_us, F.lit(True))
    )
    has_key = reduce(lambda a, b: a & b, [F.col(c).isNotNull() for c in table.key])
    tt_rows = prior.where(~has_key & F.col("_tomb").isNotNull()).select("_tomb").collect()
    tt_prior = _table_tombstone(tt_rows, [], now_us)
    tt = _table_tombstone(tt_rows, truncs, now_us)

    main = refs.where(~F.coalesce(special, F.lit(False)))
    state_rows = prior.where(has_key).select(
        key_struct(table).alias("key"),
        F.lit(0).alias("is_event"),
        F.struct(*table.column_names).alias("row"),
        "_ts",
        "_origin",
        "_event_id",
        "_cells",
        "_marker",
        "_tomb",
    )
    capture = config.cdc.enabled
    out = _resolve_keys(
        main, state_rows, config, table, truncs, tt_prior, tt, now_us, capture
    ).persist()
    disputed = [
        r.chosen_id
        for r in out.where(F.col("chosen_id").isNotNull())
        .groupBy("chosen_id")
        .count()
        .where(F.col("count") > 1)
        .select("chosen_id")
        .collect()
    ]
    if disputed:  # rare: copies of one event under different keys (see engine.py)
        log.warning(
            "table %s: %d event(s) have copies under different keys; the winning copy's "
            "key is used",
            table.name,
            len(disputed),
        )
        out.unpersist()
        main = settle_disputes(main, disputed)
        out = _resolve_keys(main, state_rows, config, table, truncs, tt_prior, tt, now_us, capture)
        out = out.persist()

    state = out.where(F.col("state").isNotNull()).select("state.*")
    if tt is not None:
        state = state.unionByName(_table_tombstone_row(spark, table, tt))
    conflicts = (
        out.where(F.col("conflict").isNotNull())
        .select("conflict.*")
        .select(*CONFLICT_FIELDS, "pos_rank", "pos_idx")
    )
    fates = out.where(F.col("fate").isNotNull()).select("fate.*")
    if special_fates:
        fates = fates.unionByName(
            spark.createDataFrame(special_fates, "event_id string, replica string, fate string")
        )
    quarantine = out.where(F.col("quarantine").isNotNull()).select("quarantine.*")
    if special_quarantine:
        quarantine = quarantine.unionByName(
            spark.createDataFrame(
                special_quarantine,
                "replica string, event_id string, reason string, detail string, raw string",
            )
        )
    divergence = spark.createDataFrame(
        [], "replica string, key string, replica_row string, converged_row string, repair string"
    )  # §9: a cell table converges in every replica's order (tests/test_cells.py)
    changes = None
    if capture:
        schema = change_schema(table)
        changes = out.where(F.col("change").isNotNull()).select(
            F.col("change").cast(schema).alias("c")
        )
        if truncs:
            truncated = out.select(F.explode("tchanges").alias("c"))
            changes = changes.unionByName(truncated.select(F.col("c").cast(schema).alias("c")))
        changes = changes.select("c.*")
    return Resolved(state, conflicts, divergence, fates, quarantine, list(truncs), changes)
