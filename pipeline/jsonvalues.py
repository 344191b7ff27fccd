"""JSON text of rows and keys for the logs (conflicts, divergence, repairs).

Exact: a decimal stays a JSON number with its digits (``10.00``), a date or timestamp is
an ISO string, binary is base64. Keys keep the configured column order.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any


class _NotPlain(Exception):
    pass


def _refuse(_v: Any) -> Any:
    raise _NotPlain


def scalar(v: Any) -> str:
    if isinstance(v, Decimal):
        return format(v, "f")
    if isinstance(v, datetime):
        if v.tzinfo is None:
            v = v.replace(tzinfo=UTC)
        return json.dumps(v.astimezone(UTC).isoformat().replace("+00:00", "Z"))
    if isinstance(v, date):
        return json.dumps(v.isoformat())
    if isinstance(v, bytes | bytearray):
        return json.dumps(base64.b64encode(bytes(v)).decode())
    return json.dumps(v, ensure_ascii=False)


def _slow(value: Any) -> str:
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{json.dumps(str(k))}:{_slow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(_slow(v) for v in value) + "]"
    return scalar(value)


def dumps(value: Any) -> str:
    """A row (mapping), a list of rows, or a scalar, as compact JSON."""
    try:  # the C encoder, for values of plain JSON types (most rows)
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=_refuse)
    except _NotPlain:
        return _slow(value)
