"""Rule 4 of the cell rules (docs/rules.md#cell-rules): values that tie on their timestamp compare
the unsigned bytes of their Cassandra serialization; :func:`value_order` maps each value
to a Spark value that orders the same way."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

import pandas as pd
from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipeline.core.kinds import INTEGER_KINDS, KINDS, ColumnType, Kind, every_kind
from pipeline.rules.cellfold import serialize


def _decimal_udf(ct: ColumnType) -> Any:
    @F.pandas_udf(T.BinaryType())  # type: ignore[call-overload]
    def ser(v: pd.Series) -> pd.Series:
        return v.map(lambda x: None if x is None else serialize(Decimal(x), ct))

    return ser


def _signed(v: Column, ct: ColumnType) -> Column:
    """Two's complement: negatives after positives."""
    return F.struct((v < 0).alias("neg"), v.alias("v"))


def _timestamp(v: Column, ct: ColumnType) -> Column:
    """Signed milliseconds, likewise."""
    ms = F.unix_millis(v)
    return F.struct((ms < 0).alias("neg"), ms.alias("v"))


def _double(v: Column, ct: ColumnType) -> Column:
    """IEEE 754: the sign bit first, then the magnitude's bits."""
    neg = (v < 0) | ((v == 0) & v.cast("string").startswith("-"))
    return F.struct(neg.alias("neg"), F.abs(v).alias("v"))


def _decimal(v: Column, ct: ColumnType) -> Column:
    if ct.precision > 18:
        return _decimal_udf(ct)(v)
    # 4-byte scale (constant per column), then the unscaled value as a minimal
    # big-endian two's complement: hex of the long, padded, redundant sign bytes cut
    unscaled = (v * F.lit(Decimal(10**ct.scale))).cast("long")
    h = F.lpad(F.hex(unscaled), 16, "0")
    h = F.regexp_replace(F.regexp_replace(h, "^(00)+(?=[0-7])", ""), "^(FF)+(?=[89A-F])", "")
    return F.unhex(h)


def _as_is(v: Column, ct: ColumnType) -> Column:
    """Date: unsigned days + 2^31 orders like the date; boolean 00 < 01; text compares
    as UTF-8 bytes; blob as bytes; a uuid's lower-case hex text orders like its bytes."""
    return v


#: the kinds whose order key is ``(v < 0, v)``, and those whose order key is the value
_SIGNED = INTEGER_KINDS
_AS_IS = frozenset(k for k, row in KINDS.items() if row.orders_as_is)
#: every column type's order key (:func:`value_order`)
_ORDER: Mapping[Kind, Callable[[Column, ColumnType], Column]] = every_kind(
    "order.value_order",
    {
        **dict.fromkeys(_SIGNED, _signed),
        **dict.fromkeys(_AS_IS, _as_is),
        Kind.TIMESTAMP: _timestamp,
        Kind.DOUBLE: _double,
        Kind.DECIMAL: _decimal,
    },
)


def value_order(v: Column, ct: ColumnType) -> Column:
    """A Spark value that orders like the unsigned bytes of ``v``'s Cassandra binary
    form (a shorter prefix first), so that rule 4 is a plain comparison."""
    return _ORDER[ct.kind](v, ct)


def keeps_value(ct: ColumnType) -> bool:
    """Whether :func:`value_order` keeps the value, to be read back (:func:`value_of_order`)."""
    return ct.kind in _AS_IS | _SIGNED


def value_of_order(key: Column, ct: ColumnType) -> Column:
    """The value whose :func:`value_order` is ``key`` (``keeps_value(ct)``)."""
    assert keeps_value(ct), ct
    return key if ct.kind in _AS_IS else key["v"]
