"""The canonical event record, typed and guarded, in pure Python (docs/adapters.md;
docs/rules.md#conflict-types, docs/rules.md#fine-points): a :class:`Typer` turns one
exported record into one typed copy, with the reason and detail of the first guard that
quarantines it. It runs where the records are read: in the Spark task that fetches an
export file, and in the Arrow batches of an adapter's output (``pipeline.ingest.copies``).
Nothing downstream parses JSON again.

How values are read: the record's scalars are taken as their JSON text
(``pipeline.rules.jsontext``), and each column's type reads that text
(``pipeline.rules.readers``). A text that does not read as the column's type is
``malformed``, with a message that quotes it.

The guards are ``Typer._verdict``'s, in the order of docs/rules.md#fine-points: the first
that matches is the copy's reason."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

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
    SEQ,
    TS,
    TTL,
    TXID,
)
from pipeline.core.config import Config, Table
from pipeline.core.policy import REPAIR_ORIGIN, Granularity, QuarantineReason
from pipeline.rules.jsontext import NotAnObject, NotJson, TextMap, object_of, parse_json, text_of
from pipeline.rules.readers import LONG_READER, event_ts_micros, reader, whole_seconds

#: docs/adapters.md#snapshot-reads: a replica's copy of a row as a snapshot read it (a
#: CDC tool's initial or re-snapshot, Debezium's ``op: r``): never a write; it seeds a
#: table that starts empty, and is otherwise counted (fate ``read``)
READ = "READ"
#: the ops of a canonical record
OPS = ("INSERT", "UPDATE", "DELETE", "TRUNCATE", READ)
ROW_OPS = ("INSERT", "UPDATE", "DELETE")
#: Scylla's and Cassandra's largest TTL (20 years)
MAX_TTL = 630_720_000
_OBJECTS = (KEY, "new_key", AFTER, BEFORE)

# ---------------------------------------------------------------------- the typed copy


@dataclass(frozen=True)
class TypingSpec:
    """What typing a table's records needs (picklable: it goes to the Spark tasks)."""

    table: Table
    replicas: tuple[str, ...]  # config order (docs/rules.md#fine-points)
    ranks: Mapping[str, int]  # tie ranks of the table's tie-break
    now_us: int
    max_clock_skew_seconds: int
    gc_grace_seconds: int

    @classmethod
    def of(cls, config: Config, table: Table, now_us: int) -> TypingSpec:
        return cls(
            table,
            config.replica_ids,
            config.tie_ranks(table.tie_break),
            now_us,
            config.max_clock_skew_seconds,
            config.gc_grace_seconds,
        )


def _quote(v: str | None) -> str:
    return "'null'" if v is None else f"'{v}'"


Verdict = tuple[str | None, str | None]  # the reason (a QuarantineReason's value), its detail


class Typer:
    """Types and guards the records of one table: its names, types and readers worked out
    once (a task types thousands of records with one)."""

    def __init__(self, spec: TypingSpec):
        t = spec.table
        self.spec = spec
        self.cols = t.column_names
        self.names = frozenset(self.cols)
        self.key = t.key
        self.types = {c.name: str(c.type) for c in t.columns}
        self.readers = {c.name: reader(c.type) for c in t.columns}
        self.rules = [
            (c, "a delta column" if c in t.delta else "a NOT NULL column")
            for c in sorted(t.not_null | t.delta)
        ]
        self.delta = sorted(t.delta)
        self.ignore_nulls = t.ignore_nulls
        self.order_by = t.order_by
        self.cell = t.granularity is Granularity.CELL
        self.ranks = spec.ranks
        self.prefs = {r: i for i, r in enumerate(spec.replicas)}
        self.future = spec.now_us + spec.max_clock_skew_seconds * 1_000_000
        self.stale = spec.now_us - spec.gc_grace_seconds * 1_000_000
        self.empty = dict.fromkeys(self.cols)
        #: docs/configuration.md#column-names: exported name -> published name
        self.renamed = dict(t.renamed)
        self._taken = frozenset(self.renamed.values()) - frozenset(self.renamed)

    def line(self, line: str, replica: str) -> dict[str, Any]:
        """A JSONL line as a typed copy; a line that is not a JSON object is malformed."""
        try:
            fields = parse_json(line)
        except NotJson as e:
            return self.malformed_line(line, replica, f"not a JSON object: {e}")
        except ValueError:
            fields = None
        if not isinstance(fields, dict):
            return self.malformed_line(line, replica, "not a JSON object")
        source = line
        if fields.get("_source") is not None:  # an adapter's record: as exported
            try:
                source = text_of(fields["_source"]) or line
            except RecursionError:
                return self.malformed_line(line, replica, "not a JSON object: nested too deep")
        return self.record(fields, source, replica)

    def _typed(self, m: TextMap | None) -> dict[str, Any]:
        """An object's members read by their columns' types (None: absent, null, or not
        read)."""
        if m is None:
            return self.empty
        readers = self.readers
        return {c: (None if (v := m.get(c)) is None else readers[c](v)) for c in self.cols}

    def record(self, fields: dict[str, Any], source: str, replica: str) -> dict[str, Any]:
        """One exported record (its parsed JSON object) as a typed copy
        (``frames.copy_schema``): its fields read, its key, row images and TTL typed, and
        the guard that quarantines it, if any. ``source`` is the text kept for the
        quarantine (``raw``), when the copy is quarantined. A value nested too deep for
        Python to walk makes the record malformed: no record stops a night."""
        try:
            return self._record(fields, source, replica)
        except RecursionError:
            return self.malformed_line(source, replica, "not a JSON object: nested too deep")

    def _published(self, m: TextMap | None) -> TextMap | None:
        """An object's members by their columns' published names
        (docs/configuration.md#column-names); a member the table does not have that
        bears a published name is kept apart, as an unknown column."""
        if m is None or not self.renamed:
            return m
        return {
            self.renamed.get(k) or (f"{k} (as exported)" if k in self._taken else k): v
            for k, v in m.items()
        }

    def _record(self, fields: dict[str, Any], source: str, replica: str) -> dict[str, Any]:
        maps, whys = {}, {}
        for n in _OBJECTS:
            m = object_of(fields.get(n))
            maps[n] = None if isinstance(m, NotAnObject) else self._published(m)
            if isinstance(m, NotAnObject) and m.why:  # named in the detail
                whys[f"{n} is not a JSON object"] = f"{n} is not a JSON object: {m.why}"
        op, origin = text_of(fields.get(OP)), text_of(fields.get(ORIGIN))
        after = maps[AFTER]
        if op == "UPDATE" and after and self.ignore_nulls:  # docs/rules.md#ignore-null-updates
            maps[AFTER] = {
                c: v for c, v in after.items() if v is not None or c not in self.ignore_nulls
            }
        typed = {n: self._typed(maps[n]) for n in _OBJECTS}
        ts_text, seq_text = text_of(fields.get(TS)), text_of(fields.get(SEQ))
        ts = event_ts_micros(ts_text)
        seq = None if seq_text is None else LONG_READER(seq_text)
        pos_text = text_of(fields.get(POS))
        pos = None if pos_text is None else LONG_READER(pos_text)
        eid = text_of(fields.get(EVENT_ID)) or None
        reason, detail = self._verdict(
            fields, maps, typed, eid, op, origin, ts_text, ts, seq_text, seq
        )
        if pos_text is not None and pos is None and reason != QuarantineReason.MALFORMED.value:
            reason = QuarantineReason.MALFORMED.value
            detail = f"pos {_quote(pos_text)} is not an integer"
        detail = whys.get(detail or "", detail)
        after, before = maps[AFTER], maps[BEFORE]
        # docs/rules.md#cell-rules: a ttl of 0 is none
        ttl = whole_seconds(text_of(fields.get(TTL))) or None
        expiry = None
        if ttl is not None:
            expiry = whole_seconds(text_of(fields.get(EXPIRY)))
            if expiry is None and ts is not None:
                expiry = ts // 1_000_000 + ttl
        return {
            EVENT_ID: eid,
            OP: op,
            ORIGIN: origin,
            SEQ: seq,
            POS: pos,
            "pref": self._pref(replica, origin),
            RANK: self.ranks.get(origin) if origin is not None else None,
            TXID: text_of(fields.get(TXID)),
            TS: ts,
            KEY: self._key(maps[KEY], typed[KEY]),
            "new_key": self._key(maps["new_key"], typed["new_key"]),
            AFTER: typed[AFTER],
            "after_has": [after is not None and c in after for c in self.cols],
            BEFORE: typed[BEFORE],
            "before_has": [before is not None and c in before for c in self.cols],
            "extra_cols": self._unknown(after, before),
            TTL: ttl,
            EXPIRY: expiry,
            "reason": reason,
            "detail": detail,
            "raw": source if reason is not None else None,
        }

    def _key(self, m: TextMap | None, typed: dict[str, Any]) -> dict[str, Any] | None:
        """The typed key (or new key), when every one of its columns reads."""
        if m is None:
            return None
        key = {c: typed[c] for c in self.key}
        return key if all(v is not None for v in key.values()) else None

    def _unknown(self, after: TextMap | None, before: TextMap | None) -> list[str]:
        """The images' columns the table does not have, first seen first."""
        extra: list[str] = []
        for m in (after, before):
            for c in m or ():
                if c not in self.names and c not in extra:
                    extra.append(c)
        return extra

    def _pref(self, replica: str, origin: str | None) -> int:
        """docs/rules.md#fine-points: the origin's own copy first (-1), then the
        replicas in config order."""
        if origin is not None and replica == origin:
            return -1
        return self.prefs.get(replica, len(self.prefs))

    # ------------------------------------------------------------------ the guards

    def _verdict(
        self,
        fields: dict[str, Any],
        maps: dict[str, TextMap | None],
        typed: dict[str, dict[str, Any]],
        eid: str | None,
        op: str | None,
        origin: str | None,
        ts_text: str | None,
        ts: int | None,
        seq_text: str | None,
        seq: int | None,
    ) -> Verdict:
        """The guards of docs/rules.md#conflict-types in the order of
        docs/rules.md#fine-points: malformed (the record's own fields, then
        its key, new key and images), future_timestamp, stale_beyond_gc_grace,
        delta_without_old_value. The first that matches is the reason."""
        detail = _record_problem(fields, eid, op, origin, self.ranks, ts_text, ts, seq_text, seq)
        if detail is None and origin == REPAIR_ORIGIN:
            return None, None  # a repair is counted, never resolved: no event's guard applies
        if detail is None:  # a read is shaped as an INSERT: a key and the whole row
            detail = self._row_problem(fields, maps, typed, "INSERT" if op == READ else op)
        if detail is not None:
            return QuarantineReason.MALFORMED.value, detail
        assert ts is not None
        spec = self.spec
        if ts > self.future:
            skew = spec.max_clock_skew_seconds
            detail = f"ts is more than max_clock_skew_seconds={skew} after the run's clock"
            return QuarantineReason.FUTURE_TIMESTAMP.value, detail
        if ts < self.stale:
            grace = spec.gc_grace_seconds
            detail = f"ts is older than gc_grace_seconds={grace} before the run's clock"
            return QuarantineReason.STALE_BEYOND_GC_GRACE.value, detail
        after, before = maps[AFTER] or {}, maps[BEFORE] or {}
        if op == "UPDATE" and any(c in after and before.get(c) is None for c in self.delta):
            detail = "no old value (before) for a changed delta column"
            return QuarantineReason.DELTA_WITHOUT_OLD_VALUE.value, detail
        return None, None

    def _row_problem(
        self,
        fields: dict[str, Any],
        maps: dict[str, TextMap | None],
        typed: dict[str, dict[str, Any]],
        op: str | None,
    ) -> str | None:
        """The key, the new key and the row images, read by the table's types."""
        detail = self._keys_problem(fields, maps, typed, op)
        return detail if detail is not None else self._images_problem(fields, maps, typed, op)

    def _keys_problem(
        self,
        fields: dict[str, Any],
        maps: dict[str, TextMap | None],
        typed: dict[str, dict[str, Any]],
        op: str | None,
    ) -> str | None:
        if op in ROW_OPS:
            if fields.get(KEY) is None:
                return "no key"
            if maps[KEY] is None:
                return "key is not a JSON object"
            if (d := self._key_problem(maps[KEY], typed[KEY], KEY)) is not None:
                return d
        nk_given = fields.get("new_key") is not None
        if op != "UPDATE" and nk_given:
            return f"new_key on {_quote(op)} (only an UPDATE changes a key)"
        nk = maps["new_key"]
        if nk_given and nk is None:
            return "new_key is not a JSON object"
        if nk is not None and (d := self._key_problem(nk, typed["new_key"], "new_key")):
            return d
        return None

    def _images_problem(
        self,
        fields: dict[str, Any],
        maps: dict[str, TextMap | None],
        typed: dict[str, dict[str, Any]],
        op: str | None,
    ) -> str | None:
        if self.cell and (d := self._cell_problem(fields, maps)) is not None:
            return d
        after, before = maps[AFTER], maps[BEFORE]
        if op == "INSERT" and fields.get(AFTER) is None and not self.cell:
            return "INSERT without after"
        if fields.get(AFTER) is not None and after is None:
            return "after is not a JSON object"
        if fields.get(BEFORE) is not None and before is None:
            return "before is not a JSON object"
        if op != "DELETE" and after and (d := self._value_problem(after, typed[AFTER], AFTER)):
            return d
        if before and (d := self._value_problem(before, typed[BEFORE], BEFORE)):
            return d
        writes = op in ("INSERT", "UPDATE") and after is not None
        if writes and (d := self._value_rules(maps, typed)) is not None:
            return d
        return self._order_problem(typed, op)

    def _order_problem(self, typed: dict[str, dict[str, Any]], op: str | None) -> str | None:
        """docs/rules.md#order-by-a-column: with ``order_by``, an INSERT or UPDATE carries
        the order value in ``after``, a DELETE in ``before``."""
        col = self.order_by
        if col is None or op not in ROW_OPS:
            return None
        image = BEFORE if op == "DELETE" else AFTER
        if typed[image][col] is None:
            return f"no order_by value ({image}.{col} is missing or null)"
        return None

    def _key_problem(self, m: TextMap, typed: dict[str, Any], name: str) -> str | None:
        if len(m) != len(self.key) or any(c not in m for c in self.key):
            cols = ", ".join(self.key)
            return f"{name} has columns [{', '.join(sorted(m))}]; the table's key is [{cols}]"
        for c in self.key:
            if m.get(c) is None:
                return f"{name}.{c} is null"
            if typed[c] is None:
                return f"{name}.{c}: {_quote(m[c])} is not {self.types[c]}"
        return None

    def _value_problem(self, m: TextMap, typed: dict[str, Any], name: str) -> str | None:
        for c in self.cols:
            if m.get(c) is not None and typed[c] is None:
                return f"{name}.{c}: {_quote(m[c])} is not {self.types[c]}"
        return None

    def _value_rules(
        self, maps: dict[str, TextMap | None], typed: dict[str, dict[str, Any]]
    ) -> str | None:
        """The values against the key and the column rules (NOT NULL, delta)."""
        after = maps[AFTER] or {}
        key, new_key = maps[KEY] or {}, maps["new_key"] or {}
        for c in self.key:
            value, target = typed[AFTER][c], typed["new_key"][c]
            if target is None:
                target = typed[KEY][c]
            if c in after and value is not None and target is not None and value != target:
                given = new_key.get(c) if new_key.get(c) is not None else key.get(c)
                return f"after.{c} = {_quote(after.get(c))} contradicts the key {_quote(given)}"
        for c, what in self.rules:
            if c in after and after[c] is None:
                return f"after.{c} is null in {what}"
        return None

    def _cell_problem(self, fields: dict[str, Any], maps: dict[str, TextMap | None]) -> str | None:
        """Malformed for a cell table (docs/rules.md#fine-points): a ``new_key``, a
        column the table does not
        have, a ``ttl`` that is not 0..20 years in whole seconds, an ``expiry`` without a
        ttl or not in whole seconds."""
        if fields.get("new_key") is not None:
            return "new_key on a cell-granularity table (a key never changes)"
        for image in (AFTER, BEFORE):  # the image is named: docs/exports.md's field paths
            if unknown := self._unknown(maps[image], None):
                return (
                    f"{image} has unknown column(s) [{', '.join(sorted(unknown))}] (a "
                    "cell-granularity table has no source_column_extra)"
                )
        ttl, expiry = text_of(fields.get(TTL)), text_of(fields.get(EXPIRY))
        ttl_s = whole_seconds(ttl)
        if ttl is not None and not (ttl_s is not None and ttl_s <= MAX_TTL):
            return f"ttl {_quote(ttl)} is not whole seconds 0..{MAX_TTL}"
        if expiry is not None and whole_seconds(expiry) is None:
            return f"expiry {_quote(expiry)} is not whole seconds"
        if expiry is not None and not ttl_s:
            return "expiry without a ttl"
        return None

    def malformed_line(self, source: str, replica: str, detail: str) -> dict[str, Any]:
        """A line that is no record (not a JSON object, not UTF-8), kept whole."""
        n = len(self.cols)
        return {
            EVENT_ID: None,
            OP: None,
            ORIGIN: None,
            SEQ: None,
            POS: None,
            "pref": self._pref(replica, None),
            RANK: None,
            TXID: None,
            TS: None,
            KEY: None,
            "new_key": None,
            AFTER: self.empty,
            "after_has": [False] * n,
            BEFORE: self.empty,
            "before_has": [False] * n,
            "extra_cols": [],
            TTL: None,
            EXPIRY: None,
            "reason": QuarantineReason.MALFORMED.value,
            "detail": detail,
            "raw": source,
        }


def _why_not_json(malformed: str, source: Any) -> str:
    """An adapter's record its JSON reader (Spark's) did not read: what the guards' reader
    says of it (a name given twice, named; nested too deep; a lone surrogate), if more."""
    if not malformed.endswith("not JSON") or not isinstance(source, str):
        return ""
    try:
        parse_json(source)
    except NotJson as e:
        return f": {e}"
    except ValueError:
        return ""
    return ": Spark's JSON reader refused it, though it is JSON (a number beyond its range?)"


def _record_problem(
    fields: dict[str, Any],
    eid: str | None,
    op: str | None,
    origin: str | None,
    ranks: Mapping[str, int],
    ts_text: str | None,
    ts: int | None,
    seq_text: str | None,
    seq: int | None,
) -> str | None:
    """The record's own fields, first of the guards (docs/rules.md#fine-points)."""
    malformed = text_of(fields.get("_malformed"))
    if malformed is not None:
        return malformed + _why_not_json(malformed, fields.get("_source"))
    if eid is None:
        return "no event_id"
    if op not in OPS:
        return f"unknown op {_quote(op)}"
    if origin is None:
        return "no origin"
    if origin not in ranks and origin != REPAIR_ORIGIN:
        return f"origin {_quote(origin)} is not a configured replica"
    if ts_text is None:
        return "no ts"
    if ts is None:
        return f"ts {_quote(ts_text)} is neither µs since the epoch nor RFC 3339 with a UTC offset"
    if seq_text is None:
        return "no seq"
    if seq is None:
        return f"seq {_quote(seq_text)} is not an integer"
    return None
