"""Policy as data: every conflict type has a default in every preset and a rule in the fold;
every configurable resolver is implemented for every type that allows it."""

from __future__ import annotations

import pytest
from fold_helpers import T0, H, ev, live, spec, tomb

from pipeline.policy import ALLOWED, PRESETS, ConflictType, Outcome, Resolver
from pipeline.rowfold import fold_converged

C = ConflictType


def situation(t: ConflictType):
    """A state and one event that meet a conflict of type ``t``."""
    full = {"id": 1, "v": "x", "n": 2}
    return {
        C.INSERT_EXISTS: ([live(1, "a", T0, "sub")], ev("INSERT", 1, T0 + H, "pub", "pub-1", full)),
        C.UPDATE_DIFFER: (
            [live(1, "a", T0, "sub")],
            ev("UPDATE", 1, T0 + H, "pub", "pub-1", {"v": "x"}),
        ),
        C.UPDATE_MISSING: ([], ev("UPDATE", 1, T0 + H, "pub", "pub-1", full)),
        C.UPDATE_DELETED: ([tomb(1, T0, "sub")], ev("UPDATE", 1, T0 + H, "pub", "pub-1", full)),
        C.DELETE_DIFFER: ([live(1, "a", T0, "sub")], ev("DELETE", 1, T0 + H, "pub", "pub-1")),
        C.DELETE_MISSING: ([], ev("DELETE", 1, T0 + H, "pub", "pub-1")),
        C.PKEY_EXISTS: (
            [live(1, "a", T0, "pub"), live(2, "b", T0, "sub")],
            ev("UPDATE", 1, T0 + H, "pub", "pub-1", {"id": 2}, new_key=2),
        ),
        C.MULTIPLE_UNIQUE_CONFLICTS: (
            [live(2, "x", T0, "sub")],
            ev("INSERT", 1, T0 + H, "pub", "pub-1", full),
        ),
        C.SOURCE_COLUMN_EXTRA: (
            [],
            ev("INSERT", 1, T0 + H, "pub", "pub-1", full, extra_cols=("zz",)),
        ),
        C.TARGET_COLUMN_EXTRA: ([], ev("INSERT", 1, T0 + H, "pub", "pub-1", {"id": 1, "v": "x"})),
    }[t]


def test_every_preset_has_a_resolver_for_every_type():
    for preset, rule in PRESETS.items():
        assert set(rule.resolvers) == set(ConflictType), preset


@pytest.mark.parametrize(
    ("ctype", "resolver"), [(t, r) for t in ConflictType for r in sorted(ALLOWED[t])]
)
def test_every_allowed_resolver_is_implemented(ctype, resolver: Resolver):
    table = {"resolvers": {ctype.value: resolver.value}}
    if ctype is C.MULTIPLE_UNIQUE_CONFLICTS:
        table["unique"] = [["v"]]
    state, event = situation(ctype)
    res = fold_converged(spec(table), dict(state), [event])
    logged = [c for a in res.applied for c in a.conflicts if c.type is ctype]
    assert len(logged) == 1
    assert logged[0].resolver is resolver
    assert logged[0].outcome in set(Outcome)
    if resolver is Resolver.ERROR:
        assert res.stopped is not None


@pytest.mark.parametrize("ctype", sorted(ConflictType))
def test_delete_wins_decides_every_row_type(ctype):
    from pipeline.policy import ROW_TYPES

    if ctype not in ROW_TYPES or ctype is C.PKEY_EXISTS:
        pytest.skip("not decided by the delete-wins rule")
    state, event = situation(ctype)
    res = fold_converged(spec({"policy": "delete_wins"}), dict(state), [event])
    logged = [c for a in res.applied for c in a.conflicts]
    assert logged and logged[0].resolver is Resolver.DELETE_WINS
