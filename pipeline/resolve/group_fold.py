"""The Python fold of one key group of the row engine: the group's state rows and every
copy of its events in, the rows of the table's outputs out (:class:`GroupFolder`, run by
each fold task of ``pipeline.resolve.fold_task``).

A *group* is a key, or the keys coupled by a key change or a unique value:

- of an event's copies, the first stands for it; an event whose standing copy a guard
  quarantines is quarantined whole; a copy of an event an earlier night resolved
  (``seen``, from the ledger) and a replica's second copy of one event are duplicates;
- the other events are folded in canonical order (the converged state, its conflict log,
  every copy's fate; with the CDC log, every change a reader sees) and once per distinct
  replica order (its perspective, docs/rules.md#convergence), reporting the keys where it
  differs with a repair mutation (:func:`repair_record`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import date
from typing import Any

from pipeline.core.columns import (
    AFTER,
    BEFORE,
    CAUSE,
    CONFLICT_ID,
    DIGEST,
    EVENT_ID,
    EVIDENCE,
    EXPIRY,
    FATE,
    KEY,
    OP,
    ORIGIN,
    POS,
    RANK,
    REPLICA,
    RUN_ID,
    SEQ,
    TS,
    TTL,
    TXID,
)
from pipeline.core.config import Table
from pipeline.core.jsonvalues import dumps
from pipeline.core.policy import ConflictType, Fate, Outcome, QuarantineReason, Resolver
from pipeline.ingest.copies import copy_record
from pipeline.resolve.skew import seen_later
from pipeline.rules.causes import divergent_perspectives
from pipeline.rules.decisions import conflict_id, key_text, local_ref, local_text, remote_text
from pipeline.rules.events import (
    NO_POS,
    Applied,
    Change,
    Conflict,
    Event,
    FoldSpec,
    Key,
    Version,
    read_groups,
    reader_view,
    write_groups,
)
from pipeline.rules.guards import READ
from pipeline.rules.lost import Label, Witness, copy_positions, judge
from pipeline.rules.rowfold import fold_converged
from pipeline.spark.frames import SKEW_FIELDS, UNFORESEEN, VALUE
from pipeline.spark.schema import GROUPS
from pipeline.storage.workpath import WorkPath

_UPDATE_MISSING = QuarantineReason.UPDATE_MISSING.value


@dataclass(frozen=True)
class FoldJob:
    """What every task of one table's fold needs (it goes to the tasks)."""

    spec: FoldSpec
    replicas: tuple[str, ...]  # config order: the perspectives'
    truncates: tuple[Event, ...]  # the run's TRUNCATEs: they touch every key
    dt: date
    run_id: str
    out: WorkPath  # the table's folder in the run's work location
    trace: bool = False  # record the changes (the CDC log's input)
    #: docs/operations.md#a-quarantine-that-heals: quarantine an UPDATE skipped for want of
    #: its row too
    retry_update_missing: bool = False
    schemas: Mapping[str, Any] = field(default_factory=dict)  # output -> Spark StructType
    witness: Witness = field(default_factory=Witness)  # docs/rules.md#lost-writes

    @property
    def table(self) -> Table:
        return self.spec.table


def event_from_row(
    r: dict[str, Any], key_cols: tuple[str, ...], columns: tuple[str, ...], seqs: dict[str, int]
) -> Event:
    after, before = r[AFTER] or {}, r[BEFORE] or {}
    nk = r["new_key"]
    return Event(
        event_id=r[EVENT_ID],
        op=r[OP],
        key=tuple(r[KEY][c] for c in key_cols) if r[KEY] is not None else None,
        ts=r[TS],
        origin=r[ORIGIN],
        rank=r[RANK],
        new_key=tuple(nk[c] for c in key_cols) if nk is not None else None,
        after={
            c: after[c] for c, given in zip(columns, r["after_has"] or (), strict=False) if given
        },
        before={
            c: before[c] for c, given in zip(columns, r["before_has"] or (), strict=False) if given
        },
        extra_cols=tuple(r["extra_cols"] or ()),
        txid=r[TXID],
        rejected=bool(r["rejected"]),
        seqs=seqs,
        pos=NO_POS if r[POS] is None else r[POS],
    )


def version_from_row(
    r: dict[str, Any], key_cols: tuple[str, ...], order_by: str | None = None
) -> tuple[Key, Version]:
    """A state row as a version: a tombstone keeps its key and its order value (order_by)."""
    row = r["row"]
    key = tuple(row[c] for c in key_cols)
    deleted = bool(r["s_deleted"])
    kept = (*key_cols, order_by) if order_by is not None else key_cols
    values = {c: row[c] for c in kept} if deleted else dict(row)
    groups = r.get("s_groups")
    return key, Version(
        values,
        r["s_ts"],
        r["s_origin"],
        r[EVENT_ID],
        r["s_rank"],
        deleted,
        r["s_deleted_at"],
        groups=read_groups(groups) if groups else None,
    )


Out = tuple[str, dict[str, Any]]  # an output's name and one of its rows


def unforeseen(
    table: Table,
    state: Mapping[Key, Version],
    events: Iterable[Event],
    held: Iterable[tuple[Key, int, tuple[Any, ...]]],
) -> list[tuple[Key, dict[str, Any]]]:
    """The unique values a live row of the group held that no source of
    ``unique.possible_values`` states (a custom resolver's row, a decision's, a delta
    column's sum): (key, the constraint's columns and values), each once. A value is
    stated when each of its columns' values is: a live prior row's, an event's ``after``
    or ``before``, or the column's default."""
    stated: dict[str, set[Any]] = {c: set() for cols in table.unique for c in cols}
    for v in state.values():
        if not v.deleted:
            for c, got in stated.items():
                got.add(v.values.get(c))
    for e in events:
        for c, got in stated.items():
            got.update(x[c] for x in (e.after, e.before) if c in x)
            if c in table.defaults:
                got.add(table.defaults[c])
    out: dict[tuple[Key, int, tuple[Any, ...]], None] = {}
    for key, i, vals in held:
        cols = table.unique[i]
        if any(x not in stated[c] for c, x in zip(cols, vals, strict=True)):
            out[(key, i, vals)] = None
    return [
        (key, dict(zip(table.unique[i], vals, strict=True)))
        for key, i, vals in sorted(out, key=repr)
    ]


class GroupFolder:
    """Folds one group at a time and renders its output rows."""

    def __init__(self, job: FoldJob):
        self.job = job
        self.spec = job.spec
        self.table = job.table
        self.key_cols = self.table.key
        self.columns = self.table.column_names
        self.run = {RUN_ID: job.run_id, "table": self.table.name}

    def key_json(self, key: Key) -> str:
        return key_text(self.key_cols, key)

    def key_dict(self, key: Key) -> dict[str, Any]:
        return dict(zip(self.key_cols, key, strict=True))

    def fold(self, rows: list[dict[str, Any]]) -> Iterator[Out]:
        """Fold one group: its state rows and every copy of its events."""
        state: dict[Key, Version] = {}
        copies: dict[str, list[dict[str, Any]]] = {}
        for r in rows:
            if r["is_event"]:
                copies.setdefault(r[EVENT_ID], []).append(r)
            else:
                k, v = version_from_row(r, self.key_cols, self.job.table.order_by)
                state[k] = v
        yield from self._skew(copies)
        events: list[Event] = []
        for eid, group in copies.items():
            chosen = group[0]  # the stream's order: the copy that stands for the event
            if chosen[OP] == READ and chosen["reason"] is None:  # a snapshot read: no write
                yield from self._fates(eid, [(c, Fate.READ) for c in group], chosen=False)
                continue
            if chosen["seen"]:
                yield from self._fates(eid, [(c, Fate.DUPLICATE) for c in group], chosen=False)
                continue
            if chosen["reason"] is not None:
                yield from self._quarantined(eid, group)
                continue
            seqs = {c[REPLICA]: c[SEQ] for c in group}
            events.append(event_from_row(chosen, self.key_cols, self.columns, seqs))
        events += self.job.truncates
        unique = bool(self.table.unique)
        result = fold_converged(self.spec, state, events, trace=self.job.trace, held=unique)
        for k, v in result.state.items():
            yield "state_pre", self._state_row(k, v)
        if unique:
            for key, values in unforeseen(self.table, state, events, result.held):
                yield UNFORESEEN, {KEY: self.key_dict(key), VALUE: values}
        yield from self._conflicts(result.applied, copies, events)
        for a in result.applied:
            for i, ch in enumerate(a.changes):
                yield "changes", self._change_row(a.event, ch, i)
        outcome = {a.event.event_id: a for a in result.applied}
        yield from self._event_fates(events, copies, outcome)
        if result.stopped is not None:
            return  # docs/rules.md#fine-points: after an error, divergence is not checked
        quarantined = {a.event.event_id for a in result.applied if a.quarantined is not None}
        kept = [e for e in events if e.event_id not in quarantined]
        decided = {
            c.key for a in result.applied for c in a.conflicts if c.resolver is Resolver.MANUAL
        }
        yield from self._divergence(state, kept, result.state, decided)

    def _skew(self, copies: Mapping[str, list[dict[str, Any]]]) -> Iterator[Out]:
        """clock skew: the clock-skew evidence of the group, when an event of it may have seen
        another's version (an UPDATE or DELETE with a before-image, beside another event)."""
        if len(copies) < 2 or not any(
            g[0][OP] in ("UPDATE", "DELETE") and g[0]["before_has"] is not None
            for g in copies.values()
        ):
            return
        views = ((c[REPLICA], c[SEQ], g[0]) for g in copies.values() for c in g)
        for evidence in seen_later(views, self.columns):
            yield "skew", dict(zip(SKEW_FIELDS, evidence, strict=True))

    def _event_fates(
        self,
        events: list[Event],
        copies: Mapping[str, list[dict[str, Any]]],
        outcome: Mapping[str, Applied],
    ) -> Iterator[Out]:
        """The fate of every copy of the folded events (the fold may quarantine one)."""
        for e in events:
            if e.op == "TRUNCATE":
                continue  # its fates are the driver's (``shuffle.special_copies``)
            got = outcome.get(e.event_id)
            if got is not None and got.quarantined is not None:
                yield from self._quarantined(e.event_id, copies[e.event_id], got)
                continue
            if got is not None and self._waits_for_its_row(got):
                why = (_UPDATE_MISSING, "the row it updates is absent: offered to the next runs")
                yield from self._quarantined(e.event_id, copies[e.event_id], got, why)
                continue
            if got is None:
                fate = Fate.NOT_REACHED
            else:
                fate = (
                    Fate.APPLIED if got.applied else Fate.ERRORED if got.errored else Fate.DISCARDED
                )
            yield from self._fates(e.event_id, [(c, fate) for c in copies[e.event_id]])

    def _fates(
        self, eid: str, fates: list[tuple[dict[str, Any], Fate]], chosen: bool = True
    ) -> Iterator[Out]:
        """One fate per copy; a replica's second copy of the event is a duplicate. The
        standing copy is marked ``chosen``: an event chosen under two keys is a dispute."""
        seen: set[str] = set()
        for i, (c, fate) in enumerate(fates):
            again = c[REPLICA] in seen
            seen.add(c[REPLICA])
            yield (
                "fates",
                {
                    EVENT_ID: eid,
                    REPLICA: c[REPLICA],
                    FATE: (Fate.DUPLICATE if again else fate).value,
                    "chosen": chosen and i == 0,
                    DIGEST: c[DIGEST],
                    "differs": c["differs"],
                },
            )

    def _waits_for_its_row(self, got: Applied) -> bool:
        """docs/operations.md#a-quarantine-that-heals: with ``retry.update_missing``, an
        UPDATE that ``skip`` or
        ``apply_or_skip`` dropped because its row is absent is quarantined too, to be
        offered again (its conflict row stays; it took part in the perspectives)."""
        return (
            self.job.retry_update_missing
            and not got.applied
            and not got.errored
            and any(
                c.type is ConflictType.UPDATE_MISSING and c.outcome is Outcome.SKIPPED
                for c in got.conflicts
            )
        )

    def _quarantined(
        self,
        eid: str,
        group: list[dict[str, Any]],
        fold: Applied | None = None,
        why: tuple[str, str] | None = None,
    ) -> Iterator[Out]:
        """The event quarantined whole: by its standing copy's guard (its record as
        exported), or by the fold (``fold``: a delta overflow, or ``why``'s reason and
        detail; the event as it was read, with the file and line of its standing copy)."""
        c = group[0]
        reason, detail, event = c["reason"], c["detail"], c["raw"]
        if fold is not None:
            reason, detail = why or (
                fold.quarantine.value,
                f"{c['file']} line {c['line']}: {fold.quarantined}",
            )
            event = dumps(copy_record(c, self.columns))
        yield (
            "quarantine",
            {
                **self.run,
                REPLICA: c[REPLICA],
                EVENT_ID: eid,
                "reason": reason,
                "detail": detail,
                "event": event,
            },
        )
        yield from self._fates(eid, [(x, Fate.QUARANTINED) for x in group])

    def _divergence(
        self,
        state: dict[Key, Version],
        events: list[Event],
        converged: dict[Key, Version],
        decided: set[Key],
    ) -> Iterator[Out]:
        """docs/rules.md#convergence: the keys where a replica's perspective differs, with
        their causes (``causes.divergent_perspectives``)."""
        for rep, k, mine, cause, evidence in divergent_perspectives(
            self.spec, self.job.replicas, state, events, converged, decided
        ):
            row = self._divergence_row(rep, k, mine.get(k), converged.get(k))
            yield "divergence", {**row, CAUSE: cause, EVIDENCE: evidence}

    def _state_row(self, k: Key, v: Version) -> dict[str, Any]:
        row = {c: v.values.get(c) for c in self.columns}
        row.update(
            _ts=v.ts,
            _origin=v.origin,
            _event_id=v.event_id,
            _deleted=v.deleted,
            _deleted_at=v.deleted_at,
        )
        if self.table.column_groups:
            row[GROUPS] = write_groups(v.groups) if v.groups else None
        return row

    def _change_row(self, e: Event, ch: Change, idx: int) -> dict[str, Any]:
        key = dict(zip(self.key_cols, ch.key, strict=True))

        def row(values: Mapping[str, Any] | None) -> dict[str, Any] | None:
            return None if values is None else {**values, **key}

        return {
            EVENT_ID: e.event_id,
            TS: e.ts,
            RANK: e.rank,
            POS: e.pos,
            "idx": idx,
            "kind": ch.kind.value,
            KEY: key,
            "values": row(ch.values) if ch.kind.value in ("insert", "update") else None,
            "cols": list(ch.cols),
            TTL: None,
            EXPIRY: None,
            "pre": row(ch.pre),
            "post": row(ch.post),
        }

    def _conflicts(
        self,
        applied: Iterable[Applied],
        copies: Mapping[str, list[dict[str, Any]]],
        events: Iterable[Event],
    ) -> Iterator[Out]:
        """The conflict-log rows, each labelled (docs/rules.md#lost-writes) from every copy's
        place in tonight's exports; and one ``labels`` row per conflict, whose ``lost``
        marks the first conflict to lose each event's write (counted once)."""
        applied = list(applied)
        if not any(a.conflicts for a in applied):
            return
        where = copy_positions(
            [(c[EVENT_ID], c[REPLICA], c[SEQ]) for g in copies.values() for c in g]
        )
        tonight = frozenset(e.event_id for e in events)
        lost: set[str] = set()
        for a in applied:
            for i, c in enumerate(a.conflicts):
                label = judge(c, where, tonight, self.job.witness)
                first = label.lost is not None and label.lost not in lost
                if first:
                    lost.add(label.lost)  # type: ignore[arg-type]
                yield "conflicts", self._conflict_row(c, i, label)
                yield (
                    "labels",
                    {"concurrency": label.concurrency.value, "lost": "1" if first else None},
                )

    def _conflict_row(self, c: Conflict, idx: int, label: Label) -> dict[str, Any]:
        first = c.local[0] if c.local else None
        local: Any = None
        if len(c.local) == 1:
            local = local_text(c.local[0])
        elif c.local:
            local = "[" + ",".join(local_text(v) for v in c.local) + "]"
        e = c.event
        key = self.key_json(c.key)
        return {
            **self.run,
            KEY: key,
            "conflict_type": c.type.value,
            "resolver": (
                self.job.table.resolver_name(c.type)  # python:<module:function>
                if c.resolver is Resolver.PYTHON
                else c.resolver.value
            ),
            "outcome": c.outcome.value,
            "local_ts": first.ts if first else None,
            "local_origin": first.origin if first else None,
            "local_event_id": first.event_id if first else None,
            "local_row": local,
            "remote_event_id": e.event_id,
            "remote_ts": e.ts,
            "remote_origin": e.origin,
            "remote_row": remote_text(e, self.key_cols),
            "reason": c.reason,
            "concurrency": label.concurrency.value,
            "concurrency_why": label.why,
            "lost_event_id": label.lost,
            CONFLICT_ID: conflict_id(
                self.job.dt, self.table.name, key, c.type.value, e.event_id, local_ref(c.local)
            ),
            "pos_rank": e.rank,
            "pos_tx": e.pos,
            "pos_idx": idx,
        }

    def _divergence_row(
        self, replica: str, k: Key, mine: Version | None, conv: Version | None
    ) -> dict[str, Any]:
        rv, cv = reader_view(mine), reader_view(conv)
        return {
            **self.run,
            "source": "perspective",
            REPLICA: replica,
            KEY: self.key_json(k),
            "replica_row": dumps(rv) if rv is not None else None,
            "converged_row": dumps(cv) if cv is not None else None,
            "repair": dumps(
                repair_record(self.table, replica, k, rv, conv, self.job.dt, self.spec.now_us)
            ),
        }


def repair_record(
    table: Table,
    replica: str,
    k: Key,
    rv: dict[str, Any] | None,
    conv: Version | None,
    dt: date,
    now_us: int,
) -> dict[str, Any]:
    """A canonical event record that brings ``replica``'s row (``rv``, what a reader sees
    there) to the converged version ``conv``; its event id is stable for a date."""
    key = dict(zip(table.key, k, strict=True))
    cv = reader_view(conv)
    digest = hashlib.sha256(f"{replica}|{dumps(key)}".encode()).hexdigest()[:16]
    rec: dict[str, Any] = {KEY: key}
    if cv is not None and rv is None:
        rec |= {OP: "INSERT", AFTER: dict(cv)}
    elif cv is not None and rv is not None:
        changed = [c for c in table.column_names if cv.get(c) != rv.get(c)]
        rec |= {
            OP: "UPDATE",
            AFTER: {c: cv[c] for c in changed},
            BEFORE: {c: rv.get(c) for c in changed},
        }
    else:
        rec |= {OP: "DELETE"}
    col = table.order_by
    if col is not None:  # order_by: the record carries its order value (absent: the replica's)
        image = BEFORE if rec[OP] == "DELETE" else AFTER
        source = conv.values if conv is not None else (rv or {})
        rec[image] = {**rec.get(image, {}), col: source.get(col)}
    rec |= {
        TS: conv.ts if conv is not None else now_us,
        ORIGIN: conv.origin if conv is not None and conv.origin else replica,
        EVENT_ID: f"repair-{dt.isoformat()}-{replica}-{digest}",
        SEQ: 0,
    }
    return rec
