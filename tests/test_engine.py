"""The Spark engine against the pure-Python fold: generated keys, each with a random prior
row and one to three events, go through ``cdr run``; the published state must equal what
``pipeline.rowfold`` computes for the same events. Single-event keys take the engine's
column-expression path, the rest its mapInArrow fold: this checks that the fast path
mirrors the rules exactly. Also: nothing an export held is lost (accounting)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import scenarios as S
import yaml

from pipeline.cli import main
from pipeline.config import parse_config
from pipeline.rowfold import Event, FoldSpec, Version, fold_converged

D1, D2 = "2026-11-20", "2026-11-21"
T1 = 1_795_132_800_000_000  # 2026-11-20T00:00:00Z
DAY = 86_400_000_000
NOW1, NOW2 = T1 + DAY, T1 + 2 * DAY
REPLICAS = [{"id": "pub", "system_id": 7301}, {"id": "sub", "system_id": 7302}]


def gen_events(
    rng: random.Random, keys: list[int], day0: int, prefix: str, delta: bool
) -> list[dict]:
    out = []
    n = 0
    for k in keys:
        for _ in range(rng.choice([1, 1, 1, 1, 2, 3])):
            n += 1
            origin = rng.choice(["pub", "sub"])
            op = rng.choice(["INSERT", "UPDATE", "UPDATE", "DELETE"])
            ts = day0 + rng.randrange(0, DAY // 2) * 1000 // 1000
            if rng.random() < 0.1:
                ts = day0 + 3_600_000_000  # equal timestamps exercise the tie-break
            e = {
                "op": op,
                "key": {"id": k},
                "ts": ts,
                "origin": origin,
                "event_id": f"{origin}-{prefix}{n}",
            }
            if op == "INSERT":
                e["after"] = {"id": k, "v": f"v{n}", "n": rng.randint(0, 9)}
                if rng.random() < 0.15:
                    del e["after"]["n"]  # target_column_extra: use_default
            elif op == "UPDATE":
                cols = rng.sample(["v", "n"], rng.randint(1, 2))
                e["after"] = {c: (f"u{n}" if c == "v" else rng.randint(0, 9)) for c in cols}
                if delta and "n" in cols:
                    e["before"] = {"n": rng.randint(0, 9)}
                elif not delta and rng.random() < 0.5:
                    e["before"] = {"v": f"b{k}"}  # the base value: matches until it changes
                if rng.random() < 0.2:
                    e["after"] = {"id": k, "v": f"f{n}", "n": rng.randint(0, 9)}
                    if delta:
                        e["before"] = {"n": rng.randint(0, 9)}
            out.append(e)
    return out


def exports_of(events: list[dict], rng: random.Random) -> dict:
    """Both replicas export every event, each in an order of its own."""
    ex = {}
    for rep in ("pub", "sub"):
        evs = [dict(e) for e in events]
        rng.shuffle(evs)
        for i, e in enumerate(evs, 1):
            e["seq"] = i
        ex[rep] = {"t": evs}
    return ex


def to_event(e: dict, ranks: dict[str, int]) -> Event:
    return Event(
        e["event_id"],
        e["op"],
        (e["key"]["id"],),
        e["ts"],
        e["origin"],
        ranks[e["origin"]],
        after=e.get("after", {}),
        before=e.get("before", {}),
    )


CASES = {
    "postgres_before_image": {"resolvers": {}, "detection": "before_image"},
    "postgres_apply": {
        "resolvers": {
            "update_differ": "apply",
            "insert_exists": "apply",
            "delete_differ": "earliest_timestamp_wins",
            "update_deleted": "apply_or_skip",
        }
    },
    "delete_wins_delta": {"policy": "delete_wins", "delta": ["n"]},
}


@pytest.mark.parametrize("case", CASES)
def test_engine_equals_the_python_fold(case: str, tmp_path: Path, spark):
    rng = random.Random(f"engine-{case}")
    table = {
        "key": ["id"],
        "columns": {"id": "int", "v": "string", "n": "int"},
        "defaults": {"n": 0},
        **CASES[case],
    }
    delta = "delta" in table
    cfg_dict = {"replicas": REPLICAS, "on_divergence": "warn", "tables": {"t": table}}
    config = parse_config(cfg_dict)
    spec1, spec2 = (FoldSpec(config.tables["t"], now) for now in (NOW1, NOW2))
    ranks = config.tie_ranks(config.tables["t"].tie_break)

    keys = list(range(400))
    base = [
        {
            "id": k,
            "v": f"b{k}",
            "n": k % 10,
            **({"_ts": T1 - DAY, "_origin": rng.choice(["pub", "sub"])} if k % 3 else {}),
        }
        for k in keys[:200]
    ]
    day1 = gen_events(rng, rng.sample(keys, 150), T1, "a", delta)
    day2 = gen_events(rng, rng.sample(keys, 250), T1 + DAY, "b", delta)

    store = tmp_path / "store"
    S.write_jsonl(store / "base/table=t", base, {"table": "t"})
    S.write_exports(store, D1, exports_of(day1, rng))
    S.write_exports(store, D2, exports_of(day2, rng))
    cfg_dict["store"] = store.as_uri()
    (tmp_path / "cdr.yaml").write_text(yaml.safe_dump(cfg_dict))
    for d, now in ((D1, "2026-11-21T00:00:00Z"), (D2, "2026-11-22T00:00:00Z")):
        assert (
            main(
                [
                    "run",
                    "--config",
                    str(tmp_path / "cdr.yaml"),
                    "--date",
                    d,
                    "--now",
                    now,
                    "--work-dir",
                    str(tmp_path / "work"),
                ]
            )
            == 0
        )

    state = {}
    for b in base:
        state[(b["id"],)] = Version(
            {"id": b["id"], "v": b["v"], "n": b["n"]},
            b.get("_ts", 0),
            b.get("_origin"),
            None,
            ranks.get(b.get("_origin"), -1),
        )
    ref1 = fold_converged(spec1, state, [to_event(e, ranks) for e in day1])
    ref2 = fold_converged(spec2, ref1.state, [to_event(e, ranks) for e in day2])

    pointer = json.loads((store / "published/t/_latest.json").read_text())
    got = {}
    for f in (store / pointer["state"]).glob("*.parquet"):
        for r in pq.read_table(f).to_pylist():
            got[(r["id"],)] = (
                r["_deleted"],
                r["v"] if not r["_deleted"] else None,
                r["n"] if not r["_deleted"] else None,
                r["_ts"],
                r["_origin"],
                r["_event_id"],
                r["_deleted_at"],
            )
    want = {
        k: (
            v.deleted,
            None if v.deleted else v.values["v"],
            None if v.deleted else v.values["n"],
            v.ts,
            v.origin,
            v.event_id,
            v.deleted_at,
        )
        for k, v in ref2.state.items()
    }
    assert got == want

    report = json.loads((store / f"published/reports/dt={D2}/run_report.json").read_text())
    t = report["tables"]["t"]
    # accounting: every distinct event is applied, discarded with a conflict row, or
    # quarantined; every record of every export is one of those events
    assert t["distinct_events"] == len(day2)
    assert t["applied"] + t["discarded"] + sum(t["quarantined"].values()) == len(day2)
    assert t["events"] == 2 * len(day2)
    n_conflicted = len(
        {c["remote_event_id"] for c in S.read_parquet_dir(store / f"published/t/conflicts/dt={D2}")}
    )
    assert t["discarded"] <= n_conflicted
    for rep in ("pub", "sub"):
        r = t["replicas"][rep]
        assert r["records"] == r.get("applied", 0) + r.get("discarded", 0) + r.get("quarantined", 0)
