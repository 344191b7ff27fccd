"""What each applied event of a cell table changed, for the CDC log (docs/cdc.md): the row a
reader saw before and after it, and the partition deletes of the run's TRUNCATEs."""

from __future__ import annotations

from collections.abc import Sequence
from functools import reduce

from pyspark.sql import Column, Window
from pyspark.sql import functions as F

from pipeline.core.columns import DEAD, EVENT_ID, EXPIRY, KEY, MARKER, POS, RANK, TOMB, TS, TTL
from pipeline.core.config import Table
from pipeline.core.policy import ChangeKind
from pipeline.resolve.cells.conflicts import position_after, table_tomb_at_event
from pipeline.resolve.cells.writes import greatest, value, value_columns
from pipeline.rules.events import Event


def _seen(x: Column, limit: Column, at_us: Column) -> Column:
    """A slot (cell or marker) a reader sees at ``at_us``: written, not dead, newer than
    the standing tombstones (``limit``), not yet expired."""
    return (
        x.isNotNull()
        & ~x[DEAD]
        & F.coalesce(x[TS] > limit, F.lit(True))
        & (~x["exp"] | F.coalesce(x[EXPIRY] * 1_000_000 > at_us, F.lit(True)))
    )


def _reader_row(table: Table, prefix: str, limit: Column, at_us: Column) -> tuple[Column, dict]:
    """Whether a reader sees the row of slots ``<prefix>_*`` at ``at_us``, and which cells."""
    seen = {c: _seen(F.col(f"{prefix}_{c}"), limit, at_us) for c, _ in value_columns(table)}
    row = reduce(lambda a, b: a | b, seen.values(), _seen(F.col(f"{prefix}__marker"), limit, at_us))
    return row, seen


def _row_struct(table: Table, values: dict[str, Column]) -> Column:
    return F.struct(
        *[(F.col(f"key.{c}") if c in table.key else values[c]).alias(c) for c in table.column_names]
    )


def _seen_row(table: Table, prefix: str, seen: dict[str, Column]) -> Column:
    """The row a reader sees: the values of the cells in ``seen``."""
    types = dict(value_columns(table))
    values = {c: F.when(v, value(F.col(f"{prefix}_{c}"), types[c])) for c, v in seen.items()}
    return _row_struct(table, values)


def _change(
    table: Table,
    event: tuple[Column, Column, Column],
    kind: Column,
    cols: dict[str, Column],
    values: dict[str, Column],
    ttl: tuple[Column, Column],
    pre: Column,
    post: Column,
) -> Column:
    """One change (``schema.change_schema``); ``ttl``: the TTL and expiry of its writes."""
    names = F.filter(
        F.array(*[F.when(w, F.lit(c)) for c, w in cols.items()]), lambda x: x.isNotNull()
    )
    return F.struct(
        event[0].alias(EVENT_ID),
        event[1].cast("long").alias(TS),
        event[2].cast("int").alias(RANK),
        # cells: ordered by their rules (docs/rules.md#cell-rules)
        F.lit(None).cast("long").alias(POS),
        F.lit(0).alias("idx"),
        kind.alias("kind"),
        F.col(KEY).alias(KEY),
        _row_struct(table, {c: F.when(cols[c], v) for c, v in values.items()}).alias("values"),
        names.alias("cols"),
        ttl[0].cast("long").alias(TTL),
        ttl[1].cast("long").alias(EXPIRY),
        pre.alias("pre"),
        post.alias("post"),
    )


def event_change(table: Table, truncs: Sequence[Event], tt_prior: dict | None) -> Column:
    """What an applied event did to the row a reader sees, at the event's own time
    (``rowfold.visible_changes`` for cells): the cells it wrote that won, and those its
    row tombstone cleared; a row a reader no longer sees is a row delete."""
    at, tt = F.col(TS), table_tomb_at_event(truncs, tt_prior)
    before, seen_b = _reader_row(table, "p", greatest([F.col("p__tomb")[TS], tt[TS]]), at)
    after, seen_a = _reader_row(table, "f", greatest([F.col("f__tomb")[TS], tt[TS]]), at)
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
        (F.col(EVENT_ID), F.col(TS), F.col(RANK)),
        kind,
        cols,
        {c: F.when(won[c], value(F.col(f"w_{c}"), ct)) for c, ct in value_columns(table)},
        (F.when(~gone, F.col(TTL)), F.when(~gone, F.col(EXPIRY))),
        F.when(before, _seen_row(table, "p", seen_b)),
        F.when(after, _seen_row(table, "f", seen_a)),
    )


def truncate_slots(table: Table, truncs: Sequence[Event]) -> list[Column]:
    """Per TRUNCATE ``i`` and slot, the maximum of the key's writes before it
    (``t<i>_<slot>``), over the whole key."""
    whole = Window.partitionBy(KEY)
    names = [c for c, _ in value_columns(table)] + [MARKER, TOMB]
    out = []
    for i, (_t, after) in enumerate(position_after(truncs)):
        earlier = (F.col("is_event") == 0) | ~after
        out += [
            F.max(F.when(earlier, F.col(f"w_{n}"))).over(whole).alias(f"t{i}_{n}") for n in names
        ]
    return out


def truncate_changes(table: Table, truncs: Sequence[Event], tt_prior: dict | None) -> Column:
    """At a key's last row: what each TRUNCATE of the run did to the row a reader saw
    just before it (a partition delete, or an update clearing the cells it shadowed
    when newer ones survive)."""
    changes = []
    ordered = sorted(truncs, key=Event.position)
    for i, t in enumerate(ordered):
        standing = [u.ts for u in ordered[:i]] + ([tt_prior[TS]] if tt_prior else [])
        tt_ts = F.lit(max(standing) if standing else None).cast("long")
        at = F.lit(t.ts).cast("long")
        limit = greatest([F.col(f"t{i}__tomb")[TS], tt_ts])
        before, seen_b = _reader_row(table, f"t{i}", limit, at)
        after, seen_a = _reader_row(table, f"t{i}", greatest([limit, at]), at)
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
            (F.lit(None), F.lit(None)),
            _seen_row(table, f"t{i}", seen_b),
            F.when(after, _seen_row(table, f"t{i}", seen_a)),
        )
        changes.append(F.when(before, ch))
    return F.filter(F.array(*changes), lambda x: x.isNotNull())
