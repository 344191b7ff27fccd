"""The state of a cell table: the purge of expired tombstones
(docs/rules.md#tombstones-and-gc_grace_seconds), the table tombstone of a TRUNCATE, and the
new state row from the maxima of its slots."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import reduce
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from pipeline.core.columns import (
    CELLS,
    DEAD,
    DELETED_AT,
    EVENT_ID,
    EXPIRY,
    MARKER,
    ORIGIN,
    RANK,
    STATE_DELETED,
    STATE_DELETED_AT,
    STATE_EVENT_ID,
    STATE_ORIGIN,
    STATE_TS,
    TOMB,
    TS,
    TTL,
)
from pipeline.core.config import Table
from pipeline.core.kinds import ColumnType
from pipeline.resolve.cells.writes import deleted_at, expiry, greatest, ttl, value, value_columns
from pipeline.rules.events import Event
from pipeline.spark.schema import state_schema


def table_tombstone(rows: list[Any], truncs: Sequence[Event], now_us: int) -> dict | None:
    """The table tombstone: the latest of the state's and the run's TRUNCATEs."""
    cands = [
        (r._tomb.ts, r._tomb.deleted_at, 0, -1, r._tomb.event_id or "", r._tomb.origin)
        for r in rows
    ]
    cands += [(t.ts, now_us, 1, t.rank, t.event_id, t.origin) for t in truncs]
    if not cands:
        return None
    ts, deleted_at, _, _, event_id, origin = max(cands)
    return {TS: ts, DELETED_AT: deleted_at, ORIGIN: origin, EVENT_ID: event_id or None}


@dataclass(frozen=True)
class _Purge:
    """docs/rules.md#tombstones-and-gc_grace_seconds at the run's clock: which slots are
    tombstones older than the GC horizon
    (``now - gc_grace``): dead cells, expired cells (counting from their write time
    ``expiry - ttl``), the row and table tombstones."""

    horizon: int  # µs
    now_s: int

    @staticmethod
    def at(now_us: int, grace_s: int) -> _Purge:
        return _Purge(now_us - grace_s * 1_000_000, now_us // 1_000_000)

    def expired_old(self, x: Column) -> Column:
        """An expired TTL write, a tombstone since its write time ``expiry - ttl``."""
        expired = x[TTL].isNotNull() & (x[EXPIRY] <= self.now_s)
        return expired & ((x[EXPIRY] - x[TTL]) * 1_000_000 < self.horizon)

    def old(self, x: Column) -> Column:
        """A cell purged (never null)."""
        old = F.when(x[DEAD], x[DELETED_AT] < self.horizon).otherwise(self.expired_old(x))
        return x.isNotNull() & F.coalesce(old, F.lit(False))

    def old_marker(self, x: Column) -> Column:  # a marker is never dead
        return x.isNotNull() & F.coalesce(self.expired_old(x), F.lit(False))

    def old_tomb(self, x: Column) -> Column:
        return x.isNotNull() & ~F.coalesce(x[DELETED_AT] >= self.horizon, F.lit(False))


def purge_cells(prior: DataFrame, table: Table, now_us: int, grace_s: int) -> DataFrame:
    """docs/rules.md#tombstones-and-gc_grace_seconds: drop the tombstones older than the GC
    horizon (:class:`_Purge`); a row left with nothing disappears."""
    p = _Purge.at(now_us, grace_s)
    cells = F.col(CELLS)
    value_cols = [c for c, _ in value_columns(table)]
    kept = {c: cells[c].isNotNull() & ~p.old(cells[c]) for c in value_cols}
    new_cells = F.when(
        cells.isNotNull(), F.struct(*[F.when(kept[c], cells[c]).alias(c) for c in value_cols])
    )
    marker = F.when(~p.old_marker(F.col(MARKER)), F.col(MARKER))
    tomb = F.when(~p.old_tomb(F.col(TOMB)), F.col(TOMB))
    anything = reduce(lambda a, b: a | b, kept.values(), F.lit(False))
    anything = anything | marker.isNotNull() | tomb.isNotNull() | cells.isNull()
    out = prior.select(
        *[c for c in prior.columns if c not in (CELLS, MARKER, TOMB)],
        new_cells.alias(CELLS),
        marker.alias(MARKER),
        tomb.alias(TOMB),
    )
    return out.where(anything).select(*prior.columns)


def due(table: Table, now_us: int, grace_s: int, since_us: int) -> Column:
    """Whether a state row, as the run at ``since_us`` left it, changes at ``now_us``
    though no event touches its key: a slot of it expires in between (its value, or the
    row, is no longer live), a tombstone of it is purged (:func:`purge_cells`), or it is
    the table tombstone (a row with no key: it shadows every key's older writes, so every
    run reads it). A night merged in place reads these rows and its events' keys only."""
    p = _Purge.at(now_us, grace_s)
    since_s = since_us // 1_000_000

    def expires(x: Column) -> Column:
        between = (x[EXPIRY] > since_s) & (x[EXPIRY] <= p.now_s)
        return x.isNotNull() & F.coalesce(x[TTL].isNotNull() & between, F.lit(False))

    cells, marker = F.col(CELLS), F.col(MARKER)
    slots = [cells[c] for c, _ in value_columns(table)]
    changes = [*(p.old(x) | expires(x) for x in slots), p.old_marker(marker), expires(marker)]
    changes += [p.old_tomb(F.col(TOMB)), *(F.col(c).isNull() for c in table.key)]
    return reduce(lambda a, b: a | b, changes)


@dataclass(frozen=True)
class _Horizon:
    """What survives at a key's last row: a write newer than the row tombstone kept and
    the table tombstone (``limit``), alive at the run's clock (``now_s``)."""

    limit: Column
    now_s: int

    def kept(self, x: Column) -> Column:
        return x.isNotNull() & F.coalesce(x[TS] > self.limit, F.lit(True))

    def unexpired(self, x: Column) -> Column:
        return ~x["exp"] | F.coalesce(x[EXPIRY] > self.now_s, F.lit(False))

    def live(self, x: Column) -> Column:
        return self.kept(x) & ~x[DEAD] & self.unexpired(x)


def final_state(table: Table, now_us: int, tt: dict | None) -> tuple[list[Column], Column]:
    """The state row from the slots' maxima ``f_*`` at a key's last row; and whether the
    key keeps a state row at all."""
    tt_ts = F.lit(tt[TS] if tt else None).cast("long")
    tomb = F.col("f__tomb")
    tomb_kept = tomb.isNotNull() & F.coalesce(tomb[TS] > tt_ts, F.lit(True))
    h = _Horizon(F.greatest(F.when(tomb_kept, tomb[TS]), tt_ts), now_us // 1_000_000)
    types = dict(value_columns(table))
    cells = {c: F.col(f"f_{c}") for c in types}
    marker = F.col("f__marker")
    by_name = {
        **{c: F.col(f"key.{c}") for c in table.key},
        **{c: F.when(h.live(x), value(x, types[c])) for c, x in cells.items()},
        **_row_meta(cells, marker, tomb, tomb_kept, h),
        CELLS: F.struct(*[_stored_cell(x, types[c], h).alias(c) for c, x in cells.items()]),
        MARKER: F.when(
            h.kept(marker),
            F.struct(
                marker[TS].alias(TS),
                ttl(marker).alias(TTL),
                expiry(marker).alias(EXPIRY),
                *_by(marker),
            ),
        ),
        TOMB: F.when(
            tomb_kept, F.struct(*[tomb[n].alias(n) for n in (TS, DELETED_AT)], *_by(tomb))
        ),
    }
    exists = (
        reduce(lambda a, b: a | b, [h.kept(x) for x in cells.values()], h.kept(marker)) | tomb_kept
    )
    schema = state_schema(table)
    return [by_name[f.name].cast(f.dataType).alias(f.name) for f in schema.fields], exists


def _by(x: Column) -> list[Column]:
    return [x[ORIGIN].alias(ORIGIN), x[EVENT_ID].alias(EVENT_ID)]


def _stored_cell(x: Column, ct: ColumnType, h: _Horizon) -> Column:
    """A cell as the state keeps it: as written, even once expired or deleted."""
    return F.when(
        h.kept(x),
        F.struct(
            value(x, ct).alias("value"),
            x[TS].alias(TS),
            ttl(x).alias(TTL),
            expiry(x).alias(EXPIRY),
            x[DEAD].alias(DEAD),
            deleted_at(x).alias(DELETED_AT),
            *_by(x),
        ),
    )


def _row_meta(
    cells: dict[str, Column], marker: Column, tomb: Column, tomb_kept: Column, h: _Horizon
) -> dict[str, Column]:
    """``_ts, _origin, _event_id`` of the row's last live write, and whether and when it
    was deleted (the latest deletion, expiry or tombstone) when nothing of it lives."""
    marker_live = h.kept(marker) & h.unexpired(marker)
    lives = [h.live(x) for x in cells.values()]
    row_live = reduce(lambda a, b: a | b, lives, marker_live)

    def last_write(x: Column, ok: Column) -> Column:
        fields = (TS, "is_event", RANK, EVENT_ID, ORIGIN)
        return F.when(ok, F.struct(*[x[n].alias(n) for n in fields]))

    latest = greatest(
        [last_write(x, ok) for x, ok in zip(cells.values(), lives, strict=True)]
        + [last_write(marker, marker_live)]
    )
    deletions = [F.when(h.kept(x), deleted_at(x)) for x in cells.values()]
    # a TTL write is a tombstone once it expires, deleted as of its write time
    # (docs/rules.md#tombstones-and-gc_grace_seconds)
    deletions += [F.when(h.kept(x) & x["exp"], x["wtime"] * 1_000_000) for x in cells.values()]
    deletions.append(F.when(tomb_kept, tomb[DELETED_AT]))
    return {
        STATE_TS: F.when(row_live, latest[TS]),
        STATE_ORIGIN: F.when(row_live, latest[ORIGIN]),
        STATE_EVENT_ID: F.when(row_live, latest[EVENT_ID]),
        STATE_DELETED: ~row_live,
        STATE_DELETED_AT: F.when(~row_live, greatest(deletions)),
    }


def table_tombstone_row(spark: SparkSession, table: Table, tt: dict) -> DataFrame:
    schema = state_schema(table)
    values: dict[str, Any] = {f.name: None for f in schema.fields}
    values.update(
        _deleted=True,
        _deleted_at=tt[DELETED_AT],
        _ts=tt[TS],
        _origin=tt[ORIGIN],
        _event_id=tt[EVENT_ID],
        _tomb=(tt[TS], tt[DELETED_AT], tt[ORIGIN], tt[EVENT_ID]),
    )
    return spark.createDataFrame([tuple(values[f.name] for f in schema.fields)], schema)
