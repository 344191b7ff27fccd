"""The conflicts of a cell table (semantics.md §12 "Cell tables"): a write that met an
equal or later write of another event, with the columns of its conflict-log row."""

from __future__ import annotations

from collections.abc import Sequence
from functools import reduce

from pyspark.sql import Column
from pyspark.sql import functions as F

from pipeline.cellfold import RULES, SHADOWED, TIE, TYPE_BY_OP
from pipeline.cells.writes import greatest, value_columns
from pipeline.config import Table
from pipeline.policy import Resolver
from pipeline.rowfold import Event


def position_after(truncs: Sequence[Event]) -> list[tuple[Event, Column]]:
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


def table_tomb_at_event(truncs: Sequence[Event], tt_prior: dict | None) -> Column:
    """The table tombstone standing when an event row is applied: the prior one, and the
    run's TRUNCATEs before it in the canonical order (``struct<ts, o>``, or null)."""
    tts: list[Column] = []
    if tt_prior is not None:
        tts.append(_ts_origin(F.lit(tt_prior["ts"]), F.lit(tt_prior["origin"])))
    for t, after in position_after(truncs):
        tts.append(F.when(after, _ts_origin(F.lit(t.ts), F.lit(t.origin))))
    return greatest(tts) if tts else F.lit(None).cast("struct<ts:bigint,o:string>")


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


def conflict_columns(table: Table, truncs: Sequence[Event], tt_prior: dict | None) -> list[Column]:
    """For every event row: ``conflict`` (one of its writes met an equal or later write
    of another event, or a tombstone shadowed it), ``won`` (one of its writes won), which
    of its slots won (``won_<slot>``), and the conflict log's fields (§12 "Cell tables")."""
    ts, eid = F.col("ts"), F.col("event_id")
    tt = table_tomb_at_event(truncs, tt_prior)
    ptomb = F.col("p__tomb")
    shadow = greatest([F.when(ptomb.isNotNull(), _ts_origin(ptomb["ts"], ptomb["origin"])), tt])
    shadowed = F.coalesce(shadow["ts"] >= ts, F.lit(False))

    def other(p: Column) -> Column:
        return F.coalesce((p["ts"] >= ts) & ~p["event_id"].eqNullSafe(eid), F.lit(False))

    slots = [(c, True) for c, _ in value_columns(table)] + [("_marker", False)]
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
    loc = greatest(local)
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
