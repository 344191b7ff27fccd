"""The canonical event record, typed and guarded, in pure Python (formats.md "The canonical
event record"; semantics.md §3, §12): one function, :func:`type_copy`, turns one exported
record into one typed copy, with the reason and detail of the first guard that quarantines
it. It runs where the records are read: in the Spark task that fetches an export file, and
in the Arrow batches of an adapter's output (``pipeline.copies``). Nothing downstream parses
JSON again.

How values are read: the record's scalars are taken as their JSON text (a number's digits
as written, ``true``/``false``, a string's content, an object's or array's compact JSON),
and each column's type reads that text (:data:`READERS`): a number keeps every digit it was
written with, so a ``decimal(38,10)`` is exact. A text that does not read as the column's
type is ``malformed``, with a message that quotes it.

The guards are :func:`guard_checks`, in the order of §12: the first that matches is the
copy's reason.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import ROUND_HALF_UP, Context, Decimal, InvalidOperation
from typing import Any

from pipeline.config import ColumnType, Config, Kind, Table
from pipeline.policy import Granularity, QuarantineReason

#: the ops of a canonical record
OPS = ("INSERT", "UPDATE", "DELETE", "TRUNCATE")
ROW_OPS = ("INSERT", "UPDATE", "DELETE")
#: Scylla's and Cassandra's largest TTL (20 years)
MAX_TTL = 630_720_000
_OBJECTS = ("key", "new_key", "after", "before")

# ---------------------------------------------------------------------- JSON text


class JsonNumber(str):
    """A JSON number, kept as the text it was written with."""

    __slots__ = ()


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_json(text: str) -> Any:
    """JSON with numbers kept as their text (:class:`JsonNumber`); ``NaN`` and
    ``Infinity`` are not JSON. Raises ValueError."""
    return json.loads(
        text, parse_int=JsonNumber, parse_float=JsonNumber, parse_constant=_no_constant
    )


def _compact(v: Any) -> str:
    if isinstance(v, JsonNumber):
        return str(v)
    if isinstance(v, dict):
        return "{" + ",".join(f"{json.dumps(k)}:{_compact(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ",".join(_compact(x) for x in v) + "]"
    return json.dumps(v, ensure_ascii=False)


def text_of(v: Any) -> str | None:
    """A JSON value as text: a string's content, a number's digits, ``true``/``false``,
    an object or array as compact JSON; None for null."""
    if v is None:
        return None
    if isinstance(v, str):
        return str(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    return _compact(v)


class _NotAnObject:
    """An object field that holds something else (a number, an array, a text that is not
    a JSON object)."""


NOT_AN_OBJECT = _NotAnObject()
TextMap = dict[str, str | None]


def object_of(v: Any) -> TextMap | _NotAnObject | None:
    """An object field as a map of its members' texts; a string that holds a JSON object
    counts as that object (Parquet exports may give objects as JSON text); None when the
    field is absent or null."""
    if v is None:
        return None
    if isinstance(v, str) and not isinstance(v, JsonNumber):
        try:
            v = parse_json(v)
        except ValueError:
            return NOT_AN_OBJECT
    if not isinstance(v, dict):
        return NOT_AN_OBJECT
    return {k: text_of(x) for k, x in v.items()}


# ---------------------------------------------------------------------- reading a type

_INT_RE = re.compile(r"^\s*[+-]?\d+\s*$", re.ASCII)
_NUM_RE = re.compile(r"^\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*$", re.ASCII)
_DOUBLE_WORDS = {"nan": float("nan"), "infinity": float("inf"), "inf": float("inf")}
_DATE_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$", re.ASCII)
_UUID_RE = re.compile(
    r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
)
#: RFC 3339 with its UTC offset (the ``T`` may be a space; ``T`` and ``Z`` in either case)
TS_WITH_OFFSET_RE = re.compile(
    r"^(\d{4}-\d{2}-\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?([Zz]|[+-]\d{2}:\d{2})$",
    re.ASCII,
)
_MICROS_RE = re.compile(r"^-?\d+$", re.ASCII)
_SECONDS_RE = re.compile(r"^\d{1,12}$", re.ASCII)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_LONG = 2**63
_INT = 2**31


def _integer(bound: int) -> Callable[[str], int | None]:
    def read(text: str) -> int | None:
        if not _INT_RE.match(text):
            return None
        v = int(text)
        return v if -bound <= v < bound else None

    return read


def _double(text: str) -> float | None:
    t = text.strip()
    sign = -1.0 if t.startswith("-") else 1.0
    word = _DOUBLE_WORDS.get(t.lstrip("+-").lower()) if t[:1] in "+-" or t[:1].isalpha() else None
    if word is not None and t.count("-") + t.count("+") <= 1:
        return sign * word
    return float(text) if _NUM_RE.match(text) else None


#: enough digits for any decimal(38, s), whatever its exponent
_DECIMALS = Context(prec=80, rounding=ROUND_HALF_UP, Emax=999_999, Emin=-999_999)


def _decimal(ct: ColumnType) -> Callable[[str], Decimal | None]:
    quantum = Decimal(1).scaleb(-ct.scale)
    limit = Decimal(10) ** (ct.precision - ct.scale)

    def read(text: str) -> Decimal | None:
        if not _NUM_RE.match(text):
            return None
        try:
            v = _DECIMALS.quantize(Decimal(text.strip()), quantum)
        except InvalidOperation:
            return None
        return v if abs(v) < limit else None

    return read


def _date(text: str) -> date | None:
    if not _DATE_RE.match(text):
        return None
    try:
        return date.fromisoformat(text)
    except ValueError:
        return None


def rfc3339_micros(text: str) -> int | None:
    """µs since the epoch of an RFC 3339 time with its UTC offset; fractions beyond the
    µs are cut."""
    m = TS_WITH_OFFSET_RE.match(text)
    if not m:
        return None
    day, hh, mm, ss, frac, offset = m.groups()
    try:
        t = datetime.fromisoformat(f"{day}T{hh}:{mm}:{ss}")
    except ValueError:
        return None
    if offset not in ("Z", "z"):
        hours, minutes = int(offset[1:3]), int(offset[4:6])
        if hours > 18 or minutes > 59:
            return None
        sign = 1 if offset[0] == "+" else -1
        t -= sign * timedelta(hours=hours, minutes=minutes)
    micros = int((frac or "").ljust(6, "0")[:6])
    return (t.replace(tzinfo=UTC) - _EPOCH) // timedelta(microseconds=1) + micros


_LONG_READER = _integer(_LONG)


def event_ts_micros(text: str | None) -> int | None:
    """§3/§12: ``ts`` is µs since the epoch or RFC 3339 *with* a UTC offset."""
    if text is None:
        return None
    if _MICROS_RE.match(text):
        return _LONG_READER(text)
    return rfc3339_micros(text)


def _timestamp(text: str) -> datetime | None:
    micros = _LONG_READER(text) if _MICROS_RE.match(text) else rfc3339_micros(text)
    if micros is None:
        return None
    try:
        return _EPOCH + timedelta(microseconds=micros)
    except OverflowError:
        return None


def _binary(text: str) -> bytes | None:
    """Base64, with or without its padding; blanks inside are ignored."""
    s = "".join(text.split())
    if "=" not in s:
        if len(s) % 4 == 1:
            return None
        s += "=" * (-len(s) % 4)
    try:
        return base64.b64decode(s, validate=True)
    except ValueError:
        return None


def _uuid(text: str) -> str | None:
    return text.lower() if _UUID_RE.match(text) else None


def _boolean(text: str) -> bool | None:
    return {"true": True, "false": False}.get(text)


def reader(ct: ColumnType) -> Callable[[str], Any]:
    """How a column type reads a value's text: the value, or None when it does not read."""
    k = ct.kind
    if k is Kind.DECIMAL:
        return _decimal(ct)
    return READERS[k]


#: every column type (but decimal, whose reader depends on its precision and scale)
READERS: dict[Kind, Callable[[str], Any]] = {
    Kind.STRING: lambda text: text,
    Kind.UUID: _uuid,
    Kind.BOOLEAN: _boolean,
    Kind.INT: _integer(_INT),
    Kind.BIGINT: _LONG_READER,
    Kind.DOUBLE: _double,
    Kind.DATE: _date,
    Kind.TIMESTAMP: _timestamp,
    Kind.BINARY: _binary,
}


# ---------------------------------------------------------------------- the typed copy


@dataclass(frozen=True)
class TypingSpec:
    """What typing a table's records needs (picklable: it goes to the Spark tasks)."""

    table: Table
    replicas: tuple[str, ...]  # config order (§12 "Duplicates")
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


@dataclass
class _Record:
    """What the guards read of one record: its fields' texts, its objects as text maps,
    their values read by the table's types."""

    fields: dict[str, Any]
    op: str | None
    origin: str | None
    ts_text: str | None
    ts: int | None
    seq_text: str | None
    seq: int | None
    objects: dict[str, TextMap | _NotAnObject | None]
    typed: dict[str, dict[str, Any]]  # object -> column -> value read (None: does not read)

    def given(self, name: str) -> bool:
        return self.fields.get(name) is not None

    def map(self, name: str) -> TextMap | None:
        m = self.objects[name]
        return None if isinstance(m, _NotAnObject) else m


def _read_record(fields: dict[str, Any], table: Table, readers: dict[str, Callable]) -> _Record:
    text = {n: text_of(fields.get(n)) for n in ("op", "origin", "ts", "seq")}
    objects = {n: object_of(fields.get(n)) for n in _OBJECTS}
    typed: dict[str, dict[str, Any]] = {}
    for n in _OBJECTS:
        m = objects[n]
        if isinstance(m, dict):
            typed[n] = {c: _read(readers, c, m.get(c)) for c in table.column_names}
        else:
            typed[n] = {}
    return _Record(
        fields,
        text["op"],
        text["origin"],
        text["ts"],
        event_ts_micros(text["ts"]),
        text["seq"],
        _LONG_READER(text["seq"]) if text["seq"] is not None else None,
        objects,
        typed,
    )


def _read(readers: dict[str, Callable], column: str, text: str | None) -> Any:
    if text is None or column not in readers:
        return None
    return readers[column](text)


Check = tuple[bool, str]


def _record_checks(r: _Record, spec: TypingSpec, event_id: str | None) -> Iterator[Check]:
    """The guards, in the order of §12: the record's own fields first."""
    malformed = text_of(r.fields.get("_malformed"))
    yield malformed is not None, malformed or ""
    yield event_id is None, "no event_id"
    yield r.op not in OPS, f"unknown op {_quote(r.op)}"
    yield r.origin is None, "no origin"
    yield r.origin not in spec.ranks, f"origin {_quote(r.origin)} is not a configured replica"
    yield r.ts_text is None, "no ts"
    yield (
        r.ts is None,
        f"ts {_quote(r.ts_text)} is neither µs since the epoch nor RFC 3339 with a UTC offset",
    )
    yield r.seq_text is None, "no seq"
    yield r.seq is None, f"seq {_quote(r.seq_text)} is not an integer"


def _key_checks(r: _Record, table: Table, name: str) -> Iterator[Check]:
    m = r.map(name)
    assert m is not None
    cols = ", ".join(table.key)
    yield (
        len(m) != len(table.key) or any(c not in m for c in table.key),
        f"{name} has columns [{', '.join(sorted(m))}]; the table's key is [{cols}]",
    )
    for c in table.key:
        yield m.get(c) is None, f"{name}.{c} is null"
        yield (
            r.typed[name].get(c) is None,
            f"{name}.{c}: {_quote(m.get(c))} is not {table.column(c).type}",
        )


def _value_checks(r: _Record, table: Table, name: str) -> Iterator[Check]:
    m = r.map(name) or {}
    for col in table.columns:
        yield (
            m.get(col.name) is not None and r.typed[name].get(col.name) is None,
            f"{name}.{col.name}: {_quote(m.get(col.name))} is not {col.type}",
        )


def _row_checks(r: _Record, table: Table) -> Iterator[Check]:
    """Then the key, the new key and the row images, read by the table's types."""
    row_op = r.op in ROW_OPS
    yield row_op and not r.given("key"), "no key"
    yield row_op and r.map("key") is None, "key is not a JSON object"
    if row_op:
        yield from _key_checks(r, table, "key")
    yield (
        r.op != "UPDATE" and r.given("new_key"),
        f"new_key on {_quote(r.op)} (only an UPDATE changes a key)",
    )
    yield r.given("new_key") and r.map("new_key") is None, "new_key is not a JSON object"
    if r.map("new_key") is not None:
        yield from _key_checks(r, table, "new_key")
    cell = table.granularity is Granularity.CELL
    if cell:
        yield from _cell_checks(r, table)
    yield r.op == "INSERT" and not r.given("after") and not cell, "INSERT without after"
    yield r.given("after") and r.map("after") is None, "after is not a JSON object"
    yield r.given("before") and r.map("before") is None, "before is not a JSON object"
    if r.op != "DELETE":
        yield from _value_checks(r, table, "after")
    yield from _value_checks(r, table, "before")
    yield from _value_rules(r, table)


def _value_rules(r: _Record, table: Table) -> Iterator[Check]:
    """Then the values against the key and the column rules (NOT NULL, delta)."""
    writes = r.op in ("INSERT", "UPDATE")
    after = r.map("after")
    if not writes or after is None:
        return
    key, new_key = r.map("key") or {}, r.map("new_key") or {}
    for c in table.key:
        value = r.typed["after"].get(c)
        target = r.typed["new_key"].get(c)
        if target is None:
            target = r.typed["key"].get(c)
        yield (
            c in after and value is not None and target is not None and value != target,
            f"after.{c} = {_quote(after.get(c))} contradicts the key "
            f"{_quote(new_key.get(c) if new_key.get(c) is not None else key.get(c))}",
        )
    for c in sorted(table.not_null | table.delta):
        what = "a delta column" if c in table.delta else "a NOT NULL column"
        yield c in after and after[c] is None, f"after.{c} is null in {what}"


def _whole_seconds(text: str | None) -> int | None:
    return int(text) if text is not None and _SECONDS_RE.match(text) else None


def _cell_checks(r: _Record, table: Table) -> Iterator[Check]:
    """Malformed for a cell table (§12): a ``new_key``, a column the table does not
    have, a ``ttl`` that is not 0..20 years in whole seconds, an ``expiry`` without a
    ttl or not in whole seconds."""
    names = set(table.column_names)
    unknown: list[str] = []
    for n in ("after", "before"):
        for c in r.map(n) or {}:
            if c not in names and c not in unknown:
                unknown.append(c)
    ttl, expiry = text_of(r.fields.get("ttl")), text_of(r.fields.get("expiry"))
    ttl_s = _whole_seconds(ttl)
    yield r.given("new_key"), "new_key on a cell-granularity table (a key never changes)"
    yield (
        bool(unknown),
        f"unknown column(s) [{', '.join(sorted(unknown))}] (a cell-granularity table has no "
        "source_column_extra)",
    )
    yield (
        ttl is not None and not (ttl_s is not None and ttl_s <= MAX_TTL),
        f"ttl {_quote(ttl)} is not whole seconds 0..{MAX_TTL}",
    )
    yield (
        expiry is not None and _whole_seconds(expiry) is None,
        f"expiry {_quote(expiry)} is not whole seconds",
    )
    yield expiry is not None and not ttl_s, "expiry without a ttl"


def guard_checks(
    r: _Record, spec: TypingSpec, event_id: str | None
) -> Iterator[tuple[QuarantineReason, bool, str]]:
    """Each quarantine reason's checks, in the order of §12: the first that matches is the
    copy's reason."""
    for hit, detail in _record_checks(r, spec, event_id):
        yield QuarantineReason.MALFORMED, hit, detail
    if r.op is None or r.op not in OPS or r.ts is None:  # the rest reads what these gave
        return
    for hit, detail in _row_checks(r, spec.table):
        yield QuarantineReason.MALFORMED, hit, detail
    skew, grace = spec.max_clock_skew_seconds, spec.gc_grace_seconds
    yield (
        QuarantineReason.FUTURE_TIMESTAMP,
        r.ts > spec.now_us + skew * 1_000_000,
        f"ts is more than max_clock_skew_seconds={skew} after the run's clock",
    )
    yield (
        QuarantineReason.STALE_BEYOND_GC_GRACE,
        r.ts < spec.now_us - grace * 1_000_000,
        f"ts is older than gc_grace_seconds={grace} before the run's clock",
    )
    after, before = r.map("after") or {}, r.map("before") or {}
    yield (
        QuarantineReason.DELTA_WITHOUT_OLD_VALUE,
        r.op == "UPDATE" and any(c in after and before.get(c) is None for c in spec.table.delta),
        "no old value (before) for a changed delta column",
    )


def _verdict(r: _Record, spec: TypingSpec, event_id: str | None) -> tuple[str | None, str | None]:
    for reason, hit, detail in guard_checks(r, spec, event_id):
        if hit:
            return reason.value, detail
    return None, None


def _struct(typed: Mapping[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    return {c: typed.get(c) for c in names}


def _key_struct(r: _Record, table: Table, name: str) -> dict[str, Any] | None:
    """The typed key (or new key), when every one of its columns reads."""
    if r.map(name) is None:
        return None
    key = _struct(r.typed[name], table.key)
    return key if all(v is not None for v in key.values()) else None


def _extra_columns(r: _Record, table: Table) -> list[str]:
    names = set(table.column_names)
    extra: list[str] = []
    for n in ("after", "before"):
        for c in r.map(n) or {}:
            if c not in names and c not in extra:
                extra.append(c)
    return extra


def type_copy(
    fields: dict[str, Any] | None,
    source: str,
    spec: TypingSpec,
    readers: dict[str, Callable[[str], Any]],
    replica: str,
) -> dict[str, Any]:
    """One exported record (``fields``: its parsed JSON object, None when it is none)
    as a typed copy (``frames.copy_schema``): the record's fields read, its key, row
    images and TTL typed, and the guard that quarantines it, if any. ``source`` is the
    text kept for the quarantine (``raw``), when the copy is quarantined."""
    table = spec.table
    if fields is None:
        return _not_an_object(source, replica, spec)
    r = _read_record(fields, table, readers)
    eid = text_of(fields.get("event_id")) or None
    reason, detail = _verdict(r, spec, eid)
    after, before = r.map("after"), r.map("before")
    cols = table.column_names
    ttl = _whole_seconds(text_of(fields.get("ttl")))
    ttl = ttl if ttl else None  # §6: a ttl of 0 is no ttl
    expiry = None
    if ttl is not None:
        expiry = _whole_seconds(text_of(fields.get("expiry")))
        if expiry is None and r.ts is not None:
            expiry = r.ts // 1_000_000 + ttl
    return {
        "event_id": eid,
        "op": r.op,
        "origin": r.origin,
        "seq": r.seq,
        "pref": _pref(replica, r.origin, spec),
        "rank": spec.ranks.get(r.origin) if r.origin is not None else None,
        "txid": text_of(fields.get("txid")),
        "ts": r.ts,
        "key": _key_struct(r, table, "key"),
        "new_key": _key_struct(r, table, "new_key"),
        "after": _struct(r.typed["after"], cols),
        "after_has": [after is not None and c in after for c in cols],
        "before": _struct(r.typed["before"], cols),
        "before_has": [before is not None and c in before for c in cols],
        "extra_cols": _extra_columns(r, table),
        "ttl": ttl,
        "expiry": expiry,
        "reason": reason,
        "detail": detail,
        "raw": source if reason is not None else None,
    }


def _pref(replica: str, origin: str | None, spec: TypingSpec) -> int:
    """§12 "Duplicates": the origin's own copy first (-1), then the replicas in config
    order."""
    if origin is not None and replica == origin:
        return -1
    return spec.replicas.index(replica) if replica in spec.replicas else len(spec.replicas)


def _not_an_object(source: str, replica: str, spec: TypingSpec) -> dict[str, Any]:
    n = len(spec.table.column_names)
    none = dict.fromkeys(spec.table.column_names)
    return {
        "event_id": None,
        "op": None,
        "origin": None,
        "seq": None,
        "pref": _pref(replica, None, spec),
        "rank": None,
        "txid": None,
        "ts": None,
        "key": None,
        "new_key": None,
        "after": none,
        "after_has": [False] * n,
        "before": dict(none),
        "before_has": [False] * n,
        "extra_cols": [],
        "ttl": None,
        "expiry": None,
        "reason": QuarantineReason.MALFORMED.value,
        "detail": "not a JSON object",
        "raw": source,
    }


def column_readers(table: Table) -> dict[str, Callable[[str], Any]]:
    return {c.name: reader(c.type) for c in table.columns}


def type_line(
    line: str, spec: TypingSpec, readers: dict[str, Callable[[str], Any]], replica: str
) -> dict[str, Any]:
    """A JSONL line as a typed copy; a line that is not a JSON object is malformed."""
    try:
        fields = parse_json(line)
    except ValueError:
        fields = None
    if not isinstance(fields, dict):
        fields = None
    source = line
    if fields is not None and fields.get("_source") is not None:
        source = text_of(fields["_source"]) or line  # an adapter's record: as exported
    return type_copy(fields, source, spec, readers, replica)
