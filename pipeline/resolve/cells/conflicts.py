"""The conflicts of a cell table (docs/rules.md#fine-points): a write that met an
equal or later write of another event, with the columns of its conflict-log row."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import date
from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from pipeline.core.columns import (
    CONFLICT_ID,
    DEAD,
    EVENT_ID,
    EXPIRY,
    KEY,
    MARKER,
    OP,
    ORIGIN,
    RANK,
    TS,
    TTL,
)
from pipeline.core.config import Table
from pipeline.core.kinds import ColumnType
from pipeline.core.policy import Outcome, Resolver
from pipeline.resolve.cells.writes import expiry, greatest, ttl, value, value_columns
from pipeline.rules.cellfold import RULES, SHADOWED, TIE, TYPE_BY_OP
from pipeline.rules.events import Event


def position_after(truncs: Sequence[Event]) -> list[tuple[Event, Column]]:
    pos = F.struct(F.col(TS), F.col(RANK), F.col(EVENT_ID))
    return [
        (
            t,
            pos
            > F.struct(
                F.lit(t.ts).cast("long").alias(TS),
                F.lit(t.rank).cast("int").alias(RANK),
                F.lit(t.event_id).alias(EVENT_ID),
            ),
        )
        for t in sorted(truncs, key=Event.position)
    ]


def _ts_origin(ts: Column, origin: Column) -> Column:
    return F.struct(ts.cast("long").alias(TS), origin.cast("string").alias("o"))


def table_tomb_at_event(truncs: Sequence[Event], tt_prior: dict | None) -> Column:
    """The table tombstone standing when an event row is applied: the prior one, and the
    run's TRUNCATEs before it in the canonical order (``struct<ts, o>``, or null)."""
    tts: list[Column] = []
    if tt_prior is not None:
        tts.append(_ts_origin(F.lit(tt_prior[TS]), F.lit(tt_prior[ORIGIN])))
    for t, after in position_after(truncs):
        tts.append(F.when(after, _ts_origin(F.lit(t.ts), F.lit(t.origin))))
    return greatest(tts) if tts else F.lit(None).cast("struct<ts:bigint,o:string>")


def _why(w: Column, p: Column, ct: ColumnType | None) -> Column:
    """The rule that decided between a write and the slot's maximum before it."""
    rules = [
        (TS, RULES.ts),
        (DEAD, RULES.dead),
        ("del", RULES.deletion),
        ("exp", RULES.expiring),
        (EXPIRY, RULES.expiry),
        ("wtime", RULES.write_time),
    ] + ([("vkey", RULES.value)] if ct is not None else [])
    expr = None
    for f, r in rules:
        cond = ~w[f].eqNullSafe(p[f])
        expr = F.when(cond, F.lit(r)) if expr is None else expr.when(cond, F.lit(r))
    assert expr is not None
    return expr.otherwise(F.lit(TIE))


def _render(x: Column, ct: ColumnType | None) -> Column:
    fields = ([] if ct is None else [value(x, ct).alias("value")]) + [
        x[TS].alias(TS),
        ttl(x).alias(TTL),
        expiry(x).alias(EXPIRY),
        F.when(x[DEAD], F.lit(True)).alias("deleted"),
    ]
    return F.struct(*fields)


def _other(p: Column) -> Column:
    """An equal or later write (``p``: a slot's maximum before this row) of another event."""
    ts, eid = F.col(TS), F.col(EVENT_ID)
    return F.coalesce((p[TS] >= ts) & ~p[EVENT_ID].eqNullSafe(eid), F.lit(False))


@dataclass(frozen=True)
class _Findings:
    """Per slot of an event row: whether it met another write (``met``), whether it won,
    the reason, the local writes it met, and the local and remote cells as logged."""

    met: tuple[Column, ...] = ()
    won: tuple[Column, ...] = ()
    reasons: tuple[Column, ...] = ()
    local: tuple[Column, ...] = ()
    local_row: tuple[Column, ...] = ()
    remote_row: tuple[Column, ...] = ()

    def __add__(self, other: _Findings) -> _Findings:
        return _Findings(
            *[getattr(self, x.name) + getattr(other, x.name) for x in fields(_Findings)]
        )


def conflict_columns(
    table: Table, truncs: Sequence[Event], tt_prior: dict | None
) -> tuple[list[Column], dict[str, Column]]:
    """For every event row, the flags: ``conflict`` (one of its writes met an equal or
    later write of another event, or a tombstone shadowed it), ``won`` (one of its writes
    won) and which of its slots won (``won_<slot>``); and the conflict log's fields
    (docs/rules.md#fine-points), by name, to be computed only where ``conflict`` holds (their
    JSON renderings cost more than the rest of the row)."""
    tt = table_tomb_at_event(truncs, tt_prior)
    ptomb = F.col("p__tomb")
    shadow = greatest([F.when(ptomb.isNotNull(), _ts_origin(ptomb[TS], ptomb[ORIGIN])), tt])
    shadowed = F.coalesce(shadow[TS] >= F.col(TS), F.lit(False))
    slots: list[tuple[str, ColumnType | None]] = [*value_columns(table), (MARKER, None)]
    f = sum((_slot_findings(name, ct, shadowed) for name, ct in slots), _Findings())
    f += _Findings(local=(F.when(shadowed & reduce(lambda a, b: a | b, f.met), shadow),))
    f += _tombstone_findings([n for n, _ in slots], tt)
    is_delete = F.col("w__tomb").isNotNull()

    any_won = reduce(lambda a, b: a | b, f.won)
    any_write = reduce(
        lambda a, b: a | b, [F.col(f"w_{n}").isNotNull() for n, _ in slots], is_delete
    )
    loc = greatest(list(f.local))
    ctype = F.create_map(*[x for k, v in TYPE_BY_OP.items() for x in (F.lit(k), F.lit(v.value))])
    flags = [
        *[w.alias(f"won_{n}") for (n, _), w in zip(slots, f.won, strict=False)],
        reduce(lambda a, b: a | b, f.met).alias("conflict"),
        (any_won | ~any_write).alias("won"),
    ]
    return flags, {
        KEY: F.to_json(F.col(KEY)),
        "conflict_type": ctype[F.col(OP)],
        "resolver": F.lit(Resolver.SCYLLA.value),
        "outcome": F.when(any_won, F.lit(Outcome.APPLIED.value)).otherwise(
            F.lit(Outcome.DISCARDED.value)
        ),
        "local_ts": loc[TS],
        "local_origin": loc["o"],
        "local_row": F.to_json(F.struct(*f.local_row)),
        "remote_row": F.to_json(F.struct(*f.remote_row)),
        "reason": F.concat_ws("; ", *f.reasons),
    }


def _slot_findings(name: str, ct: ColumnType | None, shadowed: Column) -> _Findings:
    """A cell's or the row marker's write against the slot's maximum before it."""
    w, p = F.col(f"w_{name}"), F.col(f"p_{name}")
    written = w.isNotNull()
    m = written & (_other(p) | shadowed)
    wn = written & ~shadowed & (p.isNull() | (w > p))
    label = "row marker" if name == MARKER else name
    why = F.when(shadowed, F.lit(SHADOWED)).otherwise(_why(w, p, ct))
    outcome = F.when(wn, F.lit("won")).otherwise(F.lit("lost"))
    return _Findings(
        met=(m,),
        won=(wn,),
        reasons=(F.when(m, F.concat(F.lit(f"{label}: "), outcome, F.lit(" ("), why, F.lit(")"))),),
        local=(F.when(m & _other(p), _ts_origin(p[TS], p[ORIGIN])),),
        local_row=(F.when(m & p.isNotNull(), _render(p, ct)).alias(name),),
        remote_row=(F.when(written, _render(w, ct)).alias(name),),
    )


def _tombstone_findings(slots: list[str], tt: Column) -> _Findings:
    """A DELETE: its row tombstone meets every equal or later write of the key."""
    wt, ptomb = F.col("w__tomb"), F.col("p__tomb")
    is_delete = wt.isNotNull()
    hits = [_other(F.col(f"p_{n}")) for n in slots] + [_other(ptomb)]
    tt_hit = F.coalesce(tt[TS] >= F.col(TS), F.lit(False))
    beaten = tt_hit | F.coalesce(ptomb >= wt, F.lit(False))
    met_t = is_delete & (reduce(lambda a, b: a | b, hits) | tt_hit)
    reason = F.when(beaten, F.lit("row tombstone: lost (an equal or later tombstone)")).otherwise(
        F.lit("row tombstone: won (writes newer than it survive)")
    )
    met_slots = [F.col(f"p_{n}") for n in slots] + [ptomb]
    local = [F.when(is_delete & _other(p), _ts_origin(p[TS], p[ORIGIN])) for p in met_slots]
    return _Findings(
        met=(met_t,),
        won=(is_delete & ~beaten,),
        reasons=(F.when(met_t, reason),),
        local=(*local, F.when(met_t & tt_hit, tt)),
        local_row=(
            F.when(met_t & ptomb.isNotNull(), F.struct(ptomb[TS].alias(TS))).alias(
                "_row_tombstone"
            ),
        ),
        remote_row=(F.when(is_delete, F.struct(wt[TS].alias(TS))).alias("_row_tombstone"),),
    )


def with_conflict_id(conflicts: DataFrame, dt: date, table: str) -> DataFrame:
    """docs/rules.md#manual-decisions: each cell conflict's ``conflict_id``, by the formula of
    ``pipeline.rules.decisions.conflict_id`` (the local side: the logged local row's
    digest; a cell's local write has no event id here)."""
    local = F.coalesce(F.substring(F.sha2(F.col("local_row"), 256), 1, 32), F.lit(""))
    parts = [
        F.lit(dt.isoformat()),
        F.lit(table),
        F.col(KEY),
        F.col("conflict_type"),
        F.col("remote_event_id"),
        local,
    ]
    return conflicts.withColumn(
        CONFLICT_ID, F.substring(F.sha2(F.concat_ws("\x1f", *parts), 256), 1, 32)
    )
