"""Partition tokens: Cassandra's Murmur3Partitioner token of a row's key
(docs/cdc.md#streams-and-generations).

``token(k)`` here equals ``SELECT token(k)`` on a Scylla or Cassandra table with the same
partition key: the ``h1`` half of MurmurHash3 x64_128 (seed 0) of the serialized key,
with Cassandra's quirk kept (the tail bytes are read as *signed* bytes and sign-extended:
``MurmurHash.hash3_x64_128`` casts each ``byte`` to ``long``), and ``-2^63`` mapped to
``2^63 - 1`` (``Murmur3Partitioner.normalize``: the minimum token is reserved).

The key is serialized as its Cassandra binary value (``cellfold.serialize``); a key of
several columns as, for each, a 2-byte big-endian length, the bytes and a 0 byte
(``CompositeType``).

Everything here works on whole Arrow arrays with NumPy: a batch of keys becomes one
ragged byte buffer (``Ragged``), hashed 16-byte block by 16-byte block across all rows at
once, so Spark runs it as a vectorized Arrow UDF with no Python per row. Only ``decimal``
key columns, rare as keys, are serialized one value at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.core.kinds import ColumnType, Kind, every_kind
from pipeline.rules.cellfold import serialize

U64 = np.uint64
_C1 = U64(0x87C37B91114253D5)
_C2 = U64(0x4CF5AD432745937F)
_MIN_TOKEN = -(2**63)
_MAX_TOKEN = 2**63 - 1


@dataclass(frozen=True)
class Ragged:
    """Byte strings, one per row, back to back in ``data``; row ``i`` is
    ``data[offsets[i]:offsets[i + 1]]``."""

    data: np.ndarray  # uint8
    offsets: np.ndarray  # int64, n + 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    @staticmethod
    def fixed(matrix: np.ndarray) -> Ragged:
        n, w = matrix.shape
        offsets = np.arange(n + 1, dtype=np.int64) * w
        return Ragged(np.ascontiguousarray(matrix).reshape(-1), offsets)

    @staticmethod
    def from_bytes(values: Sequence[bytes]) -> Ragged:
        lengths = np.fromiter((len(v) for v in values), dtype=np.int64, count=len(values))
        offsets = np.zeros(len(values) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return Ragged(np.frombuffer(b"".join(values), dtype=np.uint8), offsets)

    def row(self, i: int) -> bytes:
        return self.data[self.offsets[i] : self.offsets[i + 1]].tobytes()


# ---------------------------------------------------------------------- serialization


def _big_endian(values: np.ndarray, dtype: str) -> Ragged:
    be = np.ascontiguousarray(values.astype(dtype))
    return Ragged.fixed(be.view(np.uint8).reshape(len(values), -1))


def _binary(arr: pa.Array) -> Ragged:
    """The bytes of a string or binary array, without copying them row by row."""
    b = pc.cast(arr, pa.large_binary())
    b = pa.concat_arrays([b]) if b.offset else b  # a slice: rebase its offsets
    buffers = b.buffers()
    offsets = np.frombuffer(buffers[1], dtype=np.int64)[: len(b) + 1]
    data = np.zeros(0, np.uint8) if buffers[2] is None else np.frombuffer(buffers[2], np.uint8)
    start = offsets[0]
    return Ragged(data[start : offsets[-1]], offsets - start)


_HEX = np.full(256, 255, dtype=np.uint8)
for _i, _ch in enumerate(b"0123456789abcdef"):
    _HEX[_ch] = _i
for _i, _ch in enumerate(b"ABCDEF"):
    _HEX[_ch] = 10 + _i


def _uuid(arr: pa.Array) -> Ragged:
    """16 bytes from the canonical text form (the pipeline keeps uuids as lower-case
    text, checked when typed)."""
    text = _binary(arr)
    if len(arr) and not np.all(text.lengths == 36):
        raise ValueError("a uuid key is not in its 36-character text form")
    chars = text.data.reshape(len(arr), 36)
    hexdigits = np.delete(chars, [8, 13, 18, 23], axis=1)
    nibbles = _HEX[hexdigits]
    if np.any(nibbles == 255):
        raise ValueError("a uuid key holds a character that is not a hex digit")
    return Ragged.fixed((nibbles[:, 0::2] << 4) | nibbles[:, 1::2])


def serialize_array(arr: pa.Array, ct: ColumnType) -> Ragged:
    """Cassandra's binary form of every value of ``arr`` (docs/cdc.md#streams-and-generations;
    ``cellfold.serialize`` value by value). Nulls serialize as no bytes (key columns are
    never null)."""
    return _SERIALIZE[ct.kind](arr, ct)


def _decimal(arr: pa.Array, ct: ColumnType) -> Ragged:

    return Ragged.from_bytes([b"" if v is None else serialize(v, ct) for v in arr.to_pylist()])


def _timestamp(arr: pa.Array, ct: ColumnType) -> Ragged:
    """Signed milliseconds; floor, as Cassandra's Date.getTime does."""
    micros = pc.cast(arr, pa.int64()).to_numpy(zero_copy_only=False)
    return _big_endian(np.floor_divide(micros, 1000), ">i8")


def _date(arr: pa.Array, ct: ColumnType) -> Ragged:
    """Unsigned days since the epoch, centred on 2^31."""
    days = pc.cast(arr, pa.int32()).to_numpy(zero_copy_only=False).astype(np.int64)
    return _big_endian(days + 2**31, ">u4")


def _number(dtype: str) -> Callable[[pa.Array, ColumnType], Ragged]:
    """A number's fixed-width big-endian bytes (a null as 0)."""

    def ser(arr: pa.Array, ct: ColumnType) -> Ragged:
        return _big_endian(arr.fill_null(0).to_numpy(zero_copy_only=False), dtype)

    return ser


def _boolean(arr: pa.Array, ct: ColumnType) -> Ragged:
    values = arr.fill_null(False).to_numpy(zero_copy_only=False)
    return _big_endian(values.astype(np.uint8), "u1")


#: every column type's serialization, a whole array at once (:func:`serialize_array`)
_SERIALIZE: Mapping[Kind, Callable[[pa.Array, ColumnType], Ragged]] = every_kind(
    "tokens.serialize_array",
    {
        Kind.STRING: lambda arr, ct: _binary(arr),
        Kind.BINARY: lambda arr, ct: _binary(arr),
        Kind.UUID: lambda arr, ct: _uuid(arr),
        Kind.DECIMAL: _decimal,
        Kind.TIMESTAMP: _timestamp,
        Kind.DATE: _date,
        Kind.INT: _number(">i4"),
        Kind.BIGINT: _number(">i8"),
        Kind.DOUBLE: _number(">f8"),
        Kind.BOOLEAN: _boolean,
    },
)


def compose(parts: Sequence[Ragged]) -> Ragged:
    """One column: its bytes. Several: ``CompositeType``, for each component a 2-byte
    big-endian length, the bytes and a 0 byte."""
    if len(parts) == 1:
        return parts[0]
    n = len(parts[0].offsets) - 1
    lengths = [p.lengths for p in parts]
    total = sum(lengths) + 3 * len(parts)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(total, out=offsets[1:])
    out = np.zeros(offsets[-1], dtype=np.uint8)
    start = offsets[:-1].copy()
    for p, ln in zip(parts, lengths, strict=True):
        if np.any(ln > 0xFFFF):
            raise ValueError("a key component is longer than 65535 bytes")
        out[start] = (ln >> 8).astype(np.uint8)
        out[start + 1] = (ln & 0xFF).astype(np.uint8)
        body = start + 2
        dest = np.repeat(body - p.offsets[:-1], ln) + np.arange(p.offsets[0], p.offsets[-1])
        out[dest] = p.data[p.offsets[0] : p.offsets[-1]]
        start = body + ln + 1  # the 0 byte after each component is already there
    return Ragged(out, offsets)


def serialize_key(columns: Sequence[pa.Array], types: Sequence[ColumnType]) -> Ragged:
    return compose([serialize_array(a, t) for a, t in zip(columns, types, strict=True)])


# ---------------------------------------------------------------------- MurmurHash3


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << U64(r)) | (x >> U64(64 - r))


def _fmix(k: np.ndarray) -> np.ndarray:
    k = k ^ (k >> U64(33))
    k = k * U64(0xFF51AFD7ED558CCD)
    k = k ^ (k >> U64(33))
    k = k * U64(0xC4CEB9FE1A85EC53)
    return k ^ (k >> U64(33))


def _words(block: np.ndarray) -> np.ndarray:
    """Little-endian 64-bit words of an (n, 8) byte matrix."""
    return np.ascontiguousarray(block).view("<u8").reshape(-1).astype(U64)


def murmur3_h1(keys: Ragged) -> np.ndarray:
    """MurmurHash3 x64_128 (seed 0) ``h1`` of every row, as Cassandra computes it
    (``MurmurHash.hash3_x64_128``: signed tail bytes), as int64."""
    lengths = keys.lengths
    n = len(lengths)
    h1 = np.zeros(n, dtype=U64)
    h2 = np.zeros(n, dtype=U64)
    data = np.concatenate([keys.data, np.zeros(16, dtype=np.uint8)])  # tail reads stay inside
    starts = keys.offsets[:-1]
    nblocks = lengths // 16
    lane = np.arange(16)
    with np.errstate(over="ignore"):
        for b in range(int(nblocks.max()) if n else 0):
            rows = np.nonzero(nblocks > b)[0]
            block = data[(starts[rows] + 16 * b)[:, None] + lane]
            k1, k2 = _words(block[:, :8]), _words(block[:, 8:])
            a, c = h1[rows], h2[rows]
            a ^= _rotl(k1 * _C1, 31) * _C2
            a = (_rotl(a, 27) + c) * U64(5) + U64(0x52DCE729)
            c ^= _rotl(k2 * _C2, 33) * _C1
            c = (_rotl(c, 31) + a) * U64(5) + U64(0x38495AB5)
            h1[rows], h2[rows] = a, c
        tail = lengths % 16
        rows = np.nonzero(tail)[0]
        if len(rows):
            raw = data[(starts[rows] + 16 * nblocks[rows])[:, None] + lane]
            raw = np.where(lane < tail[rows][:, None], raw, 0)
            # Java's (long) byte: bytes >= 0x80 are sign-extended before the shift
            signed = raw.astype(np.int8).astype(np.int64).astype(U64)
            shifted = signed << (U64(8) * (lane % 8).astype(U64))
            k1 = np.bitwise_xor.reduce(shifted[:, :8], axis=1)
            k2 = np.bitwise_xor.reduce(shifted[:, 8:], axis=1)
            high = tail[rows] > 8
            h2[rows] ^= np.where(high, _rotl(k2 * _C2, 33) * _C1, U64(0))
            h1[rows] ^= _rotl(k1 * _C1, 31) * _C2
        ln = lengths.astype(U64)
        h1 ^= ln
        h2 ^= ln
        h1 += h2
        h2 += h1
        h1 = _fmix(h1)
        h2 = _fmix(h2)
        h1 += h2
    return h1.view(np.int64)


def tokens(keys: Ragged) -> np.ndarray:
    """Murmur3Partitioner tokens (int64) of serialized keys."""
    h = murmur3_h1(keys)
    return np.where(h == _MIN_TOKEN, np.int64(_MAX_TOKEN), h)


def token_of(values: Sequence[Any], types: Sequence[ColumnType]) -> int:
    """The token of one key given as Python values (tests, tools)."""
    from pyspark.sql.pandas.types import to_arrow_type

    from pipeline.spark.schema import spark_type  # deferred: loads pyspark

    arrays = [
        pa.array([v], type=to_arrow_type(spark_type(t), timezone="UTC"))
        for v, t in zip(values, types, strict=True)
    ]
    return int(tokens(serialize_key(arrays, types))[0])
