"""Properties of whole runs through ``cdr run`` on Spark, on generated exports that hold
what real exports hold: copies of one event in several replicas' exports (some missing,
some that differ from the origin's copy, some under another key), ties on ``ts``, key
changes, a TRUNCATE now and then, and records the guards quarantine.

- **No event is lost** (docs/outputs.md): every distinct event is applied, not applied
  with a conflict-log row, or quarantined with its reason; every record of every export
  is counted for its replica, a record a replica exported twice as a duplicate.
- **The converged result ignores the order of the exports**
(docs/rules.md#the-canonical-order): the same events
  exported in other orders (each replica's records shuffled, ``seq`` renumbered, so
  that every perspective changes) publish the same snapshot, state, conflict log and
  quarantine.

Each example is two runs, so there are few, and they are not shrunk.
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from pipeline.app.cli import main
from pipeline.core.report import RunReport
from tests.helpers import configs
from tests.helpers import published as P
from tests.helpers import scenarios as S

DATE, NOW = "2026-11-21", "2026-11-22T00:00:00Z"
T0 = 1_795_219_200_000_000  # 2026-11-21T00:00:00Z
MINUTE = 60_000_000
DAY = 86_400_000_000
REPLICAS = ["a", "b", "c"]
CONFIG = configs.config(
    configs.table(
        {"id": "int", "v": "string", "n": "int"},
        unique=[["v"]],
        delta=["n"],
        defaults={"n": 0},
        resolvers={
            "multiple_unique_conflicts": "apply",
            "update_differ": "latest_timestamp_wins",
            "insert_exists": "latest_timestamp_wins",
            "update_deleted": "latest_timestamp_wins",
        },
    ),
    replicas=REPLICAS,
    on_divergence="warn",
)
#: how an event is broken in every copy, and the guard that must quarantine it
#: (docs/rules.md#conflict-types, docs/rules.md#what-is-quarantined)
BREAKS = {
    "no_origin": "malformed",
    "future": "future_timestamp",
    "stale": "stale_beyond_gc_grace",
    "no_old_value": "delta_without_old_value",
}


@st.composite
def nights(draw) -> dict[str, Any]:
    """One night's events and, for each, which replicas exported which copy."""
    rnd = random.Random(draw(st.integers(0, 2**32)))
    events: list[dict[str, Any]] = []
    expect_q: dict[str, str] = {}
    for i in range(rnd.randint(25, 60)):
        origin = rnd.choice(REPLICAS)
        eid = f"{origin}-{i:03d}"
        k = rnd.randint(0, 7)
        op = rnd.choices(["INSERT", "UPDATE", "DELETE", "TRUNCATE"], [4, 6, 2, 0.3])[0]
        e: dict[str, Any] = {
            "op": op,
            "ts": T0 + rnd.randint(1, 6) * MINUTE,  # few distinct values: many ties
            "origin": origin,
            "event_id": eid,
        }
        if op != "TRUNCATE":
            e["key"] = {"id": k}
        v = rnd.choice(["x", "y", "z", f"u{i}"])
        if op == "INSERT":
            e["after"] = {"id": k, "v": v, "n": rnd.randint(0, 9)}
        elif op == "UPDATE":
            e["after"] = {"v": v}
            if rnd.random() < 0.5:
                old = rnd.randint(0, 9)
                e["after"]["n"], e["before"] = old + rnd.randint(-3, 3), {"n": old}
            if rnd.random() < 0.1:
                e["new_key"] = {"id": rnd.randint(0, 7)}
        if rnd.random() < 0.08:
            how = rnd.choice(sorted(BREAKS))
            if how == "no_origin":
                del e["origin"]
            elif how == "future":
                e["ts"] = T0 + DAY + 3_600_000_000
            elif how == "stale":
                e["ts"] = T0 - 20 * DAY
            else:
                e = {**e, "op": "UPDATE", "key": {"id": k}, "after": {"n": 5}}
                e.pop("before", None)
                e.pop("new_key", None)
            expect_q[eid] = BREAKS[how]
        events.append(e)
    no_id = [
        {"op": "INSERT", "key": {"id": 9}, "after": {"id": 9, "v": "w", "n": 1}, "ts": T0}
        for _ in range(rnd.randint(0, 2))
    ]
    return {"events": events, "no_id": no_id, "quarantined": expect_q, "seed": rnd.random()}


def chosen_replica(e: dict[str, Any], exporters: list[str]) -> str:
    """docs/rules.md#what-is-quarantined: the origin's own copy stands for the event, else
    the first replica in config order."""
    return e["origin"] if e.get("origin") in exporters else exporters[0]


def exports(night: dict[str, Any], order_seed: int) -> dict[str, dict[str, list[dict]]]:
    """Each replica's export: the copies it holds, in an apply order of its own (each
    origin's events in commit order), with ``seq`` numbered in that order. Copies that do
    not stand for their event may differ from it, in their values or even their key."""
    rnd = random.Random(night["seed"])  # which replica holds which copy: fixed per night
    held: dict[str, list[dict[str, Any]]] = {r: [] for r in REPLICAS}
    for e in night["events"]:
        exporters = [r for r in REPLICAS if r == e.get("origin") or rnd.random() < 0.7]
        exporters = exporters or [rnd.choice(REPLICAS)]
        chosen = chosen_replica(e, exporters)
        for r in exporters:
            copy = json.loads(json.dumps(e))
            if r != chosen and "key" in copy and "origin" in copy and rnd.random() < 0.15:
                if rnd.random() < 0.5 and copy["op"] == "INSERT":
                    # docs/rules.md#what-is-quarantined: only the chosen copy counts
                    copy["after"]["v"] = "differs"
                elif copy["op"] in ("UPDATE", "DELETE") and "new_key" not in copy:
                    copy["key"] = {"id": (copy["key"]["id"] + 1) % 8}  # under another key
            held[r].append(copy)
            if rnd.random() < 0.05:  # the replica exported it twice: a duplicate record
                held[r].append(json.loads(json.dumps(copy)))
    held[REPLICAS[0]] += [dict(x) for x in night["no_id"]]
    order = random.Random(order_seed)
    out = {}
    for r, copies in held.items():
        order.shuffle(copies)
        by_origin: dict[Any, list[dict]] = {}
        for c in sorted(copies, key=lambda c: c["ts"]):
            by_origin.setdefault(c.get("origin"), []).append(c)
        records = [by_origin[c.get("origin")].pop(0) for c in copies]
        out[r] = {"t": [{**c, "seq": i} for i, c in enumerate(records, 1)]}
    return out


def run(tmp: Path, ex: dict[str, Any]) -> Path:
    store = tmp / "store"
    S.write_exports(store, DATE, ex)
    configs.write(tmp / "cdr.yaml", CONFIG, store=store)
    args = ["run", "--config", str(tmp / "cdr.yaml"), "--date", DATE, "--now", NOW]
    assert main([*args, "--work-dir", str(tmp / "work"), "--no-data-docs"]) == 0
    return store


#: the place a quarantine's detail starts with: `<file> line <n>: `
LINE = re.compile(r"^\S+ line \d+: ")


def outputs(store: Path) -> dict[str, Any]:
    # a quarantined record is kept whole, with its seq, which the other order renumbers;
    # its detail names the line it was on, which the other order moves
    drop = {"run_id", "dt", "event"}

    def unplaced(k: str, v: Any) -> Any:
        return LINE.sub("", v) if k == "detail" and isinstance(v, str) else v

    def rows(got: list[dict[str, Any]]) -> Counter[str]:
        return Counter(
            json.dumps(
                {k: unplaced(k, v) for k, v in r.items() if k not in drop},
                sort_keys=True,
                default=str,
            )
            for r in got
        )

    report = RunReport.from_json(
        (store / f"published/reports/dt={DATE}/run_report.json").read_text()
    )
    # each replica's order's: the perspectives, and what the writers had seen
    # (docs/rules.md#lost-writes: judged from the exports' order, by definition)
    perspectives = ("divergent_keys", "divergent_causes", "concurrency", "lost_writes")
    counts = {k: v for k, v in report.tables["t"].to_dict().items() if k not in perspectives}
    seen = ("concurrency", "concurrency_why", "lost_event_id")
    conflicts = [
        {k: v for k, v in c.items() if k not in seen} for c in P.log(store, "t", "conflicts", DATE)
    ]
    return {
        "snapshot": rows(P.snapshot(store, "t")),
        "state": rows(P.state(store, "t", DATE)),
        "conflicts": rows(conflicts),
        "quarantine": rows(P.log(store, "t", "quarantine", DATE)),
        "counts": counts,
    }


def check_accounting(store: Path, night: dict[str, Any], ex: dict[str, Any]) -> None:
    report = RunReport.from_json(
        (store / f"published/reports/dt={DATE}/run_report.json").read_text()
    )
    t = report.tables["t"]
    ids = {e["event_id"] for e in night["events"]}
    distinct = len(ids) + len(night["no_id"])
    assert t.distinct_events == distinct
    quarantined = P.log(store, "t", "quarantine", DATE)
    got_q = Counter((q["event_id"], q["reason"]) for q in quarantined)
    want_q = Counter(night["quarantined"].items()) + Counter(
        {(None, "malformed"): len(night["no_id"])}
    )
    assert got_q == want_q
    conflicts = P.log(store, "t", "conflicts", DATE)
    assert {c["remote_event_id"] for c in conflicts} <= ids - set(night["quarantined"])
    not_applied = {
        c["remote_event_id"] for c in conflicts if c["outcome"] in ("discarded", "skipped")
    }
    assert t.discarded == len(not_applied)
    assert t.errored == t.not_reached == 0
    assert t.applied + t.discarded + sum(t.quarantined.values()) == distinct
    for r in REPLICAS:
        mine, records = t.replicas[r], ex[r]["t"]
        assert mine["records"] == len(records)
        with_id = [c["event_id"] for c in records if "event_id" in c]
        assert mine.get("duplicate", 0) == len(with_id) - len(set(with_id)), (r, mine)
        fates = ("applied", "discarded", "quarantined", "duplicate")
        assert mine["records"] == sum(mine.get(f, 0) for f in fates), (r, mine)


@settings(
    max_examples=2,
    deadline=None,
    derandomize=True,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(night=nights(), order_seed=st.integers(0, 2**32))
def test_no_event_is_lost_and_export_order_does_not_matter(
    night, order_seed, tmp_path_factory, spark
):
    first_ex, other_ex = exports(night, 0), exports(night, order_seed + 1)
    first = run(tmp_path_factory.mktemp("first"), first_ex)
    other = run(tmp_path_factory.mktemp("other"), other_ex)
    check_accounting(first, night, first_ex)
    check_accounting(other, night, other_ex)
    a, b = outputs(first), outputs(other)
    for what in ("snapshot", "state", "conflicts", "quarantine", "counts"):
        assert a[what] == b[what], what
