"""``cdr generate``: seeded synthetic exports of an active-active deployment, for demos,
tests and benchmarks.

The model: every change is made on one replica (its origin) at a commit ``ts`` and applied
by every other replica after a replication delay; each replica exports every change it
applied, its own and the others', in its local apply order. So one event appears in
every replica's export, in different orders: the origin applies its own change at once,
the others later. A share of keys (``conflict_rate``, 2% by default) is written by several
replicas within the delay window, which produces real conflicts (insert races, concurrent
updates, updates racing deletes); the rest of the keys get one change. Some events are
late (made the day before, exported today). Foreign-key columns reference live keys of
the parent table, unique columns get distinct values, delta columns carry before and
after.

Like a production table, the keys live across nights: half of a night's keys are new and
half are existing ones. New keys continue after the largest key generated for an earlier
date (``generated/table=<t>/dt=<D>.json`` records it, with the keys deleted so far), so a
key is never inserted twice; changes to existing keys lean toward the newest keys
(``skew``: that share of them goes to the newest tenth of the keys, the rest is spread
over all of them; 0 is uniform) and never pick a deleted key.

Same config, date, options, seed and earlier dates: the same bytes.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import random
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.core import layout
from pipeline.core.columns import (
    AFTER,
    BEFORE,
    DEAD,
    DT,
    EVENT_ID,
    KEY,
    OP,
    ORIGIN,
    REPLICA,
    SEQ,
    TS,
    TTL,
)
from pipeline.core.config import Column, Config, Table
from pipeline.core.kinds import INTEGER_KINDS, NUMERIC_KINDS, ORDER_BY_KINDS, Kind, every_kind
from pipeline.core.policy import Granularity
from pipeline.storage.context import to_micros
from pipeline.storage.store import Store

DAY_US = 86_400_000_000
MAX_DELAY_US = 90_000_000  # replication delay: up to 90 s


@dataclass(frozen=True)
class GenerateOptions:
    events: int = 10_000  # event records across all exports
    conflict_rate: float = 0.02
    #: the share of the changes to existing keys that go to the newest tenth of the keys
    #: (the rest is uniform over all keys): 0 is uniform
    skew: float = 0.5
    late_rate: float = 0.02
    delete_rate: float = 0.1
    #: the share of the touched keys that exist as the day starts (the rest are new keys)
    update_share: float = 0.5
    #: an UPDATE carries the whole row, as PostgreSQL's logical replication sends it (else
    #: only the columns it changed)
    full_rows: bool = False
    base_rows: int | None = None
    fmt: str = "jsonl"
    files: int = 1
    seed: int = 1
    #: seconds each replica's clock is off (negative: behind): its events' commit ts are
    #: stamped by it, while an ``order_by`` column keeps the application's true time
    clock_offsets: dict[str, int] = field(default_factory=dict)


#: the tenth of the keys that ``skew`` favours: the newest ones
NEWEST_SHARE = 0.1
#: draws of an existing key that may land on a deleted one before a new key is used
_PICKS = 4


@dataclass
class KeySpace:
    """A table's generated keys: ``0 .. next_key - 1``, less the ``dead`` (deleted) ones."""

    next_key: int = 0
    dead: set[int] = field(default_factory=set)

    def new(self) -> int:
        n = self.next_key
        self.next_key += 1
        return n

    def pick(self, rng: random.Random, skew: float, below: int | None = None) -> int | None:
        """A live key under ``below`` (default: any): with probability ``skew`` one of the
        newest tenth, else any; None when none is found."""
        hi = self.next_key if below is None else below
        if hi <= 0:
            return None
        for _ in range(_PICKS):
            newest = rng.random() < skew
            lo = hi - max(1, int(hi * NEWEST_SHARE)) if newest else 0
            n = rng.randrange(lo, hi)
            if n not in self.dead:
                return n
        return None

    def to_json(self) -> bytes:
        return json.dumps({"next_key": self.next_key, DEAD: sorted(self.dead)}).encode()

    @classmethod
    def before(cls, store: Store, table: str, dt: date) -> KeySpace:
        """The keys generated for ``table`` up to the latest date before ``dt`` (none: a
        new table)."""
        folder = layout.generated_keys_dir(table)
        dates = sorted(
            d
            for k in store.list(folder)
            if (d := date.fromisoformat(k.rsplit("dt=", 1)[1].removesuffix(".json"))) < dt
        )
        if not dates:
            return cls()
        body = json.loads(store.read_bytes(layout.generated_keys(table, dates[-1])))
        return cls(int(body["next_key"]), set(body[DEAD]))


@dataclass
class _Ev:
    op: str
    key: dict[str, Any]
    ts: int
    origin: str
    event_id: str
    after: dict[str, Any] | None = None
    before: dict[str, Any] | None = None
    ttl: int | None = None
    real: int = 0  # when it happened (its ts before its origin's clock offset)


def _value(col: Column, rng: random.Random, n: int) -> Any:
    return _VALUES[col.type.kind](col, rng, n)


def _decimal_value(col: Column, rng: random.Random, n: int) -> float:
    scale = col.type.scale
    top = min(10 ** (col.type.precision - scale) - 1, 100_000)
    return float(Decimal(rng.randint(0, top * 10**scale)).scaleb(-scale))


def _date_value(col: Column, rng: random.Random, n: int) -> str:
    return (date(2026, 1, 1) + timedelta(days=rng.randint(0, 364))).isoformat()


def _timestamp_value(col: Column, rng: random.Random, n: int) -> str:
    return f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T12:00:00Z"


#: a random value of every column type, as an export writes it (:func:`_value`)
_VALUES: Mapping[Kind, Callable[[Column, random.Random, int], Any]] = every_kind(
    "generate._value",
    {
        **dict.fromkeys(INTEGER_KINDS, lambda col, rng, n: rng.randint(1, 1000)),
        Kind.DOUBLE: lambda col, rng, n: round(rng.uniform(0, 1000), 3),
        Kind.DECIMAL: _decimal_value,
        Kind.BOOLEAN: lambda col, rng, n: rng.random() < 0.5,
        Kind.DATE: _date_value,
        Kind.TIMESTAMP: _timestamp_value,
        Kind.BINARY: lambda col, rng, n: base64.b64encode(rng.randbytes(8)).decode(),
        Kind.UUID: lambda col, rng, n: str(uuid.UUID(int=rng.getrandbits(128))),
        Kind.STRING: lambda col, rng, n: f"{col.name}-{n}-{rng.randint(0, 9999)}",
    },
)


def _order_value_at(col: Column, ts: int, day0: int) -> Any:
    """docs/rules.md#order-by-a-column: the value an application keeps in an ``order_by``
    column for a
    change made at ``ts`` (µs): the time itself, or the seconds since the day began (an
    ``int``, a ``decimal``), so that it grows with the changes of a key."""
    return _ORDER_VALUES[col.type.kind](col, ts, day0)


def _decimal_order_value(col: Column, ts: int, day0: int) -> float:
    return float(Decimal(ts - day0).scaleb(-6).quantize(Decimal(1).scaleb(-col.type.scale)))


#: every ``order_by`` type's value at a time (:func:`_order_value_at`)
_ORDER_VALUES: Mapping[Kind, Callable[[Column, int, int], Any]] = every_kind(
    "generate._order_value_at",
    {
        Kind.TIMESTAMP: lambda col, ts, day0: (
            datetime.fromtimestamp(ts / 1e6, UTC).isoformat().replace("+00:00", "Z")
        ),
        Kind.BIGINT: lambda col, ts, day0: ts,
        Kind.INT: lambda col, ts, day0: (ts - day0) // 1_000_000,
        Kind.DECIMAL: _decimal_order_value,
    },
    ORDER_BY_KINDS,
)


def _key_value(col: Column, n: int) -> Any:
    return _KEY_VALUES[col.type.kind](col, n)


def _text_key(col: Column, n: int) -> str:
    return f"k{n:08d}"


#: the ``n``-th key value of every column type (:func:`_key_value`)
_KEY_VALUES: Mapping[Kind, Callable[[Column, int], Any]] = every_kind(
    "generate._key_value",
    {
        **dict.fromkeys(NUMERIC_KINDS, lambda col, n: n),
        Kind.UUID: lambda col, n: str(uuid.UUID(int=n)),
        Kind.DATE: lambda col, n: (date(2000, 1, 1) + timedelta(days=n)).isoformat(),
        Kind.BOOLEAN: lambda col, n: n % 2 == 1,
        Kind.STRING: _text_key,
        Kind.TIMESTAMP: _text_key,
        Kind.BINARY: _text_key,
    },
)


class _TableGen:
    def __init__(
        self,
        config: Config,
        table: Table,
        rng: random.Random,
        parents: dict[str, _TableGen],
        day0: int,
        keys: KeySpace,
    ):
        self.config = config
        self.day0 = day0  # the generated day's start (µs)
        self.t = table
        self.rng = rng
        self.parents = parents
        self.keys = keys
        self.replicas = list(config.replica_ids)
        self.unique_cols = {c for u in table.unique for c in u}
        self.fk_cols = {c: fk for fk in table.foreign_keys for c in fk.columns}

    def key(self, n: int) -> dict[str, Any]:
        if len(self.t.key) == 1:
            return {self.t.key[0]: _key_value(self.t.column(self.t.key[0]), n)}
        return {c: _key_value(self.t.column(c), n * 7 + i) for i, c in enumerate(self.t.key)}

    def row(self, n: int, version: int = 0) -> dict[str, Any]:
        out = dict(self.key(n))
        for col in self.t.columns:
            c = col.name
            if c in out:
                continue
            if c == self.t.order_by:  # a base row: changed before the generated day
                out[c] = _order_value_at(col, self.day0 - 2 * DAY_US, self.day0)
            elif c in self.unique_cols:
                out[c] = f"{c}-{n}" if col.type.kind is Kind.STRING else n
            elif c in self.fk_cols:
                out.update(self._reference(self.fk_cols[c].references, self.fk_cols[c].columns))
            elif c in self.t.delta:
                out[c] = self.rng.randint(0, 1000)
            else:
                out[c] = _value(col, self.rng, n + version)
        return out

    def _reference(self, parent: str, cols: tuple[str, ...]) -> dict[str, Any]:
        """A live key of the parent table (generated before this table)."""
        g = self.parents.get(parent)
        n = None if g is None else g.keys.pick(self.rng, 0.0)
        if g is None or n is None:
            return {c: None for c in cols}
        return dict(zip(cols, g.key(n).values(), strict=True))

    def change(
        self, full: dict[str, Any], whole: bool = False
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """after and before of an UPDATE: some non-key, non-unique columns change; with
        ``whole`` (a row table) both images hold every value column."""
        old = dict(full)
        candidates = [c for c in self.t.value_columns if c not in self.unique_cols]
        if not candidates:
            return {}, {}
        cols = self.rng.sample(candidates, k=self.rng.randint(1, len(candidates)))
        after, before = {}, {}
        for c in cols:
            col = self.t.column(c)
            if c in self.t.delta:
                before[c] = full.get(c) or 0
                after[c] = before[c] + self.rng.randint(-50, 100)
            elif c in self.fk_cols:
                after.update(self._reference(self.fk_cols[c].references, self.fk_cols[c].columns))
            else:
                after[c] = _value(col, self.rng, self.rng.randint(0, 10**6))
                if self.t.granularity is Granularity.ROW:
                    before[c] = full.get(c)  # the value the change saw (a full before-image)
            full[c] = after.get(c, full.get(c))
        if whole and self.t.granularity is Granularity.ROW:
            delta = self.t.delta
            cols = list(self.t.value_columns)
            after = {c: (full.get(c) or 0) if c in delta else full.get(c) for c in cols} | after
            before = {c: (old.get(c) or 0) if c in delta else old.get(c) for c in cols}
        return after, before


def _write_export(
    store: Store,
    folder: str,
    records: list[dict[str, Any]],
    fmt: str,
    files: int,
    manifest: dict[str, Any],
) -> None:
    parts = max(1, min(files, len(records) or 1))
    size = -(-len(records) // parts) if records else 0
    entries = []
    for i in range(parts):
        chunk = records[i * size : (i + 1) * size] if records else []
        if fmt == "parquet":
            objs = (KEY, "new_key", AFTER, BEFORE)
            rows = [
                {k: (json.dumps(v) if k in objs and v is not None else v) for k, v in r.items()}
                for r in chunk
            ]
            buf = io.BytesIO()
            pq.write_table(pa.Table.from_pylist(rows), buf)
            data, name = buf.getvalue(), f"part-{i:04d}.parquet"
        else:
            text = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in chunk).encode()
            data, name = gzip.compress(text, compresslevel=1, mtime=0), f"part-{i:04d}.jsonl.gz"
        store.write_bytes(f"{folder}/{name}", data)
        entries.append(
            {"path": name, "rows": len(chunk), "sha256": hashlib.sha256(data).hexdigest()}
        )
    body = {**manifest, "format": fmt, "files": entries}
    store.write_bytes(f"{folder}/{layout.MANIFEST}", json.dumps(body, indent=1).encode())


#: when each replica applied each event (µs, its real time), by event id and replica; the
#: origin's entry is when it happened. What an event's writer had seen is read from it
#: (docs/rules.md#lost-writes), apart from the exports' ``seq``
Arrivals = dict[str, dict[str, int]]


def generate(
    config: Config,
    store: Store,
    dt: date,
    opts: GenerateOptions,
    arrivals: Arrivals | None = None,
) -> dict[str, Any]:
    """Write one day of exports for every configured table (parents first); ``arrivals``,
    when given, receives when each replica applied each event."""
    per_table = max(1, opts.events // max(1, len(config.tables)))
    gens: dict[str, _TableGen] = {}
    stats: dict[str, Any] = {"records": 0, "tables": {}}
    day0 = to_micros(datetime(dt.year, dt.month, dt.day, tzinfo=UTC))
    for name in _parents_first(config):
        table = config.tables[name]
        rng = random.Random(f"{opts.seed}-{name}")
        base_n = opts.base_rows or 0
        # a base snapshot starts the table anew: its rows are the keys 0 .. base_n - 1
        keys = KeySpace(base_n) if base_n else KeySpace.before(store, name, dt)
        g = gens[name] = _TableGen(config, table, rng, gens, day0, keys)
        if base_n:
            base_rows = [exported(table, g.row(n)) for n in range(base_n)]
            _write_export(store, layout.base_dir(name), base_rows, "jsonl", 1, {"table": name})
        first_new = keys.next_key
        events, k_touched = _day_events(g, dt, opts, per_table)
        n_records = _write_day(store, table, dt, events, g.replicas, rng, opts, arrivals)
        store.write_bytes(layout.generated_keys(name, dt), keys.to_json())
        stats["records"] += n_records
        stats["tables"][name] = {
            "events": len(events),
            "records": n_records,
            "keys": k_touched,
            "new_keys": keys.next_key - first_new,
            "base_rows": base_n,
        }
    return stats


def _day_events(
    g: _TableGen, dt: date, opts: GenerateOptions, per_table: int
) -> tuple[list[_Ev], int]:
    """One table's events of the day, from ``g``'s seeded generator, and how many keys it
    touched; ``g.keys`` is left as the day ends (its new keys added, its deletes dead)."""
    day0 = g.day0
    rng, replicas, name = g.rng, g.replicas, g.t.name
    distinct = max(1, per_table // len(replicas))
    # keys touched: E = K * (1 + 2.5 c); contended keys get 2-5 events
    k_touched = max(1, int(distinct / (1 + 2.5 * opts.conflict_rate)))
    events: list[_Ev] = []
    seq_no = {r: 0 for r in replicas}
    known = g.keys.next_key  # the keys that exist as the day starts (a key made today is
    # changed by its own events only: its other changes could come before it, in time)
    for _k in range(k_touched):
        picked = g.keys.pick(rng, opts.skew, known) if rng.random() < opts.update_share else None
        existing = picked is not None
        n = picked if picked is not None else g.keys.new()
        full = g.row(n) if existing else {}
        contended = rng.random() < opts.conflict_rate
        count = rng.randint(2, 5) if contended else 1
        late = rng.random() < opts.late_rate
        t = (
            (day0 - rng.randint(1, 3_600_000_000))
            if late
            else day0 + rng.randint(0, DAY_US - 3 * MAX_DELAY_US * 5)
        )
        alive = existing
        for j in range(count):
            origin = rng.choice(replicas)
            seq_no[origin] += 1
            eid = f"{origin}-{name}-{dt:%Y%m%d}-{seq_no[origin]}"  # unique across dates
            key = g.key(n)
            race = j == 1 and not existing and events[-1].op == "INSERT" and rng.random() < 0.3
            if race:  # an insert race: another replica inserts the same new key
                ev = _Ev("INSERT", key, t, origin, eid, after=g.row(n, j))
            elif not alive:
                full = g.row(n, j)
                ev = _Ev("INSERT", key, t, origin, eid, after=dict(full))
                alive = True
            elif rng.random() < opts.delete_rate:
                ev = _Ev("DELETE", key, t, origin, eid)
                alive = False
            else:
                after, before = g.change(full, opts.full_rows)
                ev = _Ev("UPDATE", key, t, origin, eid, after=after, before=before or None)
            _finish_event(g, ev, full, opts)
            events.append(ev)
            # the next change of a contended key is concurrent: within the delay window
            t += rng.randint(1, MAX_DELAY_US) if contended else rng.randint(1, 10**9)
        if not alive:
            g.keys.dead.add(n)
    return events, k_touched


def _finish_event(g: _TableGen, ev: _Ev, full: dict[str, Any], opts: GenerateOptions) -> None:
    """A cell table's TTLs and nulls, an ``order_by`` table's order value, and the commit
    ts as its origin's clock stamps it."""
    rng, table = g.rng, g.t
    cell = table.granularity is Granularity.CELL
    if cell and rng.random() < 0.1:  # a Scylla/Cassandra write with a TTL
        ev.ttl = rng.choice([3600, 7 * 86400])
    nullable = [c for c in ev.after or {} if c not in table.not_null]
    if cell and nullable and rng.random() < 0.05:  # a null: a cell tombstone
        ev.after[rng.choice(nullable)] = None  # type: ignore[index]
    if table.order_by is not None:
        _set_order(g, ev, full)
    ev.real = ev.ts
    ev.ts += opts.clock_offsets.get(ev.origin, 0) * 1_000_000


def _set_order(g: _TableGen, ev: _Ev, full: dict[str, Any]) -> None:
    """An ``order_by`` table's event carries its order value: an INSERT's or UPDATE's in
    ``after`` (the row keeps it), a DELETE's in ``before`` (the row's it deletes)."""
    col = g.t.column(g.t.order_by or "")
    if ev.op == "DELETE":
        ev.before = {col.name: full.get(col.name, _order_value_at(col, ev.ts, g.day0))}
        return
    value = _order_value_at(col, ev.ts, g.day0)
    ev.after = {**(ev.after or {}), col.name: value}
    full[col.name] = value


def exported(table: Table, row: dict[str, Any]) -> dict[str, Any]:
    """A row (a key, an image) by the names the exports give its columns
    (docs/configuration.md#column-names)."""
    if not table.renamed:
        return row
    return {table.exported(c): v for c, v in row.items()}


def _write_day(
    store: Store,
    table: Table,
    dt: date,
    events: list[_Ev],
    replicas: list[str],
    rng: random.Random,
    opts: GenerateOptions,
    applied: Arrivals | None = None,
) -> int:
    """Each replica exports every event in its own apply order: its own changes when they
    happen, the others' after a replication delay (by the time they happened, not by
    their ts, which a clock offset skews)."""
    total = 0
    for rep in replicas:
        arrivals = []
        for i, e in enumerate(events):
            delay = 0 if e.origin == rep else rng.randint(1, MAX_DELAY_US)
            arrivals.append((e.real + delay, i))
            if applied is not None:
                applied.setdefault(e.event_id, {})[rep] = e.real + delay
        arrivals.sort()
        records = []
        for seq, (_at, i) in enumerate(arrivals, start=1):
            e = events[i]
            r: dict[str, Any] = {OP: e.op, KEY: exported(table, e.key)}
            if e.after is not None:
                r[AFTER] = exported(table, e.after)
            if e.before:
                r[BEFORE] = exported(table, e.before)
            if e.ttl:
                r[TTL] = e.ttl
            r |= {TS: e.ts, ORIGIN: e.origin, EVENT_ID: e.event_id, SEQ: seq}
            records.append(r)
        folder = layout.export_dir(rep, table.name, dt)
        _write_export(
            store,
            folder,
            records,
            opts.fmt,
            opts.files,
            {
                REPLICA: rep,
                "table": table.name,
                DT: dt.isoformat(),
                "watermark": f"{dt.isoformat()}T23:59:59.999999Z",
            },
        )
        total += len(records)
    return total


def _parents_first(config: Config) -> list[str]:
    done: list[str] = []

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in done or name in path:
            return
        for fk in config.tables[name].foreign_keys:
            visit(fk.references, (*path, name))
        done.append(name)

    for name in config.tables:
        visit(name, ())
    return done
