"""The rows an event writes in the row fold: a live row with its stamps, a tombstone, the
full row an UPDATE carries, and the columns with rules of their own, the delta columns
(docs/rules.md#delta-columns) and the merge columns (docs/rules.md#merge-functions).

Pure Python, of one table and no state: the fold (``pipeline.rules.rowfold``) decides
which row to write, :class:`Rows` makes it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pipeline.core.config import Table
from pipeline.core.kinds import ColumnType
from pipeline.core.policy import ConflictType, Outcome, Why, merged, reason
from pipeline.rules.detection import order_value
from pipeline.rules.events import Conflict, Event, Key, Stamp, Version
from pipeline.rules.resolvers import RULES, refusal


class DeltaOverflow(Exception):
    """An event's delta would take a delta column past its type's range
    (docs/rules.md#delta-columns): the event is quarantined whole (``delta_overflow``),
    before it changed anything."""

    def __init__(self, column: str, ctype: ColumnType, value: Any):
        super().__init__(f"the delta of column {column!r} would make it {value}, past {ctype}")


_O = Outcome
_W = Why
_C = ConflictType


def _num(v: Any) -> Any:
    return 0 if v is None else v


class Rows:
    """The rows of one table as an event writes them, at the fold's clock ``now_us`` (a
    tombstone's ``deleted_at``)."""

    def __init__(self, table: Table, now_us: int) -> None:
        self.table = table
        self.now_us = now_us
        self._key_cols = table.key
        self.columns = table.column_names
        self._delta_types = {c: table.column(c).type for c in table.delta}
        self._merges = table.merge

    def key_dict(self, key: Key) -> dict[str, Any]:
        return dict(zip(self._key_cols, key, strict=True))

    def tombstone(
        self,
        key: Key,
        e: Event,
        current: Version | None,
        ts: int | None = None,
        rank: int | None = None,
        order_from: Version | None = None,
    ) -> Version:
        """A tombstone of ``key`` made by ``e``, over the key's ``current`` version. With
        ``order_by`` it keeps an order value (docs/rules.md#order-by-a-column): a DELETE's,
        else ``order_from``'s or the deleted row's."""
        values = self.key_dict(key)
        col = self.table.order_by
        if col is not None:
            src = e if e.op == "DELETE" and order_from is None else order_from
            src = src if src is not None else current
            values[col] = None if src is None else order_value(src, col)
        return Version(
            values,
            e.ts if ts is None else ts,
            e.origin,
            e.event_id,
            e.rank if rank is None else rank,
            deleted=True,
            deleted_at=self.now_us,
            pos=e.pos,
        )

    def live(
        self,
        values: dict[str, Any],
        e: Event,
        stamps: Mapping[str, Stamp] | None = None,
        ts: int | None = None,
    ) -> Version:
        """The row ``e`` wrote (``ts``: its ts when not the event's, a custom resolver's row,
        docs/rules.md#custom-resolvers); with ``stamps`` (column groups), the row's stamp is
        its latest group's, and the groups are kept where they differ from it."""
        if not stamps:
            return Version(
                values, e.ts if ts is None else ts, e.origin, e.event_id, e.rank, pos=e.pos
            )
        last = max(stamps.values(), key=Stamp.position)
        groups = None if all(s == last for s in stamps.values()) else dict(stamps)
        return Version(
            values, last.ts, last.origin, last.event_id, last.rank, groups=groups, pos=last.pos
        )

    def full_row(self, e: Event, key: Key) -> dict[str, Any] | None:
        """docs/rules.md#fine-points: key (or new_key) with before and after covers
        every column."""
        row: dict[str, Any] = dict(e.before)
        row.update(e.after)
        row.update(self.key_dict(key))
        if not all(c in row for c in self.columns):
            return None
        return {c: row[c] for c in self.columns}

    def written(self, local: Mapping[str, Any], e: Event, key: Key) -> dict[str, Any]:
        """The local row with the event's columns written; delta columns accumulate
        (docs/rules.md#delta-columns)."""
        row = dict(local)
        for c, v in e.after.items():
            if c in self.table.delta:
                row[c] = self.plus_delta(row.get(c), e, c)
            else:
                row[c] = v
        row.update(self.key_dict(key))
        return row

    def plus_delta(self, local: Any, e: Event, c: str) -> Any:
        """The local value (null counts as 0) plus the event's ``new - old`` of delta column
        ``c``; :class:`DeltaOverflow` past the column's range."""
        value = _num(local) + (e.after[c] - e.before[c])
        ctype = self._delta_types[c]
        if not ctype.fits(value):
            raise DeltaOverflow(c, ctype, value)
        return value

    def merge_won(
        self, values: dict[str, Any], loser: Mapping[str, Any], cols: Iterable[str] | None = None
    ) -> list[str]:
        """docs/rules.md#merge-functions: the winner's ``values`` with each ``merge``
        column (of ``cols``, the conflict's column group, when given) taking the merge of
        the two versions; returns the columns the losing version's value took, as the
        conflict log names them."""
        took = []
        for c, fn in self._merges.items():
            if cols is not None and c not in cols:
                continue
            v = merged(fn, values.get(c), loser.get(c))
            if v is not values.get(c):  # merged returns one of its two values: the loser's
                values[c] = v
                took.append(f"{c} ({fn.value})")
        return took

    def insert_row(
        self, e: Event, key: Key, local: Version | None, log: list[Conflict]
    ) -> dict[str, Any] | None:
        """The INSERT's row; docs/rules.md#conflict-types target_column_extra, logged in
        ``log``, when it lacks columns (None: its resolver refused the event or the row
        cannot be filled). ``local``: the live row an INSERT applied as an UPDATE meets."""
        given = dict(e.after)
        given.update(self.key_dict(key))
        cols = self.columns
        missing = [c for c in cols if c not in given]
        if not missing:
            return {c: given[c] for c in cols}
        t = _C.TARGET_COLUMN_EXTRA
        r = self.table.resolvers[t]
        if t not in RULES[r].takes:
            why = reason(_W.MISSING_REFUSED, columns=missing)
            log.append(Conflict(key, t, r, refusal(r), e, (), why))
            return None
        if local is not None:  # applied as an UPDATE: missing columns keep their values
            why = reason(_W.MISSING_KEEP_LOCAL, columns=missing)
            log.append(Conflict(key, t, r, _O.APPLIED, e, (local,), why))
            return {c: given.get(c, local.values.get(c)) for c in cols}
        defaults = self.table.defaults
        unfillable = [c for c in missing if c in self.table.not_null and defaults.get(c) is None]
        if unfillable:
            why = reason(_W.MISSING_NOT_NULL, columns=unfillable)
            log.append(Conflict(key, t, r, _O.ERRORED, e, (), why))
            return None
        why = reason(_W.MISSING_DEFAULTS, columns=missing)
        log.append(Conflict(key, t, r, _O.APPLIED, e, (), why))
        return {c: given[c] if c in given else defaults.get(c) for c in cols}
