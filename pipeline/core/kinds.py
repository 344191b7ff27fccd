"""The column types of ``cdr.yaml``, in one place (docs/configuration.md#column-types).

:data:`KINDS` holds, per :class:`Kind`, what the code decides from a column's type
alone: whether it is numeric, whether it may be an ``order_by`` column, its Spark and CQL
types. A column's :class:`ColumnType` (its kind, and a decimal's precision and scale) is
read from the config's text by :func:`parse_column_type`; it knows its range
(:meth:`ColumnType.fits`), which Python values are of it in the fold
(:meth:`ColumnType.admits`), and :func:`coerce_value` reads a config-supplied value
(a column default) as one of it. What a layer does with a type (a Spark type,
Cassandra's bytes, a reader) is a mapping of its own, built with :func:`every_kind` like
this table, so that a kind without an entry fails at import rather than falling through
to a default."""

from __future__ import annotations

import base64
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal, InvalidOperation
from enum import StrEnum
from typing import Any, TypeVar

V = TypeVar("V")


class Kind(StrEnum):
    INT = "int"
    BIGINT = "bigint"
    STRING = "string"
    BOOLEAN = "boolean"
    DOUBLE = "double"
    DECIMAL = "decimal"
    DATE = "date"
    TIMESTAMP = "timestamp"
    BINARY = "binary"
    UUID = "uuid"


def every_kind(what: str, entries: Mapping[Kind, V], kinds: Iterable[Kind] = Kind) -> dict[Kind, V]:
    """``entries`` in the order of ``kinds`` (every :class:`Kind` unless told), once it
    is checked to hold an entry for each of them and for no other; raises ValueError
    naming ``what`` and the kinds missing or extra."""
    wanted = list(kinds)
    missing = [str(k) for k in wanted if k not in entries]
    extra = sorted(str(k) for k in entries if k not in wanted)
    problems = [f"no entry for {', '.join(missing)}"] if missing else []
    problems += [f"an entry for {', '.join(extra)}, not a kind it covers"] if extra else []
    if problems:
        raise ValueError(f"{what}: " + "; ".join(problems))
    return {Kind(k): entries[k] for k in wanted}


@dataclass(frozen=True, slots=True)
class KindRow:
    """What a column type is (docs/configuration.md#column-types)."""

    #: may be a ``delta`` column; ``ColumnType.fits`` knows its range
    numeric: bool
    #: its place in the list of the types an ``order_by`` column may have, as messages
    #: and docs/rules.md#order-by-a-column give it; None: not an ``order_by`` type
    order_by: int | None
    #: may be a ``merge`` column (docs/rules.md#merge-functions): its values are ordered
    merge: bool
    #: a signed integer of this many bits (two's complement); 0: not an integer
    bits: int
    #: the Spark SQL type (``DataType.simpleString``; decimal's ``p,s`` are the column's)
    spark: str
    #: the CQL type whose binary form Cassandra compares and hashes (docs/rules.md#cell-rules)
    cql: str
    #: Arrow's JSON reader reads it exactly as the guards' reader does (``ingest.blocks``)
    arrow_json: bool
    #: its Spark value orders as the unsigned bytes of its CQL binary form
    #: (rule 4, ``resolve.cells.order``)
    orders_as_is: bool


# fmt: off
#: every column type, one row each (docs/configuration.md#column-types)
KINDS: Mapping[Kind, KindRow] = every_kind("the column types", {
    #                       numeric order_by merge  bits spark           cql          arrow  as_is
    Kind.INT:       KindRow(True,   3,       True,  32,  "int",          "int",       True,  False),
    Kind.BIGINT:    KindRow(True,   2,       True,  64,  "bigint",       "bigint",    True,  False),
    Kind.STRING:    KindRow(False,  None,    False, 0,   "string",       "text",      True,  True),
    Kind.BOOLEAN:   KindRow(False,  None,    False, 0,   "boolean",      "boolean",   True,  True),
    Kind.DOUBLE:    KindRow(True,   None,    True,  0,   "double",       "double",    True,  False),
    Kind.DECIMAL:   KindRow(True,   4,       True,  0,   "decimal(p,s)", "decimal",   True,  False),
    Kind.DATE:      KindRow(False,  None,    True,  0,   "date",         "date",      False, True),
    Kind.TIMESTAMP: KindRow(False,  1,       True,  0,   "timestamp",    "timestamp", False, False),
    Kind.BINARY:    KindRow(False,  None,    False, 0,   "binary",       "blob",      False, True),
    Kind.UUID:      KindRow(False,  None,    False, 0,   "string",       "uuid",      False, True),
})
# fmt: on

NUMERIC_KINDS = frozenset(k for k, row in KINDS.items() if row.numeric)
#: docs/rules.md#order-by-a-column: the types an ``order_by`` column may have, in the
#: order messages name them
_ORDER_BY_PLACES = {k: row.order_by for k, row in KINDS.items() if row.order_by is not None}
ORDER_BY_KINDS = tuple(sorted(_ORDER_BY_PLACES, key=_ORDER_BY_PLACES.__getitem__))
#: docs/rules.md#merge-functions: the types a ``merge`` column may have
MERGE_KINDS = tuple(k for k, row in KINDS.items() if row.merge)
#: the signed integers
INTEGER_KINDS = frozenset(k for k, row in KINDS.items() if row.bits)


_BOUNDS = {k: 2 ** (KINDS[k].bits - 1) for k in INTEGER_KINDS}


def integer_bound(kind: Kind) -> int:
    """``2**(bits - 1)``: a value of the integer type ``kind`` is in ``[-bound, bound)``."""
    bound = _BOUNDS.get(kind)
    if bound is None:
        raise TypeError(f"{kind} is not an integer type")
    return bound


def kinds_table() -> str:
    """docs/configuration.md#column-types's table, rendered from :data:`KINDS`
    (``tests/unit/test_kinds.py`` compares it with the page)."""
    lines = [
        "| type | numeric (`delta`) | `order_by` | Spark type | CQL type |",
        "|---|---|---|---|---|",
    ]
    for k, row in KINDS.items():
        name = "decimal(p,s)" if k is Kind.DECIMAL else k.value
        numeric = "yes" if row.numeric else "no"
        order_by = "yes" if row.order_by is not None else "no"
        lines.append(f"| `{name}` | {numeric} | {order_by} | `{row.spark}` | `{row.cql}` |")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- a column's type


_DECIMAL_RE = re.compile(r"^decimal\(\s*(\d+)\s*,\s*(\d+)\s*\)$")


@dataclass(frozen=True, slots=True)
class ColumnType:
    """A column's type as the config gives it: its kind, and a decimal's precision and
    scale (0 for every other kind)."""

    kind: Kind
    precision: int = 0
    scale: int = 0

    def __str__(self) -> str:
        if self.kind is Kind.DECIMAL:
            return f"decimal({self.precision},{self.scale})"
        return self.kind.value

    def fits(self, value: int | float | Decimal) -> bool:
        """Whether a number is in this numeric type's range (a 32- or 64-bit integer, a
        finite double, a decimal with at most ``precision - scale`` integer digits)."""
        if self.kind not in NUMERIC_KINDS:
            raise TypeError(f"{self} is not numeric")
        return _FITS[self.kind](self, value)

    def admits(self, value: Any) -> bool:
        """Whether a value (not null) is one of this type as the fold holds it
        (:data:`_PY_TYPES`): of its Python type (a bool is no number, a datetime no date),
        a decimal with at most ``scale`` digits after the point, an aware timestamp, a
        number in the type's range (a double may be NaN or infinite, as the guards read
        one). A uuid is its text; whether the text is a uuid is the guards' reading."""
        kind = self.kind
        if not _held_as(kind, value):
            return False
        if kind is Kind.DECIMAL:
            value = Decimal(value)
            exponent = value.as_tuple().exponent
            if not (isinstance(exponent, int) and -exponent <= self.scale):
                return False
        if kind is Kind.TIMESTAMP:
            return value.tzinfo is not None  # an instant, not a wall-clock time
        return kind not in NUMERIC_KINDS or kind is Kind.DOUBLE or self.fits(value)


def _fits_integer(ct: ColumnType, value: int | float | Decimal) -> bool:
    bound = integer_bound(ct.kind)
    return -bound <= value < bound


def _fits_double(ct: ColumnType, value: int | float | Decimal) -> bool:
    return math.isfinite(value)


def _fits_decimal(ct: ColumnType, value: int | float | Decimal) -> bool:
    return abs(value) < 10 ** (ct.precision - ct.scale)


#: the range of each numeric type (``ColumnType.fits``)
_FITS: Mapping[Kind, Callable[[ColumnType, int | float | Decimal], bool]] = every_kind(
    "ColumnType.fits",
    {
        **dict.fromkeys(INTEGER_KINDS, _fits_integer),
        Kind.DOUBLE: _fits_double,
        Kind.DECIMAL: _fits_decimal,
    },
    NUMERIC_KINDS,
)

#: what a value of each column type is in the fold, as the guards read them
#: (``ColumnType.admits``)
_PY_TYPES: Mapping[Kind, tuple[type, ...]] = every_kind(
    "ColumnType.admits",
    {
        Kind.INT: (int,),
        Kind.BIGINT: (int,),
        Kind.STRING: (str,),
        Kind.BOOLEAN: (bool,),
        Kind.DOUBLE: (float, int),
        Kind.DECIMAL: (Decimal, int),
        Kind.DATE: (date,),
        Kind.TIMESTAMP: (datetime,),
        Kind.BINARY: (bytes,),
        Kind.UUID: (str,),
    },
)


def _held_as(kind: Kind, value: Any) -> bool:
    """Whether ``value`` is of the Python type the fold holds a value of ``kind`` as (a
    bool is no number, a datetime no date)."""
    if isinstance(value, bool) and kind is not Kind.BOOLEAN:
        return False
    if isinstance(value, datetime) and kind is Kind.DATE:
        return False
    return isinstance(value, _PY_TYPES[kind])


def parse_column_type(text: str) -> ColumnType:
    """``int`` ... ``decimal(p,s)``, or a PostgreSQL type name of :data:`PG_NAMES`
    (case and spaces as PostgreSQL allows them); raises ValueError naming the allowed
    types, or for a PostgreSQL type the config cannot hold, what to use instead."""
    t = " ".join(text.split()).lower()
    m = _DECIMAL_RE.match(t)
    if m:
        return _decimal(t, int(m.group(1)), int(m.group(2)))
    if t not in _KIND_NAMES:
        return _pg_type(text, t)
    kind = Kind(t)
    if kind is Kind.DECIMAL:
        raise ValueError("decimal needs a precision and scale: decimal(p,s)")
    return ColumnType(kind)


_KIND_NAMES = frozenset(k.value for k in Kind)


def _decimal(name: str, p: int, s: int) -> ColumnType:
    if not 1 <= p <= 38 or s > p:
        raise ValueError(f"{name}: precision must be 1..38 and scale <= precision")
    return ColumnType(Kind.DECIMAL, p, s)


# --------------------------------------------------------------------------- PostgreSQL's names


@dataclass(frozen=True, slots=True)
class PgType:
    """A PostgreSQL type name as the config reads it
    (docs/configuration.md#postgresql-type-names): the kind it is, or None when the config
    cannot hold its values (``instead`` says what to do)."""

    kind: Kind | None
    #: what may follow the name in parentheses: "" nothing, "n" a length or precision (the
    #: kind keeps none), "p,s" a decimal's precision and, optionally, scale
    modifier: str = ""
    #: a refused type: what to use instead; else what the value becomes, when not plain
    note: str = ""


_S, _N = Kind.STRING, Kind.INT
_JSON_TEXT = "the JSON text"
_WALL_CLOCK = "PostgreSQL's wall-clock time: the column is an instant, taken as UTC (below)"
_REAL = "exactly: a double holds every real"
_TIME_TEXT = "no time-of-day type: export its text and declare `string`"
_RANGE = "no range type: export its bounds as two columns, or its text as `string`"

# fmt: off
#: PostgreSQL's type names and aliases, each with the kind it is read as, or refused with
#: what to use instead (docs/configuration.md#postgresql-type-names); the names are as
#: ``format_type`` writes them and as people do, lower case, one space between words
PG_NAMES: Mapping[str, PgType] = {
    "text": PgType(_S), "varchar": PgType(_S, "n"), "character varying": PgType(_S, "n"),
    "char": PgType(_S, "n"), "character": PgType(_S, "n"),
    "bpchar": PgType(_S, "n"), "citext": PgType(_S), "name": PgType(_S),
    "json": PgType(_S, note=_JSON_TEXT), "jsonb": PgType(_S, note=_JSON_TEXT),
    "int": PgType(_N), "int4": PgType(_N), "integer": PgType(_N), "serial": PgType(_N),
    "serial4": PgType(_N), "smallint": PgType(_N), "int2": PgType(_N),
    "smallserial": PgType(_N), "serial2": PgType(_N),
    "bigint": PgType(Kind.BIGINT), "int8": PgType(Kind.BIGINT),
    "bigserial": PgType(Kind.BIGINT), "serial8": PgType(Kind.BIGINT),
    "numeric": PgType(Kind.DECIMAL, "p,s"), "decimal": PgType(Kind.DECIMAL, "p,s"),
    "real": PgType(Kind.DOUBLE, note=_REAL), "float4": PgType(Kind.DOUBLE, note=_REAL),
    "double precision": PgType(Kind.DOUBLE), "float8": PgType(Kind.DOUBLE),
    "float": PgType(Kind.DOUBLE, "n"),
    "bool": PgType(Kind.BOOLEAN), "boolean": PgType(Kind.BOOLEAN),
    "date": PgType(Kind.DATE),
    "timestamptz": PgType(Kind.TIMESTAMP, "n"),
    "timestamp with time zone": PgType(Kind.TIMESTAMP, "n"),
    "timestamp": PgType(Kind.TIMESTAMP, "n", _WALL_CLOCK),
    "timestamp without time zone": PgType(Kind.TIMESTAMP, "n", _WALL_CLOCK),
    "bytea": PgType(Kind.BINARY), "uuid": PgType(Kind.UUID),
    "money": PgType(None, note="its text depends on lc_monetary: export it as numeric and "
                    "declare `decimal(p,2)`"),
    "interval": PgType(None, "n", "no interval type: export its seconds (`bigint` or `double`) "
                       "or its text as `string`"),
    "time": PgType(None, "n", _TIME_TEXT), "time without time zone": PgType(None, "n", _TIME_TEXT),
    "timetz": PgType(None, "n", _TIME_TEXT), "time with time zone": PgType(None, "n", _TIME_TEXT),
    "int4range": PgType(None, note=_RANGE), "int8range": PgType(None, note=_RANGE),
    "numrange": PgType(None, note=_RANGE), "tsrange": PgType(None, note=_RANGE),
    "tstzrange": PgType(None, note=_RANGE), "daterange": PgType(None, note=_RANGE),
}
# fmt: on

#: arrays (``int[]``, ``integer array``, or the catalog's ``_int4``): refused
_ARRAY_NOTE = "no array type: export it as JSON text (to_json) and declare `string`"
_PG_RE = re.compile(
    r"^(?P<base>[a-z][a-z0-9_ ]*?)(?:\((?P<args>[^()]*)\))?(?P<rest>(?: [a-z ]+)?)$"
)
_INT_RE = re.compile(r"^\d+$")


def _pg_type(text: str, t: str) -> ColumnType:
    """``t`` (``text`` lower case, its blanks single) as a name of :data:`PG_NAMES`."""
    t = re.sub(r"\s*([(,])\s*", r"\1", t).replace(" )", ")")
    if t.endswith(("[]", " array")) or re.match(r"^_[a-z]", t) or re.search(r"\[\d*\]$", t):
        raise ValueError(f"{text!r}: {_ARRAY_NOTE}")
    m = _PG_RE.match(t)
    name = f"{m.group('base')}{m.group('rest')}".strip() if m else t
    pg = PG_NAMES.get(name)
    if m is None or pg is None:
        allowed = ", ".join(k.value for k in Kind if k is not Kind.DECIMAL)
        raise ValueError(
            f"unknown type {text!r}; allowed: {allowed}, decimal(p,s), or a PostgreSQL type "
            "name of docs/configuration.md#postgresql-type-names"
        )
    if pg.kind is None:
        raise ValueError(f"{text!r}: {pg.note}")
    args = m.group("args")
    if pg.kind is Kind.DECIMAL:
        return _pg_decimal(text, name, args)
    if args is not None and not (pg.modifier == "n" and _INT_RE.match(args)):
        takes = f"{name}(n)" if pg.modifier else name
        raise ValueError(f"{text!r} is not a type: write {takes}")
    return ColumnType(pg.kind)


def _pg_decimal(text: str, name: str, args: str | None) -> ColumnType:
    """``numeric(p,s)``, ``numeric(p)`` (scale 0, as PostgreSQL reads it); a bare
    ``numeric`` is refused: its values have no fixed precision, a decimal column needs one."""
    if args is None:
        raise ValueError(
            f"{text!r} has no precision, and a decimal column needs one: write {name}(p,s) "
            "with the most digits its values have (p up to 38), or declare `double` or `string`"
        )
    parts = args.split(",")
    if not 1 <= len(parts) <= 2 or not all(_INT_RE.match(x) for x in parts):
        raise ValueError(f"{text!r} is not a type: write {name}(p,s) or {name}(p)")
    p, s = int(parts[0]), int(parts[1]) if len(parts) == 2 else 0
    return _decimal(f"{name}({p},{s})", p, s)


def pg_names_table() -> str:
    """docs/configuration.md#postgresql-type-names's table, rendered from :data:`PG_NAMES`
    (``tests/unit/test_kinds.py`` compares it with the page): the names read as each kind,
    then the refused ones, a row for each note."""
    lines = ["| PostgreSQL | type | note |", "|---|---|---|"]
    groups: dict[tuple[Kind | None, str], list[str]] = {}
    for k in [*Kind, None]:
        for n, pg in PG_NAMES.items():
            if pg.kind is k:
                groups.setdefault((k, pg.note), []).append(_pg_shown(n, pg))
    groups[(None, _ARRAY_NOTE)] = ["`int[]`, `integer array` (every array)"]
    for (k, note), names in groups.items():
        kind = "refused" if k is None else f"`{'decimal(p,s)' if k is Kind.DECIMAL else k}`"
        lines.append(f"| {', '.join(names)} | {kind} | {note} |")
    return "\n".join(lines) + "\n"


def _pg_shown(name: str, pg: PgType) -> str:
    """``name`` with its modifier where PostgreSQL writes it: ``timestamp(n) with time zone``."""
    if not pg.modifier:
        return f"`{name}`"
    first, sep, rest = name.partition(" with")
    return f"`{first}({pg.modifier}){sep}{rest}`"


def coerce_value(ctype: ColumnType, value: Any) -> Any:
    """A config-supplied value (column default) as the Python value of the column type."""
    if value is None:
        return None
    return _COERCE[ctype.kind](ctype, value)


def _coerce_integer(ctype: ColumnType, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{value!r} is not an integer")
    if not ctype.fits(value):
        raise ValueError(f"{value} does not fit {ctype.kind.value}")
    return value


def _coerce_double(ctype: ColumnType, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{value!r} is not a number")
    return float(value)


def _coerce_decimal(ctype: ColumnType, value: Any) -> Decimal:
    try:
        return Decimal(str(value)).quantize(Decimal(1).scaleb(-ctype.scale))
    except InvalidOperation:
        raise ValueError(f"{value!r} is not a decimal") from None


def _coerce_boolean(ctype: ColumnType, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{value!r} is not a boolean")
    return value


def _coerce_date(ctype: ColumnType, value: Any) -> date:
    return value if isinstance(value, date) else date.fromisoformat(str(value))


def _coerce_timestamp(ctype: ColumnType, value: Any) -> datetime:
    if isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def _coerce_binary(ctype: ColumnType, value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    return base64.b64decode(str(value), validate=True)


def _coerce_text(ctype: ColumnType, value: Any) -> str:
    return str(value)


#: how each column type reads a config-supplied value (:func:`coerce_value`)
_COERCE: Mapping[Kind, Callable[[ColumnType, Any], Any]] = every_kind(
    "coerce_value",
    {
        **dict.fromkeys(INTEGER_KINDS, _coerce_integer),
        Kind.DOUBLE: _coerce_double,
        Kind.DECIMAL: _coerce_decimal,
        Kind.BOOLEAN: _coerce_boolean,
        Kind.DATE: _coerce_date,
        Kind.TIMESTAMP: _coerce_timestamp,
        Kind.BINARY: _coerce_binary,
        Kind.STRING: _coerce_text,
        Kind.UUID: _coerce_text,
    },
)
