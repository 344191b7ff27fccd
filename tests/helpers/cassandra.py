"""Partition keys and tokens as Cassandra and Scylla see them: random values of every key
column type, and the key's bytes and Murmur3 token as the cassandra-driver package
computes them (the tokens tests, and the CDC log's stream ids on Spark)."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

from cassandra import cqltypes
from cassandra.metadata import Murmur3Token
from cassandra.query import SimpleStatement

ALPHABET = ["a", "Z", "0", " ", "é", "ß", "€", "中", "😀", "\x00", "\x7f"]


def random_value(kind: str, rnd: random.Random) -> Any:
    if kind == "int":
        return rnd.choice([0, -1, 2**31 - 1, -(2**31), rnd.randint(-(2**31), 2**31 - 1)])
    if kind == "bigint":
        return rnd.choice([0, -1, 2**63 - 1, -(2**63), rnd.randint(-(2**63), 2**63 - 1)])
    if kind == "string":  # up to 47 bytes of UTF-8: 0-2 blocks and every tail length
        return "".join(rnd.choice(ALPHABET) for _ in range(rnd.randint(0, 14)))
    if kind == "boolean":
        return rnd.random() < 0.5
    if kind == "double":
        return rnd.choice([0.0, -0.0, 1.5, -2.25, 1e308, rnd.uniform(-1e12, 1e12)])
    if kind == "decimal":
        return Decimal(rnd.randint(-(10**12) + 1, 10**12 - 1)).scaleb(-3)
    if kind == "date":
        return date(1970, 1, 1) + timedelta(days=rnd.randint(-50000, 50000))
    if kind == "timestamp":
        us = rnd.randint(-(10**15), 10**15)
        return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=us)
    if kind == "binary":
        return bytes(rnd.randint(0, 255) for _ in range(rnd.randint(0, 40)))
    return str(uuid.UUID(int=rnd.getrandbits(128)))


#: the cassandra-driver type that serializes each configured column type
DRIVER_TYPES = {
    "int": cqltypes.Int32Type,
    "bigint": cqltypes.LongType,
    "string": cqltypes.UTF8Type,
    "boolean": cqltypes.BooleanType,
    "double": cqltypes.DoubleType,
    "decimal": cqltypes.DecimalType,
    "date": cqltypes.SimpleDateType,
    "timestamp": cqltypes.DateType,
    "binary": cqltypes.BytesType,
    "uuid": cqltypes.UUIDType,
}


def _driver_value(v: Any, kind: str) -> Any:
    if kind == "timestamp":  # a Cassandra timestamp holds milliseconds: floor to them
        us = (v - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
        return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=us // 1000)
    if kind == "uuid":
        return uuid.UUID(v)
    return v


def cassandra_bytes(values: list[Any], kinds: list[str]) -> bytes:
    """The partition key as cassandra-driver serializes it (native protocol v4), and as it
    routes a statement whose key has several columns (the CompositeType framing)."""
    parts = [
        DRIVER_TYPES[k].serialize(_driver_value(v, k), 4)
        for v, k in zip(values, kinds, strict=True)
    ]
    statement = SimpleStatement("")
    statement.routing_key = parts
    return bytes(statement.routing_key)


def driver_token(data: bytes) -> int:
    return Murmur3Token.from_key(data).value
