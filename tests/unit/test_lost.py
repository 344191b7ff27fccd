"""docs/rules.md#lost-writes: a conflict's label from the exports' positions
(``pipeline.rules.lost``), checked case by case and against an oracle that reads what each
writer had applied from simulated arrival times, not from positions."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.policy import Concurrency, ConflictType, Outcome, Resolver
from pipeline.rules.events import Conflict, Event, Version
from pipeline.rules.lost import Witness, copy_positions, judge, judge_pair

C, S, U = Concurrency.CONCURRENT, Concurrency.SEQUENTIAL, Concurrency.UNKNOWN
BOTH = Witness(frozenset({"a", "b"}))


def _v(eid: str | None, origin: str | None) -> Version:
    return Version({"id": 1}, 1, origin, eid, 0)


def _label(positions, tonight=frozenset({"L", "R"}), witness=BOTH, local=("L", "a")):
    return judge_pair(_v(*local), "R", "b", positions, frozenset(tonight), witness)


def test_neither_saw_the_other_is_concurrent():
    # each replica applied its own write first, the other's after
    assert _label({"L": {"a": 1, "b": 2}, "R": {"b": 1, "a": 2}}).concurrency is C


def test_the_remote_writer_saw_the_local_write_is_sequential():
    assert _label({"L": {"a": 1, "b": 1}, "R": {"b": 2, "a": 2}}).concurrency is S


def test_the_local_writer_saw_the_remote_write_is_sequential():
    assert _label({"L": {"a": 2, "b": 2}, "R": {"b": 1, "a": 1}}).concurrency is S


def test_each_saw_the_other_is_unknown():
    got = _label({"L": {"a": 2, "b": 1}, "R": {"b": 2, "a": 1}})
    assert got.concurrency is U and "each of a and b" in (got.why or "")


def test_one_origin_is_sequential():
    got = judge_pair(_v("L", "b"), "R", "b", {}, frozenset({"L", "R"}), BOTH)
    assert got.concurrency is S


def test_a_base_snapshot_row_is_seen_by_all():
    assert _label({"R": {"b": 1}}, local=(None, None)).concurrency is S


def test_an_earlier_nights_write_is_seen_unless_the_ledger_says_it_was_lacked():
    at = {"R": {"b": 1, "a": 1}}
    assert _label(at, tonight={"R"}).concurrency is S
    lacked = Witness(frozenset({"a", "b"}), lacked={"L": frozenset({"b"})})
    assert _label(at, tonight={"R"}, witness=lacked).concurrency is C


def test_an_earlier_nights_write_the_remote_export_holds_late_is_compared_by_position():
    # b's export tonight holds L (late), after its own R: b had not seen it
    assert _label({"R": {"b": 1}, "L": {"b": 5}}, tonight={"R"}).concurrency is C


def test_a_missing_export_or_event_or_order_is_unknown_and_says_which():
    at = {"L": {"a": 1, "b": 2}, "R": {"b": 1, "a": 2}}
    got = _label(at, witness=Witness(frozenset({"a"})))
    assert (got.concurrency, got.why) == (U, "no export of b tonight")
    got = _label({"L": {"a": 1}, "R": {"a": 2}})
    assert (got.concurrency, got.why) == (U, "b's export lacks its own event R")
    got = _label({"L": {"b": 2}, "R": {"b": 1}})
    assert (got.concurrency, got.why) == (U, "a's export lacks its own event L")
    dms = Witness(frozenset({"a", "b"}), {"a": "dms export without ..."})
    assert _label(at, witness=dms).why == "dms export without ..."


def _conflict(ctype: ConflictType, outcome: Outcome, local: tuple[Version, ...]) -> Conflict:
    e = Event("R", "UPDATE", (1,), 5, "b", 0)
    return Conflict((1,), ctype, Resolver.LATEST_TIMESTAMP_WINS, outcome, e, local, "")


def test_the_lost_write_is_the_losers_and_no_local_write_is_na():
    at = {"L": {"a": 1, "b": 2}, "R": {"b": 1, "a": 2}}
    tonight = frozenset({"L", "R"})
    won = _conflict(ConflictType.UPDATE_DIFFER, Outcome.APPLIED, (_v("L", "a"),))
    assert judge(won, at, tonight, BOTH).lost == "L"
    lost = _conflict(ConflictType.UPDATE_DIFFER, Outcome.DISCARDED, (_v("L", "a"),))
    assert judge(lost, at, tonight, BOTH).lost == "R"
    missing = _conflict(ConflictType.UPDATE_MISSING, Outcome.SKIPPED, ())
    assert judge(missing, at, tonight, BOTH).concurrency is Concurrency.NA


def test_a_unique_collision_is_judged_pair_by_pair():
    at = {"L": {"a": 1, "b": 1}, "M": {"c": 1, "b": 3}, "R": {"b": 2, "a": 2, "c": 2}}
    witness = Witness(frozenset({"a", "b", "c"}))
    pair = (_v("L", "a"), _v("M", "c"))  # b saw L; b had not seen M, nor c R
    c = _conflict(ConflictType.MULTIPLE_UNIQUE_CONFLICTS, Outcome.APPLIED, pair)
    got = judge(c, at, frozenset({"L", "M", "R"}), witness)
    assert (got.concurrency, got.lost) == (C, "M")


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**32), st.integers(2, 4))
def test_labels_match_what_each_writer_had_applied_when_it_wrote(seed: int, n: int):
    """Writes at random times on random replicas, applied elsewhere after a random delay;
    each replica's export lists what it applied in time order. For every pair of writes,
    the label from the positions is the one the times give: b had seen eL when it applied
    eL before it wrote eR."""
    rng = random.Random(seed)
    replicas = [f"r{i}" for i in range(n)]
    writes = {f"e{i}": (rng.choice(replicas), rng.randint(0, 100)) for i in range(6)}
    at = {
        eid: {r: t + (0 if r == o else rng.randint(1, 60)) for r in replicas}
        for eid, (o, t) in writes.items()
    }
    copies = []
    for r in replicas:
        order = sorted(writes, key=lambda e: (at[e][r], e))
        copies += [(e, r, i) for i, e in enumerate(order)]
    positions = copy_positions(copies)
    witness = Witness(frozenset(replicas))
    for el, (a, _) in writes.items():
        for er, (b, _) in writes.items():
            if el == er:
                continue
            got = judge_pair(_v(el, a), er, b, positions, frozenset(writes), witness)
            b_saw = (at[el][b], el) < (at[er][b], er)
            a_saw = (at[er][a], er) < (at[el][a], el)
            want = S if a == b or a_saw != b_saw else (C if not a_saw else U)
            assert got.concurrency is want, (el, er, got)
