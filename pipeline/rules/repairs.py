"""docs/operations.md#repair: the row writes that bring one replica's rows to the converged
state, in an order its database's constraints accept.

Each divergent key of the replica is one :class:`RowRepair`: the row the report saw there
(``seen``; None: it lacked the row) and the converged row (``want``; None: the key is
deleted). A repair is *conditioned*: an update or a delete changes the row only while it
still equals ``seen``, an insert only while the key is absent; a row that changed since
the report is skipped and kept as it is.

:func:`plan` orders the writes as :class:`Step` s:

- a foreign key: a parent's insert before the writes of its children that reference it;
  a child's delete, or its update away from the parent, before the parent's delete;
- a unique constraint: the write that gives up a value (a delete, an update) before the
  write that takes it;
- when the unique values form a cycle (two rows that swap them), one of the rows first
  *parks* its value (:func:`park_value`: null where the column allows it, else a value no
  real row holds) and takes its converged value once the others took theirs.

Ties go by table (in config order), then by key: the same divergence gives the same plan.
Pure Python: ``pipeline.app.repair`` reads the divergence and renders the steps in a
database's dialect (``pipeline.app.statements``)."""

from __future__ import annotations

import hashlib
import heapq
import json
import math
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from pipeline.core.config import Config, Table
from pipeline.core.errors import RepairError
from pipeline.core.kinds import Kind, integer_bound
from pipeline.rules.jsontext import JsonNumber
from pipeline.rules.readers import read_values


class Write(StrEnum):
    """What one step does to its row."""

    INSERT = "insert"  # the key was absent: write the converged row unless the key exists
    UPDATE = "update"  # the changed columns, while the row equals what the step expects
    DELETE = "delete"  # while the row equals what the report saw
    PARK = "park"  # a unique value set aside (``park_value``) for another row to take


@dataclass(frozen=True)
class RowRepair:
    """One divergent key of the replica: what the report saw there and the converged row
    (typed values of the table's columns), the converged ``_ts`` (of the tombstone, for a
    key deleted; the time of the run when the run knows none) and the key's cause."""

    table: str
    key: tuple[Any, ...]
    seen: Mapping[str, Any] | None
    want: Mapping[str, Any] | None
    ts: int
    cause: str | None = None
    number: int = 0  # its place in the repair (1, 2, ...): how the skipped rows are named
    label: str = ""  # its key as the logs write it (``key``), how people read it

    @property
    def write(self) -> Write:
        if self.seen is None:
            return Write.INSERT
        return Write.DELETE if self.want is None else Write.UPDATE

    def changed(self) -> tuple[str, ...]:
        """The columns the update writes: those whose converged value differs."""
        seen, want = self.seen or {}, self.want or {}
        return tuple(c for c in want if not same(want[c], seen.get(c)))


@dataclass(frozen=True)
class Step:
    """One write of one row: ``values`` it writes (a whole row for an insert, the changed
    columns for an update, the parked columns for a park), and what the row must hold for
    it to apply (``expect``: every column; None for an insert, which needs the key
    absent)."""

    write: Write
    row: RowRepair
    values: Mapping[str, Any]
    expect: Mapping[str, Any] | None


def same(a: Any, b: Any) -> bool:
    """Equal values of one column, a NaN equal to a NaN (as Spark and the databases
    compare them)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return bool(a == b)


# --------------------------------------------------------------- reading the report


def typed_row(table: Table, text: str | None) -> dict[str, Any] | None:
    """A divergence row's JSON (``replica_row``, ``converged_row``, ``key``) as the table's
    typed values, a uuid as a ``UUID``; a value that does not read as its column's type is
    a :class:`RepairError`."""
    if text is None:
        return None
    given = json.loads(text, parse_int=JsonNumber, parse_float=JsonNumber, parse_constant=str)
    read, problems = read_values(table, given)
    if problems:
        raise RepairError(f"table {table.name}: " + "; ".join(problems))
    out = {c: read.get(c) for c in table.column_names if c in given}
    for c, v in out.items():
        if v is not None and table.column(c).type.kind is Kind.UUID:
            out[c] = uuid.UUID(v)
    return out


def row_repair(
    table: Table, divergence: Mapping[str, Any], number: int, lacked: Iterable[str] = ()
) -> RowRepair:
    """A published divergence row (``replica_row``, ``converged_row``, ``repair``: its
    canonical event, whose ``ts`` is the converged row's or its tombstone's) as a
    :class:`RowRepair`, without the ``lacked`` columns (the replica's table has none of
    them: no statement names them)."""

    def without(row: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if row is None else {c: v for c, v in row.items() if c not in lacked}

    seen = without(typed_row(table, divergence["replica_row"]))
    want = without(typed_row(table, divergence["converged_row"]))
    event = json.loads(divergence["repair"]) if divergence.get("repair") else {}
    key_row = typed_row(table, divergence["key"]) or {}
    key = tuple(key_row[c] for c in table.key)
    ts, cause = int(event.get("ts") or 0), divergence.get("cause")
    return RowRepair(table.name, key, seen, want, ts, cause, number, divergence["key"])


# ----------------------------------------------------------------------- the plan


@dataclass
class _Node:
    row: RowRepair
    park: bool = False  # this node parks ``row``'s unique values (``parked``)
    parked: Mapping[str, Any] | None = None  # the values the row's park set aside
    before: set[int] = field(default_factory=set)  # the nodes that wait for this one
    waits: int = 0  # how many nodes this one waits for


def plan(config: Config, rows: Sequence[RowRepair]) -> list[Step]:
    """The steps that repair ``rows`` (one replica's, numbered), ordered for the tables'
    foreign keys and unique constraints (module docstring)."""
    nodes = [_Node(r) for r in rows]
    for a, b in set(_edges(config, rows)):
        nodes[a].before.add(b)
        nodes[b].waits += 1
    ready = [(_rank(n), i) for i, n in enumerate(nodes) if not n.waits]
    heapq.heapify(ready)
    done: list[int] = []
    while len(done) < len(nodes):
        if not ready:
            heapq.heappush(ready, _park_one(config, nodes, set(done)))
            continue
        _, i = heapq.heappop(ready)
        done.append(i)
        for j in sorted(nodes[i].before):
            nodes[j].waits -= 1
            if not nodes[j].waits:
                heapq.heappush(ready, (_rank(nodes[j]), j))
    steps = (_step(config.tables[nodes[i].row.table], nodes[i]) for i in done)
    return [s for s in steps if s.write is not Write.UPDATE or s.values]  # nothing to write


#: parks first, then deletes (they only give values up), updates, inserts
_WRITE_ORDER = {Write.PARK: 0, Write.DELETE: 1, Write.UPDATE: 2, Write.INSERT: 3}


def _rank(n: _Node) -> tuple[int, int]:
    return (_WRITE_ORDER[Write.PARK if n.park else n.row.write], n.row.number)


def _edges(config: Config, rows: Sequence[RowRepair]) -> Iterable[tuple[int, int]]:
    """``(a, b)``: row ``a``'s write must come before row ``b``'s."""
    yield from _fk_edges(config, rows)
    yield from _unique_edges(config, rows)


def _fk_edges(config: Config, rows: Sequence[RowRepair]) -> Iterable[tuple[int, int]]:
    """A parent's insert before the children's writes that reference it; a child's delete
    or its update away from a parent before the parent's delete."""
    by_key = {(r.table, r.key): i for i, r in enumerate(rows)}
    for i, r in enumerate(rows):
        for fk in config.tables[r.table].foreign_keys:
            to = _reference(r.want, fk.columns)
            p = by_key.get((fk.references, to)) if to is not None else None
            if p is not None and p != i and rows[p].write is Write.INSERT:
                yield (p, i)
            was = _reference(r.seen, fk.columns)
            p = by_key.get((fk.references, was)) if was is not None else None
            if p is not None and p != i and rows[p].write is Write.DELETE and to != was:
                yield (i, p)


def _reference(row: Mapping[str, Any] | None, columns: Sequence[str]) -> tuple[Any, ...] | None:
    if row is None:
        return None
    ref = tuple(row.get(c) for c in columns)
    return None if any(v is None for v in ref) else ref


def _unique_edges(config: Config, rows: Sequence[RowRepair]) -> Iterable[tuple[int, int]]:
    """A write that gives a unique value up comes before the write that takes it."""
    for name, table in config.tables.items():
        mine = [(i, r) for i, r in enumerate(rows) if r.table == name]
        for cols in table.unique:
            held: dict[tuple[Any, ...], int] = {}
            for i, r in mine:
                v = _reference(r.seen, cols)
                if v is not None and _reference(r.want, cols) != v:
                    held[_hashable(v)] = i  # r gives v up
            for j, r in mine:
                v = _reference(r.want, cols)
                if v is None or _reference(r.seen, cols) == v:
                    continue
                giver = held.get(_hashable(v))
                if giver is not None and giver != j:
                    yield (giver, j)


def _hashable(v: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple("NaN" if isinstance(x, float) and math.isnan(x) else x for x in v)


def _park_one(config: Config, nodes: list[_Node], done: set[int]) -> tuple[tuple[int, int], int]:
    """A cycle: the first waiting update that gives a unique value up to a row that waits
    for it, and can set the value aside, parks it first (a new node, ready now:
    returned); the rows that waited for it to give the value up wait for the park
    instead. Each row parks once, and each park frees a waiting row: the plan ends."""
    waiting = sorted((i for i in range(len(nodes)) if i not in done), key=lambda i: _rank(nodes[i]))
    for i in waiting:
        n = nodes[i]
        if n.park or n.parked is not None or n.row.write is not Write.UPDATE:
            continue
        table = config.tables[n.row.table]
        columns = _parked_columns(table, n.row)
        takers = [j for j in sorted(n.before) if _takes_from(table, nodes[j].row, n.row, columns)]
        if not takers:
            continue
        n.parked = {c: park_value(table, c, n.row) for c in columns}
        park = len(nodes)
        nodes.append(_Node(n.row, park=True, parked=n.parked, before=set(takers)))
        n.before.difference_update(takers)
        return (_rank(nodes[park]), park)
    cycle = ", ".join(f"{nodes[i].row.table} {nodes[i].row.key}" for i in waiting)
    raise RepairError(
        f"the writes of {cycle} wait for each other (a cycle of foreign keys, or a unique "
        "value moving between rows where no column of it can hold a temporary value: a "
        "nullable column, or a string, uuid or integer one): repair them by hand"
    )


def _parked_columns(table: Table, row: RowRepair) -> tuple[str, ...]:
    """One column of each unique constraint whose value ``row`` gives up (the first that
    can hold a parked value; none for a constraint none of whose columns can)."""
    out: list[str] = []
    for cols in table.unique:
        v = _reference(row.seen, cols)
        if v is None or _reference(row.want, cols) == v or any(c in out for c in cols):
            continue
        usable = [c for c in cols if _parkable(table, c)]
        out += usable[:1]
    return tuple(out)


def _takes_from(table: Table, taker: RowRepair, giver: RowRepair, parked: Sequence[str]) -> bool:
    for cols in table.unique:
        if any(c in parked for c in cols):
            v = _reference(giver.seen, cols)
            if v is not None and _reference(taker.want, cols) == v:
                return True
    return False


def _parkable(table: Table, column: str) -> bool:
    nullable = column not in table.not_null and column not in table.key
    return nullable or table.column(column).type.kind in _PARKED


#: the value a NOT NULL column of each type parks: a text no real row holds (it names the
#: row), a uuid of its own, the integer type's smallest values
_PARKED = {Kind.STRING, Kind.UUID, Kind.INT, Kind.BIGINT}


def park_value(table: Table, column: str, row: RowRepair) -> Any:
    """The temporary value of ``row``'s unique ``column`` while another row takes its
    value: null where the column allows it; else a value derived from the row's key."""
    if column not in table.not_null and column not in table.key:
        return None
    digest = hashlib.sha256(f"{table.name}|{row.key!r}".encode()).hexdigest()
    kind = table.column(column).type.kind
    if kind is Kind.STRING:
        return f"cdr_repair:{digest[:32]}"
    if kind is Kind.UUID:
        return uuid.UUID(digest[:32])
    return -integer_bound(kind) + row.number  # the type's smallest values, one per row


def _step(table: Table, n: _Node) -> Step:
    r = n.row
    if n.park:
        assert n.parked is not None and r.seen is not None
        return Step(Write.PARK, r, dict(n.parked), dict(r.seen))
    if r.write is Write.INSERT:
        assert r.want is not None
        return Step(Write.INSERT, r, dict(r.want), None)
    assert r.seen is not None
    expect = {**r.seen, **(n.parked or {})}
    if r.write is Write.DELETE:
        return Step(Write.DELETE, r, {}, expect)
    changed = {c: r.want[c] for c in r.changed()} if r.want else {}
    changed.update({c: (r.want or {}).get(c) for c in n.parked or {}})
    return Step(Write.UPDATE, r, changed, expect)
