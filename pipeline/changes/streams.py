"""CDC generations and stream ids, laid out as ScyllaDB lays them out
(docs/cdc.md#streams-and-generations;
ScyllaDB's ``cdc::topology_description``, ``cdc::stream_id``).

A generation starts operating at its timestamp ``T`` and describes the token ring as
ranges ``(previous end, end]`` sorted by end (range 0 wraps around the ring), each with
one stream per shard. A change with token ``t`` and timestamp ``ts`` goes to the
generation operating at ``ts``, to the range holding ``t``, to the stream of
``shard_of(t)``: the stream's own token lies in the same range and on the same shard, so
that base row and log entry are co-located, as in Scylla.

Pure Python and NumPy; no Spark. The lookup (:meth:`Generations.stream_ids`) works on
whole arrays of tokens and timestamps, for the Arrow UDF of ``pipeline.changes.cdc``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.core.config import CdcConfig

MIN_TOKEN = -(2**63)
MAX_TOKEN = 2**63 - 1
_RING = 2**64
VERSION = 1  # cdc::stream_id::version_1: the id's lowest 4 bits


def vnode_ends(vnodes: int) -> tuple[int, ...]:
    """``vnodes`` evenly spaced range ends: ``-2^63 + floor((i + 1) * 2^64 / vnodes) - 1``."""
    return tuple(MIN_TOKEN + (i + 1) * _RING // vnodes - 1 for i in range(vnodes))


def shard_of(token: int, shards: int, ignore_msb: int) -> int:
    """Scylla's ``sharder::shard_of``: the token made unsigned, its ``ignore_msb`` top bits
    dropped, scaled onto ``shards``."""
    unbiased = ((token - MIN_TOKEN) << ignore_msb) % _RING
    return (unbiased * shards) >> 64


def _first_unbiased_for_shard(after: int, shard: int, shards: int, ignore_msb: int) -> int:
    """The smallest unsigned token ``u > after`` on ``shard`` (may pass ``2^64``; exactly
    ``2^64`` when no token is on that shard). The shard depends on the low
    ``b = 64 - ignore_msb`` bits only, which cycle; within a cycle shard ``j`` starts at
    ``ceil(j * 2^b / shards)``."""
    cycle = 1 << (64 - ignore_msb)
    start = -(-shard * cycle // shards)  # ceil
    if start >= cycle or (start * shards) // cycle != shard:
        return _RING  # more shards than tokens in a cycle: this one owns none
    u = after + 1
    base, w = u - u % cycle, u % cycle
    current = (w * shards) // cycle
    if current == shard:
        return u
    return base + start if current < shard else base + cycle + start


def first_token_for_shard(start: int, end: int, shard: int, shards: int, ignore_msb: int) -> int:
    """The first token of ``(start, end]`` (wrapping around the ring when ``start >= end``)
    that ``shard_of`` maps to ``shard``, else ``end`` (Scylla's
    ``dht::find_first_token_for_shard``)."""
    lo, hi = start - MIN_TOKEN, end - MIN_TOKEN  # unsigned positions
    if lo < hi:
        u = _first_unbiased_for_shard(lo, shard, shards, ignore_msb)
        return u + MIN_TOKEN if u <= hi else end
    # the wrapping range: (start, max token], then from the first real token to end
    u = _first_unbiased_for_shard(lo, shard, shards, ignore_msb)
    if u <= _RING - 1:
        return u + MIN_TOKEN
    u = _first_unbiased_for_shard(0, shard, shards, ignore_msb)  # -2^63 is never a token
    return u + MIN_TOKEN if u <= hi else end


def _signed(u: int) -> int:
    return u - _RING if u >= 2**63 else u


@dataclass(frozen=True, slots=True, order=True)
class StreamId:
    """128 bits, ``token:64 | random:38 | index:22 | version:4``, kept as two signed
    int64s as Scylla does (``_first``, ``_second``)."""

    hi: int
    lo: int

    @staticmethod
    def make(token: int, random38: int, index: int) -> StreamId:
        lo = (random38 & (2**38 - 1)) << 26 | (index & (2**22 - 1)) << 4 | VERSION
        return StreamId(token, _signed(lo))

    def to_bytes(self) -> bytes:
        return self.hi.to_bytes(8, "big", signed=True) + self.lo.to_bytes(8, "big", signed=True)

    def hex(self) -> str:
        return self.to_bytes().hex()

    @property
    def token(self) -> int:
        return self.hi

    @property
    def index(self) -> int:
        return (self.lo >> 4) & (2**22 - 1)

    @property
    def version(self) -> int:
        return self.lo & 0xF


def random_bits(generation_us: int, range_index: int, shard: int) -> int:
    """38 bits that only the generation's timestamp, the range and the shard decide, so a
    rerun gives the same ids and two generations do not share one."""
    h = hashlib.sha256(f"cdc-stream|{generation_us}|{range_index}|{shard}".encode()).digest()
    return int.from_bytes(h[:8], "big") >> 26


@dataclass(frozen=True, slots=True)
class Topology:
    """What decides a generation's streams: the range ends, shards per range, and the
    sharding's ignored most significant bits."""

    ends: tuple[int, ...]
    shards: int
    ignore_msb: int

    @staticmethod
    def of(cdc: CdcConfig) -> Topology:
        ends = cdc.token_ring if cdc.token_ring is not None else vnode_ends(cdc.vnodes or 16)
        return Topology(tuple(ends), cdc.shards, cdc.sharding_ignore_msb)


@dataclass(frozen=True, slots=True)
class Generation:
    """One generation: ``time`` (µs) from which it operates, and per range (sorted by
    end) its streams in shard order; ``expired`` (µs) once a later one superseded it."""

    time: int
    ends: tuple[int, ...]
    streams: tuple[tuple[StreamId, ...], ...]
    ignore_msb: int
    expired: int | None = None

    @staticmethod
    def build(time: int, topology: Topology) -> Generation:
        ends = topology.ends
        streams = []
        for i, end in enumerate(ends):
            start = ends[i - 1]  # range 0 starts at the last end: it wraps
            streams.append(
                tuple(
                    StreamId.make(
                        first_token_for_shard(start, end, j, topology.shards, topology.ignore_msb),
                        random_bits(time, i, j),
                        i,
                    )
                    for j in range(topology.shards)
                )
            )
        return Generation(time, ends, tuple(streams), topology.ignore_msb)

    @property
    def topology(self) -> Topology:
        shards = {len(s) for s in self.streams}
        return Topology(self.ends, shards.pop() if len(shards) == 1 else -1, self.ignore_msb)

    def range_of(self, token: int) -> int:
        """The range holding ``token``: the first whose end is ``>= token``, else range 0
        (it wraps past the last end)."""
        i = int(np.searchsorted(np.asarray(self.ends, dtype=np.int64), token, side="left"))
        return 0 if i == len(self.ends) else i

    def stream_of(self, token: int) -> StreamId:
        streams = self.streams[self.range_of(token)]
        return streams[shard_of(token, len(streams), self.ignore_msb)]

    def all_streams(self) -> list[StreamId]:
        return [s for r in self.streams for s in r]


def next_generations(
    current: Sequence[Generation], topology: Topology, start_us: int
) -> tuple[list[Generation], str | None]:
    """The generations after a run that starts at ``start_us`` with ``topology``
    configured (docs/cdc.md): the first ever has timestamp 0; a topology different from the
    latest generation's starts a new one at ``start_us`` and expires the latest. Only a
    run newer than the latest generation can start one (a backfill logs into the
    generations of its time); otherwise the second value says why nothing changed."""
    gens = sorted(current, key=lambda g: g.time)
    if not gens:
        return [Generation.build(0, topology)], None
    latest = gens[-1]
    if latest.topology == topology:
        return gens, None
    if start_us <= latest.time:
        return gens, (
            f"cdc: the configured topology differs from the generation of "
            f"{latest.time} µs, but this run starts at {start_us} µs, not after it: the "
            "change takes effect with the first run for a later date"
        )
    expired = Generation(latest.time, latest.ends, latest.streams, latest.ignore_msb, start_us)
    return [*gens[:-1], expired, Generation.build(start_us, topology)], None


class Generations:
    """The generation set as arrays, for looking up many rows at once."""

    def __init__(self, gens: Sequence[Generation]):
        self.gens = sorted(gens, key=lambda g: g.time)
        self.times = np.array([g.time for g in self.gens], dtype=np.int64)
        self._ends = [np.asarray(g.ends, dtype=np.int64) for g in self.gens]
        self._ids = [
            np.array([[s.hi, s.lo] for r in g.streams for s in r], dtype=np.int64)
            for g in self.gens
        ]
        self._shards = [np.array([len(r) for r in g.streams], dtype=np.int64) for g in self.gens]
        self._first = [np.concatenate([[0], np.cumsum(s)[:-1]]) for s in self._shards]

    def operating(self, ts: np.ndarray) -> np.ndarray:
        """Index of the generation operating at each ``ts`` (the first one also covers
        everything before it)."""
        return np.maximum(np.searchsorted(self.times, ts, side="right") - 1, 0)

    def stream_ids(self, token: np.ndarray, ts: np.ndarray) -> np.ndarray:
        """(n, 2) int64: the ``(hi, lo)`` of each row's stream."""
        out = np.zeros((len(token), 2), dtype=np.int64)
        gen = self.operating(ts)
        for g in np.unique(gen):
            rows = np.nonzero(gen == g)[0]
            t = token[rows]
            r = np.searchsorted(self._ends[g], t, side="left")
            r[r == len(self._ends[g])] = 0
            shard = shard_of_array(t, self._shards[g][r], self.gens[g].ignore_msb)
            out[rows] = self._ids[g][self._first[g][r] + shard]
        return out


def shard_of_array(token: np.ndarray, shards: np.ndarray, ignore_msb: int) -> np.ndarray:
    """:func:`shard_of` over arrays: the 128-bit product ``u * shards >> 64`` from 32-bit
    halves (exact while ``shards`` < 2^31, the config allows 1024)."""
    with np.errstate(over="ignore"):
        u = token.astype(np.int64).view(np.uint64) ^ np.uint64(2**63)  # + 2^63 mod 2^64
        u = u << np.uint64(ignore_msb)
        s = shards.astype(np.uint64)
        hi, lo = u >> np.uint64(32), u & np.uint64(0xFFFFFFFF)
        mid = hi * s + ((lo * s) >> np.uint64(32))
        return (mid >> np.uint64(32)).astype(np.int64)
