"""A store published before delta-spark (``tests/fixtures/store-before-delta-spark``:
its tables written by delta-rs, ``cdr.*`` commit info, no deletion vectors) is read by the
next night on the new layer, and a date published before the move can be run again; a
column added since (the conflict log's instants, issue 78) is added to the table by the
night's commit, the earlier rows reading null there, none of their files rewritten.

The reference is what the release before made of the third night (``after-d3.json``, made
with the fixture): the new layer's third night leaves every table as that release would
have."""

from __future__ import annotations

import json
import re
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

from deltalake import DeltaTable

from pipeline.app.cli import main
from pipeline.core.instants import instant_micros
from pipeline.spark.frames import INSTANTS
from pipeline.storage.lake import FEATURES, Lake
from pipeline.storage.store import open_store
from tests.fixtures.make_store_before_delta_spark import DATES, EXPECTED, config_for, tables
from tests.helpers import configs
from tests.helpers import published as P

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "store-before-delta-spark"
D1, D2, D3 = (d.isoformat() for d in DATES)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
TIME = re.compile(r"ts \S+ \((-?\d+)\)")  # a reason's time: its instant, its µs beside


def _night(root: Path, d: str, *extra: str) -> int:
    cfg = configs.write(root / "cdr.yaml", config_for(root))
    argv = ["run", "--config", str(cfg), "--date", d, "--work-dir", str(root / "work")]
    return main([*argv, "--no-data-docs", *extra])


def _newest_state(rows: dict[str, int], d: str) -> dict[str, int]:
    """The state rows the release before left for date ``d`` (one copy per date, each row
    with its ``dt``), as the state table now holds them: the newest date's, no ``dt``."""
    out: dict[str, int] = {}
    for text, n in rows.items():
        row = json.loads(text)
        if row.pop("dt") == d:
            again = json.dumps(row, sort_keys=True, default=str)
            out[again] = out.get(again, 0) + n
    return out


#: the conflict log's columns of docs/rules.md#lost-writes, added since the fixture's release
LOST_COLUMNS = ("local_event_id", "concurrency", "concurrency_why", "lost_event_id")


def _files(store, name: str) -> set[str]:
    """The data files the conflict log of table ``name`` holds now."""
    return set(DeltaTable(f"{P.root_uri(store)}/published/{name}/conflicts").file_uris())


def _without_instants(rows: dict[str, int]) -> dict[str, int]:
    """docs/outputs.md#instants: the conflict log's rows as the release before wrote them.
    The columns the new night added read null in the earlier nights' rows, and in the new
    night's are its µs as instants (null where the µs is), and its reasons print a time as
    its instant beside its µs, which the release before printed alone."""
    out: dict[str, int] = {}
    for text, n in rows.items():
        row = json.loads(text)
        for name, us in INSTANTS:
            at = row.pop(name)
            if row["dt"] != D3 or row[us] is None:
                assert at is None, row
            else:
                assert datetime.fromisoformat(at) == EPOCH + timedelta(microseconds=row[us])
        if row["dt"] == D3 and (m := TIME.search(row["reason"])):
            assert m.group(0) == f"ts {instant_micros(int(m.group(1)))}", row
            row["reason"] = TIME.sub(r"ts \1", row["reason"])
        again = json.dumps(row, sort_keys=True, default=str)
        out[again] = out.get(again, 0) + n
    return out


def test_the_night_after_the_move_and_a_backfill_from_before_it(tmp_path: Path, spark):
    moved = tmp_path / "moved"
    shutil.copytree(FIXTURE, moved)
    old = open_store((moved / "store").as_uri())
    before = P.runs(old)
    assert [(str(r["dt"]), r["status"]) for r in before] == [(D1, "published"), (D2, "published")]
    assert "cdr.run_id" in Lake(old).commit_info("published/accounts/snapshot", 0)  # delta-rs'

    before = _files(old, "accounts")
    assert _night(moved, D3) == 0
    assert before <= _files(old, "accounts")  # the earlier nights' files: kept, none rewritten
    assert [str(r["dt"]) for r in P.runs(old)] == [D1, D2, D3]
    expected = json.loads((FIXTURE / EXPECTED).read_text())
    for name in ("accounts", "orders", "products"):  # state: the newest date's, whole
        path = f"published/{name}/state"
        expected[path] = _newest_state(expected[path], D3)
    got = tables(moved)
    for name in ("accounts", "orders", "products"):  # the ledger's digests are new (issue 49)
        path = f"published/{name}/ledger"
        rows = [(json.loads(text), n) for text, n in got[path].items()]
        assert all((r.pop("digest") is not None) == (r["dt"] == D3) for r, _ in rows), path
        got[path] = {json.dumps(r, sort_keys=True, default=str): n for r, n in rows}
    for name in ("accounts", "orders", "products"):  # the instants (issue 78)
        path = f"published/{name}/conflicts"
        got[path] = _without_instants(got[path])
    for name in ("accounts", "orders", "products"):  # columns added since (issue 51)
        for kind, column in (("conflicts", "conflict_id"), ("divergence", "cause")):
            path = f"published/{name}/{kind}"
            rows = [(json.loads(text), n) for text, n in got.get(path, {}).items()]
            if kind == "conflicts":  # the new night's conflicts are named, the old not
                assert all((r[column] is not None) == (r["dt"] == D3) for r, _ in rows), path
                # and labelled (docs/rules.md#lost-writes): the old rows read null there
                assert all((r["concurrency"] is not None) == (r["dt"] == D3) for r, _ in rows)
                for r, _ in rows:
                    for added in LOST_COLUMNS:
                        r.pop(added)
            assert all(r.pop(column, None) is None or kind == "conflicts" for r, _ in rows)
            if path in got:
                got[path] = {json.dumps(r, sort_keys=True, default=str): n for r, n in rows}
    stats = [(json.loads(text), n) for text, n in got["published/conflict_stats"].items()]
    lost = [r for r, _ in stats if r["kind"] == "lost_writes"]  # docs/rules.md#lost-writes
    assert lost and all(r["dt"] == D3 for r in lost)
    got["published/conflict_stats"] = {
        json.dumps(r, sort_keys=True, default=str): n
        for r, n in stats
        if r["kind"] != "lost_writes"
    }
    assert got == expected
    snapshot = Lake(old).table("published/accounts/snapshot")
    assert {k: snapshot.metadata().configuration.get(k) for k in FEATURES} == FEATURES

    # D2 again, a date the release before published: from D1's state as that release left it
    assert _night(moved, D2, "--run-id", "backfill-d2", "--backfill") == 0
    assert P.runs(old)[-1]["run_id"] == "backfill-d2" and P.runs(old)[-1]["status"] == "published"
    assert P.snapshot_date(old, "accounts") == D3  # a backfill never moves it back
    by_d2 = {r["run_id"] for r in P.log(old, "accounts", "ledger", D2)}
    assert by_d2 == {"backfill-d2"}
