"""The Spark engine against the pure-Python fold: generated keys, each with a random prior
row and one to three events, go through ``cdr run``; the published state must equal what
``pipeline.rules.rowfold`` computes for the same events. A lone insert onto an absent key
takes the fold task's Arrow path (``pipeline.resolve.groups``), the other keys the Python fold:
this checks that the Arrow path mirrors the rules exactly. Also: nothing an export held
is lost (accounting)."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest

from pipeline.app.cli import main
from pipeline.core.config_load import parse_config
from pipeline.core.jsonvalues import dumps
from pipeline.core.report import RunReport
from pipeline.rules.events import Event, FoldSpec, Version, read_groups, reader_view, write_groups
from pipeline.rules.perspectives import divergent_keys, fold_perspective
from pipeline.rules.rowfold import fold_converged
from tests.helpers import configs
from tests.helpers import published as P
from tests.helpers import scenarios as S
from tests.helpers.sparkjobs import codegen_modes

D1, D2 = "2026-11-20", "2026-11-21"
T1 = 1_795_132_800_000_000  # 2026-11-20T00:00:00Z
DAY = 86_400_000_000
NOW1, NOW2 = T1 + DAY, T1 + 2 * DAY
REPLICAS = configs.replicas(pub=7301, sub=7302)


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


def to_event(e: dict, ranks: dict[str, int], seqs: dict[str, int]) -> Event:
    return Event(
        e["event_id"],
        e["op"],
        (e["key"]["id"],),
        e["ts"],
        e["origin"],
        ranks[e["origin"]],
        after=e.get("after", {}),
        before=e.get("before", {}),
        seqs=seqs,
    )


def events_of(exports: dict, events: list[dict], ranks: dict[str, int]) -> list[Event]:
    seqs: dict[str, dict[str, int]] = {e["event_id"]: {} for e in events}
    for rep, tables in exports.items():
        for e in tables["t"]:
            seqs[e["event_id"]][rep] = e["seq"]
    return [to_event(e, ranks, seqs[e["event_id"]]) for e in events]


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
    "postgres_skip_delta": {
        "delta": ["n"],
        "history": True,  # history: a discarded UPDATE still adds its delta: a version
        "resolvers": {
            "update_differ": "skip",
            "insert_exists": "earliest_timestamp_wins",
            "delete_differ": "skip",
            "update_deleted": "latest_timestamp_wins",
            "update_missing": "skip",
        },
    },
    "delete_wins_delta": {"policy": "delete_wins", "delta": ["n"]},
    "postgres_groups": {  # with a merge column in a group (docs/rules.md#merge-functions)
        "column_groups": {"label": ["v"], "stock": ["n"]},
        "merge": {"n": "max"},
        "history": True,
    },
    "postgres_priority": {  # docs/rules.md#priority, with the top-level priority: [sub, pub]
        "resolvers": {
            t: "priority_wins"
            for t in ("insert_exists", "update_differ", "delete_differ", "update_deleted")
        }
    },
}


def reference(spec: FoldSpec, state: dict, events: list[Event], replicas: list[str]) -> dict:
    """What the pure fold says a run publishes: the state, the conflict log, the events
    that were not applied, and each replica's divergent keys with both versions."""
    res = fold_converged(spec, state, events)
    assert res.stopped is None
    conflicts = Counter(
        (
            dumps({"id": c.key[0]}),
            c.type.value,
            c.resolver.value,
            c.outcome.value,
            c.event.event_id,
            c.local[0].ts if c.local else None,
            c.local[0].origin if c.local else None,
            c.reason,
        )
        for a in res.applied
        for c in a.conflicts
    )
    divergence = set()
    for rep in replicas:
        mine = fold_perspective(spec, state, events, rep)
        for k in divergent_keys(res.state, mine):
            rv, cv = reader_view(mine.get(k)), reader_view(res.state.get(k))
            divergence.add((rep, dumps({"id": k[0]}), _json(rv), _json(cv)))
    return {
        "state": res.state,
        "conflicts": conflicts,
        "not_applied": {a.event.event_id for a in res.applied if not a.applied},
        "divergence": divergence,
    }


def _live(state: dict) -> dict:
    """The rows a reader sees of a fold's state."""
    return {k: reader_view(v) for k, v in state.items() if reader_view(v) is not None}


def as_of(history: list[dict], t: int) -> dict:
    """The rows a reader saw at instant ``t`` (µs), by the history: each key's version
    whose interval holds ``t``, unless it records a deletion."""
    out = {}
    for r in history:
        start = int(r["_valid_from"].timestamp() * 1_000_000)
        end = r["_valid_to"] and int(r["_valid_to"].timestamp() * 1_000_000)
        if start <= t and (end is None or t < end):
            assert (r["id"],) not in out, f"two versions of {r['id']} hold {t}"
            out[(r["id"],)] = None if r["_deleted"] else {c: r[c] for c in ("id", "v", "n")}
    return {k: v for k, v in out.items() if v is not None}


def check_history(
    histories: list[list[dict]], nights: list[tuple], final: dict, rng: random.Random
) -> None:
    """docs/outputs.md#history's properties, on two nights without late changes: the version
    valid at an instant is the fold of the events up to it; each key's last version is
    its row in the state; night 2 changes night 1's versions only to close them."""
    last = histories[-1]
    assert not any(r["_late"] for r in last)
    for spec, prior, events in nights:
        instants = sorted({e.ts for e in events})
        for t in [*rng.sample(instants, min(15, len(instants))), instants[-1]]:
            state = fold_converged(spec, prior, [e for e in events if e.ts <= t]).state
            assert as_of(last, t) == _live(state), t
    current = [r for r in last if r["_valid_to"] is None]
    assert as_of(current, 2**62) == _live(final)
    night1 = {(r["id"], r["_version"]): r for r in histories[0]}
    dt1 = next(iter(night1.values()))["dt"]
    kept = {(r["id"], r["_version"]): r for r in last if r["dt"] == dt1}
    assert kept.keys() == night1.keys()
    for k, r in night1.items():
        closed = {**r, "_valid_to": kept[k]["_valid_to"]} if r["_valid_to"] is None else r
        assert kept[k] == closed, k


def _json(row: dict | None) -> str | None:
    return None if row is None else dumps(dict(sorted(row.items())))


def published(store: Path, d: str) -> dict:
    """The same, read from what ``cdr run`` published for date ``d``."""
    rows = P.log(store, "t", "conflicts", d)
    conflicts = Counter(
        (
            r["key"],
            r["conflict_type"],
            r["resolver"],
            r["outcome"],
            r["remote_event_id"],
            r["local_ts"],
            r["local_origin"],
            r["reason"],
        )
        for r in rows
    )
    not_applied = {
        r["remote_event_id"] for r in rows if r["outcome"] in ("discarded", "skipped", "errored")
    }
    divergence = {
        (
            r["replica"],
            r["key"],
            _json(json.loads(r["replica_row"])) if r["replica_row"] else None,
            _json(json.loads(r["converged_row"])) if r["converged_row"] else None,
        )
        for r in P.log(store, "t", "divergence", d)
    }
    return {"conflicts": conflicts, "not_applied": not_applied, "divergence": divergence}


def state_rows(state: dict) -> dict:
    return {
        k: (
            v.deleted,
            None if v.deleted else v.values["v"],
            None if v.deleted else v.values["n"],
            v.ts,
            v.origin,
            v.event_id,
            v.deleted_at,
            read_groups(write_groups(v.groups)) if v.groups else None,  # column groups
        )
        for k, v in state.items()
    }


#: cases whose runs compile their Spark plans (``CDR_CODEGEN=on``, what a large run does);
#: the others interpret them, as small runs do: both evaluations are held to the fold
COMPILED = {"postgres_skip_delta", "delete_wins_delta"}


@pytest.mark.parametrize("case", CASES)
def test_engine_equals_the_python_fold(case: str, tmp_path: Path, spark, monkeypatch):
    """State, conflict log, the fate of every event and the divergence of every replica,
    on both dates, as the pure fold computes them."""
    monkeypatch.setenv("CDR_CODEGEN", "on" if case in COMPILED else "off")
    modes = codegen_modes(monkeypatch)
    rng = random.Random(f"engine-{case}")
    table = configs.table(
        {"id": "int", "v": "string", "n": "int"}, defaults={"n": 0}, **CASES[case]
    )
    delta = "delta" in table
    cfg_dict = configs.config(
        table, replicas=REPLICAS, priority=["sub", "pub"], on_divergence="warn"
    )
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
    ex1, ex2 = exports_of(day1, rng), exports_of(day2, rng)

    store = tmp_path / "store"
    S.write_jsonl(store / "base/table=t", base, {"table": "t"})
    S.write_exports(store, D1, ex1)
    S.write_exports(store, D2, ex2)
    configs.write(tmp_path / "cdr.yaml", cfg_dict, store=store)
    histories = []  # the published history after each night (history)
    for d, now in ((D1, "2026-11-21T00:00:00Z"), (D2, "2026-11-22T00:00:00Z")):
        args = ["run", "--config", str(tmp_path / "cdr.yaml"), "--date", d, "--now", now]
        assert main([*args, "--work-dir", str(tmp_path / "work"), "--no-data-docs"]) == 0
        if "history" in table:
            histories.append(P.rows(store, "published/t/history"))
    assert set(modes) == {case in COMPILED}, modes  # each stage of each run

    state = {}
    for b in base:
        state[(b["id"],)] = Version(
            {"id": b["id"], "v": b["v"], "n": b["n"]},
            b.get("_ts", 0),
            b.get("_origin"),
            None,
            ranks.get(b.get("_origin"), -1),
        )
    replicas = [r["id"] for r in REPLICAS]
    ref1 = reference(spec1, state, events_of(ex1, day1, ranks), replicas)
    ref2 = reference(spec2, ref1["state"], events_of(ex2, day2, ranks), replicas)
    for d, ref in ((D1, ref1), (D2, ref2)):
        got = published(store, d)
        assert got["conflicts"] == ref["conflicts"], d
        assert got["not_applied"] == ref["not_applied"], d
        assert got["divergence"] == ref["divergence"], d
    assert ref2["conflicts"] and ref2["not_applied"]  # the case meets conflicts

    if "history" in table:
        nights = [
            (spec1, state, events_of(ex1, day1, ranks)),
            (spec2, ref1["state"], events_of(ex2, day2, ranks)),
        ]
        check_history(histories, nights, ref2["state"], rng)

    got_state = {
        (r["id"],): (
            r["_deleted"],
            r["v"] if not r["_deleted"] else None,
            r["n"] if not r["_deleted"] else None,
            r["_ts"],
            r["_origin"],
            r["_event_id"],
            r["_deleted_at"],
            read_groups(r["_groups"]) if r.get("_groups") else None,
        )
        for r in P.state(store, "t", D2)
    }
    assert got_state == state_rows(ref2["state"])
    if "column_groups" in table:  # the run kept rows whose groups differ
        assert any(g is not None for *_, g in got_state.values())
    if "merge" in table:  # the engine's conflicts took a losing version's max
        assert any("merge took the" in c[-1] for ref in (ref1, ref2) for c in ref["conflicts"])

    report = RunReport.from_json((store / f"published/reports/dt={D2}/run_report.json").read_text())
    t = report.tables["t"]
    # accounting: every distinct event is applied, or not applied with a conflict-log row
    # (the fold's own verdict), or quarantined; every record of every export is one of them
    assert t.distinct_events == len(day2)
    assert t.discarded == len(ref2["not_applied"])
    assert t.applied == len(day2) - len(ref2["not_applied"]) - sum(t.quarantined.values())
    assert t.events == 2 * len(day2)
    for rep in ("pub", "sub"):
        r = t.replicas[rep]
        assert r["records"] == r.get("applied", 0) + r.get("discarded", 0) + r.get("quarantined", 0)
