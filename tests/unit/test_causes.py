"""docs/rules.md#divergence-causes in pure Python: the precedence, what each cause needs
as evidence (and is not found without), and a property: a perspective that differs from
the converged state always has a cause, never ``undetermined``, whatever the orders and
whichever events a replica's export lacks."""

from __future__ import annotations

import json
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.policy import Cause
from pipeline.rules.causes import (
    Finding,
    divergent_perspectives,
    missing_ids,
    perspective_findings,
    run_findings,
    snapshot_findings,
    verdict,
)
from pipeline.rules.decisions import Take
from pipeline.rules.perspectives import divergent_keys, fold_perspective
from pipeline.rules.rowfold import fold_converged
from tests.helpers.fold_helpers import T0, H, ev, live, make_config, spec, tomb
from tests.unit.test_decisions import _conflict, _decided
from tests.unit.test_properties import build, lww_spec, workloads

SKIP = {"insert_exists": "skip", "update_differ": "skip"}


def _causes(found: list[Finding]) -> list[str]:
    return json.loads(verdict(found, {})[1])["causes"]


def test_the_first_cause_in_precedence_is_the_rows_and_every_one_is_listed():
    found = [
        Finding(Cause.POLICY, {"rules": ["priority_wins"]}),
        Finding(Cause.MISSING_EVENTS, {"missing_events": {"count": 1, "ids": ["e1"]}}),
    ]
    cause, evidence = verdict(found, {"events": 2})
    assert cause == "missing_events"
    assert json.loads(evidence) == {
        "causes": ["missing_events", "policy"],
        "missing_events": {"count": 1, "ids": ["e1"]},
        "rules": ["priority_wins"],
    }
    assert missing_ids(evidence) == ["e1"]


def test_nothing_found_is_undetermined_with_what_was_checked():
    cause, evidence = verdict([], {"events": 3, "replica_events": 3})
    assert cause == "undetermined"
    assert json.loads(evidence) == {
        "causes": ["undetermined"],
        "checked": {"events": 3, "replica_events": 3},
    }
    assert missing_ids(evidence) == []


def _race(seqs_a: dict, seqs_b: dict):
    """Two inserts of key 1 (pub's first), skip: the replica that applies sub's first
    keeps sub's row."""
    a = ev("INSERT", 1, T0, "pub", "a", {"id": 1, "v": "a", "n": 0}, seqs=seqs_a)
    b = ev("INSERT", 1, T0 + H, "sub", "b", {"id": 1, "v": "b", "n": 0}, seqs=seqs_b)
    sp = spec({"resolvers": SKIP})
    converged = fold_converged(sp, {}, [a, b]).state
    return sp, [a, b], converged


def test_a_replica_that_lacks_an_earlier_event_diverges_by_missing_events():
    sp, events, converged = _race({"pub": 0}, {"pub": 1, "sub": 0})  # sub lacks pub's
    mine = fold_perspective(sp, {}, events, "sub")
    assert divergent_keys(converged, mine) == [(1,)]
    found = perspective_findings(sp.table, "sub", (1,), events, mine, converged)
    assert _causes(found) == ["missing_events"]
    assert found[0].evidence == {"missing_events": {"count": 1, "ids": ["a"]}}


def test_a_replica_that_applied_the_same_events_in_another_order_diverges_by_apply_order():
    sp, events, converged = _race({"pub": 0, "sub": 1}, {"pub": 1, "sub": 0})
    mine = fold_perspective(sp, {}, events, "sub")
    found = perspective_findings(sp.table, "sub", (1,), events, mine, converged)
    assert _causes(found) == ["apply_order"]
    assert found[0].evidence == {"replica_order": ["b", "a"], "canonical_order": ["a", "b"]}


def test_an_event_lacked_after_every_held_one_is_no_cause():
    """pub lacks sub's later insert: its perspective applies it last, as the canonical
    order does; a difference would not be the missing event's doing."""
    sp, events, converged = _race({"pub": 0}, {"sub": 0})
    mine = fold_perspective(sp, {}, events, "pub")
    assert divergent_keys(converged, mine) == []
    assert perspective_findings(sp.table, "pub", (1,), events, mine, converged) == []


def test_a_decision_alone_where_the_order_made_no_difference():
    """The converged state took sub's row by a decision; pub applied the events in the
    canonical order and kept its own: the decision is the only cause."""
    sp, events, _ = _race({"pub": 0, "sub": 1}, {"pub": 1, "sub": 0})
    undecided = fold_perspective(sp, {}, events, "", ordered=True)
    decided = dict([live(1, "b", T0 + H, "sub", eid="b")])
    mine = fold_perspective(sp, {}, events, "pub")
    assert _causes(
        perspective_findings(sp.table, "pub", (1,), events, mine, decided, undecided)
    ) == ["decision"]
    theirs = fold_perspective(sp, {}, events, "sub")  # sub's order gave it sub's row too
    assert divergent_keys(decided, theirs) == []


def test_a_decided_conflict_of_a_single_event_diverges_on_every_replica():
    """The prior row against one remote update: each replica applies its resolver (the
    remote wins), the decision keeps the local row: one event, and yet divergence."""
    state, loc, e = _conflict()
    e = replace(e, seqs={"pub": 0, "sub": 0})
    converged = fold_converged(_decided(spec(), loc, e, Take.LOCAL), state, [e]).state
    rows = list(divergent_perspectives(spec(), ("pub", "sub"), state, [e], converged, {(1,)}))
    assert [(rep, k, cause) for rep, k, _, cause, _ in rows] == [
        ("pub", (1,), "decision"),
        ("sub", (1,), "decision"),
    ]
    assert list(divergent_perspectives(spec(), ("pub",), state, [e], converged, set())) == []


def test_resurrection_and_unique_collision_are_found_beside_the_order():
    t = make_config(
        {"columns": {"id": "int", "v": "string", "n": "int"}, "unique": [["v"]]}
    ).tables["t"]
    converged = dict([live(1, "x", T0, "pub"), tomb(2, T0, "pub")])
    mine = dict([live(3, "x", T0, "sub"), live(2, "old", T0, "sub")])
    assert (
        perspective_findings(t, "sub", (3,), [], mine, converged)[0].cause is Cause.UNIQUE_COLLISION
    )
    (found,) = perspective_findings(t, "sub", (2,), [], mine, converged)
    assert found == Finding(Cause.RESURRECTION, {"tombstone_ts": T0})


def test_a_snapshots_own_causes_need_their_evidence():
    mine, conv = {"id": 1, "v": "a", "w": None}, {"id": 1, "v": "a", "w": "x"}
    assert _causes(snapshot_findings(mine, conv, ["w"], [], None)) == ["schema"]
    assert snapshot_findings(mine, {**conv, "w": None}, ["w"], [], None) == []  # equal there
    assert _causes(snapshot_findings(mine, None, [], ["e2", "e1"], 5)) == [
        "missing_events",
        "resurrection",
    ]
    assert _causes(snapshot_findings(mine, None, [], [], None, orphan=True)) == ["policy"]
    assert snapshot_findings(mine, None, [], [], None) == []  # nothing known: undetermined


def test_the_runs_causes_of_a_snapshot_row():
    t = make_config({"delta": ["n"]}).tables["t"]
    perspective = verdict(
        [Finding(Cause.APPLY_ORDER, {"replica_order": ["b"], "canonical_order": ["a"]})], {}
    )[1]
    found = run_findings(t, perspective, ["python:acme:f", "skip"], ["target_column_extra"])
    assert _causes(found) == ["schema", "apply_order", "policy"]
    assert [f.evidence for f in found if f.cause is Cause.POLICY] == [
        {"rules": ["python:acme:f", "delta:n"]}
    ]
    assert run_findings(t, None, [], []) == []  # no conflict: no rule of the project decided it
    # an operator's decision is not one of the table's rules, even where the table has some
    assert _causes(run_findings(t, None, ["manual"], ["update_differ"])) == ["decision"]
    assert _causes(run_findings(t, None, ["manual", "skip"], [])) == ["policy", "decision"]


@settings(max_examples=300, deadline=None)
@given(workloads(deletes=True), st.data())
def test_every_divergent_perspective_has_a_cause(w, data):
    """With ``skip`` (orders matter), any replica orders, some events lacked."""
    raw, prior, orders = w
    for rep, order in orders.items():
        kept = data.draw(st.lists(st.booleans(), min_size=len(order), max_size=len(order)))
        orders[rep] = [i for i, keep in zip(order, kept, strict=True) if keep or rep == "a"]
    sp, ranks = lww_spec(
        {"insert_exists": "skip", "update_differ": "skip", "delete_differ": "skip"}
    )
    state, events = build(raw, prior, orders, ranks)
    converged = fold_converged(sp, state, events).state
    for rep in ("a", "b", "c"):
        mine = fold_perspective(sp, state, events, rep)
        for k in divergent_keys(converged, mine):
            group = [e for e in events if e.key == k]
            found = perspective_findings(sp.table, rep, k, group, mine, converged)
            assert {f.cause for f in found} & {Cause.MISSING_EVENTS, Cause.APPLY_ORDER}, (rep, k)
