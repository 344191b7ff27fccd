"""The Python side of the Spark fold: Arrow batches of a key-sorted stream in, the fold's
results out (used with ``DataFrame.mapInArrow`` by ``pipeline.engine``).

The input holds, per group of keys, the prior state rows first and then the events, in
canonical order. Each group is folded once in canonical order (the converged state, with
its conflict log) and once per replica in that replica's order (its perspective, §9); the
keys where a perspective differs are reported with a repair mutation.

Output rows have a ``kind``: ``state`` (the group's final state), ``conflict``,
``outcome`` (one per event: applied or not), ``divergence``, and, when the CDC log is
on, ``change`` (what an event did to a row a reader sees, ``rowfold.visible_changes``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Mapping
from datetime import date
from typing import Any

import pyarrow as pa

from pipeline.config import Table
from pipeline.jsonvalues import dumps
from pipeline.rowfold import (
    Change,
    Conflict,
    Event,
    FoldSpec,
    Key,
    Version,
    canonical,
    divergent_keys,
    fold_converged,
    fold_perspective,
    reader_view,
    replica_order,
)

_BATCH = 4096


def event_from_row(
    r: dict[str, Any], key_cols: tuple[str, ...], columns: tuple[str, ...], seqs: dict[str, int]
) -> Event:
    after, before = r["after"] or {}, r["before"] or {}
    nk = r["new_key"]
    return Event(
        event_id=r["event_id"],
        op=r["op"],
        key=tuple(r["key"][c] for c in key_cols) if r["key"] is not None else None,
        ts=r["ts"],
        origin=r["origin"],
        rank=r["rank"],
        new_key=tuple(nk[c] for c in key_cols) if nk is not None else None,
        after={
            c: after[c] for c, given in zip(columns, r["after_has"] or (), strict=False) if given
        },
        before={
            c: before[c] for c, given in zip(columns, r["before_has"] or (), strict=False) if given
        },
        extra_cols=tuple(r["extra_cols"] or ()),
        txid=r["txid"],
        rejected=bool(r["rejected"]),
        seqs=seqs,
    )


def version_from_row(r: dict[str, Any], key_cols: tuple[str, ...]) -> tuple[Key, Version]:
    row = r["row"]
    key = tuple(row[c] for c in key_cols)
    deleted = bool(r["s_deleted"])
    values = {c: row[c] for c in key_cols} if deleted else dict(row)
    return key, Version(
        values, r["s_ts"], r["s_origin"], r["event_id"], r["s_rank"], deleted, r["s_deleted_at"]
    )


class GroupFolder:
    """Folds one group at a time and renders the output rows."""

    def __init__(
        self,
        spec: FoldSpec,
        replicas: tuple[str, ...],
        truncates: list[Event],
        dt: date,
        trace: bool = False,
    ):
        self.spec = spec
        self.trace = trace
        self.table = spec.table
        self.key_cols = spec.table.key
        self.columns = spec.table.column_names
        self.replicas = replicas
        self.truncates = truncates
        self.dt = dt

    def key_json(self, key: Key) -> str:
        return dumps(dict(zip(self.key_cols, key, strict=True)))

    def fold(self, rows: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """Fold one group: its state rows, and every copy of its events (the copy with
        ``rn = 1`` stands for the event; all copies give their replica's ``seq``)."""
        state: dict[Key, Version] = {}
        copies: dict[str, list[dict[str, Any]]] = {}
        for r in rows:
            if r["is_event"]:
                copies.setdefault(r["event_id"], []).append(r)
            else:
                k, v = version_from_row(r, self.key_cols)
                state[k] = v
        events: list[Event] = []
        for group in copies.values():
            chosen = min(group, key=lambda r: r["rn"])
            events.append(
                event_from_row(
                    chosen, self.key_cols, self.columns, {r["replica"]: r["seq"] for r in group}
                )
            )
        events += self.truncates
        result = fold_converged(self.spec, state, events, trace=self.trace)
        for k, v in result.state.items():
            yield self._state_row(k, v)
        applied = {a.event.event_id: a for a in result.applied}
        for a in result.applied:
            for i, c in enumerate(a.conflicts):
                yield self._conflict_row(c, i)
            for i, ch in enumerate(a.changes):
                yield self._change_row(a.event, ch, i)
        for eid, group in copies.items():
            got = applied.get(eid)
            fate = (
                "applied"
                if got and got.applied
                else ("errored" if got and got.errored else "discarded" if got else "not_reached")
            )
            for r in group:
                yield {"kind": "outcome", "event_id": eid, "replica": r["replica"], "fate": fate}
        if result.stopped is not None:
            return  # §12: after an error, divergence is not checked
        # a replica that applied the events in the canonical order (or in the same order as
        # another replica) reaches the same state: fold each distinct order once
        seen: dict[tuple[str, ...], dict[Key, Version]] = {
            tuple(e.event_id for e in canonical(events)): result.state
        }
        for rep in self.replicas:
            order = replica_order(events, rep)
            ids = tuple(e.event_id for e in order)
            if ids not in seen:
                seen[ids] = fold_perspective(self.spec, state, order, rep, ordered=True)
            mine = seen[ids]
            for k in divergent_keys(result.state, mine):
                yield self._divergence_row(rep, k, mine.get(k), result.state.get(k))

    def _state_row(self, k: Key, v: Version) -> dict[str, Any]:
        row = {c: v.values.get(c) for c in self.columns}
        return {
            "kind": "state",
            "row": row,
            "_ts": v.ts,
            "_origin": v.origin,
            "_event_id": v.event_id,
            "_deleted": v.deleted,
            "_deleted_at": v.deleted_at,
        }

    def _change_row(self, e: Event, ch: Change, idx: int) -> dict[str, Any]:
        key = dict(zip(self.key_cols, ch.key, strict=True))

        def row(values: Mapping[str, Any] | None) -> dict[str, Any] | None:
            return None if values is None else {**values, **key}

        return {
            "kind": "change",
            "remote_event_id": e.event_id,
            "remote_ts": e.ts,
            "pos_rank": e.rank,
            "pos_idx": idx,
            "change": ch.kind.value,
            "row": row(ch.values),
            "cols": list(ch.cols),
            "pre": row(ch.pre),
            "post": row(ch.post),
        }

    def _remote_row(self, e: Event) -> dict[str, Any]:
        out: dict[str, Any] = {"op": e.op}
        if e.key is not None:
            out["key"] = dict(zip(self.key_cols, e.key, strict=True))
        if e.new_key is not None:
            out["new_key"] = dict(zip(self.key_cols, e.new_key, strict=True))
        if e.after:
            out["after"] = dict(e.after)
        if e.before:
            out["before"] = dict(e.before)
        return out

    def _local_row(self, v: Version) -> dict[str, Any]:
        return {**v.values, "_deleted": True} if v.deleted else dict(v.values)

    def _conflict_row(self, c: Conflict, idx: int) -> dict[str, Any]:
        first = c.local[0] if c.local else None
        local: Any = None
        if len(c.local) == 1:
            local = dumps(self._local_row(c.local[0]))
        elif c.local:
            local = dumps([self._local_row(v) for v in c.local])
        e = c.event
        return {
            "kind": "conflict",
            "key": self.key_json(c.key),
            "conflict_type": c.type.value,
            "resolver": c.resolver.value,
            "outcome": c.outcome.value,
            "local_ts": first.ts if first else None,
            "local_origin": first.origin if first else None,
            "local_row": local,
            "remote_event_id": e.event_id,
            "remote_ts": e.ts,
            "remote_origin": e.origin,
            "remote_row": dumps(self._remote_row(e)),
            "reason": c.reason,
            "pos_rank": e.rank,
            "pos_idx": idx,
        }

    def _divergence_row(
        self, replica: str, k: Key, mine: Version | None, conv: Version | None
    ) -> dict[str, Any]:
        rv, cv = reader_view(mine), reader_view(conv)
        return {
            "kind": "divergence",
            "replica": replica,
            "key": self.key_json(k),
            "replica_row": dumps(rv) if rv is not None else None,
            "converged_row": dumps(cv) if cv is not None else None,
            "repair": dumps(self.repair(replica, k, rv, conv)),
        }

    def repair(
        self, replica: str, k: Key, rv: dict[str, Any] | None, conv: Version | None
    ) -> dict[str, Any]:
        return repair_record(self.spec.table, replica, k, rv, conv, self.dt, self.spec.now_us)


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
    rec: dict[str, Any] = {"key": key}
    if cv is not None and rv is None:
        rec |= {"op": "INSERT", "after": dict(cv)}
    elif cv is not None and rv is not None:
        changed = [c for c in table.column_names if cv.get(c) != rv.get(c)]
        rec |= {
            "op": "UPDATE",
            "after": {c: cv[c] for c in changed},
            "before": {c: rv.get(c) for c in changed},
        }
    else:
        rec |= {"op": "DELETE"}
    rec |= {
        "ts": conv.ts if conv is not None else now_us,
        "origin": conv.origin if conv is not None and conv.origin else replica,
        "event_id": f"repair-{dt.isoformat()}-{replica}-{digest}",
        "seq": 0,
    }
    return rec


def make_fold_function(
    folder: GroupFolder, single_group: bool, arrow_schema: pa.Schema
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The function for ``mapInArrow``: rows arrive sorted by group; a group may span
    batches. ``single_group`` folds the whole partition as one group (coupled keys)."""
    key_cols = folder.key_cols

    def group_of(r: dict[str, Any]) -> Any:
        return None if single_group else tuple(r["key"][c] for c in key_cols)

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        out: list[dict[str, Any]] = []
        pending: list[dict[str, Any]] = []
        current: Any = object()
        for batch in batches:
            for r in batch.to_pylist():
                g = group_of(r)
                if pending and g != current:
                    out.extend(folder.fold(pending))
                    pending = []
                current = g
                pending.append(r)
                if len(out) >= _BATCH:
                    yield pa.RecordBatch.from_pylist(out, schema=arrow_schema)
                    out = []
        if pending:
            out.extend(folder.fold(pending))
        if out:
            yield pa.RecordBatch.from_pylist(out, schema=arrow_schema)

    return run
