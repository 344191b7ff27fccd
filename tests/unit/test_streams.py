"""Generations and stream ids (``pipeline.changes.streams``,
docs/cdc.md#streams-and-generations): the 128-bit
layout, ``shard_of``, the range lookup at both ends of the ring and at a range's end,
each stream's token in its range and on its shard, generation changes, and the
description tables read back."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from pipeline.changes.cdc import description_tables, read_generations, write_description_tables
from pipeline.changes.streams import (
    MAX_TOKEN,
    MIN_TOKEN,
    Generation,
    Generations,
    StreamId,
    Topology,
    first_token_for_shard,
    next_generations,
    shard_of,
    shard_of_array,
    vnode_ends,
)
from pipeline.storage.workpath import WorkPath

DAY = 86_400_000_000
RING = Topology((-(2**62), -100, 0, 100, 2**62), 3, 0)  # range 0 wraps: (2^62, -2^62]


def test_stream_id_layout():
    s = StreamId.make(-5, 2**38 - 1, 2**22 - 1)
    raw = s.to_bytes()
    assert len(raw) == 16 and len(s.hex()) == 32
    assert int.from_bytes(raw[:8], "big", signed=True) == -5  # token: the high 64 bits
    lo = int.from_bytes(raw[8:], "big")
    assert lo >> 26 == 2**38 - 1  # random: 38 bits
    assert (lo >> 4) & (2**22 - 1) == 2**22 - 1  # index: 22 bits
    assert lo & 0xF == 1  # version 1
    assert (s.hi, s.lo) == (-5, int.from_bytes(raw[8:], "big", signed=True))
    t = StreamId.make(7, 0b1011, 3)
    assert t.to_bytes().hex() == "0000000000000007" + f"{(0b1011 << 26) | (3 << 4) | 1:016x}"
    assert (t.token, t.index, t.version) == (7, 3, 1)


def test_vnode_ends():
    ends = vnode_ends(4)
    assert ends == (-(2**62) - 1, -1, 2**62 - 1, MAX_TOKEN)
    assert vnode_ends(1) == (MAX_TOKEN,)


def test_shard_of():
    assert shard_of(MIN_TOKEN, 4, 0) == 0
    assert shard_of(MAX_TOKEN, 4, 0) == 3
    assert shard_of(-1, 2, 0) == 0 and shard_of(0, 2, 0) == 1
    # ignore_msb drops the top bits: with 1 ignored, the two halves of the ring repeat
    assert shard_of(MIN_TOKEN, 2, 1) == shard_of(0, 2, 1) == 0
    assert shard_of(-1, 2, 1) == shard_of(MAX_TOKEN, 2, 1) == 1
    rnd = random.Random(5)
    toks = [rnd.randint(MIN_TOKEN + 1, MAX_TOKEN) for _ in range(3000)] + [MIN_TOKEN, MAX_TOKEN]
    for shards, msb in ((1, 0), (4, 12), (7, 3), (1024, 63), (3, 40)):
        got = shard_of_array(np.array(toks, dtype=np.int64), np.full(len(toks), shards), msb)
        assert got.tolist() == [shard_of(t, shards, msb) for t in toks], (shards, msb)


@pytest.mark.parametrize(
    ("token", "want"),
    [
        (MIN_TOKEN + 1, 0),  # the bottom of the ring: in the wrapping range 0
        (-(2**62), 0),  # equal to range 0's end
        (-(2**62) + 1, 1),
        (-100, 1),  # equal to a range end: that range
        (-99, 2),
        (0, 2),
        (100, 3),
        (2**62, 4),
        (2**62 + 1, 0),  # past the last end: wraps to range 0
        (MAX_TOKEN, 0),  # the top of the ring
    ],
)
def test_range_lookup_at_the_ends_of_the_ring(token: int, want: int):
    g = Generation.build(0, RING)
    assert g.range_of(token) == want
    stream = g.stream_of(token)
    assert stream in g.streams[want]
    assert stream == g.streams[want][shard_of(token, 3, 0)]


@pytest.mark.parametrize(
    "topology",
    [
        Topology(vnode_ends(16), 4, 12),
        Topology(vnode_ends(3), 7, 0),
        RING,
        Topology((10,), 5, 2),  # one range: the whole ring, wrapping
        Topology((0, 1, 3), 4, 0),  # ranges narrower than their shard count
    ],
)
def test_each_stream_lies_in_its_range_on_its_shard(topology: Topology):
    g = Generation.build(0, topology)
    ends = topology.ends
    for i, streams in enumerate(g.streams):
        start, end = ends[i - 1], ends[i]
        for j, s in enumerate(streams):
            t = s.token
            inside = start < t <= end if start < end else (t > start or t <= end)
            assert inside, (i, j, t)
            assert s.index == i and s.version == 1
            on_shard = shard_of(t, topology.shards, topology.ignore_msb) == j
            assert on_shard == _range_has_shard(start, end, j, topology)
            if on_shard:  # and it is the first such token of the range
                before = range(max(start + 1, t - 2000), t) if start < t else range(0)
                assert all(shard_of(x, topology.shards, topology.ignore_msb) != j for x in before)
            else:  # no token of the range is on shard j: Scylla then takes the range end
                assert t == end


def _range_has_shard(start: int, end: int, shard: int, topology: Topology) -> bool:
    """Whether a token of ``(start, end]`` is on ``shard``: the shard of a token depends on
    its low ``64 - ignore_msb`` unsigned bits, a cycle in which each shard holds one run."""
    cycle = 2 ** (64 - topology.ignore_msb)
    n = topology.shards
    first, last = -(-shard * cycle // n), -(-(shard + 1) * cycle // n) - 1
    if first > last:
        return False
    lo, hi = start - MIN_TOKEN + 1, end - MIN_TOKEN  # unsigned, inclusive
    segments = [(lo, hi)] if lo <= hi else [(lo, 2**64 - 1), (1, hi)]  # -2^63: no token
    for a, b in segments:
        if a > b:
            continue
        if b - a + 1 >= cycle:
            return True
        wa, wb = a % cycle, b % cycle
        runs = [(wa, wb)] if wa <= wb else [(wa, cycle - 1), (0, wb)]
        if any(x <= last and first <= y for x, y in runs):
            return True
    return False


def test_first_token_for_shard():
    # (0, 100] with 2 shards on the whole ring: every token of it is on shard 1
    assert first_token_for_shard(0, 100, 1, 2, 0) == 1
    assert first_token_for_shard(0, 100, 0, 2, 0) == 100  # none on shard 0: the end
    # the wrapping range (MAX - 1, MIN + 5]: MAX is on shard 1, MIN + 1 on shard 0
    assert first_token_for_shard(MAX_TOKEN - 1, MIN_TOKEN + 5, 1, 2, 0) == MAX_TOKEN
    assert first_token_for_shard(MAX_TOKEN - 1, MIN_TOKEN + 5, 0, 2, 0) == MIN_TOKEN + 1


def test_generations_are_deterministic_and_never_share_a_stream():
    topo = Topology(vnode_ends(16), 4, 12)
    assert Generation.build(DAY, topo) == Generation.build(DAY, topo)
    a, b = Generation.build(0, topo), Generation.build(DAY, topo)
    assert not set(a.all_streams()) & set(b.all_streams())
    assert len(set(a.all_streams())) == 64


def test_next_generations():
    first, why = next_generations([], Topology(vnode_ends(4), 2, 0), 5 * DAY)
    assert why is None and [g.time for g in first] == [0]  # the first covers all before
    same, why = next_generations(first, Topology(vnode_ends(4), 2, 0), 6 * DAY)
    assert same == first and why is None
    changed, why = next_generations(first, Topology(vnode_ends(8), 2, 0), 6 * DAY)
    assert why is None
    assert [(g.time, g.expired) for g in changed] == [(0, 6 * DAY), (6 * DAY, None)]
    assert changed[1].topology == Topology(vnode_ends(8), 2, 0)
    # a backfill of an earlier date does not start a generation in the past
    held, why = next_generations(changed, Topology(vnode_ends(16), 2, 0), 3 * DAY)
    assert held == changed and why and "later date" in why


def test_lookup_by_time_picks_the_generation_operating_then():
    gens, _ = next_generations(
        next_generations([], Topology(vnode_ends(4), 2, 0), 0)[0],
        Topology(vnode_ends(8), 3, 0),
        10 * DAY,
    )
    lookup = Generations(gens)
    tok = np.array([12345] * 4, dtype=np.int64)
    ts = np.array([-1, 10 * DAY - 1, 10 * DAY, 11 * DAY], dtype=np.int64)
    assert lookup.operating(ts).tolist() == [0, 0, 1, 1]
    ids = lookup.stream_ids(tok, ts)
    old, new = gens[0].stream_of(12345), gens[1].stream_of(12345)
    assert [tuple(r) for r in ids] == [(old.hi, old.lo)] * 2 + [(new.hi, new.lo)] * 2


def test_description_tables_round_trip(tmp_path: Path):
    gens, _ = next_generations(
        next_generations([], RING, 0)[0], Topology(vnode_ends(4), 2, 12), 10 * DAY
    )
    work = WorkPath.of(tmp_path)
    write_description_tables(gens, work)
    assert read_generations(work / "cdc_generation_descriptions") == gens
    t = description_tables(gens)
    assert t["cdc_generation_timestamps"].to_pylist()[0]["expired"] is not None
    v2 = t["cdc_streams_descriptions_v2"].to_pylist()
    assert len(v2) == len(RING.ends) + 4  # one row per generation and range
    assert v2[0]["streams"] == [s.to_bytes() for s in gens[0].streams[0]]
    streams = t["cdc_streams_descriptions"].to_pylist()[1]["streams"]
    assert [s["id"] for s in streams] == [s.hex() for s in gens[1].all_streams()]
