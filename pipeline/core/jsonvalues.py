"""JSON text of rows and keys for the logs (conflicts, divergence, repairs).

Exact: a decimal stays a JSON number with its digits (``10.00``), a date or timestamp is
an ISO string, binary is base64. Keys keep the configured column order.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Callable, Mapping
from datetime import UTC, date, datetime
from decimal import Decimal
from json.encoder import encode_basestring as _text  # the C encoder's, with ensure_ascii=False
from typing import Any


def scalar(v: Any) -> str:
    """A value that is not a container as JSON text."""
    enc = _SCALARS.get(type(v))
    if enc is not None:
        return enc(v)
    if isinstance(v, Decimal):
        return format(v, "f")
    if isinstance(v, datetime):
        if v.tzinfo is None:
            v = v.replace(tzinfo=UTC)
        return _text(v.astimezone(UTC).isoformat().replace("+00:00", "Z"))
    if isinstance(v, date):
        return _text(v.isoformat())
    if isinstance(v, bytes | bytearray):
        return _text(base64.b64encode(bytes(v)).decode())
    return json.dumps(v, ensure_ascii=False)


def _float(v: float) -> str:
    if v != v:
        return "NaN"
    if v in (math.inf, -math.inf):
        return "Infinity" if v > 0 else "-Infinity"
    return float.__repr__(v)


#: the encoders of the exact types most values have (as Python's JSON encoder writes them)
_SCALARS: dict[type, Callable[[Any], str]] = {
    str: _text,
    int: int.__repr__,
    bool: lambda v: "true" if v else "false",
    type(None): lambda v: "null",
    float: _float,
    Decimal: lambda v: format(v, "f"),
}


def dumps(value: Any) -> str:
    """A row (mapping), a list of rows, or a scalar, as compact JSON."""
    enc = _SCALARS.get(type(value))
    if enc is not None:
        return enc(value)
    if isinstance(value, Mapping):
        return "{" + ",".join([_text(str(k)) + ":" + dumps(v) for k, v in value.items()]) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join([dumps(v) for v in value]) + "]"
    return scalar(value)
