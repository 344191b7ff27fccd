"""How each column type reads a value's text (:data:`READERS`), in pure Python: a number
keeps every digit it was written with, so a ``decimal(38,10)`` is exact; a text that does
not read as the column's type reads as None (the guards then quarantine the record as
``malformed``, quoting it). Also the event time ``ts`` (µs since the epoch or RFC 3339
with a UTC offset) and a TTL's whole seconds."""

from __future__ import annotations

import base64
import re
from collections.abc import Callable, Mapping
from datetime import UTC, date, datetime, timedelta
from decimal import ROUND_HALF_UP, Context, Decimal, InvalidOperation
from typing import Any

from pipeline.core.config import Table
from pipeline.core.kinds import ColumnType, Kind, every_kind, integer_bound
from pipeline.rules.jsontext import text_of

_INT_RE = re.compile(r"^\s*[+-]?\d+\s*$", re.ASCII)
_NUM_RE = re.compile(r"^\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*$", re.ASCII)
_DOUBLE_WORDS = {"nan": float("nan"), "infinity": float("inf"), "inf": float("inf")}
_DATE_RE = re.compile(r"^\d{4}-\d{2}-\d{2}\Z", re.ASCII)
_UUID_RE = re.compile(
    r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\Z"
)
#: RFC 3339 with its UTC offset (the ``T`` may be a space; ``T`` and ``Z`` in either case).
#: The texts of a value end at ``\Z``: ``$`` would take a trailing newline too
TS_WITH_OFFSET_RE = re.compile(
    r"^(\d{4}-\d{2}-\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?([Zz]|[+-]\d{2}:\d{2})\Z",
    re.ASCII,
)
_MICROS_RE = re.compile(r"^-?\d+\Z", re.ASCII)
_SECONDS_RE = re.compile(r"^\d{1,12}\Z", re.ASCII)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_LONG = integer_bound(Kind.BIGINT)
_INT = integer_bound(Kind.INT)


#: the most digits an integer's text may have (a bigint has 19; Python's ``int`` refuses
#: texts of over 4,300 digits, and would take quadratic time on them)
_MAX_DIGITS = 40


def _integer(bound: int) -> Callable[[str], int | None]:
    def read(text: str) -> int | None:
        if not _INT_RE.match(text):
            return None
        if len(text) > _MAX_DIGITS:  # leading zeros or blanks: the digits that count
            t = text.strip()
            digits = t.lstrip("+-").lstrip("0")
            if len(digits) > 19:
                return None
            text = ("-" if t.startswith("-") else "") + (digits or "0")
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
        try:  # 0001-01-01T00:00:00+01:00 is before the first instant a datetime holds
            t -= sign * timedelta(hours=hours, minutes=minutes)
        except OverflowError:
            return None
    micros = int((frac or "").ljust(6, "0")[:6])
    return (t.replace(tzinfo=UTC) - _EPOCH) // timedelta(microseconds=1) + micros


#: how a bigint reads (also ``seq`` and ``pos``, and ``ts`` in µs)
LONG_READER = _integer(_LONG)


def event_ts_micros(text: str | None) -> int | None:
    """docs/rules.md#conflict-types/docs/rules.md#fine-points: ``ts`` is µs since
    the epoch or RFC 3339 *with* a UTC offset."""
    if text is None:
        return None
    if _MICROS_RE.match(text):
        return LONG_READER(text)
    return rfc3339_micros(text)


def _timestamp(text: str) -> datetime | None:
    micros = LONG_READER(text) if _MICROS_RE.match(text) else rfc3339_micros(text)
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
    return READERS[ct.kind](ct)


def read_values(table: Table, given: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A row's parsed JSON values (``parse_json``'s, or ``json.loads``') read by the
    table's column types as an export's values are; and what does not read, one line per
    column."""
    problems: list[str] = []
    out: dict[str, Any] = {}
    for c, v in given.items():
        if c not in table.column_names:
            problems.append(f"no column {c!r} (the columns: {', '.join(table.column_names)})")
            continue
        if v is None:
            out[c] = None
            continue
        ct = table.column(c).type
        value = reader(ct)(text_of(v) or "")
        if value is None:
            problems.append(f"column {c!r} is {ct}, not {text_of(v)!r}")
            continue
        out[c] = value
    return out, problems


def _text(text: str) -> str:
    return text


def _always(read: Callable[[str], Any]) -> Callable[[ColumnType], Callable[[str], Any]]:
    """The reader of a type whose reading does not depend on the column (all but decimal)."""
    return lambda ct: read


#: every column type's reader, given the column's type (decimal's depends on its
#: precision and scale)
READERS: Mapping[Kind, Callable[[ColumnType], Callable[[str], Any]]] = every_kind(
    "readers.READERS",
    {
        Kind.STRING: _always(_text),
        Kind.UUID: _always(_uuid),
        Kind.BOOLEAN: _always(_boolean),
        Kind.INT: _always(_integer(_INT)),
        Kind.BIGINT: _always(LONG_READER),
        Kind.DOUBLE: _always(_double),
        Kind.DECIMAL: _decimal,
        Kind.DATE: _always(_date),
        Kind.TIMESTAMP: _always(_timestamp),
        Kind.BINARY: _always(_binary),
    },
)


def whole_seconds(text: str | None) -> int | None:
    """A ``ttl``'s or an ``expiry``'s whole seconds (at most 12 digits), else None."""
    return int(text) if text is not None and _SECONDS_RE.match(text) else None
