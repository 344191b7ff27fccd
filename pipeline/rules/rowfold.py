"""The row-granularity fold: detection (docs/rules.md#conflict-types) and resolution
(docs/rules.md#resolvers, docs/rules.md#policies, docs/rules.md#delta-columns,
docs/rules.md#fine-points)
of a sequence of events against a state, one event at a time.

This module is pure Python with no Spark: the Spark engine (``pipeline.resolve.engine``) calls it
on groups of keys whose events need it (contended keys, keys coupled by key changes or
unique constraints), and the tests run it directly as the reference of the rules.

A :class:`RowFold` owns its state (a dict ``key -> Version``) and applies events with
:meth:`RowFold.apply`. The converged fold logs conflicts and stops at an ``error``; a
replica's perspective (docs/rules.md#convergence) logs nothing and simply does not apply an
event that would error."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pipeline.core.config import ColumnType, Table
from pipeline.core.policy import (
    REFUSED,
    TAKES,
    ChangeKind,
    ConflictType,
    Detection,
    Outcome,
    QuarantineReason,
    Resolver,
    Standing,
    Why,
    delete_wins,
    merged,
    reason,
)
from pipeline.rules import custom
from pipeline.rules.custom import ResolverError
from pipeline.rules.decisions import Decisions, Take

Key = tuple[Any, ...]

_C = ConflictType
_R = Resolver
_O = Outcome
_W = Why

#: docs/rules.md#delta-columns: the local row wins, and the UPDATE's delta is still added to it
_KEEPS_DELTA = frozenset({_O.DISCARDED, _O.SKIPPED})


#: the place in its transaction of an event that has none (a canonical record without
#: ``pos``), and of a version read from the state: it comes before every event of its
#: transaction that has one (the state's versions were written by earlier nights)
NO_POS = -1

#: where a version or an event stands in the canonical order
#: (docs/rules.md#the-canonical-order): ``ts``, the origin's tie rank, the place in the
#: origin transaction, the event id
Position = tuple[int, int, int, str]


@dataclass(frozen=True, slots=True)
class Stamp:
    """Who wrote a column group last (docs/rules.md#column-groups), in the canonical order's
    terms."""

    ts: int
    rank: int
    event_id: str | None
    origin: str | None
    pos: int = NO_POS

    def position(self) -> Position:
        return (self.ts, self.rank, self.pos, self.event_id or "")


def read_groups(text: str) -> dict[str, Stamp]:
    """The state's ``_groups`` (``{group: [ts, rank, event_id, origin]}``)."""
    return {g: Stamp(*v) for g, v in json.loads(text).items()}


def write_groups(groups: Mapping[str, Stamp]) -> str:
    return json.dumps({g: [s.ts, s.rank, s.event_id, s.origin] for g, s in groups.items()})


@dataclass(slots=True)
class Version:
    """A key's state: a live row (``values`` holds every column) or a tombstone
    (``deleted``; ``values`` holds the key columns)."""

    values: dict[str, Any]
    ts: int
    origin: str | None
    event_id: str | None
    rank: int
    deleted: bool = False
    deleted_at: int | None = None
    #: docs/rules.md#column-groups: each column group's stamp, where the groups differ (None: every
    #: group is the row's own ``ts, origin, event_id, rank``)
    groups: Mapping[str, Stamp] | None = None
    #: the place in its transaction of the event that wrote it, while the fold that
    #: applied that event runs (the state does not keep it: :data:`NO_POS`)
    pos: int = NO_POS

    def position(self) -> Position:
        return (self.ts, self.rank, self.pos, self.event_id or "")

    def stamp(self) -> Stamp:
        return Stamp(self.ts, self.rank, self.event_id, self.origin, self.pos)

    def group(self, name: str) -> Version:
        """The row as the last writer of column group ``name`` left it: its values, with
        that group's stamp (column groups)."""
        s = (self.groups or {}).get(name)
        if s is None:
            return self
        return Version(self.values, s.ts, s.origin, s.event_id, s.rank, pos=s.pos)


@dataclass(frozen=True, slots=True)
class Event:
    """One canonical event, typed. ``after``/``before`` hold only the columns present."""

    event_id: str
    op: str
    key: Key | None
    ts: int
    origin: str
    rank: int
    new_key: Key | None = None
    after: Mapping[str, Any] = field(default_factory=dict)
    before: Mapping[str, Any] = field(default_factory=dict)
    extra_cols: tuple[str, ...] = ()
    txid: str | None = None
    rejected: bool = False  # its transaction was rejected (delete_wins, scope: transaction)
    seqs: Mapping[str, int] = field(default_factory=dict)
    pos: int = NO_POS  # its place in its origin transaction (docs/adapters.md)

    def position(self) -> Position:
        """The canonical order (docs/rules.md#the-canonical-order): ``(ts, tie_rank(origin),
        event_id)``, the changes of one transaction (equal ``ts`` and origin) in the order
        of their places in it."""
        return (self.ts, self.rank, self.pos, self.event_id)


@dataclass(frozen=True, slots=True)
class Conflict:
    """One conflict-log row (docs/outputs.md)."""

    key: Key
    type: ConflictType
    resolver: Resolver
    outcome: Outcome
    event: Event
    local: tuple[Version, ...]  # the local version(s) in conflict; several for unique conflicts
    reason: str


@dataclass(frozen=True, slots=True)
class Change:
    """What an event did to one key as a reader sees it (docs/cdc.md#entries): ``cols`` are
    the value columns it wrote or cleared, with their new values in ``values``; ``pre``
    and ``post`` the key's live row before and after, if any."""

    key: Key
    kind: ChangeKind
    cols: tuple[str, ...]
    values: Mapping[str, Any]
    pre: Mapping[str, Any] | None
    post: Mapping[str, Any] | None


@dataclass(frozen=True, slots=True)
class Applied:
    """What one event did: whether the remote change took effect, its conflicts, and (when
    the fold traces) its changes to the rows a reader sees."""

    event: Event
    applied: bool
    conflicts: tuple[Conflict, ...]
    errored: bool = False
    changes: tuple[Change, ...] = ()
    quarantined: str | None = None  # why the fold quarantined it (:class:`DeltaOverflow`)
    #: the quarantine reason when ``quarantined``: a delta overflow or a custom resolver's
    #: error (docs/rules.md#custom-resolvers)
    quarantine: QuarantineReason = QuarantineReason.DELTA_OVERFLOW
    #: the columns it took effect on when not all it wrote (an UPDATE that won some
    #: column groups and lost others, column groups); None: every column it wrote
    written: frozenset[str] | None = None


class DeltaOverflow(Exception):
    """An event's delta would take a delta column past its type's range
    (docs/rules.md#delta-columns): the event is quarantined whole (``delta_overflow``),
    before it changed anything."""

    def __init__(self, column: str, ctype: ColumnType, value: Any):
        super().__init__(f"the delta of column {column!r} would make it {value}, past {ctype}")


class RunStopped(Exception):
    """An ``error`` resolver fired in the converged fold (docs/rules.md#resolvers,
    docs/rules.md#fine-points)."""

    def __init__(self, conflict: Conflict, log: tuple[Conflict, ...]):
        self.conflict = conflict
        self.log = log
        super().__init__(conflict.reason)


@dataclass(frozen=True, slots=True)
class FoldSpec:
    """Everything the rules need besides the events: the table, the clock, the ranks."""

    table: Table
    now_us: int
    #: docs/rules.md#manual-decisions: the operator's decisions of the run's date, applied
    #: by the converged fold in place of the resolver
    decisions: Decisions = field(default_factory=Decisions)


def _num(v: Any) -> Any:
    return 0 if v is None else v


def order_value(x: Event | Version, column: str) -> Any:
    """docs/rules.md#order-by-a-column: the ``order_by`` value of an event (its ``after``; a
    DELETE's ``before``) or of a version (its row's; a tombstone keeps its DELETE's)."""
    if isinstance(x, Event):
        return (x.before if x.op == "DELETE" else x.after).get(column)
    return x.values.get(column)


def _when(x: Event | Version, table: Table) -> tuple[Any, ...]:
    """What "later" compares before the tie-break (docs/rules.md#the-canonical-order):
    ``ts``, or with ``order_by`` (docs/rules.md#order-by-a-column) ``(order value, ts)``. A
    version without an order value (a base row with a null) comes before every value."""
    if table.order_by is None:
        return (x.ts,)
    o = order_value(x, table.order_by)
    return ((o is not None, o), x.ts)


def _wins_latest(e: Event, loc: Version, table: Table) -> bool:
    return (_when(e, table), e.position()[1:]) > (_when(loc, table), loc.position()[1:])


def _wins_earliest(e: Event, loc: Version, table: Table) -> bool:
    # docs/rules.md#resolvers: earlier ts wins; on equal ts the tie-break winner (higher
    # rank) still wins.
    we, wl = _when(e, table), _when(loc, table)
    if we != wl:
        return we < wl
    return e.position()[1:] > loc.position()[1:]


Decision = tuple[Outcome, str]  # the outcome and the reason the conflict log shows


@dataclass(frozen=True, slots=True)
class Ruling:
    """A resolver's decision on a conflict against a local version: the outcome, the
    resolver, the reason, and the row a custom resolver answered (its value columns; None:
    the winner's row as it is)."""

    outcome: Outcome
    resolver: Resolver
    why: str
    row: Mapping[str, Any] | None = None
    #: a custom resolver failed in a perspective: the local row stays as it is (no merge,
    #: no delta: docs/rules.md#custom-resolvers)
    failed: bool = False


def _latest(e: Event, loc: Version, win: Outcome, op: str, table: Table) -> Decision:
    if _wins_latest(e, loc, table):
        return win, reason(_W.REMOTE_LATER)
    return _O.DISCARDED, reason(_W.LOCAL_LATER)


def _earliest(e: Event, loc: Version, win: Outcome, op: str, table: Table) -> Decision:
    if _wins_earliest(e, loc, table):
        return win, reason(_W.REMOTE_EARLIER)
    return _O.DISCARDED, reason(_W.LOCAL_EARLIER)


def _origin_rank(table: Table, origin: str | None) -> int:
    """docs/rules.md#priority: the higher, the more trusted; a base row (no origin) ranks below
    every replica, as it does in the tie-break (docs/rules.md#the-canonical-order)."""
    order = table.priority
    return len(order) - order.index(origin) if origin in order else 0


def _priority(e: Event, loc: Version, win: Outcome, op: str, table: Table) -> Decision:
    """docs/rules.md#priority: the version whose origin comes first in ``priority`` wins; the
    same origin on both sides falls back to ``latest_timestamp_wins``."""
    if e.origin == loc.origin:
        out, why = _latest(e, loc, win, op, table)
        return out, reason(_W.SAME_ORIGIN, origin=e.origin, why=why)
    local = loc.origin or "(base row)"
    if _origin_rank(table, e.origin) > _origin_rank(table, loc.origin):
        return win, reason(_W.REMOTE_RANKS_ABOVE, remote=e.origin, local=local)
    return _O.DISCARDED, reason(_W.LOCAL_RANKS_ABOVE, remote=e.origin, local=local)


def standing(e: Event, loc: Version | None, table: Table) -> Standing:
    """Where the local version stands against the event: a row of docs/rules.md#policies's
    delete-wins table (with ``order_by``, "newer" compares the order value first)."""
    if loc is None:
        return Standing.ABSENT
    we, wl = _when(e, table), _when(loc, table)
    if we == wl:
        return Standing.OLDER if e.position() > loc.position() else Standing.TIE_WON
    return Standing.OLDER if we > wl else Standing.NEWER


def _ruling(e: Event, loc: Version | None, op: str, table: Table, live: bool) -> tuple[bool, str]:
    """docs/rules.md#policies's table for ``e`` against ``loc``: whether it applies, and why
    (naming the ``order_by`` column when "newer" compared it first, order_by)."""
    applies, why = delete_wins(standing(e, loc, table), op, live)
    if table.order_by is not None and loc is not None:
        why = reason(_W.COMPARED_BY, why=why, order_by=table.order_by)
    return applies, why


def _delete_wins(e: Event, loc: Version, win: Outcome, op: str, table: Table) -> Decision:
    """docs/rules.md#policies's table (:data:`pipeline.core.policy.DELETE_WINS_TABLE`)
    against a live row or a tombstone."""
    applies, why = _ruling(e, loc, op, table, live=not loc.deleted)
    return (win if applies else _O.DISCARDED), why


#: docs/rules.md#resolvers and docs/rules.md#priority: how each resolver decides a conflict
#: against a local version (insert_exists, update_differ, delete_differ, pkey_exists, and
#: update_deleted's weighing resolvers), given the event's operation as the local key meets
#: it and the table; the types without a local version to weigh (update_missing,
#: delete_missing, the column and unique conflicts) decide in their step
DECIDE: dict[Resolver, Callable[[Event, Version, Outcome, str, Table], Decision]] = {
    _R.LATEST_TIMESTAMP_WINS: _latest,
    _R.EARLIEST_TIMESTAMP_WINS: _earliest,
    _R.PRIORITY_WINS: _priority,
    _R.APPLY: lambda e, loc, win, op, table: (win, reason(_W.APPLY)),
    _R.SKIP: lambda e, loc, win, op, table: (_O.SKIPPED, reason(_W.SKIP)),
    _R.ERROR: lambda e, loc, win, op, table: (_O.ERRORED, reason(_W.ERROR)),
    _R.DELETE_WINS: _delete_wins,
}


#: the resolvers decided outside :data:`DECIDE`: the user's function
#: (docs/rules.md#custom-resolvers), which needs the fold's rows (``RowFold._custom``)
BY_FUNCTION = frozenset({_R.PYTHON})

#: one state transition of a key: (key, version before, version after)
Transition = tuple[Key, Version | None, Version | None]


class RowFold:
    def __init__(
        self,
        spec: FoldSpec,
        state: dict[Key, Version],
        *,
        converged: bool = True,
        trace: bool = False,
    ) -> None:
        self.spec = spec
        self.table = spec.table
        self.state = state
        self.converged = converged
        #: every state transition since it was last emptied, when tracing (for the CDC log)
        self.trace: list[Transition] | None = [] if trace else None
        self._key_cols = self.table.key
        self._all_cols = self.table.column_names
        self._delta_types = {c: self.table.column(c).type for c in self.table.delta}
        self._merges = self.table.merge
        self._indexes: list[dict[tuple[Any, ...], set[Key]]] = [{} for _ in self.table.unique]
        #: every (key, constraint, values) a live row held in this fold, when asked for
        #: (``pipeline.resolve.unique``: the values no export states)
        self.held: set[tuple[Key, int, tuple[Any, ...]]] | None = None
        for k, v in state.items():
            self._index(k, v)
        #: the versions the event being applied replaced, to undo it when it is quarantined
        self._journal: list[tuple[Key, Version | None]] = []

    # ------------------------------------------------------------------ state & indexes

    def _index(self, key: Key, v: Version | None, remove: bool = False) -> None:
        if v is None or v.deleted:
            return
        for i, cols in enumerate(self.table.unique):
            vals = tuple(v.values.get(c) for c in cols)
            if any(x is None for x in vals):
                continue  # nulls never collide
            bucket = self._indexes[i].setdefault(vals, set())
            if remove:
                bucket.discard(key)
            else:
                bucket.add(key)
                if self.held is not None:
                    self.held.add((key, i, vals))

    def _set(self, key: Key, v: Version | None) -> None:
        self._journal.append((key, self.state.get(key)))
        if self.trace is not None:
            self.trace.append((key, self.state.get(key), v))
        self._put(key, v)

    def _put(self, key: Key, v: Version | None) -> None:
        """The key's version, and the unique indexes with it."""
        self._index(key, self.state.get(key), remove=True)
        if v is None:
            self.state.pop(key, None)
        else:
            self.state[key] = v
            self._index(key, v)

    def key_dict(self, key: Key) -> dict[str, Any]:
        return dict(zip(self._key_cols, key, strict=True))

    def _tombstone(
        self,
        key: Key,
        e: Event,
        ts: int | None = None,
        origin: str | None = None,
        rank: int | None = None,
        event_id: str | None = None,
        order_from: Version | None = None,
    ) -> Version:
        """A tombstone of ``key`` made by ``e``. With ``order_by`` it keeps an order value
        (docs/rules.md#order-by-a-column): a DELETE's, else ``order_from``'s or the deleted
        row's."""
        values = self.key_dict(key)
        col = self.table.order_by
        if col is not None:
            src = e if e.op == "DELETE" and order_from is None else order_from
            src = src if src is not None else self.state.get(key)
            values[col] = None if src is None else order_value(src, col)
        return Version(
            values,
            e.ts if ts is None else ts,
            e.origin if origin is None else origin,
            e.event_id if event_id is None else event_id,
            e.rank if rank is None else rank,
            deleted=True,
            deleted_at=self.spec.now_us,
            pos=e.pos if event_id is None else NO_POS,
        )

    # ------------------------------------------------------------------ helpers

    def _resolver(self, t: ConflictType) -> Resolver:
        return self.table.resolvers[t]

    def _delete_wins(self, t: ConflictType) -> bool:
        return self.table.resolvers[t] is _R.DELETE_WINS

    def _differs(
        self, e: Event, loc: Version, use_before: bool, cols: Sequence[str] | None = None
    ) -> bool:
        """docs/rules.md#conflict-types update_differ / delete_differ: another origin wrote
        the row, or it is newer (with ``order_by``, by its order value first:
        docs/rules.md#order-by-a-column). Base rows (no origin) raise no origin conflict
        (docs/rules.md#fine-points)."""
        if _when(loc, self.table) > _when(e, self.table):
            return True
        if use_before and self.table.detection is Detection.BEFORE_IMAGE:
            image = {
                c: v
                for c, v in e.before.items()
                if c not in self.table.delta and (cols is None or c in cols)
            }
            # docs/rules.md#fine-points: compare only the columns present; no conflict when
            # equal
            if image:
                return any(loc.values.get(c) != v for c, v in image.items())
        return loc.origin is not None and loc.origin != e.origin

    def _full_row(self, e: Event, key: Key) -> dict[str, Any] | None:
        """docs/rules.md#fine-points: key (or new_key) with before and after covers
        every column."""
        row: dict[str, Any] = dict(e.before)
        row.update(e.after)
        row.update(self.key_dict(key))
        if not all(c in row for c in self._all_cols):
            return None
        return {c: row[c] for c in self._all_cols}

    def _merge(self, local: Mapping[str, Any], e: Event, key: Key) -> dict[str, Any]:
        """The local row with the event's columns written; delta columns accumulate
        (docs/rules.md#delta-columns)."""
        row = dict(local)
        for c, v in e.after.items():
            if c in self.table.delta:
                row[c] = self._plus_delta(row.get(c), e, c)
            else:
                row[c] = v
        row.update(self.key_dict(key))
        return row

    def _plus_delta(self, local: Any, e: Event, c: str) -> Any:
        """The local value (null counts as 0) plus the event's ``new - old`` of delta column
        ``c``; :class:`DeltaOverflow` past the column's range."""
        value = _num(local) + (e.after[c] - e.before[c])
        ctype = self._delta_types[c]
        if not ctype.fits(value):
            raise DeltaOverflow(c, ctype, value)
        return value

    def _add_delta(self, key: Key, e: Event) -> None:
        """docs/rules.md#delta-columns: an UPDATE whose row lost (discarded or skipped)
        still adds its delta to the live local row."""
        if e.op != "UPDATE":
            return
        changed = [c for c in e.after if c in self.table.delta]
        loc = self.state.get(key)
        if not changed or loc is None or loc.deleted:
            return
        values = dict(loc.values)
        for c in changed:
            values[c] = self._plus_delta(values.get(c), e, c)
        self._set(key, replace(loc, values=values))  # its stamps (and groups) stay

    def _merge_won(
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

    def _merge_lost(
        self, key: Key, remote: Mapping[str, Any], cols: Iterable[str] | None = None
    ) -> list[str]:
        """docs/rules.md#merge-functions: the live local row kept against a remote version
        that lost (the columns an INSERT or UPDATE wrote, or the row a key change moved)
        takes the merge of each ``merge`` column (of ``cols``, when given); its stamps
        stay, as a lost UPDATE's delta leaves them."""
        loc = self.state.get(key)
        if not self._merges or loc is None or loc.deleted:
            return []
        values = dict(loc.values)
        took = self._merge_won(values, remote, cols)
        if took:
            self._set(key, replace(loc, values=values))
        return took

    def _note_merge(self, log: list[Conflict], i: int, side: str, took: list[str]) -> None:
        """Name in conflict ``log[i]``'s reason the ``merge`` columns that took the ``side``
        (``local`` or ``remote``) version's value."""
        if took:
            c = log[i]
            log[i] = replace(c, reason=reason(_W.MERGED, why=c.reason, side=side, columns=took))

    def _live(
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

    # ------------------------------------------------------------------ resolution

    def _decide(
        self, t: ConflictType, e: Event, loc: Version, win: Outcome, remote: Mapping[str, Any]
    ) -> Ruling:
        """The type's resolver (:data:`DECIDE`, or the user's function) on a conflict against
        a local version; ``win`` is the outcome when the remote event wins, ``remote`` the
        remote version's row. A manual decision of this conflict (docs/rules.md#manual-decisions)
        comes first, in the converged fold only: the replicas applied their resolver."""
        if self.converged and self.spec.decisions:
            key = tuple(loc.values[c] for c in self._key_cols)
            d = self.spec.decisions.ruling(self.table, key, t, e, loc)
            if d is not None:
                why = reason(_W.MANUAL, decision=d.decision_id, take=d.take.value, note=d.why)
                out = _O.DISCARDED if d.take is Take.LOCAL else win
                return Ruling(out, _R.MANUAL, why, d.row if d.take is Take.ROW else None)
        r = self._resolver(t)
        if r in BY_FUNCTION:
            return self._custom(t, e, loc, win, remote)
        decide = DECIDE.get(r)
        if decide is None:
            raise AssertionError(f"resolver {r} is not valid for {t}")  # config forbids it
        op = "INSERT" if t is _C.PKEY_EXISTS else e.op  # a key change meets its new key
        out, why = decide(e, loc, win, op, self.table)
        return Ruling(out, r, why)

    def _custom(
        self, t: ConflictType, e: Event, loc: Version, win: Outcome, remote_row: Mapping[str, Any]
    ) -> Ruling:
        """docs/rules.md#custom-resolvers: the user's function on the two rows. An error
        quarantines the event in the converged fold (:class:`ResolverError` goes up to
        :meth:`apply`); a perspective keeps the local version. The converged fold also asks
        with the sides swapped, and says so in the reason when that gives another row."""
        path = self.table.custom[t]
        name = f"python:{path}"
        local = custom.version(loc.values, loc.ts, loc.origin, loc.event_id)
        remote = custom.version(remote_row, e.ts, e.origin, e.event_id)
        key = {c: loc.values.get(c) for c in self._key_cols}
        context = {"table": self.table.name, "conflict_type": t.value, "key": key}
        try:
            side, row = custom.answer(self.table, path, local, remote, context)
        except ResolverError as err:
            if self.converged:
                raise
            why = reason(_W.CUSTOM, function=name, answer=err)
            return Ruling(_O.DISCARDED, _R.PYTHON, why, failed=True)
        why = reason(_W.CUSTOM, function=name, answer=side)
        if self.converged:
            swapped = self._swapped(
                path, local, remote, context, self._resolved(side, row, local, remote)
            )
            if swapped is not None:
                why = reason(_W.ASYMMETRIC, why=why, swapped=swapped)
        return Ruling(_O.DISCARDED if side == "local" else win, _R.PYTHON, why, row)

    def _resolved(
        self, side: str, row: Mapping[str, Any] | None, local: dict, remote: dict
    ) -> dict[str, Any]:
        """The value columns an answer resolves to, but the delta and merge columns (they
        follow their own rules): the chosen side's row, or the remote row with the answered
        columns written."""
        base = local["row"] if side == "local" else remote["row"]
        values = {**base, **(row or {})}
        own = self.table.delta | self._merges.keys() | set(self._key_cols)
        return {c: v for c, v in values.items() if c not in own}

    def _swapped(
        self, path: str, local: dict, remote: dict, context: dict, resolved: Mapping[str, Any]
    ) -> str | None:
        """What the function answers with the sides swapped, when that resolves to another
        row than ``resolved`` (None: the same row)."""
        try:
            side, row = custom.answer(self.table, path, remote, local, context)
        except ResolverError:
            return "an error"
        if self._resolved(side, row, remote, local) == resolved:
            return None
        return side

    def _given(self, values: dict[str, Any], ruling: Ruling) -> dict[str, Any]:
        """The row a custom resolver answered, over the winner's ``values``: its value
        columns but the delta and merge ones (they follow their own rules)."""
        for c, v in (ruling.row or {}).items():
            if c not in self.table.delta and c not in self._merges:
                values[c] = v
        return values

    # ------------------------------------------------------------------ the step

    def apply(self, e: Event) -> Applied:
        """Apply one event; returns its conflicts. In the converged fold an ``errored``
        conflict raises :class:`RunStopped` (after logging); in a perspective the event is
        simply not applied. An event whose delta would overflow changes nothing and is
        quarantined, without its conflicts."""
        self._journal.clear()
        traced = len(self.trace) if self.trace is not None else 0
        try:
            return self._apply(e)
        except DeltaOverflow as overflow:
            self._undo(traced)
            return Applied(e, False, (), quarantined=str(overflow))
        except ResolverError as err:  # docs/rules.md#custom-resolvers, the converged fold
            self._undo(traced)
            return Applied(
                e, False, (), quarantined=str(err), quarantine=QuarantineReason.RESOLVER_ERROR
            )

    def _undo(self, traced: int) -> None:
        """Take back what the event being applied changed (a merge column it raised before
        its delta overflowed): a quarantined event changes nothing."""
        for key, old in reversed(self._journal):
            self._put(key, old)
        self._journal.clear()
        if self.trace is not None:
            del self.trace[traced:]

    def _apply(self, e: Event) -> Applied:
        if e.op == "TRUNCATE":
            self._truncate(e)
            return Applied(e, True, ())
        assert e.key is not None
        log: list[Conflict] = []
        if e.rejected:
            return self._rejected(e, log)
        if e.extra_cols:
            t = _C.SOURCE_COLUMN_EXTRA
            r = self._resolver(t)
            extra = list(e.extra_cols)
            if r is TAKES[t]:
                why = reason(_W.EXTRA_DROPPED, columns=extra)
                log.append(self._conflict(e.key, t, r, _O.APPLIED, e, (), why))
            else:
                why = reason(_W.EXTRA_REFUSED, columns=extra)
                log.append(self._conflict(e.key, t, r, REFUSED[r], e, (), why))
                return self._done(e, False, log)
        if e.op == "INSERT":
            return self._insert(e, log)
        if e.op == "UPDATE":
            return self._update(e, log)
        return self._delete(e, log)

    def _conflict(
        self,
        key: Key,
        t: ConflictType,
        r: Resolver,
        o: Outcome,
        e: Event,
        local: tuple[Version, ...],
        reason: str,
    ) -> Conflict:
        return Conflict(key, t, r, o, e, local, reason)

    def _done(self, e: Event, applied: bool, log: list[Conflict]) -> Applied:
        errored = any(c.outcome is _O.ERRORED for c in log)
        if errored and self.converged:
            raise RunStopped(next(c for c in log if c.outcome is _O.ERRORED), tuple(log))
        if not applied and not errored and any(c.outcome in _KEEPS_DELTA for c in log):
            assert e.key is not None
            self._add_delta(e.key, e)
        return Applied(e, applied and not errored, tuple(log), errored)

    def _rejected(self, e: Event, log: list[Conflict]) -> Applied:
        """docs/rules.md#fine-points transaction scope: logged at its canonical
        position, whole, no delta."""
        assert e.key is not None
        loc = self.state.get(e.key)
        if e.op == "INSERT":
            t = _C.INSERT_EXISTS
        elif e.op == "UPDATE":
            t = (
                _C.UPDATE_MISSING
                if loc is None
                else (_C.UPDATE_DELETED if loc.deleted else _C.UPDATE_DIFFER)
            )
        else:
            t = _C.DELETE_MISSING if loc is None or loc.deleted else _C.DELETE_DIFFER
        local = () if loc is None else (loc,)
        log.append(
            self._conflict(e.key, t, self._resolver(t), _O.DISCARDED, e, local, reason(_W.REJECTED))
        )
        return Applied(e, False, tuple(log))

    def _truncate(self, e: Event) -> None:
        """docs/rules.md#fine-points: every live row with ts <= the TRUNCATE's
        becomes a tombstone; no conflict."""
        for k, v in list(self.state.items()):
            if not v.deleted and v.ts <= e.ts:
                self._set(k, self._tombstone(k, e))

    # -------------------------------------------------------------- INSERT

    def _insert(self, e: Event, log: list[Conflict]) -> Applied:
        assert e.key is not None
        key = e.key
        loc = self.state.get(key)
        as_update = False
        at = -1
        ts: int | None = None  # the written row's ts, when not the event's
        ruling = Ruling(_O.APPLIED, self._resolver(_C.INSERT_EXISTS), "")
        if loc is not None and (not loc.deleted or self._delete_wins(_C.INSERT_EXISTS)):
            # docs/rules.md#conflict-types insert_exists; docs/rules.md#fine-points:
            # under postgres an INSERT onto a tombstone is no conflict
            win = _O.APPLIED if loc.deleted else _O.CONVERTED_TO_UPDATE
            ruling = self._decide(_C.INSERT_EXISTS, e, loc, win, {**e.after, **self.key_dict(key)})
            out, r, why = ruling.outcome, ruling.resolver, ruling.why
            log.append(self._conflict(key, _C.INSERT_EXISTS, r, out, e, (loc,), why))
            at = len(log) - 1
            if ruling.failed:
                return Applied(e, False, tuple(log))
            if not out.remote_applied:
                if out is not _O.ERRORED:
                    self._note_merge(log, at, "remote", self._merge_lost(key, e.after))
                return self._done(e, False, log)
            as_update = not loc.deleted
        values = self._insert_values(e, key, loc if as_update else None, log)
        if values is None:
            return self._done(e, False, log)
        noted = []
        if as_update:
            assert loc is not None
            if ruling.row is not None:
                values = self._given(values, ruling)
                ts = max(e.ts, loc.ts)
            noted.append((at, "local", self._merge_won(values, loc.values)))
        return self._finish(e, key, values, log, None, ts=ts, noted=noted)

    def _insert_values(
        self, e: Event, key: Key, local: Version | None, log: list[Conflict]
    ) -> dict[str, Any] | None:
        """The INSERT's row; docs/rules.md#conflict-types target_column_extra when it lacks
        columns."""
        given = dict(e.after)
        given.update(self.key_dict(key))
        missing = [c for c in self._all_cols if c not in given]
        if not missing:
            return {c: given[c] for c in self._all_cols}
        t = _C.TARGET_COLUMN_EXTRA
        r = self._resolver(t)
        if r is not TAKES[t]:
            why = reason(_W.MISSING_REFUSED, columns=missing)
            log.append(self._conflict(key, t, r, REFUSED[r], e, (), why))
            return None
        if local is not None:  # applied as an UPDATE: missing columns keep their values
            why = reason(_W.MISSING_KEEP_LOCAL, columns=missing)
            log.append(self._conflict(key, t, r, _O.APPLIED, e, (local,), why))
            return {c: given.get(c, local.values.get(c)) for c in self._all_cols}
        defaults = self.table.defaults
        unfillable = [c for c in missing if c in self.table.not_null and defaults.get(c) is None]
        if unfillable:
            why = reason(_W.MISSING_NOT_NULL, columns=unfillable)
            log.append(self._conflict(key, t, r, _O.ERRORED, e, (), why))
            return None
        why = reason(_W.MISSING_DEFAULTS, columns=missing)
        log.append(self._conflict(key, t, r, _O.APPLIED, e, (), why))
        return {c: given[c] if c in given else defaults.get(c) for c in self._all_cols}

    # -------------------------------------------------------------- UPDATE

    def _update(self, e: Event, log: list[Conflict]) -> Applied:
        assert e.key is not None
        key = e.key
        target = e.new_key if e.new_key is not None and e.new_key != e.key else key
        loc = self.state.get(key)
        if loc is None or loc.deleted:
            return self._update_absent(e, key, target, loc, log)
        groups = [(g, c) for g, c in self.table.column_groups if any(x in e.after for x in c)]
        if groups and target == key:
            return self._update_groups(e, key, loc, groups, log)
        at = None
        ruling: Ruling | None = None
        if self._differs(e, loc, use_before=True):
            # the remote version's row only for a custom resolver: its delta could overflow,
            # which a built-in resolver's ``error`` must meet first
            custom_row = self._resolver(_C.UPDATE_DIFFER) in BY_FUNCTION
            remote = self._merge(loc.values, e, target) if custom_row else e.after
            ruling = self._decide(_C.UPDATE_DIFFER, e, loc, _O.APPLIED, remote)
            out, r = ruling.outcome, ruling.resolver
            why = reason(_W.AGAINST_LOCAL, why=ruling.why, origin=loc.origin, ts=loc.ts)
            log.append(self._conflict(key, _C.UPDATE_DIFFER, r, out, e, (loc,), why))
            at = len(log) - 1
            if ruling.failed:
                return Applied(e, False, tuple(log))
            if not out.remote_applied:
                if out is not _O.ERRORED:
                    self._note_merge(log, at, "remote", self._merge_lost(key, e.after))
                return self._done(e, False, log)
        values = self._merge(loc.values, e, target)
        ts = None
        if ruling is not None and ruling.row is not None:
            values = self._given(values, ruling)
            ts = max(e.ts, loc.ts)
        took = self._merge_won(values, loc.values) if at is not None else []
        return self._finish(
            e,
            target,
            values,
            log,
            key if target != key else None,
            ts=ts,
            noted=() if at is None else [(at, "local", took)],
        )

    def _update_groups(
        self,
        e: Event,
        key: Key,
        loc: Version,
        groups: list[tuple[str, tuple[str, ...]]],
        log: list[Conflict],
    ) -> Applied:
        """docs/rules.md#column-groups: an UPDATE meets ``update_differ`` per column group
        it writes, each against that group's last writer; it takes effect on the groups it
        wins (``applied`` if any), and its delta columns follow docs/rules.md#delta-columns
        whatever their group's outcome."""
        stamps = {g: loc.group(g).stamp() for g, _ in self.table.column_groups}
        won: set[str] = set()
        #: the group conflicts each side won: (the group's columns, its conflict-log row)
        merges: dict[bool, list[tuple[tuple[str, ...], int]]] = {True: [], False: []}
        for g, cols in groups:
            gv = loc.group(g)
            if self._differs(e, gv, use_before=True, cols=cols):
                # (a custom resolver is refused with column groups: config)
                ruling = self._decide(_C.UPDATE_DIFFER, e, gv, _O.APPLIED, e.after)
                out, r = ruling.outcome, ruling.resolver
                why = reason(_W.AGAINST_LOCAL, why=ruling.why, origin=gv.origin, ts=gv.ts)
                why = reason(_W.IN_GROUP, group=g, why=why)
                log.append(self._conflict(key, _C.UPDATE_DIFFER, r, out, e, (gv,), why))
                if out is _O.ERRORED:
                    return self._done(e, False, log)
                merges[out.remote_applied].append((cols, len(log) - 1))
                if not out.remote_applied:
                    continue
            won.update(cols)
            stamps[g] = Stamp(e.ts, e.rank, e.event_id, e.origin, e.pos)
        if not won:
            for cols, at in merges[False]:
                self._note_merge(log, at, "remote", self._merge_lost(key, e.after, cols))
            return self._done(e, False, log)
        values = dict(loc.values)
        for c, v in e.after.items():
            if c in self.table.delta:
                values[c] = self._plus_delta(values.get(c), e, c)
            elif c in won:
                values[c] = v
        values.update(self.key_dict(key))
        noted = [
            (at, "local", self._merge_won(values, loc.values, cols)) for cols, at in merges[True]
        ]
        noted += [
            (at, "remote", self._merge_won(values, e.after, cols)) for cols, at in merges[False]
        ]
        a = self._finish(e, key, values, log, None, stamps, noted=noted)
        return replace(a, written=frozenset(won | (self.table.delta & set(e.after))))

    def _update_absent(
        self, e: Event, key: Key, target: Key, loc: Version | None, log: list[Conflict]
    ) -> Applied:
        """An UPDATE of a row that is not there (``update_missing``) or deleted
        (``update_deleted``): its resolver decides."""
        t = _C.UPDATE_MISSING if loc is None else _C.UPDATE_DELETED
        r = self._resolver(t)
        full = self._full_row(e, target)
        local = () if loc is None else (loc,)

        def note(out: Outcome, why: str) -> None:
            log.append(self._conflict(key, t, r, out, e, local, why))

        if r is _R.DELETE_WINS:  # docs/rules.md#policies's table: an update never creates a row
            applies, why = _ruling(e, loc, "UPDATE", self.table, live=False)
            if not applies or full is None:
                note(_O.DISCARDED, why)
                return self._done(e, False, log)
            note(_O.CONVERTED_TO_INSERT, why)
        elif r in (_R.LATEST_TIMESTAMP_WINS, _R.PRIORITY_WINS):
            assert loc is not None  # only allowed for update_deleted
            out, why = DECIDE[r](e, loc, _O.CONVERTED_TO_INSERT, "UPDATE", self.table)
            if not out.remote_applied:
                note(out, reason(_W.DELETE_BEATS_UPDATE, why=why))
                return self._done(e, False, log)
            if full is None:
                note(_O.SKIPPED, reason(_W.UPDATE_WINS_NO_ROW, why=why))
                return self._done(e, False, log)
            note(out, reason(_W.UPDATE_BEATS_DELETE, why=why))
        elif r in (_R.APPLY_OR_SKIP, _R.APPLY_OR_ERROR):
            if full is None:
                note(REFUSED[r], reason(_W.NO_FULL_ROW))
                return self._done(e, False, log)
            note(_O.CONVERTED_TO_INSERT, reason(_W.FULL_ROW))
        else:
            note(REFUSED[r], reason(_W.REFUSED, resolver=r.value))
            return self._done(e, False, log)
        assert full is not None
        return self._finish(e, target, full, log, key if target != key else None)

    # -------------------------------------------------------------- DELETE

    def _delete(self, e: Event, log: list[Conflict]) -> Applied:
        assert e.key is not None
        key = e.key
        loc = self.state.get(key)
        if loc is None or loc.deleted:
            t = _C.DELETE_MISSING
            r = self._resolver(t)
            local = () if loc is None else (loc,)
            if r is _R.DELETE_WINS:  # docs/rules.md#policies's table; the newer tombstone is kept
                applies, why = _ruling(e, loc, "DELETE", self.table, live=False)
                out = _O.APPLIED if applies else _O.DISCARDED
                log.append(self._conflict(key, t, r, out, e, local, why))
                if applies and (loc is None or _wins_latest(e, loc, self.table)):
                    self._set(key, self._tombstone(key, e))
                return self._done(e, applies, log)
            log.append(self._conflict(key, t, r, REFUSED[r], e, local, reason(_W.NO_LIVE_ROW)))
            return self._done(e, False, log)
        if self._differs(e, loc, use_before=False):
            ruling = self._decide(_C.DELETE_DIFFER, e, loc, _O.APPLIED, {})
            out, r = ruling.outcome, ruling.resolver
            why = reason(_W.AGAINST_LOCAL, why=ruling.why, origin=loc.origin, ts=loc.ts)
            log.append(self._conflict(key, _C.DELETE_DIFFER, r, out, e, (loc,), why))
            if not out.remote_applied:
                return self._done(e, False, log)
            if r is _R.DELETE_WINS and _when(loc, self.table) > _when(e, self.table):
                # a delete is never undone: the tombstone keeps the newer ts (and order
                # value), so that the changes the live row had beaten still lose against it
                self._set(key, self._tombstone(key, e, ts=loc.ts, rank=e.rank, order_from=loc))
                return self._done(e, True, log)
        self._set(key, self._tombstone(key, e))
        return self._done(e, True, log)

    # -------------------------------------------------------------- key change, unique

    def _finish(
        self,
        e: Event,
        target: Key,
        values: dict[str, Any],
        log: list[Conflict],
        old_key: Key | None,
        stamps: Mapping[str, Stamp] | None = None,
        ts: int | None = None,
        noted: Sequence[tuple[int, str, list[str]]] = (),
    ) -> Applied:
        """Write the row at ``target`` after the pkey_exists (docs/rules.md#conflict-types)
        and multiple_unique_conflicts checks; a key change (``old_key``) leaves the old key
        absent (docs/rules.md#fine-points). ``stamps``: the row's column groups
        (column groups)."""
        old = self.state.get(old_key) if old_key is not None else None
        moved_from = old_key if old is not None and not old.deleted else None
        if old_key is not None:
            m = self.state.get(target)
            if m is not None and (not m.deleted or self._delete_wins(_C.PKEY_EXISTS)):
                ruling = self._decide(_C.PKEY_EXISTS, e, m, _O.APPLIED, values)
                out, r, why = ruling.outcome, ruling.resolver, ruling.why
                log.append(self._conflict(target, _C.PKEY_EXISTS, r, out, e, (m,), why))
                at = len(log) - 1
                if ruling.failed:
                    return Applied(e, False, tuple(log))
                if not out.remote_applied:  # a key change loses as a whole
                    if out is not _O.ERRORED:  # the target takes what the event wrote
                        self._note_merge(log, at, "remote", self._merge_lost(target, e.after))
                    return self._done(e, False, log)
                if ruling.row is not None:
                    values = self._given(dict(values), ruling)
                    ts = max(e.ts, m.ts, ts or e.ts)
                if not m.deleted:
                    self._note_merge(log, at, "local", self._merge_won(values, m.values))
        colliding = self._collisions(values, target, moved_from)
        if colliding:
            t = _C.MULTIPLE_UNIQUE_CONFLICTS
            r = self._resolver(t)
            rows = tuple(self.state[k] for k in colliding)
            why = reason(_W.UNIQUE_COLLISION, keys=[repr(k) for k in colliding])
            if r is TAKES[t]:
                log.append(self._conflict(target, t, r, _O.APPLIED, e, rows, why))
                # docs/rules.md#fine-points: they become tombstones with the event's ts
                for k in colliding:
                    self._set(k, self._tombstone(k, e))
            else:
                log.append(self._conflict(target, t, r, REFUSED[r], e, rows, why))
                return self._done(e, False, log)
        for note in noted:  # the merges of the conflicts before, now that the row is written
            self._note_merge(log, *note)
        if moved_from is not None:
            self._set(moved_from, None)
        self._set(target, self._live(values, e, stamps, ts))
        return self._done(e, True, log)

    def _collisions(
        self, values: Mapping[str, Any], target: Key, moved_from: Key | None
    ) -> list[Key]:
        found: list[Key] = []
        for i, cols in enumerate(self.table.unique):
            vals = tuple(values.get(c) for c in cols)
            if any(x is None for x in vals):
                continue
            for k in sorted(self._indexes[i].get(vals, ()), key=repr):
                if k not in (target, moved_from) and k not in found:
                    found.append(k)
        return found


# ---------------------------------------------------------------------- running folds


def canonical(events: Iterable[Event]) -> list[Event]:
    return sorted(events, key=Event.position)


def replica_order(events: Sequence[Event], replica: str) -> list[Event]:
    """docs/rules.md#convergence: the replica's export order (``seq``), then the events
    missing from its export in canonical order."""
    mine = sorted(
        (e for e in events if replica in e.seqs), key=lambda e: (e.seqs[replica], e.position())
    )
    rest = canonical(e for e in events if replica not in e.seqs)
    return mine + rest


@dataclass
class FoldResult:
    state: dict[Key, Version]
    applied: list[Applied]
    stopped: Conflict | None  # the errored conflict that stopped the fold, if any
    #: every (key, constraint, values) a live row held (``RowFold.held``), when asked for
    held: frozenset[tuple[Key, int, tuple[Any, ...]]] = frozenset()


def fold_converged(
    spec: FoldSpec,
    state: Mapping[Key, Version],
    events: Iterable[Event],
    trace: bool = False,
    held: bool = False,
) -> FoldResult:
    """docs/rules.md#the-canonical-order: apply the events in canonical order; stop at an
    ``error``. With ``trace``, each result carries its event's changes
    (:func:`visible_changes`); with ``held``, the result has every unique value a live
    row held (``FoldResult.held``)."""
    f = RowFold(spec, dict(state), converged=True, trace=trace)
    if held:
        f.held = set()
    results: list[Applied] = []

    def done(stopped: Conflict | None) -> FoldResult:
        return FoldResult(f.state, results, stopped, frozenset(f.held or ()))

    for e in canonical(events):
        try:
            a = f.apply(e)
        except RunStopped as stop:
            results.append(Applied(e, False, stop.log, errored=True))
            return done(stop.conflict)
        if f.trace is not None:
            changes = visible_changes(e, f.trace, spec.table, a.applied, a.written)
            a = replace(a, changes=changes)
            f.trace.clear()
        results.append(a)
    return done(None)


def visible_changes(
    e: Event,
    trace: Sequence[Transition],
    table: Table,
    applied: bool = True,
    written: frozenset[str] | None = None,
) -> tuple[Change, ...]:
    """An event's state transitions as changes of the rows a reader sees, key by key in the
    order they were made (docs/cdc.md#entries): a row that appears is an insert (every
    column), one that goes a row delete (a partition delete for a TRUNCATE), one that stays
    an update of the columns the event wrote or changed (only those it changed, when it was
    not applied: a discarded UPDATE that still added its delta, docs/rules.md#delta-columns;
    only the columns it took effect on, ``written``, when it won some column groups, column
    groups). An applied DELETE of a row already gone is still a row delete. This is what
    makes the log replay to the snapshot whatever rule decided: deltas, defaults, converted
    events, key changes and unique-constraint deletions all show up as their effect."""
    first: dict[Key, Version | None] = {}
    last: dict[Key, Version | None] = {}
    for key, before, after in trace:
        first.setdefault(key, before)
        last[key] = after
    values = table.value_columns
    out = []
    for key in first:
        pre, post = reader_view(first[key]), reader_view(last[key])
        if post is None:
            if pre is None and e.op != "DELETE":
                continue
            kind = ChangeKind.PARTITION_DELETE if e.op == "TRUNCATE" else ChangeKind.ROW_DELETE
            out.append(Change(key, kind, (), {}, pre, None))
            continue
        if pre is None or (e.op == "INSERT" and applied):
            kind, cols = ChangeKind.INSERT, values
        else:
            kind = ChangeKind.UPDATE
            took = (e.after if written is None else written) if applied else ()
            cols = tuple(c for c in values if c in took or post.get(c) != pre.get(c))
        out.append(Change(key, kind, cols, {c: post.get(c) for c in cols}, pre, post))
    return tuple(out)


def fold_perspective(
    spec: FoldSpec,
    state: Mapping[Key, Version],
    events: Sequence[Event],
    replica: str,
    ordered: bool = False,
) -> dict[Key, Version]:
    """docs/rules.md#convergence: the state the replica reaches applying the events in its own order
    (``ordered``: the events are already in that order)."""
    f = RowFold(spec, dict(state), converged=False)
    for e in events if ordered else replica_order(events, replica):
        f.apply(e)
    return f.state


def reader_view(v: Version | None) -> dict[str, Any] | None:
    """What a reader sees of a key (docs/rules.md#convergence): nothing, or the live row's
    values."""
    if v is None or v.deleted:
        return None
    return v.values


def divergent_keys(converged: Mapping[Key, Version], other: Mapping[Key, Version]) -> list[Key]:
    keys = set(converged) | set(other)
    return sorted(
        (k for k in keys if reader_view(converged.get(k)) != reader_view(other.get(k))),
        key=repr,
    )
