"""docs/outputs.md#a-night-costs-the-night (``pipeline.ingest.inplace``): a night after the newest
published date reads the prior rows its events touch and MERGEs ``state`` and
``snapshot`` in place; it publishes what the whole-table path publishes, rewrites no
file that holds no touched key, and each of its checks has a test that makes it fail."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pipeline.app.cli import main
from pipeline.core import layout
from pipeline.ingest import inplace
from pipeline.storage.lake import Lake
from tests.helpers import configs
from tests.helpers import published as P
from tests.helpers import scenarios as S

D1, D2, D3 = "2026-11-20", "2026-11-21", "2026-11-22"
NOW = {D1: "2026-11-21T00:00:00Z", D2: "2026-11-22T00:00:00Z", D3: "2026-11-23T00:00:00Z"}
A = configs.table(
    {"id": "int", "v": "string", "u": "string"},
    unique=[["u"]],
    resolvers={"insert_exists": "apply", "multiple_unique_conflicts": "apply"},
    history=True,
)
CONFIG = configs.config(
    {"a": A, "b": configs.table()}, replicas=("r1", "r2"), on_divergence="warn",
    gc_grace_seconds=129600,
)  # fmt: skip


def _event(
    op: str, table_key: int, ts: str, n: int, after: dict[str, Any] | None = None, col: str = "id"
):
    e = {"op": op, "key": {col: table_key}, "ts": ts, "origin": "r1", "event_id": f"e{n}"}
    if after and "new_key" in after:  # a key change
        e["new_key"] = after.pop("new_key")
    return {**e, "after": after, "seq": n} if after is not None else {**e, "seq": n}


#: the nights (a tombstone is kept 36 hours: night 1's is purged by night 3): table a's
#: events (a delete, an insert whose unique value an untouched row holds, a key change),
#: table b's on the first night only
NIGHTS = {
    D1: {
        "a": [
            _event("UPDATE", 1, "2026-11-20T01:00:00Z", 1, {"v": "x"}),
            _event("DELETE", 2, "2026-11-20T02:00:00Z", 2),
            _event("INSERT", 100, "2026-11-20T03:00:00Z", 3, {"id": 100, "v": "n", "u": "u100"}),
        ],
        "b": [_event("UPDATE", 1, "2026-11-20T01:00:00Z", 4, {"v": "b1"})],
    },
    D2: {
        "a": [
            _event("INSERT", 101, "2026-11-21T01:00:00Z", 5, {"id": 101, "v": "m", "u": "u5"}),
            _event("UPDATE", 3, "2026-11-21T02:00:00Z", 6, {"new_key": {"id": 103}, "id": 103}),
            _event("UPDATE", 1, "2026-11-21T03:00:00Z", 7, {"v": "y"}),
        ],
    },
    D3: {"a": [_event("UPDATE", 100, "2026-11-22T01:00:00Z", 8, {"v": "o"})]},
}


def _store(root: Path) -> Path:
    root.mkdir()
    base = {
        "a": [{"id": i, "v": f"v{i}", "u": f"u{i}", "_ts": 1, "_origin": "r2"} for i in range(40)],
        "b": [{"id": i, "v": f"w{i}", "_ts": 1, "_origin": "r2"} for i in range(10)],
    }
    for t, rows in base.items():
        S.write_jsonl(root / f"base/table={t}", rows, {"table": t})
    for d, tables in NIGHTS.items():
        S.write_exports(root, d, {r: tables for r in ("r1", "r2")})
    return configs.write(root.parent / f"{root.name}.yaml", CONFIG, store=root)


def _run(cfg: Path, d: str, work: Path, *more: str) -> int:
    args = ["run", "--config", str(cfg), "--date", d, "--now", NOW[d], "--no-data-docs"]
    return main([*args, "--allow-missing-exports", "--work-dir", str(work), *more])


def _tables(store: Any) -> dict[str, Any]:
    """State, snapshot and a's history (history), each row as JSON (run ids left out)."""
    out = {}
    for t, kinds in (("a", (*KINDS, layout.HISTORY)), ("b", KINDS)):
        for kind in kinds:
            rows = [
                {k: v for k, v in r.items() if k != "_run_id"}
                for r in P.rows(store, layout.table_path(t, kind))
            ]
            out[f"{t}/{kind}"] = sorted(json.dumps(r, sort_keys=True, default=str) for r in rows)
    return out


KINDS = (layout.STATE, layout.SNAPSHOT)


def _counts(store: Any) -> list[dict[str, Any]]:
    return [
        {
            t: (c["rows"], c["state_rows"], c.get("history", {}).get("rows"))
            for t, c in r["counts"]["tables"].items()
        }
        for r in P.runs(store)
    ]


@pytest.fixture(scope="module")
def nights(tmp_path_factory, spark) -> dict[str, Any]:
    """The three nights run twice: merged in place, and on the whole-table path."""
    tmp = tmp_path_factory.mktemp("inplace")
    cfg = _store(tmp / "merged")
    for d in NIGHTS:
        assert _run(cfg, d, tmp / "w-merged") == 0
    whole_cfg = _store(tmp / "whole")
    mp = pytest.MonkeyPatch()
    mp.setattr(inplace, "plan", lambda *a: inplace.Plan(None, "the whole-table path, for the test"))
    try:
        for d in NIGHTS:
            assert _run(whole_cfg, d, tmp / "w-whole") == 0
    finally:
        mp.undo()
    from pipeline.storage.store import open_store

    return {
        "merged": open_store((tmp / "merged").as_uri()),
        "whole": open_store((tmp / "whole").as_uri()),
        "cfg": cfg,
        "tmp": tmp,
    }


def test_a_night_merged_in_place_publishes_what_the_whole_table_path_publishes(nights):
    merged, whole = nights["merged"], nights["whole"]
    assert _tables(merged) == _tables(whole)
    assert _counts(merged) == _counts(whole)
    got = {r["id"]: r for r in P.snapshot(merged, "a")}
    assert got[1]["v"] == "y" and 2 not in got and 103 in got and 3 not in got
    assert got[101]["u"] == "u5" and 5 not in got  # apply removed the row that held u5
    assert not any(r["id"] == 2 for r in P.rows(merged, layout.table_path("a", layout.STATE)))
    # the runs rows' counts are what a reader finds at the versions they name
    for run in P.runs(merged):
        for t, c in run["counts"]["tables"].items():
            assert len(P.as_of(merged, layout.table_path(t, layout.STATE), run)) == c["state_rows"]
            assert len(P.as_of(merged, layout.table_path(t, layout.SNAPSHOT), run)) == c["rows"]


def test_the_nights_after_the_first_merge_and_rewrite_no_file(nights):
    """The second and third nights' commits of ``state``, ``snapshot`` and ``history``
    are MERGEs that
    keep every file of the version before (deletion vectors mark what they replace); the
    nights with no event of ``b`` commit nothing to ``b``, and their rows name the version
    of the first night (which each next night pins: another run's commit)."""
    store = nights["merged"]
    lake = Lake(store)
    r1, r2, r3 = P.runs(store)
    merged = 0
    for t, kinds in (("a", (*KINDS, layout.HISTORY)), ("b", KINDS)):
        for kind in kinds:
            path = layout.table_path(t, kind)
            for before, after in ((r1, r2), (r2, r3)):
                v0, v1 = before["versions"][path], after["versions"][path]
                if v0 == v1:  # no event of b after the first night
                    assert t == "b", path
                    continue
                merged += 1
                ops = {lake.commit_info(path, v).get("operation") for v in range(v0 + 1, v1 + 1)}
                assert ops <= {"MERGE"}, (path, ops)
                files0 = {a["path"] for a in _adds(lake, path, v0)}
                files1 = {a["path"] for a in _adds(lake, path, v1)}
                assert files0 <= files1, (path, files0 - files1)
    assert merged == 6  # a's state, snapshot and history, on the second and third nights
    b = layout.table_path("b", layout.STATE)
    assert r3["versions"][b] == r1["versions"][b] == 0


def _adds(lake: Lake, path: str, version: int) -> list[dict[str, Any]]:
    from pipeline.storage.lake_read import add_actions

    return add_actions(lake.table(path, version))


#: a fourth night, after the fixture's three
D4 = "2026-11-23"
NOW[D4] = "2026-11-24T00:00:00Z"


def _copy(nights: dict[str, Any], tmp_path: Path) -> tuple[Path, Any]:
    """A copy of the store the fixture merged its nights into: its folder and store."""
    import shutil

    from pipeline.storage.store import open_store

    copy = tmp_path / "copy"
    shutil.copytree(Path(nights["merged"].uri.removeprefix("file://")), copy)
    return copy, open_store(copy.as_uri())


def _fourth_night(copy: Path, tmp_path: Path, key: int) -> Path:
    """The exports of a fourth night that updates table a's ``key``; the config."""
    tables = {"a": [_event("UPDATE", key, "2026-11-23T01:00:00Z", 9, {"v": "z"})]}
    S.write_exports(copy, D4, {r: tables for r in ("r1", "r2")})
    return configs.write(tmp_path / "cdr.yaml", CONFIG, store=copy)


def test_a_table_another_writer_moved_takes_the_whole_table_path(nights, tmp_path, capfd):
    """The state's latest version is not the one the newest run's row names (here a
    RESTORE by someone else): the night replaces the whole table from the pinned version,
    and the warning names the table and both versions."""
    copy, moved = _copy(nights, tmp_path)
    lake = Lake(moved)
    path = layout.table_path("a", layout.STATE)
    named = P.runs(moved)[-1]["versions"][path]
    lake.restore(path, named - 1, {"run_id": "someone"})
    cfg = _fourth_night(copy, tmp_path, 7)
    assert _run(cfg, D4, tmp_path / "w") == 0
    said = f"{path} is at version {named + 1}, not version {named} that run"
    assert said in capfd.readouterr().err
    last = P.runs(moved)[-1]
    assert lake.commit_info(path, last["versions"][path]).get("operation") != "MERGE"
    got = {r["id"]: r["v"] for r in P.snapshot(moved, "a")}
    assert got[7] == "z" and got[1] == "y"  # from the pinned version, not the restored one


def test_a_count_that_differs_after_a_merge_restores_the_version_and_publishes_no_run(
    nights, tmp_path, monkeypatch
):
    """The committed version's count (Delta's, deletion vectors applied) must be the
    carried count: else the version before is restored, and the run's row (failed) names
    no version of it."""
    copy, bad = _copy(nights, tmp_path)
    cfg = _fourth_night(copy, tmp_path, 8)
    path = layout.table_path("a", layout.STATE)
    before = Lake(bad).version(path)
    real = Lake.rows
    monkeypatch.setattr(Lake, "rows", lambda self, p, v: real(self, p, v) + (1 if p == path else 0))
    assert _run(cfg, D4, tmp_path / "w") != 0
    lake = Lake(bad)
    assert lake.version(path) == before + 2  # the merge, and the restore of the one before
    assert lake.commit_meta(path, before + 2).get("operation") == f"restored version {before}"
    assert [r["status"] for r in P.runs(bad)] == ["published"] * 3 + ["failed"]
    assert path not in P.runs(bad)[-1]["versions"]
    got = {r["id"]: r["v"] for r in P.snapshot(bad, "a")}
    assert got[8] == "v8"


def test_a_table_moved_between_ingest_and_publish_stops_the_publish(
    nights, tmp_path, monkeypatch, capfd
):
    """Another writer commits to ``state`` after ingest planned the merge from its
    version: the publish stops, naming the table and both versions, and merges nothing."""
    copy, moved = _copy(nights, tmp_path)
    path = layout.table_path("a", layout.STATE)
    named = P.runs(moved)[-1]["versions"][path]
    real = inplace.plan

    def then_moved(*args):
        planned = real(*args)
        if args[5] == "a":
            Lake(moved).restore(path, named - 1, {"run_id": "someone"})
        return planned

    monkeypatch.setattr(inplace, "plan", then_moved)
    cfg = _fourth_night(copy, tmp_path, 9)
    assert _run(cfg, D4, tmp_path / "w") != 0
    said = f"commit {path}: at version {named + 1}, but this run started from version {named}"
    assert said in capfd.readouterr().err
    assert Lake(moved).version(path) == named + 1  # nothing merged
    assert P.runs(moved)[-1]["status"] == "failed"


def test_verify_full_passes_for_every_published_date(nights, capsys):
    """``cdr verify`` recomputes the whole-table checks at each date's versions
    (time travel): the nights merged in place pass them all."""
    for d in NIGHTS:
        args = ["verify", "--config", str(nights["cfg"]), "--date", d, "--full"]
        assert main(args) == 0, capsys.readouterr().out
        out = capsys.readouterr().out
        assert "0 failed" in out and "snapshot_is_live_state" in out


def test_a_rerun_of_the_newest_date_without_one_export_undoes_what_only_it_changed(
    nights, tmp_path
):
    """The newest date run again with an export that changed key 20, then again without
    that export: key 20 is back to the row of the date before, the rest as the first run
    of the date left it, and each table moved by one commit per rerun (a rerun takes the
    whole-table path from the date before: exact by construction)."""
    import shutil

    copy, store = _copy(nights, tmp_path)
    before = _tables(store)
    extra = _event("UPDATE", 20, "2026-11-22T02:00:00Z", 20, {"v": "only-r1"})
    S.write_exports(copy, D3, {"r1": {"a": [*NIGHTS[D3]["a"], extra]}, "r2": NIGHTS[D3]})
    cfg = configs.write(tmp_path / "cdr.yaml", CONFIG, store=copy)
    assert _run(cfg, D3, tmp_path / "w1") == 0
    assert {r["id"]: r["v"] for r in P.snapshot(store, "a")}[20] == "only-r1"
    shutil.rmtree(copy / f"exports/replica=r1/table=a/dt={D3}")
    lake = Lake(store)
    paths = [layout.table_path("a", k) for k in (layout.STATE, layout.SNAPSHOT)]
    versions = {p: lake.version(p) for p in paths}
    assert _run(cfg, D3, tmp_path / "w2") == 0
    assert {r["id"]: r["v"] for r in P.snapshot(store, "a")}[20] == "v20"
    assert {p: lake.version(p) for p in paths} == {p: v + 1 for p, v in versions.items()}
    assert _tables(store) == before  # r2's export holds every other event of the date


def test_rows_a_merge_wrote_other_than_the_runs_restore_the_version(nights, tmp_path, monkeypatch):
    """The rows the merge added must be the fold's, by count and checksum: a merge whose
    source was changed on the way (one value, the counts unchanged) is undone."""
    from pyspark.sql import functions as F

    from pipeline.publish import commit as published

    copy, store = _copy(nights, tmp_path)
    cfg = _fourth_night(copy, tmp_path, 8)
    real = published.merge_source

    def changed(rows, touched, key):
        source = real(rows, touched, key)
        if "v" not in source.columns:
            return source
        return source.withColumn("v", F.when(F.col("id") == 8, "changed").otherwise(F.col("v")))

    monkeypatch.setattr(published, "merge_source", changed)
    path = layout.table_path("a", layout.STATE)
    before = Lake(store).version(path)
    assert _run(cfg, D4, tmp_path / "w") != 0
    lake = Lake(store)
    assert lake.commit_meta(path, before + 2).get("operation") == f"restored version {before}"
    assert {r["id"]: r["v"] for r in P.rows(store, path)}[8] == "v8"
    assert P.runs(store)[-1]["status"] == "failed"


FK_CONFIG = configs.config(
    {"products": configs.products(), "orders": configs.orders()},
    replicas=("r1", "r2"), on_divergence="warn", on_fk_violation="quarantine",
)  # fmt: skip


def _order(k: int, product: int) -> dict[str, Any]:
    after = {"order_id": k, "product_no": product, "qty": 1}
    return _event("INSERT", k, f"2026-11-22T0{k - 29}:00:00Z", k, after, "order_id")


#: a product deleted on the second night orphans two orders no event touches (11, 16);
#: an order inserted for it on the third is an orphan the fold wrote
FK_NIGHTS = {
    D1: {"orders": [_event("UPDATE", 10, "2026-11-20T01:00:00Z", 1, {"qty": 7}, "order_id")]},
    D2: {"products": [_event("DELETE", 2, "2026-11-21T01:00:00Z", 2, None, "product_no")]},
    D3: {"orders": [_order(30, 2), _order(31, 3)]},
}  # fmt: skip


def _fk_store(root: Path) -> Path:
    root.mkdir()
    base = {
        "products": [{"product_no": i, "name": f"p{i}", "_ts": 1} for i in range(1, 6)],
        "orders": [
            {"order_id": i, "product_no": i % 5 + 1, "qty": 1, "_ts": 1} for i in range(10, 20)
        ],
    }  # fmt: skip
    for t, rows in base.items():
        S.write_jsonl(root / f"base/table={t}", rows, {"table": t})
    for d, tables in FK_NIGHTS.items():
        S.write_exports(root, d, {r: tables for r in ("r1", "r2")})
    return configs.write(root.parent / f"{root.name}.yaml", FK_CONFIG, store=root)


def test_tables_in_a_foreign_key_merged_in_place_publish_what_the_whole_table_path_does(
    tmp_path, monkeypatch
):
    """Orders whose product a night deletes are quarantined and leave state and snapshot
    though no event touched them; the nights merged in place publish the rows of the
    whole-table path."""
    from pipeline.storage.store import open_store

    got = {}
    for name in ("merged", "whole"):
        cfg = _fk_store(tmp_path / name)
        with monkeypatch.context() as mp:
            if name == "whole":
                mp.setattr(inplace, "plan", lambda *a: inplace.Plan(None, "for the test"))
            for d in FK_NIGHTS:
                assert _run(cfg, d, tmp_path / f"w-{name}") == 0
        store = open_store((tmp_path / name).as_uri())
        got[name] = {
            t: sorted(json.dumps(r, sort_keys=True, default=str) for r in P.rows(store, p))
            for t in ("products", "orders")
            for p in (layout.table_path(t, layout.STATE), layout.table_path(t, layout.SNAPSHOT))
        }
        got[name]["counts"] = _counts(store)
        if name == "merged":
            orders = {r["order_id"] for r in P.snapshot(store, "orders")}
            assert orders == {10, 12, 13, 14, 15, 17, 18, 19, 31}, orders
            quarantined = P.log(store, "orders", "quarantine", D2) + P.log(
                store, "orders", "quarantine", D3
            )
            assert sorted(q["reason"] for q in quarantined) == ["fk_violation"] * 3
            path = layout.table_path("orders", layout.STATE)
            ops = {Lake(store).commit_info(path, v).get("operation") for v in (1, 2)}
            assert ops == {"MERGE"}, ops
    assert got["merged"] == got["whole"]


CELL_CONFIG = configs.config(
    {"c": configs.table({"id": "int", "v": "string", "w": "string"}, policy="scylla")},
    replicas=("r1", "r2"), on_divergence="warn", gc_grace_seconds=129600,
)  # fmt: skip


def _cell(op: str, k: int | None, ts: str, n: int, after=None, ttl: int | None = None):
    e = {"op": op, "ts": f"2026-11-{ts}:00:00Z", "origin": "r1", "event_id": f"c{n}", "seq": n}
    e |= {"key": {"id": k}} if k is not None else {}
    return e | ({"after": after} if after is not None else {}) | ({"ttl": ttl} if ttl else {})


#: a cell table's nights (the GC horizon 36 hours before each night's clock). Night 1: a
#: TRUNCATE (the table tombstone, purged on night 3), rows 1 to 6, a cell of 7 expiring
#: between nights 1 and 2 and purged on night 2, a cell of 8 expiring then and purged on
#: night 3, a row tombstone (2), a dead cell (3) and a row of 10 whose marker alone
#: expires then. Nights 2 and 3 touch other keys: what changes in 2, 3, 7, 8 and 10 is
#: found by the narrowing, not by an event
CELL_NIGHTS = {
    D1: {"c": [
        _cell("TRUNCATE", None, "20T00", 1),
        *[_cell("INSERT", i, "20T01", 1 + i, {"v": f"v{i}", "w": f"w{i}"}) for i in range(1, 7)],
        _cell("UPDATE", 7, "20T02", 8, {"v": "t7"}, ttl=100000),
        _cell("UPDATE", 8, "20T20", 9, {"w": "t8"}, ttl=86400),
        _cell("DELETE", 2, "20T03", 10),
        _cell("UPDATE", 3, "20T04", 11, {"w": None}),
        _cell("INSERT", 10, "20T21", 16, None, ttl=86400),  # its row marker alone expires
    ]},
    D2: {"c": [
        _cell("UPDATE", 1, "21T01", 12, {"v": "y"}),
        _cell("INSERT", 9, "21T02", 13, {"v": "v9", "w": "w9"}),
        _cell("UPDATE", 4, "21T02", 14, {"v": "t4"}, ttl=3600),
    ]},
    D3: {"c": [_cell("UPDATE", 9, "22T01", 15, {"w": "o"})]},
}  # fmt: skip


def test_a_cell_table_merged_in_place_publishes_what_the_whole_table_path_does(
    tmp_path, monkeypatch
):
    """A cell table's nights after the first MERGE in place: the rows whose TTL expires
    or whose tombstones are purged since the night before are read with the events'
    keys (the table tombstone too, kept and then purged), and each night publishes what
    the whole-table path publishes."""
    from pipeline.storage.store import open_store

    got = {}
    for name in ("merged", "whole"):
        root = tmp_path / name
        root.mkdir()
        for d, tables in CELL_NIGHTS.items():
            S.write_exports(root, d, {r: tables for r in ("r1", "r2")})
        cfg = configs.write(tmp_path / f"{name}.yaml", CELL_CONFIG, store=root)
        snapshots = []
        with monkeypatch.context() as mp:
            if name == "whole":
                mp.setattr(inplace, "plan", lambda *a: inplace.Plan(None, "for the test"))
            for d in CELL_NIGHTS:
                assert _run(cfg, d, tmp_path / f"w-{name}") == 0
                store = open_store(root.as_uri())
                snapshots.append({r["id"]: (r["v"], r["w"]) for r in P.snapshot(store, "c")})
        got[name] = {
            kind: sorted(json.dumps(r, sort_keys=True, default=str) for r in P.rows(store, p))
            for kind in KINDS
            for p in [layout.table_path("c", kind)]
        }
        got[name]["counts"] = _counts(store)
        got[name]["snapshots"] = snapshots
        if name == "merged":
            path = layout.table_path("c", layout.STATE)
            lake = Lake(store)
            runs = P.runs(store)
            ops = [lake.commit_info(path, r["versions"][path]).get("operation") for r in runs]
            assert ops[1:] == ["MERGE", "MERGE"], ops
    assert got["merged"] == got["whole"]
    n1, n2, n3 = got["merged"]["snapshots"]
    assert n1[7] == ("t7", None) and n1[8] == (None, "t8") and n1[3] == ("v3", None)
    assert n1[10] == (None, None) and 10 not in n2
    assert 7 not in n2 and 8 not in n2 and n2[1] == ("y", "w1") and n2[4] == (None, "w4")
    assert set(n3) == {1, 3, 4, 5, 6, 9} and n3[9] == ("v9", "o")
    states = [json.loads(r) for r in got["merged"][layout.STATE]]
    assert {r["id"] for r in states} == {1, 3, 4, 5, 6, 9}  # 2, 7, 8, 10, the TRUNCATE purged


def test_a_table_optimized_between_nights_is_still_merged_in_place(nights, tmp_path, spark):
    """Delta's ``OPTIMIZE`` of ``state`` and ``snapshot`` after the newest night moves
    their versions by commits that change no data: the next night merges into the
    optimized versions, and publishes the rows it would have."""
    from delta.tables import DeltaTable

    copy, store = _copy(nights, tmp_path)
    lake = Lake(store)
    paths = [layout.table_path("a", k) for k in KINDS]
    for path in paths:
        before = lake.version(path)
        DeltaTable.forPath(spark, lake.spark_uri(path)).optimize().executeCompaction()
        assert lake.version(path) == before + 1 and not lake.changes_data(path, before + 1)
    optimized = {p: lake.version(p) for p in paths}
    cfg = _fourth_night(copy, tmp_path, 7)
    assert _run(cfg, D4, tmp_path / "w") == 0
    last = P.runs(store)[-1]
    for path in paths:
        assert last["versions"][path] == optimized[path] + 1
        assert lake.commit_info(path, optimized[path] + 1).get("operation") == "MERGE"
    got = {r["id"]: r["v"] for r in P.snapshot(store, "a")}
    assert got[7] == "z" and got[1] == "y"
    assert len(P.rows(store, paths[0])) == last["counts"]["tables"]["a"]["state_rows"]
