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
    return json.dumps(v)


def dumps(value: Any) -> str:
    """A row (mapping), a list of rows, or a scalar, as compact JSON."""
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{json.dumps(str(k))}:{dumps(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(dumps(v) for v in value) + "]"
    return scalar(value)
