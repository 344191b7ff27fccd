"""The row-granularity fold: detection (docs/rules.md#conflict-types) and resolution
(docs/rules.md#resolvers, docs/rules.md#policies, docs/rules.md#delta-columns,
docs/rules.md#fine-points)
of a sequence of events against a state, one event at a time.

This module is pure Python with no Spark: the Spark engine (``pipeline.resolve.engine``) calls it
on groups of keys whose events need it (contended keys, keys coupled by key changes or
unique constraints), and the tests run it directly as the reference of the rules.

A :class:`RowFold` owns its state (a dict ``key -> Version``) and applies events with
:meth:`RowFold.apply`. The converged fold logs conflicts and stops at an ``error``; a
replica's perspective (docs/rules.md#convergence, ``pipeline.rules.perspectives``) logs
nothing and simply does not apply an event that would error. Its values are
``pipeline.rules.events``'s; how each resolver decides is the table of
``pipeline.rules.resolvers``, asked through ``pipeline.rules.resolution``; the rows it
writes are made by ``pipeline.rules.rows``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pipeline.core.config import Table
from pipeline.core.policy import (
    ChangeKind,
    ConflictType,
    Outcome,
    QuarantineReason,
    Resolver,
    Why,
    reason,
)
from pipeline.rules.custom import ResolverError
from pipeline.rules.detection import differs, rejected_type, when
from pipeline.rules.events import (
    Applied,
    Change,
    Conflict,
    Event,
    FoldSpec,
    Key,
    Stamp,
    Transition,
    Version,
    reader_view,
)
from pipeline.rules.foldstate import FoldState
from pipeline.rules.resolution import Resolution, Ruling
from pipeline.rules.resolvers import (
    RULES,
    Absent,
    delete_wins_ruling,
    refusal,
    wins_latest,
)
from pipeline.rules.rows import DeltaOverflow, Rows

_C = ConflictType
_O = Outcome
_W = Why

#: docs/rules.md#delta-columns: the local row wins, and the UPDATE's delta is still added to it
_KEEPS_DELTA = frozenset({_O.DISCARDED, _O.SKIPPED})


class RunStopped(Exception):
    """An ``error`` resolver fired in the converged fold (docs/rules.md#resolvers,
    docs/rules.md#fine-points)."""

    def __init__(self, conflict: Conflict, log: tuple[Conflict, ...]):
        self.conflict = conflict
        self.log = log
        super().__init__(conflict.reason)


class RowFold:
    """The fold of one group of keys (see the module): the converged fold, or a replica's
    perspective (``converged=False``)."""

    def __init__(
        self,
        spec: FoldSpec,
        state: dict[Key, Version],
        *,
        converged: bool = True,
        trace: bool = False,
        held: bool = False,
    ) -> None:
        self.spec = spec
        self.table = spec.table
        self.state = state
        self.converged = converged
        self.rows = Rows(self.table, spec.now_us)
        self.resolution = Resolution(spec, converged)
        self.keys = FoldState(state, self.rows, trace=trace, held=held)

    @property
    def trace(self) -> list[Transition] | None:
        """Every state transition since it was last emptied, when tracing (for the CDC
        log)."""
        return self.keys.trace

    @property
    def held(self) -> set[tuple[Key, int, tuple[Any, ...]]] | None:
        """Every (key, constraint, values) a live row held in this fold since it started,
        when asked for (``held``; ``pipeline.resolve.unique``: the values no export
        states)."""
        return self.keys.uniques.held

    # ------------------------------------------------------------------ helpers

    def _resolver(self, t: ConflictType) -> Resolver:
        return self.table.resolvers[t]

    def _note_merge(self, log: list[Conflict], i: int, side: str, took: list[str]) -> None:
        """Name in conflict ``log[i]``'s reason the ``merge`` columns that took the ``side``
        (``local`` or ``remote``) version's value."""
        if took:
            c = log[i]
            log[i] = replace(c, reason=reason(_W.MERGED, why=c.reason, side=side, columns=took))

    def _lost(self, e: Event, key: Key, ruling: Ruling, log: list[Conflict]) -> Applied | None:
        """After ``ruling`` on a conflict against the live row at ``key`` (the last of
        ``log``), what the event did if it lost as a whole: nothing, when a custom resolver
        failed in a perspective; else the local row stays, taking the merge of what the
        event wrote (unless it errored). None: the event won."""
        if ruling.failed:
            return Applied(e, False, tuple(log))
        if ruling.outcome.remote_applied:
            return None
        if ruling.outcome is not _O.ERRORED:
            self._note_merge(log, len(log) - 1, "remote", self.keys.merge_lost(key, e.after))
        return self._done(e, False, log)

    # ------------------------------------------------------------------ the step

    def apply(self, e: Event) -> Applied:
        """Apply one event; returns its conflicts. In the converged fold an ``errored``
        conflict raises :class:`RunStopped` (after logging); in a perspective the event is
        simply not applied. An event whose delta would overflow changes nothing and is
        quarantined, without its conflicts."""
        self.keys.begin()
        try:
            return self._apply(e)
        except DeltaOverflow as overflow:
            self.keys.undo()
            return Applied(e, False, (), quarantined=str(overflow))
        except ResolverError as err:  # docs/rules.md#custom-resolvers, the converged fold
            self.keys.undo()
            return Applied(
                e, False, (), quarantined=str(err), quarantine=QuarantineReason.RESOLVER_ERROR
            )

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
            if t in RULES[r].takes:
                why = reason(_W.EXTRA_DROPPED, columns=extra)
                log.append(Conflict(e.key, t, r, _O.APPLIED, e, (), why))
            else:
                why = reason(_W.EXTRA_REFUSED, columns=extra)
                log.append(Conflict(e.key, t, r, refusal(r), e, (), why))
                return self._done(e, False, log)
        if e.op == "INSERT":
            return self._insert(e, log)
        if e.op == "UPDATE":
            return self._update(e, log)
        return self._delete(e, log)

    def _done(self, e: Event, applied: bool, log: list[Conflict]) -> Applied:
        errored = any(c.outcome is _O.ERRORED for c in log)
        if errored and self.converged:
            raise RunStopped(next(c for c in log if c.outcome is _O.ERRORED), tuple(log))
        if not applied and not errored and any(c.outcome in _KEEPS_DELTA for c in log):
            assert e.key is not None
            self.keys.add_delta(e.key, e)
        return Applied(e, applied and not errored, tuple(log), errored)

    def _rejected(self, e: Event, log: list[Conflict]) -> Applied:
        """docs/rules.md#fine-points transaction scope: logged at its canonical
        position, whole, no delta."""
        assert e.key is not None
        loc = self.state.get(e.key)
        t = rejected_type(e, loc)
        local = () if loc is None else (loc,)
        log.append(
            Conflict(e.key, t, self._resolver(t), _O.DISCARDED, e, local, reason(_W.REJECTED))
        )
        return Applied(e, False, tuple(log))

    def _truncate(self, e: Event) -> None:
        """docs/rules.md#fine-points: every live row with ts <= the TRUNCATE's
        becomes a tombstone; no conflict."""
        for k, v in list(self.state.items()):
            if not v.deleted and v.ts <= e.ts:
                self.keys.tombstone(k, e)

    # -------------------------------------------------------------- INSERT

    def _insert(self, e: Event, log: list[Conflict]) -> Applied:
        assert e.key is not None
        key = e.key
        loc = self.state.get(key)
        as_update = False
        at = -1
        ts: int | None = None  # the written row's ts, when not the event's
        r = self._resolver(_C.INSERT_EXISTS)
        ruling = Ruling(_O.APPLIED, r, "")
        if loc is not None and (not loc.deleted or RULES[r].tombstone_is_row):
            # docs/rules.md#conflict-types insert_exists; docs/rules.md#fine-points:
            # under postgres an INSERT onto a tombstone is no conflict
            win = _O.APPLIED if loc.deleted else _O.CONVERTED_TO_UPDATE
            remote = {**e.after, **self.rows.key_dict(key)}
            ruling = self.resolution.decide(_C.INSERT_EXISTS, e, loc, win, remote)
            out, r, why = ruling.outcome, ruling.resolver, ruling.why
            log.append(Conflict(key, _C.INSERT_EXISTS, r, out, e, (loc,), why))
            at = len(log) - 1
            lost = self._lost(e, key, ruling, log)
            if lost is not None:
                return lost
            as_update = not loc.deleted
        values = self.rows.insert_row(e, key, loc if as_update else None, log)
        if values is None:
            return self._done(e, False, log)
        noted = []
        if as_update:
            assert loc is not None
            if ruling.row is not None:
                values = self.resolution.given(values, ruling)
                ts = max(e.ts, loc.ts)
            noted.append((at, "local", self.rows.merge_won(values, loc.values)))
        return self._finish(e, key, values, log, None, ts=ts, noted=noted)

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
        if differs(self.table, e, loc, use_before=True):
            # the remote version's row only for a custom resolver: its delta could overflow,
            # which a built-in resolver's ``error`` must meet first
            custom_row = RULES[self._resolver(_C.UPDATE_DIFFER)].by_function
            remote = self.rows.written(loc.values, e, target) if custom_row else e.after
            ruling = self.resolution.decide(_C.UPDATE_DIFFER, e, loc, _O.APPLIED, remote)
            out, r = ruling.outcome, ruling.resolver
            why = reason(_W.AGAINST_LOCAL, why=ruling.why, origin=loc.origin, ts=loc.ts)
            log.append(Conflict(key, _C.UPDATE_DIFFER, r, out, e, (loc,), why))
            at = len(log) - 1
            lost = self._lost(e, key, ruling, log)
            if lost is not None:
                return lost
        values = self.rows.written(loc.values, e, target)
        ts = None
        if ruling is not None and ruling.row is not None:
            values = self.resolution.given(values, ruling)
            ts = max(e.ts, loc.ts)
        took = self.rows.merge_won(values, loc.values) if at is not None else []
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
            if differs(self.table, e, gv, use_before=True, cols=cols):
                # (a custom resolver is refused with column groups: config)
                ruling = self.resolution.decide(_C.UPDATE_DIFFER, e, gv, _O.APPLIED, e.after)
                out, r = ruling.outcome, ruling.resolver
                why = reason(_W.AGAINST_LOCAL, why=ruling.why, origin=gv.origin, ts=gv.ts)
                why = reason(_W.IN_GROUP, group=g, why=why)
                log.append(Conflict(key, _C.UPDATE_DIFFER, r, out, e, (gv,), why))
                if out is _O.ERRORED:
                    return self._done(e, False, log)
                merges[out.remote_applied].append((cols, len(log) - 1))
                if not out.remote_applied:
                    continue
            won.update(cols)
            stamps[g] = Stamp(e.ts, e.rank, e.event_id, e.origin, e.pos)
        if not won:
            for cols, at in merges[False]:
                self._note_merge(log, at, "remote", self.keys.merge_lost(key, e.after, cols))
            return self._done(e, False, log)
        values = dict(loc.values)
        for c, v in e.after.items():
            if c in self.table.delta:
                values[c] = self.rows.plus_delta(values.get(c), e, c)
            elif c in won:
                values[c] = v
        values.update(self.rows.key_dict(key))
        noted = [
            (at, "local", self.rows.merge_won(values, loc.values, cols))
            for cols, at in merges[True]
        ]
        noted += [
            (at, "remote", self.rows.merge_won(values, e.after, cols)) for cols, at in merges[False]
        ]
        a = self._finish(e, key, values, log, None, stamps, noted=noted)
        return replace(a, written=frozenset(won | (self.table.delta & set(e.after))))

    def _update_absent(
        self, e: Event, key: Key, target: Key, loc: Version | None, log: list[Conflict]
    ) -> Applied:
        """An UPDATE of a row that is not there (``update_missing``) or deleted
        (``update_deleted``): its resolver decides (:attr:`Rule.absent`)."""
        t = _C.UPDATE_MISSING if loc is None else _C.UPDATE_DELETED
        r = self._resolver(t)
        rule = RULES[r]
        full = self.rows.full_row(e, target)
        local = () if loc is None else (loc,)

        def note(out: Outcome, why: str) -> None:
            log.append(Conflict(key, t, r, out, e, local, why))

        if rule.absent is Absent.DELETE_WINS:  # an update never creates a row
            applies, why = delete_wins_ruling(e, loc, "UPDATE", self.table, live=False)
            if not applies or full is None:
                note(_O.DISCARDED, why)
                return self._done(e, False, log)
            note(_O.CONVERTED_TO_INSERT, why)
        elif rule.absent is Absent.WEIGH:
            assert loc is not None and rule.weigh is not None  # only allowed for update_deleted
            out, why = rule.weigh(e, loc, _O.CONVERTED_TO_INSERT, "UPDATE", self.table)
            if not out.remote_applied:
                note(out, reason(_W.DELETE_BEATS_UPDATE, why=why))
                return self._done(e, False, log)
            if full is None:
                note(_O.SKIPPED, reason(_W.UPDATE_WINS_NO_ROW, why=why))
                return self._done(e, False, log)
            note(out, reason(_W.UPDATE_BEATS_DELETE, why=why))
        elif rule.absent is Absent.FULL_ROW:
            if full is None:
                note(refusal(r), reason(_W.NO_FULL_ROW))
                return self._done(e, False, log)
            note(_O.CONVERTED_TO_INSERT, reason(_W.FULL_ROW))
        else:
            note(refusal(r), reason(_W.REFUSED, resolver=r.value))
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
            if RULES[r].absent is Absent.DELETE_WINS:  # the newer tombstone is kept
                applies, why = delete_wins_ruling(e, loc, "DELETE", self.table, live=False)
                out = _O.APPLIED if applies else _O.DISCARDED
                log.append(Conflict(key, t, r, out, e, local, why))
                if applies and (loc is None or wins_latest(e, loc, self.table)):
                    self.keys.tombstone(key, e)
                return self._done(e, applies, log)
            log.append(Conflict(key, t, r, refusal(r), e, local, reason(_W.NO_LIVE_ROW)))
            return self._done(e, False, log)
        if differs(self.table, e, loc, use_before=False):
            ruling = self.resolution.decide(_C.DELETE_DIFFER, e, loc, _O.APPLIED, {})
            out, r = ruling.outcome, ruling.resolver
            why = reason(_W.AGAINST_LOCAL, why=ruling.why, origin=loc.origin, ts=loc.ts)
            log.append(Conflict(key, _C.DELETE_DIFFER, r, out, e, (loc,), why))
            if not out.remote_applied:
                return self._done(e, False, log)
            if RULES[r].keeps_newer_tombstone and when(loc, self.table) > when(e, self.table):
                # a delete is never undone: the tombstone keeps the newer ts (and order
                # value), so that the changes the live row had beaten still lose against it
                stone = self.rows.tombstone(key, e, loc, ts=loc.ts, rank=e.rank, order_from=loc)
                self.keys.set(key, stone)
                return self._done(e, True, log)
        self.keys.tombstone(key, e)
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
            tombstone_is_row = RULES[self._resolver(_C.PKEY_EXISTS)].tombstone_is_row
            if m is not None and (not m.deleted or tombstone_is_row):
                ruling = self.resolution.decide(_C.PKEY_EXISTS, e, m, _O.APPLIED, values)
                out, r, why = ruling.outcome, ruling.resolver, ruling.why
                log.append(Conflict(target, _C.PKEY_EXISTS, r, out, e, (m,), why))
                at = len(log) - 1
                lost = self._lost(e, target, ruling, log)  # a key change loses as a whole
                if lost is not None:
                    return lost
                if ruling.row is not None:
                    values = self.resolution.given(dict(values), ruling)
                    ts = max(e.ts, m.ts, ts or e.ts)
                if not m.deleted:
                    self._note_merge(log, at, "local", self.rows.merge_won(values, m.values))
        colliding = self.keys.uniques.collisions(values, target, moved_from)
        if colliding:
            t = _C.MULTIPLE_UNIQUE_CONFLICTS
            r = self._resolver(t)
            rows = tuple(self.state[k] for k in colliding)
            why = reason(_W.UNIQUE_COLLISION, keys=[repr(k) for k in colliding])
            if t in RULES[r].takes:
                log.append(Conflict(target, t, r, _O.APPLIED, e, rows, why))
                # docs/rules.md#fine-points: they become tombstones with the event's ts
                for k in colliding:
                    self.keys.tombstone(k, e)
            else:
                log.append(Conflict(target, t, r, refusal(r), e, rows, why))
                return self._done(e, False, log)
        for note in noted:  # the merges of the conflicts before, now that the row is written
            self._note_merge(log, *note)
        if moved_from is not None:
            self.keys.set(moved_from, None)
        self.keys.set(target, self.rows.live(values, e, stamps, ts))
        return self._done(e, True, log)


# ---------------------------------------------------------------------- running folds


def canonical(events: Iterable[Event]) -> list[Event]:
    return sorted(events, key=Event.position)


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
    f = RowFold(spec, dict(state), converged=True, trace=trace, held=held)
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
