"""Blocks of exported JSONL lines typed at once by Arrow's JSON reader: the fast path of
:class:`pipeline.rules.guards.Typer` for the records that are certainly clean.

A line is typed here only when the block shows that ``Typer.line`` would accept it whole
and read the same values from it:

- it is one JSON object on one line (it starts with ``{`` and ends with ``}``, and Arrow
  reads one row from it) and holds no ``null`` anywhere, so that a member of ``after`` or
  ``before`` is present exactly when Arrow reads a value for it;
- Arrow reads it with the canonical record's fields only, each value as its column's type
  (a field the record does not name, a member the table does not have, a value of another
  JSON type, a number out of its type's range or with more decimals than its scale: the
  block does not read, and it is split until the lines that do not read are found);
- and none of the rules of docs/rules.md#conflict-types and docs/rules.md#fine-points
matches: the record's own fields, its key and new
  key, its values against the key, the cell rules, then future_timestamp,
  stale_beyond_gc_grace and delta_without_old_value.

Every other line is typed by ``Typer.line``, which gives the quarantine reason and its
detail: the rules' messages have one home. ``tests/unit/test_blocks.py`` holds the two paths to
the same typed copies, on generated and on mangled records.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from pipeline.core.columns import (
    AFTER,
    BEFORE,
    EVENT_ID,
    EXPIRY,
    KEY,
    OP,
    ORIGIN,
    POS,
    RANK,
    REPLICA,
    SEQ,
    TS,
    TTL,
    TXID,
)
from pipeline.core.config import Table
from pipeline.core.kinds import KINDS, Kind
from pipeline.core.policy import Granularity
from pipeline.rules.guards import MAX_TTL, READ, ROW_OPS, Typer
from pipeline.rules.readers import reader

#: lines per block given to Arrow's reader (a block that does not read is halved)
BLOCK = 16384
#: below this many lines a block that does not read is typed line by line
_SMALLEST = 16
#: the kinds Arrow's JSON reader reads itself, exactly as the guards' readers do; the
#: others are read as JSON strings, then by the guards' reader of their type
_ARROW_KINDS = tuple(k for k, row in KINDS.items() if row.arrow_json)
_WHOLE_SECONDS = 10**12  # readers.whole_seconds: at most 12 digits


def _parse_type(kind: Kind, target: pa.DataType) -> pa.DataType:
    return target if kind in _ARROW_KINDS else pa.string()


class BlockTyper:
    """Types the clean lines of a block at once (see the module's docstring); the copies'
    Arrow schema is ``copy_schema``'s (``pipeline.ingest.copies.arrow_schema``)."""

    def __init__(self, typer: Typer, schema: pa.Schema):
        self.typer, self.schema = typer, schema
        t: Table = typer.spec.table
        self.table = t
        self.cell = t.granularity is Granularity.CELL
        row_type: pa.StructType = schema.field(AFTER).type
        key_type: pa.StructType = schema.field(KEY).type
        self.row_type, self.key_type = row_type, key_type
        kinds = {c.name: c.type.kind for c in t.columns}
        #: docs/configuration.md#column-names: each column as the exports name it
        self.exported = {c.name: c.exported for c in t.columns}
        #: per column: its type as Arrow reads it, and the guards' reader when Arrow reads text
        self.readers: dict[str, Callable[[str], Any] | None] = {
            c.name: None if c.type.kind in _ARROW_KINDS else reader(c.type) for c in t.columns
        }

        def parsed(struct: pa.StructType) -> pa.StructType:
            return pa.struct(
                [
                    pa.field(self.exported[f.name], _parse_type(kinds[f.name], f.type))
                    for f in struct
                ]
            )

        self.read_schema = pa.schema(
            [
                (OP, pa.string()),
                (KEY, parsed(key_type)),
                ("new_key", parsed(key_type)),
                (AFTER, parsed(row_type)),
                (BEFORE, parsed(row_type)),
                (TS, pa.int64()),
                (ORIGIN, pa.string()),
                (EVENT_ID, pa.string()),
                (TXID, pa.string()),
                (SEQ, pa.int64()),
                (POS, pa.int64()),
                (TTL, pa.int64()),
                (EXPIRY, pa.int64()),
            ]
        )
        self.options = pj.ParseOptions(
            explicit_schema=self.read_schema, unexpected_field_behavior="error"
        )
        self.origins = pa.array(sorted(typer.ranks), pa.string())
        self.origin_ranks = pa.array([typer.ranks[o] for o in sorted(typer.ranks)], pa.int32())

    # ------------------------------------------------------------------ reading

    def split(
        self, numbered: list[tuple[int, bytes]], replica: str, file: str
    ) -> tuple[pa.Table | None, list[tuple[int, bytes]]]:
        """The clean lines of ``numbered`` (line number, text) of ``replica``'s export file
        ``file`` as typed copies; and the lines left for ``Typer.line``, in their
        order."""
        eligible: list[tuple[int, bytes]] = []
        rest: list[tuple[int, bytes]] = []
        for item in numbered:
            text = item[1]
            if text[:1] == b"{" and text[-1:] == b"}" and b"null" not in text:
                eligible.append(item)
            else:
                rest.append(item)
        parts: list[pa.Table] = []
        for start in range(0, len(eligible), BLOCK):
            self._read(eligible[start : start + BLOCK], (replica, file), parts, rest)
        if rest:
            rest.sort(key=lambda x: x[0])
        return (pa.concat_tables(parts) if parts else None), rest

    def _read(
        self,
        block: list[tuple[int, bytes]],
        source: tuple[str, str],
        parts: list[pa.Table],
        rest: list[tuple[int, bytes]],
    ) -> None:
        """Read ``block`` with Arrow; halve it while it does not read."""
        if not block:
            return
        try:
            data = pj.read_json(
                io.BytesIO(b"\n".join(t for _, t in block)),
                read_options=pj.ReadOptions(use_threads=False, block_size=64 << 20),
                parse_options=self.options,
            )
        except (pa.ArrowInvalid, UnicodeDecodeError):
            data = None
        if data is None or data.num_rows != len(block):
            if len(block) <= _SMALLEST:
                rest.extend(block)
                return
            half = len(block) // 2
            self._read(block[:half], source, parts, rest)
            self._read(block[half:], source, parts, rest)
            return
        numbers = pa.array([n for n, _ in block], pa.int64())
        typed, clean = self._typed(data, source, numbers)
        mask = np.asarray(clean)
        if not mask.all():
            rest.extend(item for item, ok in zip(block, mask.tolist(), strict=True) if not ok)
        if mask.any():
            parts.append(typed.filter(pa.array(mask)))

    # ------------------------------------------------------------------ typing

    def _values(self, struct: pa.StructArray, target: pa.StructType) -> tuple[list, np.ndarray]:
        """The struct's members as their columns' types, and per row whether every member
        given reads (a text read by a guards' reader that gives None does not)."""
        n = len(struct)
        reads = np.ones(n, dtype=bool)
        children = []
        given = pc.is_valid(struct)
        for f in target:
            # a member of an absent object is absent (whatever Arrow keeps under its null)
            child = pc.struct_field(struct, self.exported[f.name])
            child = pc.if_else(given, child, pa.scalar(None, child.type))
            read = self.readers[f.name]
            if read is not None:
                texts = child.to_pylist()
                values = [None if v is None else read(v) for v in texts]
                reads &= np.array(
                    [v is None or x is not None for v, x in zip(texts, values, strict=True)],
                    dtype=bool,
                )
                child = pa.array(values, f.type)
            elif pa.types.is_decimal(f.type):  # Arrow lets one digit too many through
                reads &= self._fits(child, f.type)
            children.append(child.cast(f.type))
        return children, reads

    def _typed(
        self, data: pa.Table, source: tuple[str, str], numbers: pa.Array
    ) -> tuple[pa.Table, np.ndarray]:
        """The block's rows as typed copies, and per row whether it is clean."""
        col = {name: data.column(name).combine_chunks() for name in data.column_names}
        key, key_reads = self._values(col[KEY], self.key_type)
        new_key, new_key_reads = self._values(col["new_key"], self.key_type)
        after, after_reads = self._values(col[AFTER], self.row_type)
        before, before_reads = self._values(col[BEFORE], self.row_type)
        key_ok = np.asarray(pc.is_valid(col[KEY]))
        for v in key:
            key_ok &= np.asarray(pc.is_valid(v))
        images = _Images(
            key,
            new_key,
            after,
            before,
            reads=key_reads & new_key_reads & after_reads & before_reads,
            key_ok=key_ok,
            new_key_given=np.asarray(pc.is_valid(col["new_key"])),
            after_has=self._has(col[AFTER], after),
            before_has=self._has(col[BEFORE], before),
        )
        return self._columns(col, images, source, numbers), self._clean(col, images)

    def _clean(self, col: dict[str, pa.Array], im: _Images) -> np.ndarray:
        """Per row: no rule of
        docs/rules.md#conflict-types/docs/rules.md#fine-points matches (see the
        module's docstring)."""
        typer, op, ts = self.typer, col[OP], col[TS]
        ok = im.reads & im.key_ok
        for cond in (
            pc.greater(pc.utf8_length(col[EVENT_ID]), 0),
            pc.is_in(op, pa.array([*ROW_OPS, READ])),
            pc.is_in(col[ORIGIN], self.origins),
            pc.is_valid(col[SEQ]),
            pc.less_equal(ts, typer.future),
            pc.greater_equal(ts, typer.stale),
        ):
            ok &= np.asarray(pc.fill_null(cond, False))
        nk_given = im.new_key_given
        is_update = np.asarray(pc.fill_null(pc.equal(op, "UPDATE"), False))
        if self.cell:
            ok &= ~nk_given & self._cell_rules(col[TTL], col[EXPIRY])
        else:
            ok &= ~nk_given | is_update
            is_insert = np.asarray(pc.fill_null(pc.is_in(op, pa.array(["INSERT", READ])), False))
            ok &= ~is_insert | np.asarray(pc.is_valid(col[AFTER]))
        nk_full = nk_given.copy()
        for v in im.new_key:
            nk_full &= np.asarray(pc.is_valid(v))
        ok &= ~nk_given | nk_full
        ok &= self._agrees_with_key(op, im.key, im.new_key, im.after, nk_given)
        ok &= self._delta_old_values(is_update, im.after_has, im.before_has)
        ok &= self._order_values(op, im.after_has, im.before_has)
        return ok

    def _columns(
        self, col: dict[str, pa.Array], im: _Images, source: tuple[str, str], numbers: pa.Array
    ) -> pa.Table:
        """The typed copies (``frames.copy_schema``) of the block's rows."""
        n, (replica, file), origin = len(numbers), source, col[ORIGIN]
        prefs = self.typer.prefs
        ttl, expiry = self._ttl(col[TTL], col[EXPIRY], col[TS])
        null_s = pa.nulls(n, pa.string())
        ncols = len(self.row_type)
        arrays = {
            REPLICA: pa.repeat(pa.scalar(replica, pa.string()), n),
            "file": pa.repeat(pa.scalar(file, pa.string()), n),
            "line": numbers,
            "pref": pc.if_else(
                pc.fill_null(pc.equal(origin, replica), False),
                pa.scalar(-1, pa.int32()),
                pa.scalar(prefs.get(replica, len(prefs)), pa.int32()),
            ),
            RANK: pc.take(self.origin_ranks, pc.fill_null(pc.index_in(origin, self.origins), 0)),
            KEY: self._struct(im.key, self.key_type, im.key_ok),
            "new_key": self._struct(im.new_key, self.key_type, im.new_key_given),
            AFTER: self._struct(im.after, self.row_type, None),
            "after_has": _flags(im.after_has, n, ncols),
            BEFORE: self._struct(im.before, self.row_type, None),
            "before_has": _flags(im.before_has, n, ncols),
            "extra_cols": pa.ListArray.from_arrays(
                pa.array(np.zeros(n + 1, dtype=np.int32)), pa.array([], pa.string())
            ),
            TTL: ttl,
            EXPIRY: expiry,
            "reason": null_s,
            "detail": null_s,
            "raw": null_s,
        }
        for name in (EVENT_ID, OP, ORIGIN, SEQ, POS, TXID, TS):
            arrays[name] = col[name]
        return pa.Table.from_arrays(
            [arrays[f.name].cast(f.type) for f in self.schema], schema=self.schema
        )

    @staticmethod
    def _fits(values: pa.Array, t: pa.Decimal128Type) -> np.ndarray:
        """A decimal's value within its precision (guards: ``abs(v) < 10**(p - s)``)."""
        wide = pa.decimal128(38, t.scale)
        limit = pa.scalar(Decimal(10) ** (t.precision - t.scale), wide)
        inside = pc.less(pc.abs(values.cast(wide)), limit)
        return np.asarray(pc.fill_null(inside, True))

    @staticmethod
    def _struct(children: list, target: pa.StructType, valid: np.ndarray | None) -> pa.Array:
        mask = None if valid is None else pa.array(~valid)
        return pa.StructArray.from_arrays(children, fields=list(target), mask=mask)

    @staticmethod
    def _has(struct: pa.StructArray, values: list) -> np.ndarray:
        """(rows, columns): the member is given (a clean line holds no null: a member is
        given exactly when it has a value)."""
        given = np.asarray(pc.is_valid(struct))
        return np.stack([given & np.asarray(pc.is_valid(v)) for v in values], axis=1).reshape(
            len(struct), len(values)
        )

    def _agrees_with_key(
        self, op: pa.Array, key: list, new_key: list, after: list, nk_given: np.ndarray
    ) -> np.ndarray:
        """guards ``_value_rules``: a key column given in ``after`` of an INSERT or UPDATE
        equals the key (the new key, when the event changes it)."""
        n = len(op)
        writes = np.asarray(pc.fill_null(pc.is_in(op, pa.array(["INSERT", "UPDATE", READ])), False))
        ok = np.ones(n, dtype=bool)
        names = [f.name for f in self.row_type]
        for i, c in enumerate(self.table.key):
            value = after[names.index(c)]
            target = pc.if_else(pa.array(nk_given), new_key[i], key[i])
            differs = np.asarray(pc.fill_null(pc.not_equal(value, target), False))
            ok &= ~(writes & differs)
        return ok

    def _delta_old_values(
        self, is_update: np.ndarray, after_has: np.ndarray, before_has: np.ndarray
    ) -> np.ndarray:
        """docs/rules.md#conflict-types delta_without_old_value: an UPDATE that changes a
        delta column carries its old value."""
        ok = np.ones(len(is_update), dtype=bool)
        names = [f.name for f in self.row_type]
        for c in self.typer.delta:
            i = names.index(c)
            ok &= ~(is_update & after_has[:, i] & ~before_has[:, i])
        return ok

    def _order_values(
        self, op: pa.Array, after_has: np.ndarray, before_has: np.ndarray
    ) -> np.ndarray:
        """guards ``_order_problem`` (docs/rules.md#order-by-a-column): the ``order_by``
        value is in the ``after`` of an INSERT or UPDATE, the ``before`` of a DELETE."""
        col = self.typer.order_by
        if col is None:
            return np.ones(len(op), dtype=bool)
        i = [f.name for f in self.row_type].index(col)
        writes = np.asarray(pc.fill_null(pc.is_in(op, pa.array(["INSERT", "UPDATE", READ])), False))
        deletes = np.asarray(pc.fill_null(pc.equal(op, "DELETE"), False))
        return ~(writes & ~after_has[:, i]) & ~(deletes & ~before_has[:, i])

    def _cell_rules(self, ttl: pa.Array, expiry: pa.Array) -> np.ndarray:
        """guards ``_cell_problem``'s ttl and expiry: whole seconds, a ttl of at most
        ``MAX_TTL``, an expiry only with a ttl."""
        t = np.asarray(pc.fill_null(ttl, -1))
        e = np.asarray(pc.fill_null(expiry, -1))
        t_given, e_given = np.asarray(pc.is_valid(ttl)), np.asarray(pc.is_valid(expiry))
        ok = ~t_given | ((t >= 0) & (t <= MAX_TTL))
        ok &= ~e_given | ((e >= 0) & (e < _WHOLE_SECONDS) & t_given & (t > 0))
        return ok

    @staticmethod
    def _ttl(ttl: pa.Array, expiry: pa.Array, ts: pa.Array) -> tuple[pa.Array, pa.Array]:
        """guards ``Typer.record``: a ttl of whole seconds (0 is none), its expiry as given
        or ``floor(ts / 1e6) + ttl``."""
        t = np.asarray(pc.fill_null(ttl, 0))
        has_ttl = (t >= 1) & (t < _WHOLE_SECONDS)
        e = np.asarray(pc.fill_null(expiry, -1))
        e_ok = (e >= 0) & (e < _WHOLE_SECONDS)
        tsv = np.asarray(pc.fill_null(ts, 0))
        ts_ok = np.asarray(pc.is_valid(ts))
        derived = np.floor_divide(tsv, 1_000_000) + t
        exp = np.where(e_ok, e, derived)
        exp_valid = has_ttl & (e_ok | ts_ok)
        return (
            pa.array(t, pa.int64(), mask=~has_ttl),
            pa.array(exp, pa.int64(), mask=~exp_valid),
        )


@dataclass(frozen=True)
class _Images:
    """A block's key, new key and row images as their columns' types (a list of arrays
    each), with what the checks read of them, per row."""

    key: list
    new_key: list
    after: list
    before: list
    reads: np.ndarray  # every member given reads as its column's type
    key_ok: np.ndarray  # the key is given, with every column
    new_key_given: np.ndarray
    after_has: np.ndarray  # (rows, columns): the member is given
    before_has: np.ndarray


def _flags(has: np.ndarray, n: int, ncols: int) -> pa.Array:
    offsets = pa.array(np.arange(0, (n + 1) * ncols, ncols, dtype=np.int32)[: n + 1])
    return pa.ListArray.from_arrays(offsets, pa.array(has.reshape(-1)))
