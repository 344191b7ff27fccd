"""A CDC consumer as a user would write one, from the published files only (docs/cdc.md, the
README's consumer example): read the streams description, then each stream's log rows in
``(cdc$time, cdc$batch_seq_no)`` order, and apply them to a copy of the table.

Rows are applied as Scylla writes: ``cdc$operation`` 2 (insert) writes the row marker and
the columns it lists, 1 (update) only the columns, 3 and 4 remove the row; a column is
listed when it holds a value or ``cdc$deleted_<col>`` is true (written null). A value or
marker written with ``cdc$ttl`` expires ``ttl`` seconds after its write time. A reader
sees a row while its marker or one of its values lives. Pre- and post-images (0, 9) are
checked against the copy instead of applied: a pre-image must be the row as it stood, a
post-image the row as the change left it.
"""

from __future__ import annotations

import math
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

UUID_EPOCH_OFFSET = 0x01B21DD213814000


def time_order(text: str) -> tuple[int, tuple[int, ...]]:
    """How Cassandra and Scylla order timeuuids: by time, then by the other 8 bytes
    compared as signed bytes."""
    u = uuid.UUID(text)
    assert u.version == 1, text
    return u.time, tuple(b - 256 if b > 127 else b for b in u.bytes[8:])


def micros(text: str) -> int:
    return (uuid.UUID(text).time - UUID_EPOCH_OFFSET) // 10


@dataclass
class Row:
    marker: float | None = None  # expiry in seconds (inf: none); None: no marker
    cells: dict[str, tuple[Any, float]] = field(default_factory=dict)

    def seen(self, at_s: float, columns: list[str]) -> dict[str, Any] | None:
        live = {c: v for c, (v, exp) in self.cells.items() if v is not None and exp > at_s}
        if not live and not (self.marker is not None and self.marker > at_s):
            return None
        return {c: live.get(c) for c in columns}


class Consumer:
    """The copy of one table a consumer keeps, key -> :class:`Row`."""

    def __init__(self, key: list[str], columns: list[str]):
        self.key = key
        self.values = [c for c in columns if c not in key]
        self.rows: dict[tuple, Row] = {}
        self.applied = 0

    def seed(self, snapshot: list[dict[str, Any]]) -> None:
        """Start from a published snapshot: every row has a marker, no TTL known."""
        self.rows = {
            tuple(r[k] for k in self.key): Row(
                math.inf, {c: (r.get(c), math.inf) for c in self.values}
            )
            for r in snapshot
        }

    def view(self, now_us: int) -> dict[tuple, dict[str, Any]]:
        out = {}
        for k, row in self.rows.items():
            seen = row.seen(now_us // 1_000_000, self.values)
            if seen is not None:
                out[k] = {**dict(zip(self.key, k, strict=True)), **seen}
        return out

    def apply_log(self, rows: list[dict[str, Any]], check_images: bool = True) -> None:
        streams: dict[bytes, list[dict[str, Any]]] = defaultdict(list)
        for r in rows:
            streams[r["cdc$stream_id"]].append(r)
        for entries in streams.values():
            entries.sort(key=lambda r: (time_order(r["cdc$time"]), r["cdc$batch_seq_no"]))
        # an older generation's streams are read to their end before a newer one's (a
        # consumer's order across generations; rows come in no order of their own)
        for entries in sorted(streams.values(), key=lambda e: time_order(e[0]["cdc$time"])):
            for r in entries:
                self.apply(r, check_images)

    def apply(self, r: dict[str, Any], check_images: bool) -> None:
        op = r["cdc$operation"]
        k = tuple(r[c] for c in self.key)
        at_s = micros(r["cdc$time"]) // 1_000_000
        if op in (0, 9):
            if check_images:
                row = self.rows.get(k)
                have = row.seen(at_s, self.values) if row else None
                want = {c: r[c] for c in self.values}
                what = "pre-image" if op == 0 else "post-image"
                assert have == want, f"{what} of {k} at {r['cdc$time']}: {want}, copy has {have}"
            return
        self.applied += 1
        if op in (3, 4):
            self.rows.pop(k, None)
            return
        assert op in (1, 2), op
        ttl = r["cdc$ttl"]
        expiry = at_s + ttl if ttl else math.inf
        row = self.rows.setdefault(k, Row())
        if op == 2:
            row.marker = expiry
        for c in self.values:
            if r[c] is not None:
                row.cells[c] = (r[c], expiry)
            elif r.get(f"cdc$deleted_{c}"):
                row.cells[c] = (None, math.inf)
