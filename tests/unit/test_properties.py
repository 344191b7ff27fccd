"""Property tests of the row fold (docs/rules.md#the-canonical-order,
docs/rules.md#convergence), generated with hypothesis.

- With last-writer-wins resolvers the converged state depends on neither the order of the
  exports nor the order of events that tie on their timestamp.
- With last-writer-wins resolvers and full-row writes, every replica's perspective (its
  own apply order) equals the converged state.
- No event is lost: each one is applied, or discarded with a conflict-log row.
- With ``insert_exists: skip``, a two-replica insert race is a divergence.

The Spark engine is held to the Python fold by ``tests/spark/test_engine.py``, and its
divergence report on a generated race by ``tests/spark/test_properties.py``.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.core.policy import ConflictType, allowed_resolvers
from pipeline.rules.events import Event, FoldSpec, Version, reader_view
from pipeline.rules.perspectives import divergent_keys, fold_perspective
from pipeline.rules.rowfold import fold_converged
from tests.helpers import configs
from tests.helpers.fold_helpers import NOW, T0, make_config

REPLICAS3 = configs.replicas("a", "b", "c")
LWW = {
    "insert_exists": "latest_timestamp_wins",
    "update_differ": "latest_timestamp_wins",
    "update_missing": "apply_or_skip",
    "update_deleted": "latest_timestamp_wins",
    "delete_differ": "latest_timestamp_wins",
    "delete_missing": "skip",
}
#: docs/rules.md#priority: every resolver that may be ``priority_wins`` is
PRIORITY = {t: ("priority_wins" if r == "latest_timestamp_wins" else r) for t, r in LWW.items()}
MS = 1000


def lww_spec(
    resolvers: dict[str, str] = LWW, table: dict | None = None, **top
) -> tuple[FoldSpec, dict[str, int]]:
    cfg = make_config({"resolvers": resolvers, **(table or {})}, replicas=REPLICAS3, **top)
    t = cfg.tables["t"]
    return FoldSpec(t, NOW), cfg.tie_ranks(t.tie_break)


def converged_in_every_order(spec: FoldSpec, state: dict, events: list[Event]) -> dict:
    """The converged state, once every replica's own apply order is shown to reach it."""
    converged = fold_converged(spec, state, events).state
    for replica in ("a", "b", "c"):
        mine = fold_perspective(spec, state, events, replica)
        assert divergent_keys(converged, mine) == [], replica
        assert view(mine) == view(converged)
    return converged


@st.composite
def workloads(draw, deletes: bool = True):
    """Events on a few keys from three origins; timestamps drawn from a small set so that
    ties between origins are frequent. Writes carry the full row. Each replica exports
    every event in an order of its own, which is its perspective's apply order: any
    interleaving of the origins, but each origin's events in its commit order, as logical
    replication applies them (an origin's commit timestamps are distinct and increasing)."""
    n = draw(st.integers(1, 12))
    ops = ["INSERT", "UPDATE", "DELETE"] if deletes else ["INSERT", "UPDATE"]
    raw = []
    used: set[tuple[str, int]] = set()
    for i in range(n):
        origin = draw(st.sampled_from(["a", "b", "c"]))
        ts = T0 + draw(st.integers(0, 4)) * MS
        while (origin, ts) in used:
            ts += 1
        used.add((origin, ts))
        raw.append(
            {
                "event_id": f"e{i:02d}",
                "op": draw(st.sampled_from(ops)),
                "key": draw(st.integers(0, 2)),
                "ts": ts,
                "origin": origin,
                "v": draw(st.sampled_from(["x", "y", "z"])),
                "n": draw(st.integers(0, 3)),
            }
        )
    prior = draw(
        st.dictionaries(
            st.integers(0, 2),
            st.tuples(
                st.sampled_from(["p", "q"]), st.integers(0, 3), st.sampled_from(["a", "b", "c"])
            ),
            max_size=3,
        )
    )
    orders = {r: commit_order(raw, draw(st.permutations(range(n)))) for r in ("a", "b", "c")}
    return raw, prior, orders


def commit_order(raw: list[dict], order: list[int]) -> list[int]:
    """Keep the interleaving of origins in ``order``, each origin's events by ``ts``."""
    queues = {
        o: sorted((i for i in order if raw[i]["origin"] == o), key=lambda i: raw[i]["ts"])
        for o in ("a", "b", "c")
    }
    return [queues[raw[i]["origin"]].pop(0) for i in order]


def build(raw, prior, orders, ranks) -> tuple[dict, list[Event]]:
    state = {
        (k,): Version({"id": k, "v": v, "n": nn}, T0 - 10 * MS, o, None, ranks[o])
        for k, (v, nn, o) in prior.items()
    }
    seqs = {r["event_id"]: {} for r in raw}
    for rep, order in orders.items():
        for pos, i in enumerate(order):
            seqs[raw[i]["event_id"]][rep] = pos
    events = []
    for r in raw:
        after = {} if r["op"] == "DELETE" else {"id": r["key"], "v": r["v"], "n": r["n"]}
        events.append(
            Event(
                r["event_id"],
                r["op"],
                (r["key"],),
                r["ts"],
                r["origin"],
                ranks[r["origin"]],
                after=after,
                seqs=seqs[r["event_id"]],
            )
        )
    return state, events


def view(state: dict) -> dict:
    return {k: reader_view(v) for k, v in state.items() if reader_view(v) is not None}


@settings(max_examples=300, deadline=None)
@given(workloads(deletes=False))
def test_every_perspective_equals_the_converged_state(w):
    raw, prior, orders = w
    spec, ranks = lww_spec()
    state, events = build(raw, prior, orders, ranks)
    converged_in_every_order(spec, state, events)


@settings(max_examples=300, deadline=None)
@given(workloads(deletes=False), st.permutations(["a", "b", "c"]))
def test_priority_wins_is_independent_of_the_apply_order(w, priority):
    """docs/rules.md#priority: under ``priority_wins`` (the most trusted origin, then the latest
    for one origin) with full-row writes, every replica's own apply order reaches the
    converged state, and the converged row of a key is the write of its most trusted
    origin. (As under last-writer-wins, deletes break it: a DELETE of a row a replica has
    not received yet is ``delete_missing``, skipped.)"""
    raw, prior, orders = w
    spec, ranks = lww_spec(PRIORITY, priority=priority)
    state, events = build(raw, prior, orders, ranks)
    converged = converged_in_every_order(spec, state, events)
    for k, v in converged.items():
        writers = [e for e in events if e.key == k] + ([state[k]] if k in state else [])
        best = max(writers, key=lambda x: (-priority.index(x.origin), x.ts, x.rank))
        assert v.origin == best.origin and v.ts == best.ts, (k, v, best)


@settings(max_examples=300, deadline=None)
@given(workloads(deletes=False))
def test_order_by_is_independent_of_the_apply_order(w):
    """docs/rules.md#order-by-a-column: with ``order_by: n`` and last-writer-wins resolvers,
    full-row
    writes reach the same state in every replica's apply order, and a key's converged row
    is the write with the largest ``(n, ts, tie_rank)``, whatever its commit time."""
    raw, prior, orders = w
    spec, ranks = lww_spec(table={"order_by": "n"})
    state, events = build(raw, prior, orders, ranks)
    converged = converged_in_every_order(spec, state, events)
    for k, v in converged.items():
        writers = [(e.after["n"], e.ts, e.rank, e.event_id) for e in events if e.key == k]
        if k in state:
            writers.append((state[k].values["n"], state[k].ts, state[k].rank, ""))
        assert (v.values["n"], v.ts, v.rank, v.event_id or "") == max(writers), k


@st.composite
def group_updates(draw):
    """UPDATEs of rows that exist, each writing one or both column groups (``v``, ``n``),
    from three origins with frequent equal timestamps, in each replica's commit order."""
    raw, prior, orders = draw(workloads(deletes=False))
    prior = {k: draw(st.sampled_from([("p", 0, "a"), ("q", 1, "b")])) for k in range(3)}
    for r in raw:
        r["op"] = "UPDATE"
        r["cols"] = draw(st.sampled_from([("v",), ("n",), ("v", "n")]))
    return raw, prior, orders


@settings(max_examples=300, deadline=None)
@given(group_updates())
def test_column_groups_converge_in_every_apply_order(w):
    """docs/rules.md#column-groups: under per-group last-writer-wins, UPDATEs (no deletes, no key
    changes) reach the same state in every replica's apply order, and each group of a row
    holds its latest writer's values."""
    raw, prior, orders = w
    spec, ranks = lww_spec(table={"column_groups": {"label": ["v"], "stock": ["n"]}})
    state, events = build(raw, prior, orders, ranks)
    events = [
        replace(e, after={c: e.after[c] for c in r["cols"]})
        for e, r in zip(events, raw, strict=True)
    ]
    converged = converged_in_every_order(spec, state, events)
    for k, v in converged.items():
        for col in ("v", "n"):
            writes = [(e.position(), e.after[col]) for e in events if e.key == k and col in e.after]
            base = state[k]
            latest = max(writes, default=None)
            if latest is not None and latest[0] > base.position():
                assert v.values[col] == latest[1], (k, col)
            else:
                assert v.values[col] == base.values[col], (k, col)


@st.composite
def merge_workloads(draw):
    """Full-row writes in which every write but a key's first meets a conflict in every
    apply order: each origin writes a key at most once, and never the origin of its prior
    row (docs/rules.md#merge-functions: outside conflicts a merge column is written as it is)."""
    raw, prior, orders = draw(workloads(deletes=False))
    seen = {(k, o) for k, (_, _, o) in prior.items()}
    keep = []
    for i, r in enumerate(raw):
        if (r["key"], r["origin"]) not in seen:
            seen.add((r["key"], r["origin"]))
            keep.append(i)
    if not keep:
        keep = [0]
        prior.pop(raw[0]["key"], None)
    place = {old: new for new, old in enumerate(keep)}
    kept = [raw[i] for i in keep]
    return kept, prior, {rep: [place[i] for i in o if i in place] for rep, o in orders.items()}


@settings(max_examples=300, deadline=None)
@given(merge_workloads(), st.sampled_from(["max", "min"]))
def test_merge_columns_converge_and_hold_the_extreme_of_every_write(w, fn):
    """docs/rules.md#merge-functions: when every write meets a conflict, every replica's own
    apply order reaches the converged state, whose merge column ``n`` holds the largest
    (smallest) value any version of the key had, and whose other columns are the
    last-writer-wins row's."""
    raw, prior, orders = w
    spec, ranks = lww_spec(table={"merge": {"n": fn}})
    state, events = build(raw, prior, orders, ranks)
    converged = converged_in_every_order(spec, state, events)
    plain = fold_converged(lww_spec()[0], state, events).state
    pick = max if fn == "max" else min
    for k, v in converged.items():
        values = [e.after["n"] for e in events if e.key == k]
        values += [state[k].values["n"]] if k in state else []
        assert v.values["n"] == pick(values), k
        assert {**v.values, "n": None} == {**plain[k].values, "n": None}, k


def test_a_replica_that_lowers_its_own_max_without_a_conflict_diverges():
    """The other side of the rule above (GoldenGate's USEMAX has it too): replica ``a``
    lowers its own row (no conflict: the column is written as it is), ``b`` writes later
    from another origin. ``b``'s perspective meets ``a``'s lowering only as a conflict
    that it wins by the max, the converged order meets it before ``b``'s write: the
    divergence report shows the key."""
    spec, ranks = lww_spec(table={"merge": {"n": "max"}})
    state = {(0,): Version({"id": 0, "v": "p", "n": 3}, T0 - MS, "a", None, ranks["a"])}
    low = Event("e0", "UPDATE", (0,), T0, "a", ranks["a"], after={"n": 0}, seqs={"a": 0, "b": 1})
    high = Event(
        "e1", "UPDATE", (0,), T0 + MS, "b", ranks["b"], after={"n": 1}, seqs={"a": 1, "b": 0}
    )
    converged = fold_converged(spec, state, [low, high]).state
    assert converged[(0,)].values["n"] == 1
    mine = fold_perspective(spec, state, [low, high], "b")
    assert mine[(0,)].values["n"] == 3
    assert divergent_keys(converged, mine) == [(0,)]


@settings(max_examples=100, deadline=None)
@given(
    st.integers(0, 50), st.integers(0, 50), st.sampled_from(["x", "y"]), st.sampled_from(["z", "w"])
)
def test_insert_race_under_skip_diverges(ts_a, ts_b, va, vb):
    """Both replicas insert the same key; each applies its own insert first and skips the
    other's: one of them must differ from the converged state."""
    cfg = make_config({"resolvers": {"insert_exists": "skip"}})
    table = cfg.tables["t"]
    spec, ranks = FoldSpec(table, NOW), cfg.tie_ranks(table.tie_break)
    ea = Event(
        "ea",
        "INSERT",
        (1,),
        T0 + ts_a * MS,
        "pub",
        ranks["pub"],
        after={"id": 1, "v": va, "n": 0},
        seqs={"pub": 0, "sub": 1},
    )
    eb = Event(
        "eb",
        "INSERT",
        (1,),
        T0 + ts_b * MS,
        "sub",
        ranks["sub"],
        after={"id": 1, "v": vb, "n": 0},
        seqs={"sub": 0, "pub": 1},
    )
    converged = fold_converged(spec, {}, [ea, eb]).state
    views = {r: view(fold_perspective(spec, {}, [ea, eb], r)) for r in ("pub", "sub")}
    assert views["pub"] != views["sub"]
    assert any(
        divergent_keys(converged, fold_perspective(spec, {}, [ea, eb], r)) for r in ("pub", "sub")
    )


# ---------------------------------------------------------------------- the CDC log


@st.composite
def rule_mixes(draw):
    """A table with a unique column, a delta column and a merge column (``m``, max or min,
    or none) under resolvers drawn from every allowed one (``error`` left out: a stopped
    run publishes nothing), a prior state, and events of every kind: partial rows, key
    changes, deletes, TRUNCATEs."""
    resolvers = {
        t.value: draw(
            st.sampled_from(
                sorted(r for r in allowed_resolvers(t) if "error" not in r and r != "python")
            )
        )
        for t in ConflictType
    }
    merge = draw(st.sampled_from([{}, {"m": "max"}, {"m": "min"}]))
    table = {
        "columns": {"id": "int", "v": "string", "n": "int", "m": "int"},
        "unique": [["v"]],
        "delta": ["n"],
        "merge": merge,
        "resolvers": resolvers,
        "defaults": {"v": "dflt"},
    }
    priority = draw(st.permutations(["a", "b", "c"]))  # for priority_wins (priority)
    cfg = make_config(table, replicas=REPLICAS3, priority=priority)
    t = cfg.tables["t"]
    ranks = cfg.tie_ranks(t.tie_break)
    prior = {}
    for k in draw(st.sets(st.integers(0, 3), max_size=3)):
        o = draw(st.sampled_from(["a", "b", "c"]))
        values = {
            "id": k,
            "v": draw(st.sampled_from(["x", "y", None])),
            "n": draw(st.integers(0, 5)),
            "m": draw(st.sampled_from([None, 1, 5])),
        }
        prior[(k,)] = Version(values, T0 - draw(st.integers(1, 9)) * MS, o, f"p{k}", ranks[o])
    events = []
    for i in range(draw(st.integers(1, 10))):
        o = draw(st.sampled_from(["a", "b", "c"]))
        op = draw(st.sampled_from(["INSERT", "UPDATE", "UPDATE", "DELETE", "TRUNCATE"]))
        k = draw(st.integers(0, 3))
        after: dict = {}
        before: dict = {}
        if op in ("INSERT", "UPDATE"):
            for c in draw(st.sets(st.sampled_from(["v", "n", "m"]), min_size=1)):
                after[c] = (
                    draw(st.sampled_from(["x", "y", "z"])) if c == "v" else draw(st.integers(0, 9))
                )
            if "n" in after and op == "UPDATE":
                before["n"] = draw(st.integers(0, 9))
            if op == "INSERT":
                after["id"] = k
        new_key = (draw(st.integers(0, 3)),) if op == "UPDATE" and draw(st.booleans()) else None
        events.append(
            Event(
                f"e{i}",
                op,
                None if op == "TRUNCATE" else (k,),
                T0 + draw(st.integers(0, 5)) * MS,
                o,
                ranks[o],
                new_key=new_key,
                after=after,
                before=before,
            )
        )
    return FoldSpec(t, NOW), prior, events


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rule_mixes())
def test_replaying_the_changes_gives_the_converged_state(mix):
    """What the CDC log is made of (``rowfold.visible_changes``): applied in order to the
    rows a reader saw before, the changes give the rows a reader sees after, and each
    change's pre- and post-image is the row as it stood and as it left it."""
    spec, prior, events = mix
    res = fold_converged(spec, prior, events, trace=True)
    rows = view(prior)
    for a in res.applied:
        for c in a.changes:
            assert rows.get(c.key) == c.pre, (a.event, c)
            if c.kind.value in ("row_delete", "partition_delete"):
                rows.pop(c.key, None)
            else:
                base = rows.get(c.key) or {col: None for col in spec.table.column_names}
                rows[c.key] = {**base, **dict(zip(spec.table.key, c.key, strict=True)), **c.values}
                if c.kind.value == "insert":
                    assert set(c.cols) == set(spec.table.value_columns)
            assert rows.get(c.key) == c.post, (a.event, c)
    assert rows == view(res.state)
