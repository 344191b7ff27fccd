"""Partition tokens (``pipeline.changes.tokens``) against the cassandra-driver package's
Murmur3Partitioner token, on thousands of random keys of every key column type, single and
composite, with multi-byte UTF-8 and every tail length; and the same tokens computed on
Spark, through the log's stream ids."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_type

from pipeline.changes.tokens import Ragged, compose, serialize_key, token_of, tokens
from pipeline.core.kinds import ColumnType, Kind
from pipeline.spark.schema import spark_type
from tests.helpers.cassandra import ALPHABET, cassandra_bytes, driver_token, random_value

TYPES = {
    "int": ColumnType(Kind.INT),
    "bigint": ColumnType(Kind.BIGINT),
    "string": ColumnType(Kind.STRING),
    "boolean": ColumnType(Kind.BOOLEAN),
    "double": ColumnType(Kind.DOUBLE),
    "decimal": ColumnType(Kind.DECIMAL, 12, 3),
    "date": ColumnType(Kind.DATE),
    "timestamp": ColumnType(Kind.TIMESTAMP),
    "binary": ColumnType(Kind.BINARY),
    "uuid": ColumnType(Kind.UUID),
}


def arrow_column(values: list[Any], ct: ColumnType) -> pa.Array:
    """The column as Spark hands it to an Arrow UDF."""
    return pa.array(values, type=to_arrow_type(spark_type(ct), timezone="UTC"))


def test_murmur3_on_raw_bytes_of_every_length():
    rnd = random.Random(1)
    # every length 0..70 (all tail lengths, up to four blocks), bytes >= 0x80 included:
    # Cassandra sign-extends the tail bytes
    values = [bytes(rnd.randint(0, 255) for _ in range(n)) for n in range(71) for _ in range(40)]
    got = tokens(Ragged.from_bytes(values))
    want = np.array([driver_token(v) for v in values], dtype=np.int64)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("kind", sorted(TYPES))
def test_single_column_keys_match_the_driver(kind: str):
    rnd = random.Random(kind)
    ct = TYPES[kind]
    values = [random_value(kind, rnd) for _ in range(2000)]
    got = tokens(serialize_key([arrow_column(values, ct)], [ct]))
    want = [driver_token(cassandra_bytes([v], [kind])) for v in values]
    assert got.tolist() == want


def test_composite_keys_match_the_driver():
    rnd = random.Random(7)
    shapes = [
        ["bigint", "string"],
        ["string", "string"],
        ["uuid", "int", "date"],
        ["timestamp", "binary", "boolean", "double"],
        ["decimal", "string"],
    ]
    for shape in shapes:
        types = [TYPES[k] for k in shape]
        rows = [[random_value(k, rnd) for k in shape] for _ in range(1000)]
        columns = [arrow_column([r[i] for r in rows], t) for i, t in enumerate(types)]
        got = tokens(serialize_key(columns, types))
        want = [driver_token(cassandra_bytes(r, shape)) for r in rows]
        assert got.tolist() == want, shape


def test_utf8_keys_cover_every_tail_length():
    """Strings whose UTF-8 form has each length 0..47 (multi-byte characters included)."""
    rnd = random.Random(3)
    by_length: dict[int, str] = {}
    while len(by_length) < 48:
        v = "".join(rnd.choice(ALPHABET) for _ in range(rnd.randint(0, 16)))
        if len(v.encode()) < 48:
            by_length.setdefault(len(v.encode()), v)
    values = list(by_length.values())
    ct = TYPES["string"]
    got = tokens(serialize_key([arrow_column(values, ct)], [ct]))
    assert got.tolist() == [driver_token(v.encode()) for v in values]
    assert {len(v.encode()) % 16 for v in values} == set(range(16))


def test_a_sliced_arrow_array_is_read_from_its_offset():
    ct = TYPES["string"]
    arr = arrow_column(["skip", "me", "a", "bé", "😀c"], ct).slice(2)
    assert tokens(serialize_key([arr], [ct])).tolist() == [
        driver_token(v.encode()) for v in ["a", "bé", "😀c"]
    ]


def test_composite_framing():
    got = compose([Ragged.from_bytes([b"ab", b""]), Ragged.from_bytes([b"\x01", b"xyz"])])
    assert got.row(0) == b"\x00\x02ab\x00\x00\x01\x01\x00"
    assert got.row(1) == b"\x00\x00\x00\x00\x03xyz\x00"


def test_known_token():
    """``SELECT token(k)`` of an ``int`` key 1, as Cassandra's documentation shows it."""
    assert token_of([1], [TYPES["int"]]) == -4069959284402364209
    assert token_of(["a"], [TYPES["string"]]) == driver_token(b"a")
