"""``cdr generate`` looks like production: keys live across nights (a new key is never
inserted twice), changes lean toward the newest keys (``--skew``), 2% of keys are
contended by default, and a date generated again gives the same bytes."""

from __future__ import annotations

import gzip
import itertools
import json
import random
from collections import Counter
from datetime import date
from pathlib import Path
from typing import Any

import pytest

from pipeline.app.generate import GenerateOptions, KeySpace, generate
from pipeline.core.config_load import parse_config
from pipeline.storage.store import FileStore
from tests.helpers import configs

D1, D2, D3 = date(2026, 11, 21), date(2026, 11, 22), date(2026, 11, 23)
CONFIG = configs.config({"items": configs.table(configs.ITEMS)}, replicas=("r1", "r2"))


def records(store: FileStore, dt: date, replica: str = "r1") -> list[dict[str, Any]]:
    out = []
    for key in store.list(f"exports/replica={replica}/table=items/dt={dt}"):
        if key.endswith(".jsonl.gz"):
            out += [json.loads(x) for x in gzip.decompress(store.read_bytes(key)).splitlines()]
    return out


@pytest.fixture
def store(tmp_path: Path) -> FileStore:
    return FileStore(tmp_path / "store")


def test_new_keys_continue_after_every_earlier_night(store: FileStore):
    config = parse_config(CONFIG)
    generate(config, store, D1, GenerateOptions(events=2000, base_rows=300, seed=1))
    generate(config, store, D2, GenerateOptions(events=2000, seed=2))
    generate(config, store, D3, GenerateOptions(events=2000, seed=3))
    seen = set(range(300))  # the base snapshot's keys
    for dt in (D1, D2, D3):
        recs = records(store, dt)
        new = {r["key"]["id"] for r in recs if r["op"] == "INSERT"} - seen
        changed = {r["key"]["id"] for r in recs if r["op"] != "INSERT"}
        assert new and min(new) > max(seen), dt  # continues after every earlier key
        assert changed <= seen | new, dt  # an UPDATE or DELETE touches a key that exists
        seen |= new
    # night 2 inserts none of night 1's keys, but its own contended re-inserts after a delete
    first = {r["key"]["id"] for r in records(store, D1)}
    second = Counter(r["key"]["id"] for r in records(store, D2) if r["op"] == "INSERT")
    reinserted = [k for k in second if k in first]
    deleted_then = {r["key"]["id"] for r in records(store, D2) if r["op"] == "DELETE"}
    assert set(reinserted) <= deleted_then


def test_a_deleted_key_is_not_changed_again(store: FileStore):
    config = parse_config(CONFIG)
    generate(config, store, D1, GenerateOptions(events=3000, base_rows=200, seed=4))
    dead = {r["key"]["id"] for r in records(store, D1) if r["op"] == "DELETE"}
    last_op = {r["key"]["id"]: r["op"] for r in sorted(records(store, D1), key=lambda r: r["ts"])}
    dead = {k for k in dead if last_op[k] == "DELETE"}
    assert dead
    generate(config, store, D2, GenerateOptions(events=3000, seed=5))
    assert not dead & {r["key"]["id"] for r in records(store, D2) if r["op"] != "INSERT"}


@pytest.mark.parametrize(("skew", "share"), [(0.0, 0.1), (0.5, 0.55), (0.8, 0.82)])
def test_skew_is_the_share_of_changes_on_the_newest_tenth(skew: float, share: float):
    keys = KeySpace(10_000, dead={9_999})
    rng = random.Random(1)
    picks = [keys.pick(rng, skew) for _ in range(20_000)]
    assert 9_999 not in picks and None not in picks
    assert sum(n >= 9_000 for n in picks) / len(picks) == pytest.approx(share, abs=0.015)


def test_two_percent_of_keys_are_contended_by_default(store: FileStore):
    config = parse_config(CONFIG)
    opts = GenerateOptions(events=12_000, base_rows=50_000, skew=0, late_rate=0, seed=7)
    generate(config, store, D1, opts)
    by_key: dict[int, list[int]] = {}
    for r in records(store, D1):
        by_key.setdefault(r["key"]["id"], []).append(r["ts"])
    # contended: written more than once within the replication delay (90 s)
    contended = sum(
        any(b - a <= 90_000_000 for a, b in itertools.pairwise(sorted(ts)))
        for ts in by_key.values()
    )
    assert 0.012 <= contended / len(by_key) <= 0.03, contended / len(by_key)


def test_a_date_generated_again_gives_the_same_bytes(store: FileStore, tmp_path: Path):
    config = parse_config(CONFIG)
    generate(config, store, D1, GenerateOptions(events=500, base_rows=50, seed=1))
    generate(config, store, D2, GenerateOptions(events=500, seed=2))
    first = {k: store.read_bytes(k) for k in store.list("exports")}
    generate(config, store, D2, GenerateOptions(events=500, seed=2))
    assert {k: store.read_bytes(k) for k in store.list("exports")} == first
    # the record of the keys is per date: a later date does not change an earlier one's
    assert (
        KeySpace.before(store, "items", D2).next_key < KeySpace.before(store, "items", D3).next_key
    )


def test_a_key_made_tonight_is_changed_only_after_it_is_made(store: FileStore):
    """A night's changes to existing keys pick the keys that existed as it began: a key
    made tonight gets no UPDATE or DELETE timed before its INSERT."""
    config = parse_config(CONFIG)
    generate(config, store, D1, GenerateOptions(events=3000, base_rows=100, skew=0.9, seed=8))
    by_key: dict[int, list[dict[str, Any]]] = {}
    for r in records(store, D1):
        by_key.setdefault(r["key"]["id"], []).append(r)
    made = {k: sorted(rs, key=lambda r: r["ts"]) for k, rs in by_key.items() if k >= 100}
    assert len(made) > 500
    assert [k for k, rs in made.items() if rs[0]["op"] != "INSERT"] == []
