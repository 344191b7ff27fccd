"""Manual decisions (docs/rules.md#manual-decisions) in the row fold: the conflict id, a
decision applied in place of the resolver (local, remote, a row), the fold going on with
the key's later events, a stale decision not applied, the perspectives untouched; and the
checks ``cdr decide`` makes before it records one."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipeline.app import decide
from pipeline.core.errors import StageError
from pipeline.core.policy import ConflictType as C
from pipeline.core.policy import Outcome as O
from pipeline.core.policy import Resolver as R
from pipeline.ingest import decisions as table_
from pipeline.rules.custom import RowMisfit
from pipeline.rules.decisions import (
    Decision,
    Decisions,
    Stale,
    Take,
    conflict_id,
    digest,
    key_text,
    local_ref,
    local_text,
    remote_text,
    typed_row,
)
from pipeline.rules.events import FoldSpec, reader_view
from pipeline.rules.perspectives import fold_perspective
from pipeline.rules.rowfold import fold_converged
from tests.helpers.fold_helpers import T0, H, ev, live, make_config, spec

DT = "2026-11-21"


def _id_of(sp: FoldSpec, loc, e, t: C = C.UPDATE_DIFFER) -> str:
    return conflict_id(
        DT, "t", key_text(sp.table.key, e.key), t.value, e.event_id, local_ref([loc])
    )


def _decided(sp: FoldSpec, loc, e, take: Take, row=None, *, remote=None) -> FoldSpec:
    d = Decision(
        "d-000000000001",
        _id_of(sp, loc, e),
        take,
        row,
        "the customer called",
        digest(local_text(loc)),
        digest(remote_text(remote or e, sp.table.key)),
    )
    return replace(sp, decisions=Decisions(DT, {d.conflict_id: d}))


def _conflict():
    """pub's row (n=5) is older than sub's update (n=7): sub's update wins by ts."""
    k, loc = live(1, "a", T0, "pub", n=5, eid="p1")
    e = ev("UPDATE", 1, T0 + H, "sub", "s1", {"v": "b", "n": 7})
    return {k: loc}, loc, e


def test_the_conflict_id_is_the_same_for_the_same_conflict_and_differs_for_another():
    sp = spec()
    _, loc, e = _conflict()
    assert _id_of(sp, loc, e) == _id_of(sp, loc, e)
    other = ev("UPDATE", 1, T0 + H, "sub", "s2", {"v": "b"})
    assert _id_of(sp, loc, other) != _id_of(sp, loc, e)
    base = replace(loc, event_id=None)  # a base row: its row's digest stands for it
    assert local_ref([base]) == digest(local_text(base))
    assert conflict_id("2026-11-22", "t", "{}", "x", "e", "l") != conflict_id(
        "2026-11-21", "t", "{}", "x", "e", "l"
    )


def test_without_a_decision_the_resolver_decides():
    state, _, e = _conflict()
    res = fold_converged(spec(), state, [e])
    (c,) = res.applied[0].conflicts
    assert c.resolver is R.LATEST_TIMESTAMP_WINS and c.outcome is O.APPLIED
    assert reader_view(res.state[(1,)]) == {"id": 1, "v": "b", "n": 7}


def test_take_local_discards_the_remote_event_and_is_logged_manual():
    state, loc, e = _conflict()
    sp = _decided(spec(), loc, e, Take.LOCAL)
    res = fold_converged(sp, state, [e])
    (c,) = res.applied[0].conflicts
    assert (c.resolver, c.outcome) == (R.MANUAL, O.DISCARDED)
    assert "decision d-000000000001 took local: the customer called" in c.reason
    assert reader_view(res.state[(1,)]) == {"id": 1, "v": "a", "n": 5}


def test_take_remote_applies_an_event_the_resolver_discards():
    k, loc = live(1, "a", T0 + H, "pub", n=5, eid="p1")  # the local row is the newer
    e = ev("UPDATE", 1, T0, "sub", "s1", {"v": "b"})
    assert not fold_converged(spec(), {k: loc}, [e]).applied[0].applied
    res = fold_converged(_decided(spec(), loc, e, Take.REMOTE), {k: loc}, [e])
    assert res.applied[0].applied
    assert res.applied[0].conflicts[0].resolver is R.MANUAL
    assert reader_view(res.state[(1,)])["v"] == "b"


def test_a_row_is_written_with_the_larger_ts_and_the_remote_origin():
    state, loc, e = _conflict()
    sp = _decided(spec(), loc, e, Take.ROW, {"v": "agreed"})
    res = fold_converged(sp, state, [e])
    v = res.state[(1,)]
    assert reader_view(v) == {"id": 1, "v": "agreed", "n": 7}  # n: the remote's (it won)
    assert (v.ts, v.origin) == (T0 + H, "sub")


def test_the_fold_goes_on_with_the_keys_later_events():
    state, loc, e = _conflict()
    later = ev("UPDATE", 1, T0 + 2 * H, "pub", "p2", {"n": 9}, {"n": 5})
    res = fold_converged(_decided(spec(), loc, e, Take.LOCAL), state, [e, later])
    assert reader_view(res.state[(1,)]) == {"id": 1, "v": "a", "n": 9}


def test_a_decision_whose_versions_changed_is_not_applied():
    state, loc, e = _conflict()
    changed = ev("UPDATE", 1, T0 + H, "sub", "s1", {"v": "c", "n": 7})  # same id, new content
    sp = _decided(spec(), loc, e, Take.LOCAL)
    res = fold_converged(sp, state, [changed])
    assert res.applied[0].conflicts[0].resolver is R.LATEST_TIMESTAMP_WINS
    assert reader_view(res.state[(1,)])["v"] == "c"


def test_a_perspective_applies_the_resolver_not_the_decision():
    state, loc, e = _conflict()
    sp = _decided(spec(), loc, e, Take.LOCAL)
    mine = fold_perspective(sp, state, [e], "pub")
    assert reader_view(mine[(1,)])["v"] == "b"


def test_a_delta_column_follows_its_own_rule_under_a_decision():
    sp = spec({"delta": ["n"]})
    k, loc = live(1, "a", T0, "pub", n=5, eid="p1")
    e = ev("UPDATE", 1, T0 + H, "sub", "s1", {"v": "b", "n": 8}, {"n": 5})
    res = fold_converged(_decided(sp, loc, e, Take.LOCAL), {k: loc}, [e])
    assert reader_view(res.state[(1,)]) == {"id": 1, "v": "a", "n": 8}  # its +3 still counts


def test_statuses_tell_applied_changed_and_gone():
    def d(i: str, cid: str) -> Decision:
        return Decision(i, cid, Take.LOCAL, None, "w", "a", "b")

    chosen = Decisions(DT, {c: d(i, c) for i, c in (("d-a", "x"), ("d-b", "y"), ("d-c", "z"))})
    logged = [
        {"conflict_id": "x", "resolver": "manual"},
        {"conflict_id": "y", "resolver": "latest_timestamp_wins"},
    ]
    assert table_.statuses(chosen, logged) == {
        "d-a": table_.APPLIED,
        "d-b": Stale.CHANGED.value,
        "d-c": Stale.GONE.value,
    }


def test_a_row_that_does_not_fit_is_refused_naming_the_column():
    t = make_config().tables["t"]
    assert typed_row(t, {"v": "x", "n": "12"}) == {"v": "x", "n": 12}
    with pytest.raises(RowMisfit, match=r"column 'n' is int, not 'many'"):
        typed_row(t, {"n": "many"})
    with pytest.raises(RowMisfit, match=r"no column 'w'"):
        typed_row(t, {"w": 1})
    with pytest.raises(RowMisfit, match=r"column 'n' is int"):
        typed_row(t, {"n": 2**40})


def _logged(ctype: str, local_row: str = '{"id":1,"v":"a","n":5}') -> dict:
    return {"conflict_id": "0" * 32, "conflict_type": ctype, "local_row": local_row}


@pytest.mark.parametrize(
    ("ctype", "take", "row", "table", "message"),
    [
        ("update_missing", Take.REMOTE, None, {}, r"is update_missing: a decision answers"),
        ("delete_differ", Take.ROW, {"v": "x"}, {}, r"takes local or remote, not a row"),
        ("update_differ", Take.ROW, {"n": "x"}, {}, r"--row does not fit: column 'n' is int"),
        ("update_differ", Take.ROW, [1], {}, r"--row must be a JSON object"),
        ("update_differ", Take.ROW, {"id": 2, "v": "x"}, {}, r"--row names the key column"),
        (
            "update_differ",
            Take.ROW,
            {"v": "x"},
            {"column_groups": {"g": ["v"]}},
            r"has column_groups",
        ),
    ],
    ids=["type", "row_on_delete", "misfit", "not_object", "key", "groups"],
)
def test_cdr_decide_refuses_what_it_cannot_apply(ctype, take, row, table, message):
    cfg = make_config(table)
    with pytest.raises(StageError, match=message):
        decide.check(cfg, "t", _logged(ctype), take, row)


def test_cdr_decide_takes_a_row_that_fits_and_refuses_one_on_a_tombstone():
    cfg = make_config()
    assert decide.check(cfg, "t", _logged("update_differ"), Take.ROW, {"v": "x"}) == {"v": "x"}
    with pytest.raises(StageError, match=r"tombstone"):
        decide.check(
            cfg, "t", _logged("insert_exists", '{"id":1,"_deleted":true}'), Take.ROW, {"v": "x"}
        )


def test_the_dates_to_rerun_are_the_date_and_every_later_published_one():
    from datetime import date

    class Row:
        def __init__(self, d, published=True, tables=("t",)):
            self.dt, self.published, self._t = d, published, tables

        def tables(self):
            return dict.fromkeys(self._t)

    runs = [
        Row(date(2026, 11, 20)),
        Row(date(2026, 11, 21)),
        Row(date(2026, 11, 23)),
        Row(date(2026, 11, 24), published=False),
        Row(date(2026, 11, 25), tables=("u",)),
        Row(date(2026, 11, 26), tables=("w",)),
    ]
    assert decide.reruns(runs, ("t", "u"), date(2026, 11, 21)) == (
        date(2026, 11, 21),
        date(2026, 11, 23),
        date(2026, 11, 25),
    )


def test_a_decision_whose_row_no_longer_fits_is_reported_not_applied(tmp_path):
    """The table changed since the decision (a column dropped): the run goes on, the
    decision is not loaded, and its status says why."""
    import json
    from datetime import date

    from pipeline.storage.workpath import WorkPath

    folder = WorkPath.of(tmp_path)
    staged = [
        {"decision_id": "d-1", "conflict_id": "x", "key": "{}", "take": "row",
         "row": json.dumps({"gone": 1}), "why": "w", "digests": ["a", "b"]},
        {"decision_id": "d-2", "conflict_id": "y", "key": "{}", "take": "local",
         "row": None, "why": "w", "digests": ["a", "b"]},
    ]  # fmt: skip
    (folder / table_.STAGED).write_text(json.dumps(staged))
    got = table_.load(folder, make_config().tables["t"], date(2026, 11, 21))
    assert list(got.by_conflict) == ["y"] and "no column 'gone'" in got.unfit["d-1"]
    status = table_.statuses(got, [{"conflict_id": "y", "resolver": "manual"}])
    assert status["d-2"] == table_.APPLIED
    assert status["d-1"].startswith(Stale.UNFIT.value) and "gone" in status["d-1"]


@pytest.mark.parametrize("name", ["decisions", "runs", "conflict_stats", "cdc", "reports", "_x"])
def test_a_table_may_not_take_a_folder_of_the_stores_own(name):
    from pipeline.core.config_load import parse_config
    from pipeline.core.errors import ConfigError
    from tests.helpers import configs

    cfg = configs.config({name: {"key": ["id"], "columns": {"id": "int"}}}, replicas=("A", "B"))
    with pytest.raises(ConfigError, match=rf"tables\.{name}: .*(store's own|starts with a letter)"):
        parse_config(cfg)


def test_cdr_decide_says_the_command_that_runs_its_dates_again():
    """The line ``cdr decide`` prints ends with a command a user can paste: it parses as
    ``cdr run`` of the decision's date, with every later date after it."""
    import argparse
    import shlex
    from datetime import date
    from pathlib import Path

    from pipeline.app.cli_args import build_parser
    from pipeline.app.cli_review import decided_text

    row = {"decision_id": "d-5a1b2c3d4e5f", "table": "t", "key": '{"id": 1}',
           "dt": date(2026, 11, 21), "take": "local"}  # fmt: skip
    result = decide.Decided(row, (date(2026, 11, 21), date(2026, 11, 23)))
    args = argparse.Namespace(
        config=Path("my configs/cdr.yaml"), store="file:///s", withdraw=None, rerun=False
    )
    text = decided_text(args, result)
    assert "2026-11-21 2026-11-23" in text
    command = shlex.split(text.rsplit(": ", 1)[1])
    assert command[0] == "cdr"
    run = build_parser().parse_args(command[1:])
    assert run.command == "run" and run.date == date(2026, 11, 21) and run.then_later
    assert run.config == args.config and run.store == "file:///s"
    alone = decide.Decided(row, (date(2026, 11, 21),))  # no later date: the date alone
    args.store = None
    run = build_parser().parse_args(shlex.split(decided_text(args, alone).rsplit(": ", 1)[1])[1:])
    assert run.date == date(2026, 11, 21) and not run.then_later and run.store is None
    args.rerun = True  # cdr decide --rerun runs them: no command to paste
    assert "cdr run" not in decided_text(args, result)
