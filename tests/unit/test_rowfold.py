"""The row fold's rules, one case each (docs/rules.md#conflict-types,
docs/rules.md#tombstones-and-gc_grace_seconds, docs/rules.md#delta-columns,
docs/rules.md#what-is-quarantined); pure Python."""

from __future__ import annotations

import pytest

from pipeline.core.policy import ConflictType as C
from pipeline.core.policy import Outcome as O
from pipeline.rules.events import Stamp, Version, reader_view
from pipeline.rules.perspectives import fold_perspective
from pipeline.rules.rowfold import RowFold, RunStopped, fold_converged
from tests.helpers.fold_helpers import NOW, T0, H, ev, live, spec, tomb


def fold(sp, state, events):
    return fold_converged(sp, dict(state), events)


def only_conflict(res):
    conflicts = [c for a in res.applied for c in a.conflicts]
    assert len(conflicts) == 1, conflicts
    return conflicts[0]


def test_insert_on_absent_key_is_no_conflict():
    res = fold(spec(), {}, [ev("INSERT", 1, T0, "pub", "pub-1", {"id": 1, "v": "a", "n": 1})])
    assert [a.conflicts for a in res.applied] == [()]
    assert reader_view(res.state[(1,)]) == {"id": 1, "v": "a", "n": 1}


@pytest.mark.parametrize(
    ("resolver", "remote_ts", "outcome", "winner"),
    [
        ("latest_timestamp_wins", T0 + 2 * H, O.CONVERTED_TO_UPDATE, "remote"),
        ("latest_timestamp_wins", T0, O.DISCARDED, "local"),
        ("earliest_timestamp_wins", T0, O.CONVERTED_TO_UPDATE, "remote"),
        ("earliest_timestamp_wins", T0 + 2 * H, O.DISCARDED, "local"),
        ("apply", T0, O.CONVERTED_TO_UPDATE, "remote"),
        ("skip", T0 + 2 * H, O.SKIPPED, "local"),
    ],
)
def test_insert_exists(resolver, remote_ts, outcome, winner):
    sp = spec({"resolvers": {"insert_exists": resolver}})
    state = dict([live(1, "local", T0 + H, "sub")])
    e = ev("INSERT", 1, remote_ts, "pub", "pub-1", {"id": 1, "v": "remote", "n": 0})
    res = fold(sp, state, [e])
    c = only_conflict(res)
    assert (c.type, c.outcome) == (C.INSERT_EXISTS, outcome)
    assert res.state[(1,)].values["v"] == winner


def test_insert_exists_error_stops_the_fold():
    sp = spec({"resolvers": {"insert_exists": "error"}})
    state = dict([live(1, "local", T0, "sub")])
    events = [
        ev("INSERT", 1, T0 + H, "pub", "pub-1", {"id": 1, "v": "x", "n": 0}),
        ev("INSERT", 2, T0 + 2 * H, "pub", "pub-2", {"id": 2, "v": "y", "n": 0}),
    ]
    res = fold(sp, state, events)
    assert res.stopped is not None and res.stopped.outcome is O.ERRORED
    assert len(res.applied) == 1  # the fold stopped at the erroring event
    with pytest.raises(RunStopped):
        RowFold(sp, dict(state)).apply(events[0])


def test_equal_ts_tie_break_higher_system_id_wins():
    sp = spec({"resolvers": {"insert_exists": "latest_timestamp_wins"}})
    state = dict([live(1, "local", T0, "pub")])  # pub = 7301, sub = 7302
    res = fold(sp, state, [ev("INSERT", 1, T0, "sub", "sub-1", {"id": 1, "v": "sub", "n": 0})])
    assert only_conflict(res).outcome is O.CONVERTED_TO_UPDATE
    assert res.state[(1,)].values["v"] == "sub"


def test_earliest_timestamp_wins_on_equal_ts_the_tie_break_winner_still_wins():
    sp = spec({"resolvers": {"insert_exists": "earliest_timestamp_wins"}})
    state = dict([live(1, "local", T0, "pub")])
    res = fold(sp, state, [ev("INSERT", 1, T0, "sub", "sub-1", {"id": 1, "v": "sub", "n": 0})])
    assert res.state[(1,)].values["v"] == "sub"


def test_update_by_same_origin_is_no_conflict_and_merges_columns():
    state = dict([live(1, "a", T0, "pub", n=5)])
    res = fold(spec(), state, [ev("UPDATE", 1, T0 + H, "pub", "pub-1", {"v": "b"})])
    assert [a.conflicts for a in res.applied] == [()]
    assert reader_view(res.state[(1,)]) == {"id": 1, "v": "b", "n": 5}


def test_update_differ_on_other_origin_and_on_late_event():
    state = dict([live(1, "a", T0 + H, "pub")])
    other = fold(spec(), state, [ev("UPDATE", 1, T0 + 2 * H, "sub", "sub-1", {"v": "b"})])
    assert (only_conflict(other).type, only_conflict(other).outcome) == (C.UPDATE_DIFFER, O.APPLIED)
    late = fold(spec(), state, [ev("UPDATE", 1, T0, "pub", "pub-9", {"v": "old"})])
    assert (only_conflict(late).type, only_conflict(late).outcome) == (C.UPDATE_DIFFER, O.DISCARDED)
    assert late.state[(1,)].values["v"] == "a"


def test_before_image_detection():
    """docs/rules.md#conflict-types with ``detection: before_image``: a before-image that
    matches the local row (only
    the columns it holds) is no conflict, even from another origin; a mismatch is, and so
    is a local row newer than the event; without a before-image the origin decides."""
    sp = spec({"detection": "before_image"})
    state = dict([live(1, "a", T0 + H, "pub", n=5)])

    def run(before, ts=T0 + 2 * H):
        return fold(sp, state, [ev("UPDATE", 1, ts, "sub", "sub-1", {"v": "b"}, before=before)])

    match = run({"v": "a"})
    assert [a.conflicts for a in match.applied] == [()]
    assert reader_view(match.state[(1,)]) == {"id": 1, "v": "b", "n": 5}
    assert only_conflict(run({"v": "zz"})).type is C.UPDATE_DIFFER
    assert only_conflict(run({"v": "a"}, ts=T0)).outcome is O.DISCARDED  # local is newer
    assert only_conflict(run({})).type is C.UPDATE_DIFFER  # no image: origin differs
    # the default detection ignores the before-image
    plain = fold(
        spec(), state, [ev("UPDATE", 1, T0 + 2 * H, "sub", "sub-1", {"v": "b"}, before={"v": "a"})]
    )
    assert only_conflict(plain).type is C.UPDATE_DIFFER


def test_before_image_does_not_apply_to_deletes():
    sp = spec({"detection": "before_image"})
    state = dict([live(1, "a", T0 + H, "pub")])
    res = fold(sp, state, [ev("DELETE", 1, T0 + 2 * H, "sub", "sub-1", before={"v": "a"})])
    assert only_conflict(res).type is C.DELETE_DIFFER


def test_base_row_without_origin_raises_no_origin_conflict():
    state = dict([live(1, "a", 0, None)])
    res = fold(spec(), state, [ev("UPDATE", 1, T0, "sub", "sub-1", {"v": "b"})])
    assert [a.conflicts for a in res.applied] == [()]


@pytest.mark.parametrize(
    ("resolver", "after", "outcome", "live_after"),
    [
        ("apply_or_skip", {"id": 1, "v": "x", "n": 1}, O.CONVERTED_TO_INSERT, True),
        ("apply_or_skip", {"v": "x"}, O.SKIPPED, False),
        ("skip", {"id": 1, "v": "x", "n": 1}, O.SKIPPED, False),
        ("apply_or_error", {"id": 1, "v": "x", "n": 1}, O.CONVERTED_TO_INSERT, True),
    ],
)
def test_update_missing(resolver, after, outcome, live_after):
    sp = spec({"resolvers": {"update_missing": resolver}})
    res = fold(sp, {}, [ev("UPDATE", 1, T0, "pub", "pub-1", after)])
    c = only_conflict(res)
    assert (c.type, c.outcome) == (C.UPDATE_MISSING, outcome)
    assert ((1,) in res.state) is live_after


def test_update_missing_apply_or_error_without_full_row_errors():
    sp = spec({"resolvers": {"update_missing": "apply_or_error"}})
    res = fold(sp, {}, [ev("UPDATE", 1, T0, "pub", "pub-1", {"v": "x"})])
    assert res.stopped is not None and res.stopped.type is C.UPDATE_MISSING


def test_full_row_may_come_from_before_and_after():
    sp = spec()
    res = fold(sp, {}, [ev("UPDATE", 1, T0, "pub", "pub-1", {"v": "x"}, before={"v": "w", "n": 3})])
    assert reader_view(res.state[(1,)]) == {"id": 1, "v": "x", "n": 3}


@pytest.mark.parametrize(
    ("resolver", "remote_ts", "outcome"),
    [
        ("skip", T0 + 2 * H, O.SKIPPED),
        ("apply_or_skip", T0 + 2 * H, O.CONVERTED_TO_INSERT),
        ("latest_timestamp_wins", T0 + 2 * H, O.CONVERTED_TO_INSERT),
        ("latest_timestamp_wins", T0, O.DISCARDED),
    ],
)
def test_update_deleted(resolver, remote_ts, outcome):
    sp = spec({"resolvers": {"update_deleted": resolver}})
    state = dict([tomb(1, T0 + H, "sub")])
    res = fold(sp, state, [ev("UPDATE", 1, remote_ts, "pub", "pub-1", {"id": 1, "v": "x", "n": 0})])
    c = only_conflict(res)
    assert (c.type, c.outcome) == (C.UPDATE_DELETED, outcome)


def test_update_deleted_becomes_update_missing_after_the_purge():
    # the engine purges before folding (docs/rules.md#tombstones-and-gc_grace_seconds): a
    # purged tombstone is simply absent
    res = fold(spec(), {}, [ev("UPDATE", 1, T0, "pub", "pub-1", {"v": "x"})])
    assert only_conflict(res).type is C.UPDATE_MISSING


def test_delete_missing_skip_leaves_absent_key_absent():
    res = fold(spec(), {}, [ev("DELETE", 1, T0, "pub", "pub-1")])
    c = only_conflict(res)
    assert (c.type, c.outcome) == (C.DELETE_MISSING, O.SKIPPED)
    assert (1,) not in res.state


def test_delete_differ_latest_and_tombstone_metadata():
    state = dict([live(1, "a", T0, "pub")])
    res = fold(spec(), state, [ev("DELETE", 1, T0 + H, "sub", "sub-1")])
    c = only_conflict(res)
    assert (c.type, c.outcome) == (C.DELETE_DIFFER, O.APPLIED)
    t = res.state[(1,)]
    assert t.deleted and t.deleted_at == NOW and t.ts == T0 + H and t.origin == "sub"


def test_insert_onto_tombstone_under_postgres_makes_the_row_again():
    state = dict([tomb(1, T0 + 5 * H, "sub")])
    res = fold(spec(), state, [ev("INSERT", 1, T0, "pub", "pub-1", {"id": 1, "v": "x", "n": 0})])
    assert [a.conflicts for a in res.applied] == [()]
    assert reader_view(res.state[(1,)]) is not None


def test_truncate_tombstones_rows_not_newer():
    state = dict([live(1, "a", T0, "pub"), live(2, "b", T0 + 3 * H, "pub")])
    res = fold(spec(), state, [ev("TRUNCATE", None, T0 + H, "sub", "sub-1")])
    assert res.state[(1,)].deleted and not res.state[(2,)].deleted


# ---------------------------------------------------------------- delta columns
# (docs/rules.md#delta-columns)

DELTA = {"columns": {"id": "int", "v": "string", "n": "int"}, "delta": ["n"]}


def test_two_credits_converge_on_the_sum():
    state = dict([live(1, "a", T0 - H, "pub", n=100)])
    events = [
        ev("UPDATE", 1, T0, "pub", "pub-1", {"n": 110}, {"n": 100}),
        ev("UPDATE", 1, T0 + H, "sub", "sub-1", {"n": 120}, {"n": 100}),
    ]
    res = fold(spec(DELTA), state, events)
    assert res.state[(1,)].values["n"] == 130


def test_losing_update_still_adds_its_delta():
    sp = spec({**DELTA, "resolvers": {"update_differ": "earliest_timestamp_wins"}})
    state = dict([live(1, "a", T0 - H, "pub", n=100)])
    events = [
        ev("UPDATE", 1, T0, "pub", "pub-1", {"n": 110}, {"n": 100}),
        ev("UPDATE", 1, T0 + H, "sub", "sub-1", {"n": 120, "v": "b"}, {"n": 100, "v": "a"}),
    ]
    res = fold(sp, state, events)
    assert res.state[(1,)].values == {"id": 1, "v": "a", "n": 130}
    assert res.state[(1,)].origin == "pub"


@pytest.mark.parametrize("winner", ["remote", "local"])
def test_a_delta_past_an_int_columns_range_quarantines_the_event_and_changes_nothing(winner):
    """docs/rules.md#delta-columns with the column's range: whether the UPDATE wins (its
    delta merged) or loses
    (only its delta added), a sum past 2^31-1 quarantines it before it changed anything;
    a perspective that meets the same overflow does not apply it either."""
    rule = "latest_timestamp_wins" if winner == "remote" else "earliest_timestamp_wins"
    sp = spec({**DELTA, "resolvers": {"update_differ": rule}})
    top = 2**31 - 1
    state = dict([live(1, "a", T0 - H, "pub", n=top - 5)])
    events = [
        ev("UPDATE", 1, T0, "pub", "pub-1", {"n": top - 4}, {"n": top - 5}),
        ev("UPDATE", 1, T0 + H, "sub", "sub-1", {"n": top, "v": "b"}, {"n": top - 5, "v": "a"}),
    ]
    res = fold(sp, state, events)
    over = res.applied[1]
    assert (over.applied, over.conflicts) == (False, ())
    assert over.quarantined == f"the delta of column 'n' would make it {top + 1}, past int"
    assert res.state[(1,)].values == {"id": 1, "v": "a", "n": top - 4}
    assert fold_perspective(sp, state, events, "sub").get((1,)).values["n"] == top - 4


@pytest.mark.parametrize(
    ("ctype", "start", "step", "fits"),
    [
        ("bigint", 2**63 - 2, 1, True),
        ("bigint", 2**63 - 2, 2, False),
        ("bigint", -(2**63) + 1, -1, True),
        ("bigint", -(2**63) + 1, -2, False),
        ("double", 1e308, 1e308, False),
        ("decimal(5,2)", "999.00", "0.99", True),
        ("decimal(5,2)", "999.00", "1.00", False),
    ],
)
def test_a_delta_column_keeps_its_types_range(ctype, start, step, fits):
    from decimal import Decimal

    conv = Decimal if ctype.startswith("decimal") else (lambda x: x)
    a, d = conv(start), conv(step)
    sp = spec({"columns": {"id": "int", "v": "string", "n": ctype}, "delta": ["n"]})
    state = dict([live(1, "a", T0 - H, "pub", n=a)])
    res = fold(sp, state, [ev("UPDATE", 1, T0, "pub", "pub-1", {"n": a + d}, {"n": a})])
    assert res.applied[0].applied is fits
    assert (res.applied[0].quarantined is None) is fits
    assert res.state[(1,)].values["n"] == (a + d if fits else a)


def test_insert_sets_delta_absolutely():
    res = fold(spec(DELTA), {}, [ev("INSERT", 1, T0, "pub", "pub-1", {"id": 1, "v": "a", "n": 7})])
    assert res.state[(1,)].values["n"] == 7


# ---------------------------------------------------------------- key changes, unique


def test_pkey_exists_latest_wins_replaces_target_and_removes_old_key():
    state = dict([live(1, "one", T0 - H, "pub"), live(3, "three", T0 - H, "pub")])
    res = fold(
        spec(), state, [ev("UPDATE", 1, T0, "pub", "pub-1", {"id": 3, "v": "moved"}, new_key=3)]
    )
    c = only_conflict(res)
    assert (c.type, c.key, c.outcome) == (C.PKEY_EXISTS, (3,), O.APPLIED)
    assert (1,) not in res.state and res.state[(3,)].values["v"] == "moved"


def test_pkey_exists_losing_key_change_loses_as_a_whole():
    state = dict([live(1, "one", T0 - H, "pub"), live(3, "three", T0 + H, "pub")])
    res = fold(spec(), state, [ev("UPDATE", 1, T0, "pub", "pub-1", {"id": 3}, new_key=3)])
    assert only_conflict(res).outcome is O.DISCARDED
    assert res.state[(1,)].values["v"] == "one" and res.state[(3,)].values["v"] == "three"


UNIQUE = {"columns": {"id": "int", "v": "string", "n": "int"}, "unique": [["v"], ["n"]]}


@pytest.mark.parametrize(("resolver", "outcome"), [("apply", O.APPLIED), ("skip", O.SKIPPED)])
def test_multiple_unique_conflicts(resolver, outcome):
    sp = spec({**UNIQUE, "resolvers": {"multiple_unique_conflicts": resolver}})
    state = dict([live(2, "x", T0 - H, "sub", n=20), live(3, "y", T0 - H, "sub", n=30)])
    res = fold(sp, state, [ev("INSERT", 1, T0, "pub", "pub-1", {"id": 1, "v": "x", "n": 30})])
    c = only_conflict(res)
    assert (c.type, c.outcome, len(c.local)) == (C.MULTIPLE_UNIQUE_CONFLICTS, outcome, 2)
    if resolver == "apply":
        assert res.state[(2,)].deleted and res.state[(3,)].deleted and not res.state[(1,)].deleted
    else:
        assert (1,) not in res.state


def test_nulls_never_collide_on_unique():
    sp = spec(UNIQUE)
    state = dict([live(2, None, T0 - H, "sub", n=20)])
    res = fold(sp, state, [ev("INSERT", 1, T0, "pub", "pub-1", {"id": 1, "v": None, "n": 1})])
    assert [a.conflicts for a in res.applied] == [()]


# ---------------------------------------------------------------- column drift


def test_source_column_extra_ignore_and_skip():
    e = ev("INSERT", 1, T0, "pub", "pub-1", {"id": 1, "v": "a", "n": 1}, extra_cols=("zz",))
    ign = fold(spec({"resolvers": {"source_column_extra": "ignore"}}), {}, [e])
    assert only_conflict(ign).outcome is O.APPLIED and (1,) in ign.state
    skp = fold(spec({"resolvers": {"source_column_extra": "skip"}}), {}, [e])
    assert only_conflict(skp).outcome is O.SKIPPED and (1,) not in skp.state


def test_target_column_extra_use_default_and_not_null_error():
    e = ev("INSERT", 1, T0, "pub", "pub-1", {"id": 1, "v": "a"})
    sp = spec({"defaults": {"n": 9}})
    res = fold(sp, {}, [e])
    assert only_conflict(res).type is C.TARGET_COLUMN_EXTRA
    assert res.state[(1,)].values["n"] == 9
    bad = fold(spec({"not_null": ["n"]}), {}, [e])
    assert bad.stopped is not None and bad.stopped.type is C.TARGET_COLUMN_EXTRA


# ---------------------------------------------------------------- delete wins
# (docs/rules.md#policies)

DW = {"policy": "delete_wins"}


def test_delete_wins_update_never_creates_a_row():
    res = fold(spec(DW), {}, [ev("UPDATE", 1, T0, "pub", "pub-1", {"id": 1, "v": "x", "n": 0})])
    c = only_conflict(res)
    assert (c.type, c.resolver.value, c.outcome) == (C.UPDATE_MISSING, "delete_wins", O.DISCARDED)


def test_delete_wins_older_delete_still_wins_and_keeps_newer_ts():
    state = dict([live(1, "a", T0 + 5 * H, "pub")])
    events = [
        ev("DELETE", 1, T0, "sub", "sub-1"),
        ev("INSERT", 1, T0 + 2 * H, "sub", "sub-2", {"id": 1, "v": "b", "n": 0}),
    ]
    res = fold(spec(DW), state, events)
    assert res.state[(1,)].deleted  # the insert older than the beaten row does not resurrect it


def test_delete_wins_lower_system_id_wins_ties():
    # lower_system_id: pub (7301) ranks above sub (7302), so pub wins equal-ts conflicts
    sp = spec(DW)
    assert sp.table.tie_break.value == "lower_system_id"
    state = dict([live(1, "a", T0, "sub", rank=0)])
    res = fold(sp, state, [ev("UPDATE", 1, T0, "pub", "pub-1", {"v": "p"}, rank=1)])
    assert res.state[(1,)].values["v"] == "p"
    state = dict([live(1, "a", T0, "pub", rank=1)])
    res = fold(sp, state, [ev("UPDATE", 1, T0, "sub", "sub-1", {"v": "s"}, rank=0)])
    assert res.state[(1,)].values["v"] == "a"


@pytest.mark.parametrize("policy", ["postgres", "delete_wins"])
def test_the_changes_of_one_transaction_apply_in_the_order_of_their_places(policy):
    """Events of one transaction share ``ts`` and origin: their places (``pos``), not
    their ids' text, order them, also against the version the one before wrote."""
    sp = spec({"policy": policy})
    row = {"id": 1, "v": "x", "n": 0}
    tx = [  # ids that sort against the transaction's order
        ev("INSERT", 1, T0, "pub", "c", row, pos=1),
        ev("DELETE", 1, T0, "pub", "b", before=row, pos=2),
        ev("INSERT", 1, T0, "pub", "a", {**row, "v": "again"}, pos=3),
    ]
    res = fold(sp, {}, list(reversed(tx)))
    assert [a.event.event_id for a in res.applied] == ["c", "b", "a"]
    assert not res.state[(1,)].deleted and res.state[(1,)].values["v"] == "again"
    assert all(a.applied for a in res.applied)
    if policy == "delete_wins":  # a tombstone is a row there: the insert meets it and wins
        (c,) = [c for a in res.applied for c in a.conflicts]
        assert (c.type, c.outcome) == (C.INSERT_EXISTS, O.APPLIED)
    else:
        assert not any(a.conflicts for a in res.applied)


def test_an_event_of_a_transaction_an_earlier_night_began_comes_after_its_version():
    """The state keeps no place: a version read from it comes before every event of its
    transaction that has one (the rest of a transaction cut by a night, docs/adapters.md);
    without places the event ids decide, as before."""
    sp = spec({"policy": "delete_wins"})
    gone = Version({"id": 1}, T0, "pub", "z", 0, deleted=True, deleted_at=NOW - H)
    again = {"id": 1, "v": "b", "n": 0}
    later = fold(sp, {(1,): gone}, [ev("INSERT", 1, T0, "pub", "a", again, pos=2)])
    assert not later.state[(1,)].deleted
    by_id = fold(sp, {(1,): gone}, [ev("INSERT", 1, T0, "pub", "a", again)])
    assert by_id.state[(1,)].deleted  # "a" sorts before "z": the tombstone stands


def test_rejected_transaction_event_is_logged_and_not_applied():
    state = dict([live(1, "a", T0, "pub")])
    res = fold(
        spec({**DW, "scope": "transaction"}),
        state,
        [ev("UPDATE", 1, T0 + H, "sub", "sub-1", {"v": "b"}, txid="t1", rejected=True)],
    )
    c = only_conflict(res)
    assert (c.outcome, c.reason) == (O.DISCARDED, "transaction rejected")
    assert res.state[(1,)].values["v"] == "a"


# ---------------------------------------------------------------- perspectives
# (docs/rules.md#convergence)


def test_perspective_follows_the_replicas_export_order():
    sp = spec({"resolvers": {"insert_exists": "skip"}})
    a = ev("INSERT", 1, T0, "pub", "pub-1", {"id": 1, "v": "a", "n": 0}, seqs={"pub": 1, "sub": 2})
    b = ev(
        "INSERT", 1, T0 + H, "sub", "sub-1", {"id": 1, "v": "b", "n": 0}, seqs={"sub": 1, "pub": 2}
    )
    conv = fold(sp, {}, [a, b])
    assert conv.state[(1,)].values["v"] == "a"
    assert fold_perspective(sp, {}, [a, b], "pub")[(1,)].values["v"] == "a"
    assert fold_perspective(sp, {}, [a, b], "sub")[(1,)].values["v"] == "b"


# ---------------------------------------------------------------------- changes (CDC)


def changes(sp, state, events):
    """(event id, kind, key, cols, values, pre, post) of every change, in order."""
    res = fold_converged(sp, dict(state), events, trace=True)
    return [
        (a.event.event_id, c.kind.value, c.key, c.cols, dict(c.values), c.pre, c.post)
        for a in res.applied
        for c in a.changes
    ]


def test_changes_of_insert_update_delete():
    row = {"id": 1, "v": "a", "n": 1}
    got = changes(
        spec(),
        {},
        [
            ev("INSERT", 1, T0, "pub", "pub-1", row),
            ev("UPDATE", 1, T0 + H, "pub", "pub-2", {"v": "b"}),
            ev("DELETE", 1, T0 + 2 * H, "pub", "pub-3"),
        ],
    )
    assert got == [
        ("pub-1", "insert", (1,), ("v", "n"), {"v": "a", "n": 1}, None, row),
        ("pub-2", "update", (1,), ("v",), {"v": "b"}, row, {**row, "v": "b"}),
        ("pub-3", "row_delete", (1,), (), {}, {**row, "v": "b"}, None),
    ]


def test_a_key_change_deletes_the_old_key_and_inserts_the_new():
    state = dict([live(1, "a", T0, "pub", n=5)])
    got = changes(spec(), state, [ev("UPDATE", 1, T0 + H, "pub", "pub-1", {"v": "b"}, new_key=2)])
    assert [(g[1], g[2]) for g in got] == [("row_delete", (1,)), ("insert", (2,))]
    assert got[1][4] == {"v": "b", "n": 5}  # the whole row moves


def test_a_unique_apply_deletes_the_colliding_rows_in_the_same_event():
    sp = spec({"unique": [["v"]], "resolvers": {"multiple_unique_conflicts": "apply"}})
    state = dict([live(1, "x", T0, "pub"), live(2, "y", T0, "pub")])
    got = changes(sp, state, [ev("UPDATE", 2, T0 + H, "pub", "pub-1", {"v": "x"})])
    assert [(g[0], g[1], g[2]) for g in got] == [
        ("pub-1", "row_delete", (1,)),
        ("pub-1", "update", (2,)),
    ]


def test_a_discarded_update_that_adds_its_delta_changes_only_the_delta():
    sp = spec({"delta": ["n"]})
    state = dict([live(1, "local", T0 + 2 * H, "sub", n=10)])
    e = ev("UPDATE", 1, T0 + H, "pub", "pub-1", {"v": "lost", "n": 13}, {"n": 10})
    res = fold_converged(sp, state, [e], trace=True)
    assert not res.applied[0].applied
    (c,) = res.applied[0].changes
    assert (c.kind.value, c.cols, dict(c.values)) == ("update", ("n",), {"n": 13})


def test_a_truncate_is_a_partition_delete_of_each_live_row_it_covers():
    state = dict([live(1, "a", T0, "pub"), live(2, "b", T0 + 3 * H, "pub"), tomb(3, T0, "pub")])
    got = changes(spec(), state, [ev("TRUNCATE", None, T0 + H, "sub", "sub-1")])
    assert [(g[1], g[2]) for g in got] == [("partition_delete", (1,))]


def test_a_skipped_event_changes_nothing():
    sp = spec({"resolvers": {"update_differ": "skip"}})
    state = dict([live(1, "a", T0, "sub")])
    assert changes(sp, state, [ev("UPDATE", 1, T0 + H, "pub", "pub-1", {"v": "b"})]) == []


def test_tracing_changes_no_result():
    """The converged fold gives the same state and conflicts with and without tracing."""
    sp = spec({"unique": [["v"]], "resolvers": {"multiple_unique_conflicts": "apply"}})
    state = dict([live(1, "x", T0, "pub"), live(2, "y", T0, "sub")])
    events = [
        ev("UPDATE", 2, T0 + H, "pub", "pub-1", {"v": "x"}),
        ev("INSERT", 1, T0 + 2 * H, "sub", "sub-1", {"id": 1, "v": "z", "n": 0}),
        ev("UPDATE", 1, T0 + 3 * H, "pub", "pub-2", {"v": "w"}, new_key=3),
    ]
    plain, traced = fold(sp, state, events), fold_converged(sp, dict(state), events, trace=True)
    assert plain.state == traced.state
    assert [a.conflicts for a in plain.applied] == [a.conflicts for a in traced.applied]


# ---------------------------------------------------------------------- order_by (order_by)

ORDERED = {"order_by": "n", "resolvers": {"update_deleted": "latest_timestamp_wins"}}


@pytest.mark.parametrize(
    ("resolver", "n", "remote_ts", "outcome"),
    [
        # the order value decides, whatever the commit times
        ("latest_timestamp_wins", 3, T0 + 2 * H, O.DISCARDED),
        ("latest_timestamp_wins", 7, T0 - 2 * H, O.APPLIED),
        # an equal order value falls back to (ts, tie_rank)
        ("latest_timestamp_wins", 5, T0 + 2 * H, O.APPLIED),
        ("latest_timestamp_wins", 5, T0 - 2 * H, O.DISCARDED),
        ("earliest_timestamp_wins", 3, T0 + 2 * H, O.APPLIED),
        ("earliest_timestamp_wins", 7, T0 - 2 * H, O.DISCARDED),
    ],
)
def test_order_by_decides_later_and_earlier(resolver, n, remote_ts, outcome):
    """docs/rules.md#order-by-a-column: "later" compares (order value, ts, tie_rank)."""
    sp = spec({"order_by": "n", "resolvers": {"update_differ": resolver}})
    state = dict([live(1, "a", T0, "sub", n=5)])
    res = fold(sp, state, [ev("UPDATE", 1, remote_ts, "pub", "pub-1", {"v": "b", "n": n})])
    c = only_conflict(res)
    assert c.type is C.UPDATE_DIFFER and c.outcome is outcome
    assert res.state[(1,)].values["n"] == (n if outcome is O.APPLIED else 5)


def test_order_by_a_delete_compares_its_before_and_its_tombstone_keeps_it():
    """A DELETE's order value is in its ``before``; its tombstone keeps it, so a later
    UPDATE (by ts) with a smaller order value loses against the delete."""
    sp = spec(ORDERED)
    state = dict([live(1, "a", T0, "sub", n=5)])
    older = ev("DELETE", 1, T0 + H, "pub", "pub-1", before={"n": 4})
    assert only_conflict(fold(sp, state, [older])).outcome is O.DISCARDED
    delete = ev("DELETE", 1, T0 + H, "pub", "pub-1", before={"n": 6})
    res = fold(sp, state, [delete])
    assert only_conflict(res).outcome is O.APPLIED
    assert res.state[(1,)].deleted and res.state[(1,)].values == {"id": 1, "n": 6}
    late = ev("UPDATE", 1, T0 + 2 * H, "sub", "sub-2", {"v": "c", "n": 5})
    res = fold(sp, res.state, [late])
    c = only_conflict(res)
    assert (c.type, c.outcome) == (C.UPDATE_DELETED, O.DISCARDED)
    newer = ev("UPDATE", 1, T0 - H, "sub", "sub-3", {"v": "c", "n": 9})
    res = fold(sp, fold(sp, state, [delete]).state, [newer])
    assert only_conflict(res).outcome is O.CONVERTED_TO_INSERT


def test_order_by_one_origin_writing_a_smaller_value_later_is_a_conflict():
    """The order value decides "newer" in detection too: an origin's own later write with a
    smaller value meets its row (update_differ) and loses, as NDB$MAX would have it."""
    sp = spec(ORDERED)
    state = dict([live(1, "a", T0, "pub", n=5)])
    res = fold(sp, state, [ev("UPDATE", 1, T0 + H, "pub", "pub-1", {"v": "b", "n": 4})])
    assert only_conflict(res).outcome is O.DISCARDED
    res = fold(sp, state, [ev("UPDATE", 1, T0 + H, "pub", "pub-1", {"v": "b", "n": 6})])
    assert [a.conflicts for a in res.applied] == [()]


def test_order_by_drives_the_delete_wins_table():
    """docs/rules.md#policies's "newer" compares the order value first: an INSERT with a
    newer ts but a smaller order value meets a newer local row and is discarded."""
    sp = spec({"policy": "delete_wins", "order_by": "n"})
    state = dict([live(1, "a", T0, "sub", n=5)])
    insert = ev("INSERT", 1, T0 + H, "pub", "pub-1", {"id": 1, "v": "b", "n": 3})
    c = only_conflict(fold(sp, state, [insert]))
    assert c.outcome is O.DISCARDED and "L.ts > E.ts" in c.reason
    assert c.reason.endswith("(L and E compared by (n, ts))")


# ---------------------------------------------------------------------- column groups
# (column groups)

GROUPED = {"column_groups": {"stock": ["n"], "label": ["v"]}}


def test_column_groups_keep_a_change_to_another_group():
    """docs/rules.md#column-groups: pub renames the product, then sub's earlier stock change
    arrives:
    it writes another group, last written by sub itself, so it is no conflict and both
    changes stay (without groups it would meet pub's newer row and be discarded)."""
    state = dict([live(1, "a", T0, "sub", n=1)])
    rename = ev("UPDATE", 1, T0 + 2 * H, "pub", "pub-1", {"v": "b"})
    stock = ev("UPDATE", 1, T0 + H, "sub", "sub-1", {"n": 7})
    res = fold_perspective(spec(GROUPED), state, [rename, stock], "x", ordered=True)
    assert reader_view(res[(1,)]) == {"id": 1, "v": "b", "n": 7}
    assert (res[(1,)].ts, res[(1,)].origin) == (T0 + 2 * H, "pub")  # the group written last
    assert res[(1,)].groups is not None and res[(1,)].groups["stock"].origin == "sub"
    plain = fold_perspective(spec(), state, [rename, stock], "x", ordered=True)
    assert reader_view(plain[(1,)])["n"] == 1


def test_an_update_wins_one_group_and_loses_another():
    """One conflict-log row per group in conflict, naming it; the UPDATE is applied for the
    groups it won; the row's stamp is its latest group's; its change lists the columns it
    took effect on."""
    (k, v) = live(1, "a", T0 + 2 * H, "pub", n=1, eid="pub-0")
    v.groups = {"label": Stamp(T0, 1, "sub-0", "sub"), "stock": v.stamp()}
    both = ev("UPDATE", 1, T0 + H, "sub", "sub-1", {"v": "c", "n": 9})
    res = fold_converged(spec(GROUPED), {k: v}, [both], trace=True)
    c = only_conflict(res)
    assert (c.type, c.outcome) == (C.UPDATE_DIFFER, O.DISCARDED)
    assert c.reason.startswith("group stock: ") and c.local[0].origin == "pub"
    assert res.applied[0].applied
    row = res.state[(1,)]
    assert reader_view(row) == {"id": 1, "v": "c", "n": 1}
    assert (row.ts, row.origin) == (T0 + 2 * H, "pub")
    assert row.groups == {"label": Stamp(T0 + H, 1, "sub-1", "sub"), "stock": v.stamp()}
    (change,) = res.applied[0].changes
    assert change.cols == ("v",)


def test_a_delta_column_follows_its_rule_whatever_its_groups_outcome():
    """docs/rules.md#delta-columns under column groups: the stock group is lost, yet its
    delta is added; the label is won."""
    sp = spec({"delta": ["n"], **GROUPED})
    (k, v) = live(1, "a", T0 + 2 * H, "pub", n=10, eid="pub-0")
    v.groups = {"label": Stamp(T0, 1, "sub-0", "sub"), "stock": v.stamp()}
    e = ev("UPDATE", 1, T0 + H, "sub", "sub-1", {"v": "c", "n": 15}, before={"n": 12})
    res = fold_converged(sp, {k: v}, [e])
    assert reader_view(res.state[(1,)]) == {"id": 1, "v": "c", "n": 13}


def test_insert_and_delete_meet_the_row_as_a_whole():
    """An INSERT or DELETE compares with the row's stamp, its latest group's."""
    (k, v) = live(1, "a", T0 + 2 * H, "pub", n=1, eid="pub-0")
    v.groups = {"label": Stamp(T0, 1, "sub-0", "sub"), "stock": v.stamp()}
    delete = ev("DELETE", 1, T0 + H, "sub", "sub-1")
    c = only_conflict(fold_converged(spec(GROUPED), {k: v}, [delete]))
    assert (c.type, c.outcome, c.local[0].ts) == (C.DELETE_DIFFER, O.DISCARDED, T0 + 2 * H)


def test_a_lost_update_adds_its_delta_and_keeps_the_rows_groups():
    """docs/rules.md#delta-columns under column groups: every group lost (``skip``), the
    delta is still added, and the row keeps its stamps, group by group."""
    sp = spec({"delta": ["n"], "resolvers": {"update_differ": "skip"}, **GROUPED})
    (k, v) = live(1, "a", T0 + 2 * H, "pub", n=10, eid="pub-0")
    v.groups = {"label": Stamp(T0, 1, "sub-0", "sub"), "stock": v.stamp()}
    e = ev("UPDATE", 1, T0 + H, "pub", "pub-1", {"v": "c", "n": 15}, before={"n": 12, "v": "z"})
    res = fold_converged(sp, {k: v}, [e])
    assert [c.outcome for a in res.applied for c in a.conflicts] == [O.SKIPPED, O.SKIPPED]
    row = res.state[(1,)]
    assert reader_view(row) == {"id": 1, "v": "a", "n": 13}
    assert row.groups == v.groups and (row.ts, row.origin) == (v.ts, v.origin)


# ---------------------------------------------------------------- merge functions

MAX_N = {"merge": {"n": "max"}}
MAX_M = {"merge": {"m": "max"}}


def test_a_winning_update_keeps_the_local_max():
    """docs/rules.md#merge-functions: update_differ, the remote wins the row, the local's
    larger ``n`` stays; the reason names the column."""
    state = dict([live(1, "a", T0 - H, "pub", n=50)])
    res = fold(spec(MAX_N), state, [ev("UPDATE", 1, T0, "sub", "sub-1", {"v": "b", "n": 7})])
    assert reader_view(res.state[(1,)]) == {"id": 1, "v": "b", "n": 50}
    assert res.state[(1,)].origin == "sub"
    c = only_conflict(res)
    assert (c.type, c.outcome) == (C.UPDATE_DIFFER, O.APPLIED)
    assert c.reason.endswith("; merge took the local value of n (max)")


def test_a_losing_update_still_raises_the_max_and_keeps_the_local_stamp():
    sp = spec({**MAX_N, "resolvers": {"update_differ": "earliest_timestamp_wins"}})
    state = dict([live(1, "a", T0 - H, "pub", n=5, eid="p0")])
    res = fold_converged(
        sp, state, [ev("UPDATE", 1, T0, "sub", "sub-1", {"v": "b", "n": 9})], trace=True
    )
    row = res.state[(1,)]
    assert reader_view(row) == {"id": 1, "v": "a", "n": 9}
    assert (row.ts, row.origin, row.event_id) == (T0 - H, "pub", "p0")
    a = res.applied[0]
    assert (a.applied, a.conflicts[0].outcome) == (False, O.DISCARDED)
    assert a.conflicts[0].reason.endswith("; merge took the remote value of n (max)")
    assert [(ch.kind.value, ch.cols, dict(ch.values)) for ch in a.changes] == [
        ("update", ("n",), {"n": 9})
    ]


def test_a_lower_losing_value_and_a_null_change_nothing():
    sp = spec({**MAX_N, "resolvers": {"update_differ": "earliest_timestamp_wins"}})
    state = dict([live(1, "a", T0 - H, "pub", n=5)])
    for n in (4, None):
        res = fold(sp, state, [ev("UPDATE", 1, T0, "sub", "sub-1", {"v": "b", "n": n})])
        assert reader_view(res.state[(1,)]) == {"id": 1, "v": "a", "n": 5}
        assert "merge" not in only_conflict(res).reason


def test_min_takes_the_smaller_and_a_null_never_wins():
    sp = spec({"merge": {"n": "min"}})
    state = dict([live(1, "a", T0 - H, "pub", n=None)])
    res = fold(sp, state, [ev("UPDATE", 1, T0, "sub", "sub-1", {"n": 3})])
    assert res.state[(1,)].values["n"] == 3
    state = dict([live(1, "a", T0 - H, "pub", n=2)])
    res = fold(sp, state, [ev("UPDATE", 1, T0, "sub", "sub-1", {"n": 3})])
    assert res.state[(1,)].values["n"] == 2


def test_no_conflict_no_merge_a_replica_lowers_its_own_value():
    """Outside conflicts the column is written like any other: the same origin lowering its
    own newer row is not overridden."""
    state = dict([live(1, "a", T0 - H, "pub", n=50)])
    res = fold(spec(MAX_N), state, [ev("UPDATE", 1, T0, "pub", "pub-1", {"n": 7})])
    assert res.state[(1,)].values["n"] == 7
    assert [a.conflicts for a in res.applied] == [()]


@pytest.mark.parametrize("remote_ts", [T0 - 2 * H, T0])
def test_insert_exists_merges_whichever_insert_wins(remote_ts):
    state = dict([live(1, "a", T0 - H, "pub", n=5)])
    res = fold(
        spec(MAX_N), state, [ev("INSERT", 1, remote_ts, "sub", "s", {"id": 1, "v": "b", "n": 8})]
    )
    won = remote_ts > T0 - H
    assert reader_view(res.state[(1,)]) == {"id": 1, "v": "b" if won else "a", "n": 8}
    c = only_conflict(res)
    assert c.type is C.INSERT_EXISTS
    assert ("merge took" in c.reason) is (not won)


def test_a_key_change_onto_a_row_merges_in_pkey_exists():
    state = dict([live(1, "a", T0 - H, "pub", n=2), live(2, "b", T0 - H, "pub", n=9)])
    e = ev("UPDATE", 1, T0, "sub", "sub-1", {"id": 3, "n": 1}, new_key=2)
    res = fold(spec(MAX_N), state, [e])
    assert (1,) not in res.state or res.state[(1,)].deleted
    assert reader_view(res.state[(2,)])["n"] == 9
    assert any(c.type is C.PKEY_EXISTS and "n (max)" in c.reason for c in res.applied[0].conflicts)


def test_with_column_groups_the_merge_follows_the_columns_group():
    """docs/rules.md#merge-functions with column groups: an UPDATE that loses group ``stock``
    still raises its max column; one that loses group ``label`` and writes ``n`` without a
    conflict in ``stock`` writes ``n`` as it is."""
    sp = spec({**MAX_N, "column_groups": {"label": ["v"], "stock": ["n"]}})
    state = dict([live(1, "a", T0, "pub", n=5)])
    late = ev("UPDATE", 1, T0 - H, "sub", "sub-1", {"v": "z", "n": 8})
    res = fold(sp, state, [late])
    assert reader_view(res.state[(1,)]) == {"id": 1, "v": "a", "n": 8}
    assert (
        sum("merge took the remote value of n (max)" in c.reason for c in res.applied[0].conflicts)
        == 1
    )
    assert res.state[(1,)].origin == "pub"


def test_merge_keeps_nan_above_every_number_in_both_orders():
    sp = spec({"columns": {"id": "int", "v": "string", "n": "double"}, **MAX_N})
    nan = float("nan")
    for local, remote in ((nan, 1.0), (1.0, nan)):
        state = dict([live(1, "a", T0 - H, "pub", n=local)])
        res = fold(sp, state, [ev("UPDATE", 1, T0, "sub", "sub-1", {"n": remote})])
        assert res.state[(1,)].values["n"] != res.state[(1,)].values["n"]  # NaN


def test_an_error_resolver_stops_before_a_losing_delta_would_overflow():
    """``update_differ: error`` meets the conflict before the UPDATE's delta is added: the
    run stops there (no quarantine for the overflow the delta would have caused)."""
    sp = spec({**DELTA, "resolvers": {"update_differ": "error"}})
    top = 2**31 - 1
    state = dict([live(1, "a", T0, "pub", n=top - 1)])
    e = ev("UPDATE", 1, T0 + H, "sub", "sub-1", {"n": top}, {"n": top - 10})
    res = fold(sp, state, [e])
    assert res.stopped is not None and res.stopped.outcome is O.ERRORED
    assert res.applied[0].quarantined is None


def test_a_quarantined_event_takes_back_the_merge_it_made():
    """A losing UPDATE raises the merge column ``m``, then its delta overflows: quarantined,
    the row as it was, no change for the CDC log."""
    sp = spec({**DELTA, **MAX_M, "columns": {"id": "int", "v": "string", "n": "int", "m": "int"}})
    top = 2**31 - 1
    (k, base) = live(1, "a", T0, "pub")
    base.values.update(n=top, m=1)
    e = ev("UPDATE", 1, T0 - H, "sub", "s1", {"n": top, "m": 9}, {"n": top - 1})
    res = fold_converged(sp, {k: base}, [e], trace=True)
    assert res.applied[0].quarantined is not None and res.applied[0].changes == ()
    assert reader_view(res.state[(1,)]) == {"id": 1, "v": "a", "n": top, "m": 1}


def test_a_losing_insert_that_raises_a_max_is_an_update_of_the_column():
    state = dict([live(1, "a", T0, "pub", n=5)])
    e = ev("INSERT", 1, T0 - H, "sub", "s1", {"id": 1, "v": "b", "n": 8})
    res = fold_converged(spec(MAX_N), state, [e], trace=True)
    assert [(c.kind.value, c.cols) for c in res.applied[0].changes] == [("update", ("n",))]


def test_a_key_change_that_loses_pkey_exists_merges_only_what_it_wrote():
    """The UPDATE 1 -> 2 wins update_differ against row 1 (whose ``n`` is 50), then loses
    pkey_exists against row 2: key 2 takes the max of the event's own ``n`` (7), not row
    1's, and the update_differ row names no merge."""
    sp = spec({**MAX_N, "resolvers": {"pkey_exists": "skip"}})
    state = dict([live(1, "a", T0 - H, "pub", n=50), live(2, "b", T0 + 2 * H, "pub", n=5)])
    e = ev("UPDATE", 1, T0, "sub", "s1", {"id": 2, "n": 7}, new_key=2)
    res = fold(sp, state, [e])
    assert reader_view(res.state[(2,)])["n"] == 7
    assert reader_view(res.state[(1,)])["n"] == 50
    differ = [c for c in res.applied[0].conflicts if c.type is C.UPDATE_DIFFER]
    assert differ and all("merge" not in c.reason for c in differ)


def test_with_column_groups_a_write_without_a_conflict_in_its_group_is_written_as_is():
    sp = spec({**MAX_N, "column_groups": {"label": ["v"], "stock": ["n"]}})
    state = dict([live(1, "a", T0, "pub", n=5)])
    state[(1,)].groups = {"label": Stamp(T0 + 2 * H, 1, "s0", "sub")}
    e = ev("UPDATE", 1, T0 + H, "pub", "p1", {"v": "z", "n": 2})  # stock: pub's own, newer
    res = fold(sp, state, [e])
    assert reader_view(res.state[(1,)]) == {"id": 1, "v": "a", "n": 2}
    (c,) = res.applied[0].conflicts
    assert c.reason.startswith("group label:") and "merge" not in c.reason
