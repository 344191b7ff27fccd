"""Custom resolvers (docs/rules.md#custom-resolvers) in the row fold: the answers, the
errors, the asymmetry check, and the examples of ``docs/examples/resolvers.py``."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings

from pipeline.core.errors import ConfigError
from pipeline.core.policy import ASYMMETRIC_NOTE, QuarantineReason
from pipeline.core.policy import ConflictType as C
from pipeline.core.policy import Outcome as O
from pipeline.core.policy import Resolver as R
from pipeline.rules import custom
from pipeline.rules.events import FoldSpec, reader_view
from pipeline.rules.perspectives import fold_perspective
from pipeline.rules.rowfold import fold_converged
from tests.helpers.fold_helpers import NOW, T0, H, ev, live, make_config, spec
from tests.unit.test_properties import build, converged_in_every_order, lww_spec, merge_workloads

HELPERS = "tests.helpers.resolvers"
EXAMPLES = "docs.examples.resolvers"


def custom_spec(function: str, *types: str, table: dict | None = None) -> FoldSpec:
    types = types or ("update_differ",)
    resolvers = {t: {"python": function} for t in types}
    return spec({**(table or {}), "resolvers": resolvers})


def test_the_config_checks_the_path_only_and_names_the_resolver():
    sp = custom_spec("no.such.module:f")
    assert sp.table.resolvers[C.UPDATE_DIFFER] is R.PYTHON
    assert sp.table.resolver_name(C.UPDATE_DIFFER) == "python:no.such.module:f"
    with pytest.raises(
        custom.ResolverMissing, match=r"python:no\.such\.module:f cannot be imported"
    ):
        custom.load("no.such.module:f")


@pytest.mark.parametrize(
    ("resolvers", "table", "message"),
    [
        (
            {"update_differ": "python"},
            {},
            r'update_differ: a custom resolver is \{python: "module:',
        ),
        (
            {"update_differ": {"python": "acme"}},
            {},
            r"update_differ\.python: 'acme' is not module:",
        ),
        ({"update_differ": {"python": "a b:c"}}, {}, r"is not module:function"),
        ({"delete_differ": {"python": "a:b"}}, {}, r"resolver 'python' is not allowed for delete_"),
        ({"update_differ": {"python": "a:b", "x": 1}}, {}, r"update_differ"),
        (
            {"update_differ": {"python": "a:b"}},
            {"column_groups": {"g": ["v"]}},
            r"tables\.t\.resolvers\.update_differ: a custom resolver cannot decide update_differ",
        ),
        (
            {"update_differ": {"python": "a:b"}},
            {"policy": "delete_wins"},
            r"update_differ: a custom resolver is not allowed under policy delete_wins",
        ),
    ],
    ids=["bare_word", "no_function", "spaces", "delete_differ", "extra_key", "groups", "informix"],
)
def test_custom_resolver_mistakes_are_refused(resolvers, table, message):
    with pytest.raises(ConfigError, match=message):
        make_config({**table, "resolvers": resolvers})


def test_the_function_decides_and_is_logged_with_its_answer():
    """``larger_n``: the version with the larger ``n`` wins, though it is older."""
    sp = custom_spec(f"{HELPERS}:larger_n")
    state = dict([live(1, "a", T0, "pub", n=9)])
    res = fold_converged(sp, state, [ev("UPDATE", 1, T0 + H, "sub", "s1", {"v": "b", "n": 2})])
    assert reader_view(res.state[(1,)]) == {"id": 1, "v": "a", "n": 9}
    (c,) = res.applied[0].conflicts
    assert (c.resolver, c.outcome) == (R.PYTHON, O.DISCARDED)
    assert c.reason.startswith(f"python:{HELPERS}:larger_n answered local; local origin pub")
    assert ASYMMETRIC_NOTE not in c.reason


def test_an_asymmetric_function_is_marked_in_the_reason():
    sp = custom_spec(f"{HELPERS}:always_remote")
    state = dict([live(1, "a", T0, "pub")])
    res = fold_converged(sp, state, [ev("UPDATE", 1, T0 + H, "sub", "s1", {"v": "b"})])
    (c,) = res.applied[0].conflicts
    assert c.outcome is O.APPLIED
    assert ASYMMETRIC_NOTE + "remote, another row)" in c.reason


MIXED = {
    "columns": {"id": "int", "v": "string", "n": "int", "m": "int"},
    "not_null": ["v"],
    "delta": ["n"],
    "merge": {"m": "max"},
}


def test_a_returned_row_keeps_the_key_and_leaves_delta_and_merge_columns_to_their_rules():
    """The row ``{id: 99, v: mine, n: 1000, m: -5}``: the key stays 1, ``n`` adds the
    UPDATE's delta, ``m`` takes the max of the two versions; ``_ts`` is the larger of the
    two, ``_origin`` the remote's."""
    sp = custom_spec(f"{HELPERS}:ROW", table=MIXED)
    (k, base) = live(1, "a", T0 + 2 * H, "pub")
    base.values.update(n=10, m=3)
    e = ev("UPDATE", 1, T0 + H, "sub", "s1", {"v": "b", "n": 15, "m": 7}, {"n": 12})
    res = fold_converged(sp, {k: base}, [e])
    row = res.state[(1,)]
    assert reader_view(row) == {"id": 1, "v": "mine", "n": 13, "m": 7}
    assert (row.ts, row.origin, row.event_id) == (T0 + 2 * H, "sub", "s1")
    assert res.applied[0].applied


def test_a_returned_row_in_insert_exists():
    sp = custom_spec(f"{HELPERS}:ROW", "insert_exists", table=MIXED)
    (k, base) = live(1, "a", T0, "pub")
    base.values.update(n=10, m=3)
    e = ev("INSERT", 1, T0 + H, "sub", "s1", {"id": 1, "v": "b", "n": 4, "m": 1})
    res = fold_converged(sp, {k: base}, [e])
    assert reader_view(res.state[(1,)]) == {"id": 1, "v": "mine", "n": 4, "m": 3}
    assert res.applied[0].conflicts[0].outcome is O.CONVERTED_TO_UPDATE


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("boom", "raised RuntimeError: no rule for key {'id': 1}"),
        ("BAD_WORD", "answered 'both': not 'local', 'remote' or {'row': {...}}"),
        ("NO_SUCH_COLUMN", "answered a row that does not fit: no column 'nope'"),
        ("WRONG_TYPE", "answered a row that does not fit: column 'n' is int, not 'seven'"),
        ("NULL_NOT_NULL", "answered a row that does not fit: column 'v' is NOT NULL"),
    ],
)
def test_an_error_quarantines_the_event_and_a_perspective_keeps_the_local_row(name, message):
    sp = custom_spec(f"{HELPERS}:{name}", table={"not_null": ["v"]})
    state = dict([live(1, "a", T0, "pub"), live(2, "x", T0, "pub")])
    events = [
        ev("UPDATE", 1, T0 + H, "sub", "s1", {"v": "b"}, seqs={"sub": 0}),
        ev("INSERT", 3, T0 + H, "sub", "s2", {"id": 3, "v": "c", "n": 0}, seqs={"sub": 1}),
    ]
    res = fold_converged(sp, state, events)
    bad, fine = res.applied
    assert bad.quarantine is QuarantineReason.RESOLVER_ERROR
    assert bad.quarantined == f"python:{HELPERS}:{name} {message}"
    assert (bad.applied, bad.conflicts) == (False, ())
    assert fine.applied and res.stopped is None  # the run goes on
    assert reader_view(res.state[(1,)]) == {"id": 1, "v": "a", "n": 0}
    mine = fold_perspective(sp, state, events, "sub")
    assert reader_view(mine[(1,)]) == {"id": 1, "v": "a", "n": 0}


@settings(max_examples=300, deadline=None)
@given(merge_workloads())
def test_a_symmetric_function_converges_in_every_apply_order(w):
    """``larger_n`` for insert_exists and update_differ, full-row writes that each meet a
    conflict in every order (each origin writes a key once, and not its prior row's
    origin): every replica's own order reaches the converged state, and no conflict is
    marked asymmetric. (A later write of the row's own origin is applied without a
    conflict, as PostgreSQL applies it: a function that can prefer the older version can
    diverge then, which ``docs/rules.md#custom-resolvers`` says.)"""
    raw, prior, orders = w
    path = {"python": f"{HELPERS}:larger_n"}
    resolvers = {"insert_exists": path, "update_differ": path, "update_missing": "apply_or_skip"}
    sp, ranks = lww_spec(resolvers)
    state, events = build(raw, prior, orders, ranks)
    converged_in_every_order(sp, state, events)
    res = fold_converged(sp, state, events)
    assert not any(ASYMMETRIC_NOTE in c.reason for a in res.applied for c in a.conflicts)


def test_an_asymmetric_function_diverges_where_it_is_marked():
    """``always_remote``: each replica keeps the other's write, the converged state the
    later one's; the conflict says so."""
    sp, ranks = lww_spec({"update_differ": {"python": f"{HELPERS}:always_remote"}})
    raw = [
        {"event_id": "e0", "op": "UPDATE", "key": 0, "ts": T0, "origin": "a", "v": "x", "n": 1},
        {"event_id": "e1", "op": "UPDATE", "key": 0, "ts": T0 + 1, "origin": "b", "v": "y", "n": 2},
    ]
    state, events = build(raw, {0: ("p", 0, "c")}, {"a": [0, 1], "b": [1, 0], "c": [0, 1]}, ranks)
    res = fold_converged(sp, state, events)
    assert any(ASYMMETRIC_NOTE in c.reason for a in res.applied for c in a.conflicts)
    views = {r: reader_view(fold_perspective(sp, state, events, r)[(0,)]) for r in "ab"}
    assert views["a"] != views["b"]


# ---------------------------------------------------------------- the docs' examples


def test_the_plan_tier_example_prefers_the_paid_plan_in_every_order():
    columns = {"id": "int", "plan": "string", "seats": "int"}
    path = {"python": f"{EXAMPLES}:prefer_paid_plan"}
    cfg = make_config({"columns": columns, "resolvers": {"update_differ": path}})
    sp = FoldSpec(cfg.tables["t"], NOW)
    state = dict([live(1, "a", T0 - H, "pub")])
    state[(1,)].values.clear()
    state[(1,)].values.update(id=1, plan="free", seats=1)
    events = [
        ev("UPDATE", 1, T0, "pub", "p1", {"plan": "team", "seats": 5}, seqs={"pub": 0, "sub": 1}),
        ev(
            "UPDATE",
            1,
            T0 + H,
            "sub",
            "s1",
            {"plan": "free", "seats": 2},
            seqs={"pub": 1, "sub": 0},
        ),
    ]
    res = fold_converged(sp, state, events)
    assert reader_view(res.state[(1,)]) == {"id": 1, "plan": "team", "seats": 5}
    for r in ("pub", "sub"):
        assert reader_view(fold_perspective(sp, state, events, r)[(1,)]) == {
            "id": 1,
            "plan": "team",
            "seats": 5,
        }


def test_the_json_merge_example_keeps_both_sides_keys_in_every_order():
    columns = {"id": "int", "attrs": "string"}
    path = {"python": f"{EXAMPLES}:merge_json_documents"}
    cfg = make_config({"columns": columns, "resolvers": {"update_differ": path}})
    sp = FoldSpec(cfg.tables["t"], NOW)
    base = {(1,): live(1, "a", T0 - H, "pub")[1]}
    base[(1,)].values.clear()
    base[(1,)].values.update(id=1, attrs=json.dumps({"color": "red"}))
    blue = {"attrs": json.dumps({"color": "blue", "size": "L"})}
    green = {"attrs": json.dumps({"color": "green", "fit": "slim"})}
    events = [
        ev("UPDATE", 1, T0, "pub", "p1", blue, seqs={"pub": 0, "sub": 1}),
        ev("UPDATE", 1, T0 + H, "sub", "s1", green, seqs={"pub": 1, "sub": 0}),
    ]
    want = {"color": "green", "fit": "slim", "size": "L"}
    res = fold_converged(sp, base, events)
    assert json.loads(res.state[(1,)].values["attrs"]) == want
    for r in ("pub", "sub"):
        assert json.loads(fold_perspective(sp, base, events, r)[(1,)].values["attrs"]) == want


def test_a_perspective_keeps_the_local_row_as_it_is_when_the_function_fails():
    """No merge and no delta from the failed event in a perspective, as in the converged
    fold that quarantines it: the key does not diverge."""
    sp = custom_spec(f"{HELPERS}:boom", table=MIXED)
    (k, base) = live(1, "a", T0, "pub")
    base.values.update(n=10, m=1)
    e = ev(
        "UPDATE", 1, T0 + H, "sub", "s1", {"v": "b", "n": 15, "m": 9}, {"n": 12}, seqs={"sub": 0}
    )
    res = fold_converged(sp, {k: base}, [e])
    assert res.applied[0].quarantine is QuarantineReason.RESOLVER_ERROR
    for r in ("pub", "sub"):
        mine = fold_perspective(sp, {k: base}, [e], r)
        assert (
            reader_view(mine[(1,)])
            == {"id": 1, "v": "a", "n": 10, "m": 1}
            == reader_view(res.state[(1,)])
        )


def test_an_answered_row_may_hold_nan_and_infinity_in_a_double():
    sp = custom_spec(
        f"{HELPERS}:echo_local_row", table={"columns": {"id": "int", "v": "string", "x": "double"}}
    )
    (k, base) = live(1, "a", T0, "pub")
    base.values.clear()
    base.values.update(id=1, v="a", x=float("inf"))
    res = fold_converged(sp, {k: base}, [ev("UPDATE", 1, T0 + H, "sub", "s1", {"x": 1.0})])
    assert res.applied[0].quarantined is None
    assert res.state[(1,)].values["x"] == float("inf")


def test_an_answered_uuid_is_checked_and_lower_cased():
    sp_table = {"columns": {"id": "int", "v": "string", "u": "uuid"}}
    (k, base) = live(1, "a", T0, "pub")
    base.values["u"] = None
    e = ev("UPDATE", 1, T0 + H, "sub", "s1", {"v": "b"})
    res = fold_converged(custom_spec(f"{HELPERS}:UPPER_UUID", table=sp_table), {k: base}, [e])
    assert res.state[(1,)].values["u"] == "0f8fad5b-d9cb-469f-a165-70867728950e"
    res = fold_converged(custom_spec(f"{HELPERS}:NOT_A_UUID", table=sp_table), {k: base}, [e])
    assert "column 'u' is uuid, not '0f8fad5b'" in (res.applied[0].quarantined or "")


def test_a_custom_insert_exists_resolver_goes_with_column_groups():
    sp = custom_spec(f"{HELPERS}:larger_n", "insert_exists", table={"column_groups": {"g": ["v"]}})
    assert sp.table.custom == {C.INSERT_EXISTS: f"{HELPERS}:larger_n"}


@pytest.mark.parametrize(
    ("source", "said"),
    [
        ("raise RuntimeError('no database here')", r"raised RuntimeError: no database here"),
        ("def f(:\n    pass\n", r"raised SyntaxError \(.*broken_\w+\.py line 1\)"),
    ],
)
def test_a_module_that_raises_on_import_names_the_resolver(tmp_path, monkeypatch, source, said):
    """A custom resolver whose module raises when imported (its own error, a syntax
    error) stops the run with a message that names the resolver, not a traceback."""
    name = f"broken_{len(source)}"
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(
        custom.ResolverMissing,
        match=rf"python:{name}:f cannot be imported: importing {name} {said}",
    ):
        custom.load(f"{name}:f")
