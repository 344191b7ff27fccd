"""The cell-granularity rules (docs/rules.md#cell-rules,
docs/rules.md#tombstones-and-gc_grace_seconds, docs/rules.md#fine-points) in plain
Python.

This is the reference of the ``scylla`` preset: the Spark engine (``pipeline.resolve.cells``)
computes the same results with column expressions and one window per key, and the tests
compare the two on generated data. No Spark here.

A row of a cell table is a set of independent **slots**: one cell per non-key column, the
row marker written by an INSERT, and the row tombstone written by a DELETE; a TRUNCATE
writes the table tombstone. Two writes to one slot are reconciled by a total order, so
merging is a maximum: commutative, associative and idempotent, which is why a cell table
always converges whatever order the replicas applied its events in
(docs/rules.md#convergence).

The order of two cells (:func:`cell_order`) is ScyllaDB's ``compare_atomic_cell_for_merge``
(``mutation/atomic_cell.cc``, 5.2.5 and later; the same rules as Cassandra's
``Cells.reconcile`` and ``Conflicts.resolveRegular``):

1. the higher write timestamp wins;
2. on equal timestamps a dead cell (a delete, or a null written) beats a live one, and of
   two dead cells the later deletion time wins. "Dead" is what was written: a TTL cell
   that has expired still compares as live here;
3. of two live cells, an expiring one beats a non-expiring one; of two expiring ones the
   later expiry wins, then the later derived write time ``expiry - ttl`` (the smaller TTL);
4. then the bigger value, comparing the unsigned bytes of the value's serialized form,
   a shorter prefix being smaller. The serialization is Cassandra's native protocol
   binary form of the column's CQL type (:func:`serialize`), so that ties are decided
   as the database decides them: ``int`` -1 (``ff ff ff ff``) beats 1 (``00 00 00 01``).

Cells that tie on every rule are identical to a reader; the product then keeps the one later
in the canonical order (docs/rules.md#the-canonical-order: the tie-break winner comes last),
so that the metadata of the result is deterministic too."""

from __future__ import annotations

import struct
import uuid as uuidlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import Decimal, localcontext
from typing import Any, NamedTuple

from pipeline.core.columns import MARKER, STATE_ORIGIN, STATE_TS
from pipeline.core.config import Table
from pipeline.core.kinds import ColumnType, Kind, every_kind
from pipeline.core.policy import ConflictType, Fate, Outcome

Key = tuple[Any, ...]
_EPOCH_DAY = date(1970, 1, 1)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class Rules(NamedTuple):
    """Why one cell beat another, each rule by name, in the order the rules are tried
    (docs/rules.md#cell-rules): the order of the fields of :meth:`Cell.rule_key`."""

    ts: str
    dead: str
    deletion: str
    expiring: str
    expiry: str
    write_time: str
    value: str


#: the reasons of the cell rules (docs/rules.md#cell-rules)
RULES = Rules(
    ts="rule 1: higher ts",
    dead="rule 2: dead beats live",
    deletion="rule 2: later deletion time",
    expiring="rule 3: expiring beats non-expiring",
    expiry="rule 3: later expiry",
    write_time="rule 3: later write time (smaller ttl)",
    value="rule 4: bigger value",
)
TIE = "tie: later in canonical order"
SHADOWED = "shadowed by a tombstone"


def _signed_min_bytes(n: int) -> bytes:
    """Java's ``BigInteger.toByteArray``: minimal big-endian two's complement."""
    length = ((n if n >= 0 else ~n).bit_length() + 8) // 8
    return n.to_bytes(length, "big", signed=True)


def serialize(value: Any, ct: ColumnType) -> bytes:
    """The value in Cassandra's binary form for the column's type (native protocol v4
    docs/rules.md#cell-rules: int, bigint, boolean, double, decimal, text, date, timestamp,
    blob, uuid)."""
    return _SERIALIZE[ct.kind](value, ct)


def _decimal_bytes(value: Any, ct: ColumnType) -> bytes:
    """4-byte scale, then the unscaled value as a varint."""
    with localcontext() as ctx:
        ctx.prec = 80  # exact for every decimal(p <= 38, s)
        unscaled = int(Decimal(value).scaleb(ct.scale).to_integral_value())
    return struct.pack(">i", ct.scale) + _signed_min_bytes(unscaled)


def _date_bytes(value: Any, ct: ColumnType) -> bytes:
    """Unsigned days since the epoch, centred on 2^31."""
    return ((value - _EPOCH_DAY).days + 2**31).to_bytes(4, "big")


def _timestamp_bytes(value: Any, ct: ColumnType) -> bytes:
    """Signed milliseconds since the epoch."""
    if value.tzinfo is None:  # Spark's session time zone is UTC (pipeline.spark.session)
        value = value.replace(tzinfo=UTC)
    micros = (value - _EPOCH) // datetime.resolution
    return struct.pack(">q", micros // 1000)


#: every column type's binary form (:func:`serialize`), by its CQL type
#: (docs/configuration.md#column-types)
_SERIALIZE: Mapping[Kind, Callable[[Any, ColumnType], bytes]] = every_kind(
    "cellfold.serialize",
    {
        Kind.INT: lambda value, ct: struct.pack(">i", value),
        Kind.BIGINT: lambda value, ct: struct.pack(">q", value),
        Kind.BOOLEAN: lambda value, ct: b"\x01" if value else b"\x00",
        Kind.DOUBLE: lambda value, ct: struct.pack(">d", value),
        Kind.DECIMAL: _decimal_bytes,
        Kind.DATE: _date_bytes,
        Kind.TIMESTAMP: _timestamp_bytes,
        Kind.BINARY: lambda value, ct: bytes(value),
        Kind.UUID: lambda value, ct: uuidlib.UUID(str(value)).bytes,
        Kind.STRING: lambda value, ct: str(value).encode("utf-8"),
    },
)


@dataclass(frozen=True, slots=True)
class Cell:
    """One write to a slot (a column's cell or the row marker). ``dead``: a delete or a
    null written; ``deleted_at`` (µs) is its deletion time. ``expiry`` is in seconds."""

    ts: int
    value: Any = None
    dead: bool = False
    deleted_at: int = 0
    ttl: int | None = None
    expiry: int | None = None
    origin: str | None = None
    event_id: str | None = None
    rank: int = -1
    is_event: bool = False

    @property
    def expiring(self) -> bool:
        return not self.dead and self.ttl is not None

    def expired(self, now_s: int) -> bool:
        return self.expiring and self.expiry is not None and self.expiry <= now_s

    def live(self, now_s: int) -> bool:
        return not self.dead and not self.expired(now_s)

    def rule_key(self, ct: ColumnType | None) -> tuple:
        """The fields of rules 1-4 in order (``ct`` None: a row marker, no value)."""
        exp = self.expiring
        return (
            self.ts,
            self.dead,
            self.deleted_at if self.dead else 0,
            exp,
            self.expiry if exp else 0,
            (self.expiry - self.ttl) if exp else 0,  # type: ignore[operator]
            serialize(self.value, ct) if ct is not None and not self.dead else b"",
        )

    def order_key(self, ct: ColumnType | None) -> tuple:
        """The total order: the rules, then the canonical order for full ties."""
        return (*self.rule_key(ct), self.is_event, self.rank, self.event_id or "")


@dataclass(frozen=True, slots=True)
class Tombstone:
    """A row tombstone (a DELETE) or the table tombstone (a TRUNCATE): shadows every
    cell and marker with ``ts <=`` its own."""

    ts: int
    deleted_at: int
    origin: str | None = None
    event_id: str | None = None
    rank: int = -1
    is_event: bool = False

    def order_key(self) -> tuple:
        return (self.ts, self.deleted_at, self.is_event, self.rank, self.event_id or "")


def cell_order(a: Cell, b: Cell, ct: ColumnType | None) -> tuple[int, str]:
    """``(sign, rule)``: sign > 0 when ``a`` beats ``b``, < 0 when ``b`` beats ``a``, with
    the rule that decided; antisymmetric by construction."""
    ka, kb = a.rule_key(ct), b.rule_key(ct)
    for i, (x, y) in enumerate(zip(ka, kb, strict=True)):
        if x != y:
            return (1 if x > y else -1), RULES[i]
    ta, tb = a.order_key(ct)[len(ka) :], b.order_key(ct)[len(kb) :]
    return (0 if ta == tb else (1 if ta > tb else -1)), TIE


def _max(a: Any, b: Any, key: Any) -> Any:
    if a is None:
        return b
    if b is None:
        return a
    return b if key(b) > key(a) else a


@dataclass(slots=True)
class CellRow:
    """A key's state: its cells by column, its marker, its row tombstone."""

    cells: dict[str, Cell] = field(default_factory=dict)
    marker: Cell | None = None
    tomb: Tombstone | None = None

    def copy(self) -> CellRow:
        return CellRow(dict(self.cells), self.marker, self.tomb)

    def is_empty(self) -> bool:
        return not self.cells and self.marker is None and self.tomb is None


def merge_rows(a: CellRow, b: CellRow, types: Mapping[str, ColumnType]) -> CellRow:
    """The reconciliation of two states of one key: each slot's maximum, then the
    tombstone's shadow. Commutative, associative and idempotent."""
    out = CellRow(tomb=_max(a.tomb, b.tomb, Tombstone.order_key))
    for c in sorted(a.cells.keys() | b.cells.keys()):
        ct = types[c]
        out.cells[c] = _max(a.cells.get(c), b.cells.get(c), lambda x, ct=ct: x.order_key(ct))
    out.marker = _max(a.marker, b.marker, lambda x: x.order_key(None))
    return shadow(out, None)


def shadow(row: CellRow, table_tomb: Tombstone | None) -> CellRow:
    """Drop what the row's or the table's tombstone shadows (``ts <=`` its own); a row
    tombstone not newer than the table tombstone is redundant."""
    limit = max((t.ts for t in (row.tomb, table_tomb) if t is not None), default=None)
    if limit is None:
        return row
    tomb = row.tomb if row.tomb and (table_tomb is None or row.tomb.ts > table_tomb.ts) else None
    cells = {c: x for c, x in row.cells.items() if x.ts > limit}
    marker = row.marker if row.marker and row.marker.ts > limit else None
    return CellRow(cells, marker, tomb)


def purge(
    rows: Mapping[Key, CellRow], table_tomb: Tombstone | None, now_us: int, grace_s: int
) -> tuple[dict[Key, CellRow], Tombstone | None]:
    """docs/rules.md#tombstones-and-gc_grace_seconds: tombstones (dead cells, row and table
    tombstones, expired cells counting from
    their write time ``expiry - ttl``) whose deletion time is before ``now - gc_grace``
    are dropped; a row with nothing left disappears."""
    horizon = now_us - grace_s * 1_000_000
    now_s = now_us // 1_000_000

    def keep(c: Cell) -> bool:
        if c.dead:
            return c.deleted_at >= horizon
        if c.expired(now_s):
            return (c.expiry - c.ttl) * 1_000_000 >= horizon  # type: ignore[operator]
        return True

    out: dict[Key, CellRow] = {}
    for k, r in rows.items():
        row = CellRow(
            {c: x for c, x in r.cells.items() if keep(x)},
            r.marker if r.marker is not None and keep(r.marker) else None,
            r.tomb if r.tomb is not None and r.tomb.deleted_at >= horizon else None,
        )
        if not row.is_empty():
            out[k] = row
    if table_tomb is not None and table_tomb.deleted_at < horizon:
        table_tomb = None
    return out, table_tomb


def read_row(row: CellRow, now_s: int) -> dict[str, Any] | None:
    """What a reader sees (an already shadowed row): the live values, ``_ts`` and
    ``_origin`` of the latest live write; None when nothing is live
    (docs/rules.md#cell-rules: a row whose cells are all dead and that has no live marker is
    gone)."""
    live = {c: x for c, x in row.cells.items() if x.live(now_s)}
    writes = list(live.values())
    if row.marker is not None and row.marker.live(now_s):
        writes.append(row.marker)
    if not writes:
        return None
    last = max(writes, key=lambda x: (x.ts, x.is_event, x.rank, x.event_id or ""))
    return {**{c: x.value for c, x in live.items()}, STATE_TS: last.ts, STATE_ORIGIN: last.origin}


@dataclass(frozen=True, slots=True)
class CellEvent:
    """A canonical event of a cell table, typed; ``after`` holds the columns written."""

    event_id: str
    op: str
    key: Key | None
    ts: int
    origin: str
    rank: int
    after: Mapping[str, Any] = field(default_factory=dict)
    ttl: int | None = None
    expiry: int | None = None

    def position(self) -> tuple[int, int, str]:
        return (self.ts, self.rank, self.event_id)

    def writes(self, now_us: int) -> tuple[dict[str, Cell], Cell | None, Tombstone | None]:
        """docs/rules.md#cell-rules: an INSERT writes the marker and its cells, an UPDATE
        its cells, a null writes a cell tombstone (deletion time ``now``), a DELETE the row
        tombstone."""
        if self.op == "DELETE":
            return {}, None, Tombstone(self.ts, now_us, self.origin, self.event_id, self.rank, True)
        ttl = self.ttl if self.ttl else None
        expiry = None
        if ttl is not None:
            expiry = self.expiry if self.expiry is not None else self.ts // 1_000_000 + ttl

        def write(value: Any, dead: bool, deleted_at: int, ttl: int | None) -> Cell:
            exp = expiry if ttl is not None else None
            return Cell(
                self.ts,
                value,
                dead,
                deleted_at,
                ttl,
                exp,
                self.origin,
                self.event_id,
                self.rank,
                True,
            )

        cells = {
            c: write(None, True, now_us, None) if v is None else write(v, False, 0, ttl)
            for c, v in self.after.items()
        }
        marker = write(None, False, 0, ttl) if self.op == "INSERT" else None
        return cells, marker, None


@dataclass(frozen=True, slots=True)
class CellConflict:
    """One conflict-log row: an event one of whose writes met a write of another event with
    an equal or later ts (docs/rules.md#fine-points). ``cells``: per slot met,
    ``(slot, won, why)``."""

    key: Key
    conflict_type: ConflictType
    outcome: Outcome
    event_id: str
    local_ts: int
    local_origin: str | None
    cells: tuple[tuple[str, bool, str], ...]


#: a cell table's conflict type is named by the op (docs/rules.md#fine-points)
TYPE_BY_OP = {
    "INSERT": ConflictType.INSERT_EXISTS,
    "UPDATE": ConflictType.UPDATE_DIFFER,
    "DELETE": ConflictType.DELETE_DIFFER,
}


def _met(x: Cell | Tombstone | None, e: CellEvent) -> bool:
    """``x`` is a version of another event than ``e``, as late as ``e`` or later: ``e``
    meets it (a conflict)."""
    return x is not None and x.ts >= e.ts and x.event_id != e.event_id


class CellFold:
    """Applies events in the canonical order to a table's state, logging conflicts; the
    final state equals the merge of every write in any order (the property tests)."""

    def __init__(
        self,
        table: Table,
        now_us: int,
        rows: Mapping[Key, CellRow] | None = None,
        table_tomb: Tombstone | None = None,
    ) -> None:
        self.types = {c.name: c.type for c in table.columns if c.name not in table.key}
        self.now_us = now_us
        self.rows: dict[Key, CellRow] = {k: r.copy() for k, r in (rows or {}).items()}
        self.table_tomb = table_tomb
        self.conflicts: list[CellConflict] = []
        self.fates: dict[str, Fate] = {}

    def apply(self, e: CellEvent) -> None:
        if e.op == "TRUNCATE":  # never a conflict
            t = Tombstone(e.ts, self.now_us, e.origin, e.event_id, e.rank, True)
            self.table_tomb = _max(self.table_tomb, t, Tombstone.order_key)
            self.rows = {k: shadow(r, self.table_tomb) for k, r in self.rows.items()}
            self.fates[e.event_id] = Fate.APPLIED
            return
        assert e.key is not None
        row = self.rows.get(e.key, CellRow())
        cells, marker, tomb = e.writes(self.now_us)
        met, local, won_any = self._meet_cells(e, row, cells, marker)
        if tomb is not None:
            won_any = self._meet_tombstone(e, row, tomb, met, local)
        if met:
            lts, lorigin = max(local, key=lambda x: (x[0], x[1] or ""))
            outcome = Outcome.APPLIED if won_any else Outcome.DISCARDED
            self.conflicts.append(
                CellConflict(e.key, TYPE_BY_OP[e.op], outcome, e.event_id, lts, lorigin, tuple(met))
            )
        self.fates[e.event_id] = (
            Fate.APPLIED if won_any or not (cells or marker or tomb) else Fate.DISCARDED
        )
        new = merge_rows(row, CellRow(cells, marker, tomb), self.types)
        self.rows[e.key] = shadow(new, self.table_tomb)

    def _meet_cells(
        self, e: CellEvent, row: CellRow, cells: dict[str, Cell], marker: Cell | None
    ) -> tuple[list[tuple[str, bool, str]], list[tuple[int, str | None]], bool]:
        """Each cell (and the row marker) ``e`` writes against the row's: which it met (a
        version of another event as late or later, or a tombstone shadowing it) and
        whether it won; the (ts, origin) of what it met; whether any cell won."""
        tt = self.table_tomb.ts if self.table_tomb else None
        limit = max(
            (x for x in (tt, row.tomb.ts if row.tomb else None) if x is not None), default=None
        )
        met: list[tuple[str, bool, str]] = []
        local: list[tuple[int, str | None]] = []
        won_any = False
        slots: list[tuple[str, Cell, Cell | None, ColumnType | None]] = [
            (c, cells[c], row.cells.get(c), self.types[c]) for c in self.types if c in cells
        ]
        if marker is not None:
            slots.append((MARKER, marker, row.marker, None))
        for name, w, cur, ct in slots:
            if limit is not None and limit >= w.ts:
                won, why = False, SHADOWED
                local.append((limit, self._shadow_origin(row)))
            elif cur is None:
                won, why = True, ""
            else:
                sign, why = cell_order(w, cur, ct)
                won = sign > 0
            if _met(cur, e) or (limit is not None and limit >= w.ts):
                met.append((name, won, why))
                if _met(cur, e):
                    local.append((cur.ts, cur.origin))  # type: ignore[union-attr]
            won_any |= won
        return met, local, won_any

    def _meet_tombstone(
        self,
        e: CellEvent,
        row: CellRow,
        tomb: Tombstone,
        met: list[tuple[str, bool, str]],
        local: list[tuple[int, str | None]],
    ) -> bool:
        """The row tombstone ``e`` writes against the row and the table's tombstone: adds
        what it met to ``met`` and ``local``; whether it won."""
        tt = self.table_tomb.ts if self.table_tomb else None
        hits = [x for x in (*row.cells.values(), row.marker, row.tomb) if _met(x, e)]
        beaten = (tt is not None and tt >= tomb.ts) or (
            row.tomb is not None and row.tomb.order_key() >= tomb.order_key()
        )
        if hits or (tt is not None and tt >= tomb.ts):
            met.append(("_row_tombstone", not beaten, "" if not beaten else SHADOWED))
            local += [(x.ts, x.origin) for x in hits if x is not None]
            if tt is not None and tt >= tomb.ts:
                local.append((tt, self.table_tomb.origin))  # type: ignore[union-attr]
        return not beaten

    def _shadow_origin(self, row: CellRow) -> str | None:
        tombs = [t for t in (row.tomb, self.table_tomb) if t is not None]
        return max(tombs, key=lambda t: t.ts).origin if tombs else None

    def run(self, events: Iterable[CellEvent]) -> CellFold:
        for e in sorted(events, key=CellEvent.position):
            self.apply(e)
        return self

    def snapshot(self) -> dict[Key, dict[str, Any]]:
        now_s = self.now_us // 1_000_000
        out = {}
        for k, r in self.rows.items():
            seen = read_row(r, now_s)
            if seen is not None:
                out[k] = seen
        return out

    def state(self) -> dict[Key, CellRow]:
        return {k: r for k, r in self.rows.items() if not r.is_empty()}


def merge_all(
    table: Table, now_us: int, rows: Mapping[Key, CellRow], events: Iterable[CellEvent]
) -> tuple[dict[Key, CellRow], Tombstone | None]:
    """The state reached by merging every write, with no order at all: what any replica
    reaches, whatever order it applied the events in."""
    types = {c.name: c.type for c in table.columns if c.name not in table.key}
    out = {k: r.copy() for k, r in rows.items()}
    table_tomb: Tombstone | None = None
    for e in events:
        if e.op == "TRUNCATE":
            t = Tombstone(e.ts, now_us, e.origin, e.event_id, e.rank, True)
            table_tomb = _max(table_tomb, t, Tombstone.order_key)
            continue
        assert e.key is not None
        cells, marker, tomb = e.writes(now_us)
        out[e.key] = merge_rows(out.get(e.key, CellRow()), CellRow(cells, marker, tomb), types)
    shadowed = {k: shadow(r, table_tomb) for k, r in out.items()}
    return {k: r for k, r in shadowed.items() if not r.is_empty()}, table_tomb


__all__ = [
    "Cell",
    "CellConflict",
    "CellEvent",
    "CellFold",
    "CellRow",
    "Tombstone",
    "cell_order",
    "merge_all",
    "merge_rows",
    "purge",
    "read_row",
    "serialize",
    "shadow",
]
