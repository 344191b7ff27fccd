"""Policy as data: every conflict type has a default in every preset and a rule in the fold;
every configurable resolver gives the outcome docs/rules.md#resolvers,
docs/rules.md#policies and docs/rules.md#what-is-quarantined say it gives, for a remote
event later and earlier than the local row, and leaves the state that outcome means."""

from __future__ import annotations

import pytest

from pipeline.core.policy import ALLOWED, PRESETS, ROW_TYPES, ConflictType, Outcome, Resolver
from pipeline.rules.rowfold import fold_converged
from tests.helpers import REPO
from tests.helpers.fold_helpers import T0, H, ev, live, spec, tomb

C = ConflictType
R = Resolver
Out = Outcome


def situation(t: ConflictType, dt: int):
    """A state and one event, ``dt`` µs after the local row, that meet a conflict of
    type ``t``."""
    full = {"id": 1, "v": "x", "n": 2}
    e = T0 + dt
    return {
        C.INSERT_EXISTS: ([live(1, "a", T0, "sub")], ev("INSERT", 1, e, "pub", "pub-1", full)),
        C.UPDATE_DIFFER: (
            [live(1, "a", T0, "sub")],
            ev("UPDATE", 1, e, "pub", "pub-1", {"v": "x"}),
        ),
        C.UPDATE_MISSING: ([], ev("UPDATE", 1, e, "pub", "pub-1", full)),
        C.UPDATE_DELETED: ([tomb(1, T0, "sub")], ev("UPDATE", 1, e, "pub", "pub-1", full)),
        C.DELETE_DIFFER: ([live(1, "a", T0, "sub")], ev("DELETE", 1, e, "pub", "pub-1")),
        C.DELETE_MISSING: ([], ev("DELETE", 1, e, "pub", "pub-1")),
        C.PKEY_EXISTS: (
            [live(1, "a", T0 - 2 * H, "pub"), live(2, "b", T0, "sub")],
            ev("UPDATE", 1, e, "pub", "pub-1", {"id": 2}, new_key=2),
        ),
        C.MULTIPLE_UNIQUE_CONFLICTS: (
            [live(2, "x", T0, "sub")],
            ev("INSERT", 1, e, "pub", "pub-1", full),
        ),
        C.SOURCE_COLUMN_EXTRA: ([], ev("INSERT", 1, e, "pub", "pub-1", full, extra_cols=("zz",))),
        C.TARGET_COLUMN_EXTRA: ([], ev("INSERT", 1, e, "pub", "pub-1", {"id": 1, "v": "x"})),
    }[t]


LATER, EARLIER = H, -H

#: docs/rules.md#resolvers and docs/rules.md#what-is-quarantined, written from the spec:
#: (type, resolver, remote later?) -> outcome. A resolver that does not look at timestamps
#: gives the same outcome either way.
EXPECTED: dict[tuple[ConflictType, Resolver], tuple[Outcome, Outcome]] = {
    (C.INSERT_EXISTS, R.LATEST_TIMESTAMP_WINS): (Out.CONVERTED_TO_UPDATE, Out.DISCARDED),
    (C.INSERT_EXISTS, R.EARLIEST_TIMESTAMP_WINS): (Out.DISCARDED, Out.CONVERTED_TO_UPDATE),
    (C.INSERT_EXISTS, R.APPLY): (Out.CONVERTED_TO_UPDATE, Out.CONVERTED_TO_UPDATE),
    (C.UPDATE_DIFFER, R.LATEST_TIMESTAMP_WINS): (Out.APPLIED, Out.DISCARDED),
    (C.UPDATE_DIFFER, R.EARLIEST_TIMESTAMP_WINS): (Out.DISCARDED, Out.APPLIED),
    (C.UPDATE_DIFFER, R.APPLY): (Out.APPLIED, Out.APPLIED),
    (C.UPDATE_MISSING, R.APPLY_OR_SKIP): (Out.CONVERTED_TO_INSERT, Out.CONVERTED_TO_INSERT),
    (C.UPDATE_MISSING, R.APPLY_OR_ERROR): (Out.CONVERTED_TO_INSERT, Out.CONVERTED_TO_INSERT),
    (C.UPDATE_DELETED, R.LATEST_TIMESTAMP_WINS): (Out.CONVERTED_TO_INSERT, Out.DISCARDED),
    (C.UPDATE_DELETED, R.APPLY_OR_SKIP): (Out.CONVERTED_TO_INSERT, Out.CONVERTED_TO_INSERT),
    (C.UPDATE_DELETED, R.APPLY_OR_ERROR): (Out.CONVERTED_TO_INSERT, Out.CONVERTED_TO_INSERT),
    (C.DELETE_DIFFER, R.LATEST_TIMESTAMP_WINS): (Out.APPLIED, Out.DISCARDED),
    (C.DELETE_DIFFER, R.EARLIEST_TIMESTAMP_WINS): (Out.DISCARDED, Out.APPLIED),
    (C.DELETE_DIFFER, R.APPLY): (Out.APPLIED, Out.APPLIED),
    (C.PKEY_EXISTS, R.LATEST_TIMESTAMP_WINS): (Out.APPLIED, Out.DISCARDED),
    (C.PKEY_EXISTS, R.EARLIEST_TIMESTAMP_WINS): (Out.DISCARDED, Out.APPLIED),
    (C.PKEY_EXISTS, R.APPLY): (Out.APPLIED, Out.APPLIED),
    # docs/rules.md#priority, with ``priority: [pub, sub]``: the remote (pub) outranks the local
    # row's origin (sub), later or earlier
    (C.INSERT_EXISTS, R.PRIORITY_WINS): (Out.CONVERTED_TO_UPDATE, Out.CONVERTED_TO_UPDATE),
    (C.UPDATE_DIFFER, R.PRIORITY_WINS): (Out.APPLIED, Out.APPLIED),
    (C.UPDATE_DELETED, R.PRIORITY_WINS): (Out.CONVERTED_TO_INSERT, Out.CONVERTED_TO_INSERT),
    (C.DELETE_DIFFER, R.PRIORITY_WINS): (Out.APPLIED, Out.APPLIED),
    (C.PKEY_EXISTS, R.PRIORITY_WINS): (Out.APPLIED, Out.APPLIED),
    (C.MULTIPLE_UNIQUE_CONFLICTS, R.APPLY): (Out.APPLIED, Out.APPLIED),
    (C.SOURCE_COLUMN_EXTRA, R.IGNORE): (Out.APPLIED, Out.APPLIED),
    (C.TARGET_COLUMN_EXTRA, R.USE_DEFAULT): (Out.APPLIED, Out.APPLIED),
    **{(t, R.SKIP): (Out.SKIPPED, Out.SKIPPED) for t in ConflictType},
    **{(t, R.ERROR): (Out.ERRORED, Out.ERRORED) for t in ConflictType},
}

#: docs/rules.md#policies's table, for a remote event later and earlier than the local row
#: or tombstone, and docs/rules.md#what-is-quarantined for UPDATE or DELETE on an absent key
#: or a tombstone
DELETE_WINS: dict[ConflictType, tuple[Outcome, Outcome]] = {
    C.INSERT_EXISTS: (Out.CONVERTED_TO_UPDATE, Out.DISCARDED),
    C.UPDATE_DIFFER: (Out.APPLIED, Out.DISCARDED),
    C.UPDATE_MISSING: (Out.DISCARDED, Out.DISCARDED),
    C.UPDATE_DELETED: (Out.DISCARDED, Out.DISCARDED),
    C.DELETE_DIFFER: (Out.APPLIED, Out.APPLIED),
    C.DELETE_MISSING: (Out.APPLIED, Out.APPLIED),
    C.PKEY_EXISTS: (Out.APPLIED, Out.DISCARDED),
}


def test_every_preset_has_a_resolver_for_every_type():
    for preset, rule in PRESETS.items():
        assert set(rule.resolvers) == set(ConflictType), preset


def test_every_allowed_resolver_has_an_expected_outcome():
    """(A custom resolver's outcome is its function's: ``tests/unit/test_custom_resolvers.py``.)"""
    allowed = {(t, r) for t in ConflictType for r in ALLOWED[t] if r is not R.PYTHON}
    assert allowed == set(EXPECTED)
    assert set(DELETE_WINS) == ROW_TYPES


def _check_state(ctype: ConflictType, outcome: Outcome, before: dict, after: dict, event) -> None:
    """What an outcome means for the row (docs/rules.md#resolvers): the remote's values when
    it took effect, the local state otherwise."""
    target = event.new_key or event.key
    if not outcome.remote_applied:
        assert after == before
    elif event.op == "DELETE":
        assert after[target].deleted
    else:
        assert not after[target].deleted
        assert after[target].event_id == event.event_id
        assert all(after[target].values[c] == v for c, v in event.after.items())
        if ctype is C.PKEY_EXISTS:
            # docs/rules.md#what-is-quarantined: the old key disappears
            assert event.key not in after


@pytest.mark.parametrize("later", [True, False], ids=["remote_later", "remote_earlier"])
@pytest.mark.parametrize(("ctype", "resolver"), sorted(EXPECTED))
def test_every_allowed_resolver_gives_its_outcome(ctype, resolver: Resolver, later: bool):
    table: dict = {"resolvers": {ctype.value: resolver.value}}
    if ctype is C.MULTIPLE_UNIQUE_CONFLICTS:
        table["unique"] = [["v"]]
    top = {"priority": ["pub", "sub"]} if resolver is R.PRIORITY_WINS else {}
    state, event = situation(ctype, LATER if later else EARLIER)
    res = fold_converged(spec(table, **top), dict(state), [event])
    logged = [c for a in res.applied for c in a.conflicts if c.type is ctype]
    assert len(logged) == 1
    assert logged[0].resolver is resolver
    want = EXPECTED[(ctype, resolver)][0 if later else 1]
    assert logged[0].outcome is want
    assert sentence_of(logged[0].reason) is not None, logged[0].reason
    assert (res.stopped is not None) == (want is Out.ERRORED)
    if want is not Out.ERRORED and ctype is not C.MULTIPLE_UNIQUE_CONFLICTS:
        _check_state(ctype, want, dict(state), res.state, event)


@pytest.mark.parametrize("later", [True, False], ids=["remote_later", "remote_earlier"])
@pytest.mark.parametrize("ctype", sorted(DELETE_WINS))
def test_delete_wins_decides_every_row_type(ctype, later: bool):
    state, event = situation(ctype, LATER if later else EARLIER)
    res = fold_converged(spec({"policy": "delete_wins"}), dict(state), [event])
    logged = [c for a in res.applied for c in a.conflicts if c.type is ctype]
    assert len(logged) == 1 and logged[0].resolver is Resolver.DELETE_WINS
    want = DELETE_WINS[ctype][0 if later else 1]
    assert logged[0].outcome is want
    if ctype in (C.DELETE_MISSING,):
        assert res.state[event.key].deleted  # the newer tombstone is kept
    elif want.remote_applied and event.op == "DELETE":
        assert res.state[event.key].deleted  # a delete is never undone
    else:
        _check_state(ctype, want, dict(state), res.state, event)


PRIORITY_TYPES = sorted(t for t in ConflictType if R.PRIORITY_WINS in ALLOWED[t])


@pytest.mark.parametrize("later", [True, False], ids=["remote_later", "remote_earlier"])
@pytest.mark.parametrize("ctype", PRIORITY_TYPES)
def test_priority_wins_keeps_the_local_row_of_a_more_trusted_origin(ctype, later: bool):
    """docs/rules.md#priority from the other side: with ``priority: [sub, pub]`` the local row's
    origin (sub) outranks the remote (pub), so the remote is discarded whatever its ts."""
    table = {"resolvers": {ctype.value: "priority_wins"}}
    state, event = situation(ctype, LATER if later else EARLIER)
    res = fold_converged(spec(table, priority=["sub", "pub"]), dict(state), [event])
    (logged,) = [c for a in res.applied for c in a.conflicts if c.type is ctype]
    assert logged.resolver is R.PRIORITY_WINS and logged.outcome is Out.DISCARDED
    assert "local origin sub ranks above remote origin pub" in logged.reason
    _check_state(ctype, logged.outcome, dict(state), res.state, event)


@pytest.mark.parametrize("later", [True, False], ids=["remote_later", "remote_earlier"])
def test_priority_wins_falls_back_to_the_latest_for_one_origin(later: bool):
    """priority: the same origin on both sides is decided by latest_timestamp_wins (a row
    written by pub, whose later ts the event's own origin beats or not); a base row (no
    origin) ranks below every replica."""
    table = {"resolvers": {"insert_exists": "priority_wins"}, "detection": "origin"}
    event = ev(
        "INSERT", 1, T0 + (LATER if later else EARLIER), "pub", "pub-1", {"id": 1, "v": "x", "n": 2}
    )
    top = {"priority": ["sub", "pub"]}
    res = fold_converged(spec(table, **top), dict([live(1, "a", T0, "pub")]), [event])
    (logged,) = [c for a in res.applied for c in a.conflicts]
    assert logged.outcome is (Out.CONVERTED_TO_UPDATE if later else Out.DISCARDED)
    assert logged.reason.startswith("same origin pub: ")
    res = fold_converged(spec(table, **top), dict([live(1, "a", T0 + 2 * H, None)]), [event])
    (logged,) = [c for a in res.applied for c in a.conflicts]
    assert logged.outcome is Out.CONVERTED_TO_UPDATE
    assert "above local origin (base row)" in logged.reason


RULES_PAGE = REPO / "docs" / "rules.md"


def sentence_of(text: str):
    """The :class:`policy.Why` whose sentence ``text`` is, its facts filled in (a ``{why}``
    by any other sentence, a ``{resolver}`` by a resolver's name), or None."""
    import re

    from pipeline.core.policy import REASONS

    for why, sentence in REASONS.items():
        parts = re.split(r"\{(\w+)\}", sentence)
        resolvers = "|".join(r.value for r in Resolver)
        pattern = "".join(
            re.escape(x) if i % 2 == 0 else f"({resolvers})" if x == "resolver" else "(.+)"
            for i, x in enumerate(parts)
        )
        m = re.fullmatch(pattern, text)
        if m is None:
            continue
        inner = [g for name, g in zip(parts[1::2], m.groups(), strict=True) if name == "why"]
        if all(sentence_of(g) is not None for g in inner):
            return why
    return None


def test_every_sentence_is_written_by_the_fold_and_named_facts_are_required():
    """Every :class:`Why` has a sentence and the row fold writes it (a sentence no code
    writes is a page that lies); :func:`policy.reason` refuses a fact its sentence does
    not name and a named fact not given."""
    from pipeline.core import policy

    assert list(policy.REASONS) == list(policy.Why)
    fold = ("rowfold", "resolvers", "resolution", "rows", "detection", "foldstate")
    source = "".join((REPO / "pipeline" / "rules" / f"{m}.py").read_text() for m in fold)
    source += (REPO / "pipeline" / "core" / "policy.py").read_text().split("class Why")[0]
    unused = [
        w for w in policy.Why if f"_W.{w.name}" not in source and f"Why.{w.name}," not in source
    ]
    assert unused == []
    with pytest.raises(ValueError, match="given"):
        policy.reason(policy.Why.REJECTED, columns=["a"])
    with pytest.raises(ValueError, match="given"):
        policy.reason(policy.Why.EXTRA_REFUSED)
    assert policy.reason(policy.Why.EXTRA_REFUSED, columns=["a", "b"]) == "extra columns: a, b"
    assert (
        sentence_of("local (ts, tie_rank) is later; local origin us-east, ts 1")
        is policy.Why.AGAINST_LOCAL
    )
    assert sentence_of("local origin us-east, ts 1") is None


@pytest.mark.parametrize(
    "marker, render",
    [
        ("resolvers", "resolver_table"),
        ("delete-wins", "delete_wins_table"),
        ("conflict-types", "conflict_types_table"),
        ("resolver-meanings", "resolvers_meaning_table"),
        ("quarantine-reasons", "quarantine_table"),
        ("causes", "causes_table"),
        ("reasons", "reasons_table"),
    ],
)
def test_the_rules_page_shows_the_policy_tables(marker, render):
    """Each table of ``docs/rules.md`` is rendered from the policy by
    ``pipeline.core.meanings``: edit the table, then paste ``meanings.<render>()`` between
    the page's markers."""
    from pipeline.core import meanings

    page = RULES_PAGE.read_text()
    shown = page.split(f"<!-- {marker}:begin -->\n")[1].split(f"<!-- {marker}:end -->")[0]
    assert shown == getattr(meanings, render)()


def test_every_conflict_type_resolver_and_reason_is_explained():
    from pipeline.core import meanings, policy

    assert list(meanings.CONFLICT_MEANING) == list(policy.ConflictType)
    assert set(meanings.RESOLVER_MEANING) == set(policy.Resolver)
    assert list(meanings.QUARANTINE_MEANING) == list(policy.QuarantineReason)
    assert list(meanings.CAUSE_MEANING) == list(policy.Cause)
    assert all(
        v.strip()
        for d in (meanings.CONFLICT_MEANING, meanings.RESOLVER_MEANING)
        for v in d.values()
    )


@pytest.mark.parametrize("ctype", [C.INSERT_EXISTS, C.UPDATE_DELETED, C.DELETE_MISSING])
def test_the_fold_reads_the_delete_wins_literal(ctype, monkeypatch):
    """The fold decides delete_wins from ``policy.DELETE_WINS_TABLE`` and nothing else:
    with the ruling of the remote's row and column flipped in the literal, the fold's
    outcome flips too (an earlier INSERT onto a live row; a later UPDATE of a tombstone;
    a DELETE of an absent key)."""
    from pipeline.core import policy

    state, event = situation(ctype, EARLIER if ctype is C.INSERT_EXISTS else LATER)
    res = fold_converged(spec({"policy": "delete_wins"}), dict(state), [event])
    (before,) = [c.outcome for a in res.applied for c in a.conflicts if c.type is ctype]
    standing = {C.INSERT_EXISTS: policy.Standing.NEWER, C.UPDATE_DELETED: policy.Standing.OLDER}
    row = standing.get(ctype, policy.Standing.ABSENT)
    column = policy.DELETE_WINS_OPS.index(event.op)
    rulings = list(policy.DELETE_WINS_TABLE[row])
    rulings[column] = (
        policy.DeleteWinsRuling.DISCARD if before.remote_applied else policy.DeleteWinsRuling.APPLY
    )
    monkeypatch.setitem(policy.DELETE_WINS_TABLE, row, tuple(rulings))
    res = fold_converged(spec({"policy": "delete_wins"}), dict(state), [event])
    (after,) = [c.outcome for a in res.applied for c in a.conflicts if c.type is ctype]
    assert after.remote_applied != before.remote_applied, (before, after)


def test_every_resolver_of_a_conflict_against_a_local_row_decides_from_the_table():
    """The fold dispatches insert_exists, update_differ, delete_differ and pkey_exists
    through the resolver table (``resolvers.RULES``): every resolver a config may give
    them, or a row preset gives them by default, weighs there or is the user's function."""
    from pipeline.core.policy import Granularity
    from pipeline.rules.resolvers import RULES

    versus_local = (
        ConflictType.INSERT_EXISTS,
        ConflictType.UPDATE_DIFFER,
        ConflictType.DELETE_DIFFER,
        ConflictType.PKEY_EXISTS,
    )
    row_presets = [r for r in PRESETS.values() if r.granularity is Granularity.ROW]
    for t in versus_local:
        given = ALLOWED[t] | {rule.resolvers[t] for rule in row_presets}
        undecided = {r for r in given if RULES[r].weigh is None and not RULES[r].by_function}
        assert undecided == set(), t


def test_every_resolver_a_conflict_can_meet_has_its_decision_in_a_table():
    """Every resolver a config may give a conflict type, or a row preset gives it, has its
    decision in the one resolver table (``resolvers.RULES``, a row per resolver): it weighs
    the event against the local version, is the user's function, takes the event in a step
    without a local version (``takes``), or refuses it (``refused``). A resolver allowed for
    a type with none of these fails here rather than falling through in the fold."""
    from pipeline.core.policy import Granularity
    from pipeline.rules.resolvers import RULES, Absent

    assert set(RULES) == set(Resolver)
    row_presets = [r for r in PRESETS.values() if r.granularity is Granularity.ROW]
    undecided = {
        (t, r)
        for t in ConflictType
        for r in ALLOWED[t] | {rule.resolvers[t] for rule in row_presets}
        if RULES[r].weigh is None
        and not RULES[r].by_function
        and t not in RULES[r].takes
        and RULES[r].refused is None
    }
    assert undecided == set()
    # a step without a local version takes the event under one resolver, allowed for it,
    # and any other refuses it
    for t in {t for rule in RULES.values() for t in rule.takes}:
        takers = [r for r, rule in RULES.items() if t in rule.takes]
        assert len(takers) == 1 and takers[0] in ALLOWED[t], (t, takers)
        assert RULES[takers[0]].refused is None
    # an UPDATE or a DELETE without a live row: the resolvers that refuse it say how
    for t in (
        ConflictType.UPDATE_MISSING,
        ConflictType.UPDATE_DELETED,
        ConflictType.DELETE_MISSING,
    ):
        for r in ALLOWED[t] | {rule.resolvers[t] for rule in row_presets}:
            absent = RULES[r].absent
            assert absent is not Absent.WEIGH or RULES[r].weigh is not None, (t, r)
            if absent in (Absent.REFUSE, Absent.FULL_ROW):
                assert RULES[r].refused is not None, (t, r)
