"""docs/rules.md#manual-decisions in whole runs, through the CLI: a decision that takes the
losing version survives a rerun and the chain of later dates ``--rerun`` runs, and shows in
the what-if; its divergence does not fail the gate; a decision whose conflict disappears,
or whose versions changed, is reported stale and not applied; a withdrawal is recorded
and the resolver decides again; ``cdr decide`` refuses what does not fit."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

import pytest

from tests.helpers import configs
from tests.helpers import published as P
from tests.helpers import scenarios as S
from tests.helpers.cli import cdr

D1, D2 = "2026-11-21", "2026-11-22"
TABLE = {"items": {"key": ["id"], "columns": {"id": "bigint", "v": "string"}}}


def _update(r: str, k: int, day: str, hour: int, v: str, eid: str | None = None) -> dict:
    return {
        "op": "UPDATE",
        "key": {"id": k},
        "ts": f"{day}T{hour:02d}:00:00Z",
        "origin": r,
        "event_id": eid or f"{r}-{day}-{k}",
        "seq": hour,
        "after": {"v": v},
    }


def _night1(b_event: dict | None) -> dict:
    """A updates key 1 at 09:00, B at 10:00: an update_differ that B wins."""
    return {
        "A": {"items": [_update("A", 1, D1, 9, "from A")]},
        "B": {"items": [b_event] if b_event else []},
    }


B1 = _update("B", 1, D1, 10, "from B")


@pytest.fixture
def store(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    base = [{"id": k, "v": "base", "_ts": 1795132800000000, "_origin": "A"} for k in (1, 2)]
    S.layout_store({"prior_state": {"items": base}, "date": D1, "exports": _night1(B1)}, root)
    night2 = {"A": {"items": [_update("A", 2, D2, 9, "two")]}, "B": {"items": []}}
    S.write_exports(root, D2, night2)
    return root


def _cfg(tmp: Path, store: Path) -> Path:
    return configs.write(tmp / "cdr.yaml", configs.config(TABLE, replicas=("A", "B")), store=store)


def _run(cfg: Path, tmp: Path, day: str, *extra: str) -> int:
    rc, _ = cdr(
        "run", "--config", str(cfg), "--date", day, "--work-dir", str(tmp / "work"),
        "--no-data-docs", *extra,
    )  # fmt: skip
    return rc


def _v(store: Path, k: int) -> str:
    return {r["id"]: r["v"] for r in P.snapshot(store, "items")}[k]


def _the_conflict(store: Path, day: str) -> dict:
    (c,) = [c for c in P.log(store, "items", "conflicts", day) if json.loads(c["key"]) == {"id": 1}]
    return c


def test_a_decision_survives_the_rerun_chain_and_goes_stale_when_its_conflict_changes(
    tmp_path: Path, store: Path
):
    cfg = _cfg(tmp_path, store)
    assert _run(cfg, tmp_path, D1) == 0 and _run(cfg, tmp_path, D2) == 0
    assert _v(store, 1) == "from B"  # B's later update won
    c = _the_conflict(store, D1)
    assert (c["conflict_type"], c["resolver"]) == ("update_differ", "latest_timestamp_wins")
    cid = c["conflict_id"]
    assert len(cid) == 32

    # a row that does not fit is refused naming the column; so is an unknown conflict
    rc, out = cdr("decide", "--config", str(cfg), "--conflict-id", cid, "--row", '{"w": 1}',
                   "--why", "x")  # fmt: skip
    assert rc == 1 and "no column 'w'" in out
    rc, out = cdr("decide", "--config", str(cfg), "--conflict-id", "0" * 32, "--take",
                   "local", "--why", "x")  # fmt: skip
    assert rc == 1 and "no conflict" in out

    # take the loser, and run the chain: D1, then D2 (which starts from D1's state)
    rc, out = cdr(
        "decide", "--config", str(cfg), "--conflict-id", cid, "--take", "local",
        "--why", "A is the system of record", "--by", "ops", "--rerun",
        "--work-dir", str(tmp_path / "work"),
    )  # fmt: skip
    assert rc == 0, out
    result = json.loads(out.splitlines()[0])
    assert result["rerun"] == [D1, D2]
    did = result["decision"]["decision_id"]
    (row,) = P.rows(store, "published/decisions")
    assert (row["decision_id"], row["take"], row["by"], row["withdrawn_at"]) == (
        did,
        "local",
        "ops",
        None,
    )
    assert _v(store, 1) == "from A"  # the latest snapshot (D2's) holds the decision
    c = _the_conflict(store, D1)
    assert (c["resolver"], c["outcome"], c["conflict_id"]) == ("manual", "discarded", cid)
    assert did in c["reason"]
    report = P.report(store, D1)
    assert report is not None and report.published
    assert report.tables["items"].decisions == {did: "applied"}
    # both replicas applied their resolver (B's later update won on each): both diverge,
    # by decision alone (their orders made no difference), and the gate passed
    div = P.log(store, "items", "divergence", D1)
    assert sorted((r["replica"], r["cause"]) for r in div) == [("A", "decision"), ("B", "decision")]
    assert {tuple(json.loads(r["evidence"])["causes"]) for r in div} == {("decision",)}
    assert any("divergence_by_decision" in w for w in report.warnings)
    stats = P.rows(store, "published/conflict_stats", D1)
    assert any(s["resolver"] == "manual" and s["count"] == 1 for s in stats)

    # a rerun of D1 applies it again (D1 alone: one date of a backfill, D2 left as it is)
    assert _run(cfg, tmp_path, D1, "--backfill") == 0
    assert _the_conflict(store, D1)["resolver"] == "manual"

    # what-if: D1's inputs under another config (still with the decision)
    rc, out = cdr("whatif", "--config", str(cfg), "--date", D1, "--name", "same",
                   "--work-dir", str(tmp_path / "work"))  # fmt: skip
    assert rc == 0, out
    assert json.loads(out)["tables"]["items"]["differing_rows"]["count"] == 0

    # B's export replaced: its update has other content under the same id: stale
    changed = {**B1, "after": {"v": "from B, again"}}
    S.write_exports(store, D1, {"B": {"items": [changed]}})
    assert _run(cfg, tmp_path, D1, "--accept-late-exports", "--backfill") == 0
    report = P.report(store, D1)
    assert report.tables["items"].decisions == {did: "the versions in conflict changed since it "
                                                "was decided"}  # fmt: skip
    assert any(f"decision {did} is stale" in w for w in report.warnings)
    assert _the_conflict(store, D1)["resolver"] == "latest_timestamp_wins"

    # B's update gone from its export: the conflict does not occur
    S.write_exports(store, D1, {"B": {"items": []}})
    assert _run(cfg, tmp_path, D1, "--accept-late-exports", "--backfill") == 0
    report = P.report(store, D1)
    assert report.tables["items"].decisions == {did: "its conflict did not occur"}
    assert _v(store, 1) == "from A"

    # withdrawn: recorded, never deleted; the next run of D1 stages it no more
    rc, out = cdr("decide", "--config", str(cfg), "--withdraw", did)
    assert rc == 0, out
    (row,) = P.rows(store, "published/decisions")
    assert row["withdrawn_at"] is not None
    S.write_exports(store, D1, {"B": {"items": [B1]}})
    assert _run(cfg, tmp_path, D1, "--accept-late-exports", "--backfill") == 0
    assert P.report(store, D1).tables["items"].decisions == {}
    assert _the_conflict(store, D1)["resolver"] == "latest_timestamp_wins"
    assert str(P.rows(store, "published/decisions")[0]["dt"]) == str(date.fromisoformat(D1))


def test_a_cell_conflicts_id_follows_the_same_formula(spark):
    """The cell engine names its conflicts in Spark by ``rules.decisions.conflict_id`` (the
    local side: its logged row's digest; none: empty)."""
    from pipeline.resolve.cells.conflicts import with_conflict_id
    from pipeline.rules.decisions import conflict_id, digest

    rows = [('{"id":1}', "update_differ", "e1", '{"v":"a"}'), ('{"id":2}', "cell", "e2", None)]
    frame = spark.createDataFrame(
        rows, "key string, conflict_type string, remote_event_id string, local_row string"
    )
    got = [r["conflict_id"] for r in with_conflict_id(frame, date(2026, 11, 21), "t").collect()]
    want = [
        conflict_id(D1, "t", key, ctype, eid, digest(local) if local else "")
        for key, ctype, eid, local in rows
    ]
    assert got == want
