"""The column types of ``cdr.yaml`` as one table (docs/configuration.md#column-types).

:data:`KINDS` holds, per :class:`Kind`, what the code decides from a column's type
alone: whether it is numeric, whether it may be an ``order_by`` column, its Spark and CQL
types. What a layer does with a type (a Spark type, Cassandra's bytes, a reader) is a
mapping of its own, built with :func:`every_kind` like this table, so that a kind
without an entry fails at import rather than falling through to a default."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar

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
