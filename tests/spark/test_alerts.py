"""docs/operations.md#alerts in whole runs: 30 seeded ``conflict_stats`` runs of a table
at one conflict per hundred events, then a real run of the next date whose rate jumps
to one per two. Fewer than ``min_runs`` runs or fewer than ``min_conflicts`` conflicts
tonight: no alert. ``on: fail``: the gate fails naming the alert; the rerun with
``--accept-alert`` publishes with the alert as a warning."""

from __future__ import annotations

import json
from datetime import date, timedelta
from pathlib import Path

import pyarrow as pa

from pipeline.app.cli import main
from pipeline.core import layout
from pipeline.core.report import RunReport
from pipeline.publish.commit import commit_meta
from pipeline.storage import stats
from pipeline.storage.lake import Lake
from pipeline.storage.store import open_store
from tests.helpers import configs
from tests.helpers import scenarios as S

D = date(2026, 11, 21)
KEYS = 30  # contested keys tonight: one update_differ each


def _seed(store: Path, days: int) -> None:
    """``days`` published-looking runs of ``items`` before D, 1,000 events and 10
    conflicts each, in two commits (the first makes the table, partitioned by date)."""
    rows = []
    for i in range(days):
        dt = D - timedelta(days=days - i)
        run = f"seed-{dt}"
        rows += [
            {"run_id": run, "table": "items", "kind": "events", "count": 1000, "dt": dt},
            {
                "run_id": run,
                "table": "items",
                "kind": "conflicts",
                "conflict_type": "update_differ",
                "resolver": "latest_timestamp_wins",
                "outcome": "applied",
                "count": 10,
                "dt": dt,
            },
        ]
    schema = stats.SCHEMA.append(pa.field("dt", pa.date32()))
    data = pa.Table.from_pylist(rows, schema)
    lake = Lake(open_store(store.as_uri()))
    first = data.slice(0, 2)
    lake.write(stats.PATH, first, commit_meta("seed", rows[0]["dt"], "passed"), dt=rows[0]["dt"])
    rest = data.slice(2)
    lake.commit(
        stats.PATH,
        lake.session().createDataFrame(rest).coalesce(1),
        commit_meta("seed", D, "passed"),
        mode="append",
    )


def _scenario() -> dict:
    exports: dict = {"A": {"items": []}, "B": {"items": []}}
    for r, hour in (("A", 9), ("B", 10)):
        for k in range(1, KEYS + 1):
            exports[r]["items"].append(
                {
                    "op": "UPDATE",
                    "key": {"id": k},
                    "ts": f"2026-11-21T{hour:02d}:{k:02d}:00Z",
                    "origin": r,
                    "event_id": f"{r}-{k}",
                    "seq": k,
                    "after": {"v": f"{r}{k}"},
                }
            )
    base = [{"id": k, "v": "base", "_ts": 1795132800000000, "_origin": "A"} for k in range(1, 31)]
    return {
        "config": configs.config(
            {"items": {"key": ["id"], "columns": {"id": "bigint", "v": "string"}}},
            replicas=("A", "B"),
        ),
        "date": D.isoformat(),
        "now": "2026-11-22T00:00:00Z",
        "exports": exports,
        "prior_state": {"items": base},
    }


def _run(tmp: Path, s: dict, alert: dict, run_id: str, *extra: str) -> tuple[int, RunReport]:
    store = tmp / "store"
    cfg = configs.write(
        tmp / f"{run_id}.yaml", {**s["config"], "alerts": {"conflict_rate": alert}}, store=store
    )
    rc = main(
        [
            "run",
            "--config",
            str(cfg),
            "--date",
            s["date"],
            "--now",
            s["now"],
            "--work-dir",
            str(tmp / "work"),
            "--run-id",
            run_id,
            "--no-data-docs",
            *extra,
        ]
    )
    report = RunReport.from_json((store / layout.run_report(D, run_id)).read_text())
    return rc, report


def test_a_jump_in_the_conflict_rate_fires_past_its_floors(tmp_path: Path):
    s = _scenario()
    store = tmp_path / "store"
    store.mkdir()
    S.layout_store(s, store)
    _seed(store, 30)

    # 30 runs, but the alert wants 31: no trend yet
    rc, r = _run(tmp_path, s, {"min_runs": 31, "on": "fail"}, "young")
    assert rc == 0 and r.published and r.alerts == {}
    assert r.tables["items"].totals().conflicts == KEYS and r.tables["items"].distinct_events == 60
    assert r.validation.suites["alerts.items"] is True

    # 30 conflicts, but the alert wants 31: too few to mean anything
    rc, r = _run(tmp_path, s, {"min_conflicts": 31, "on": "fail"}, "quiet")
    assert rc == 0 and r.published and r.alerts == {}

    # both floors met: 0.5 conflicts per event is over 3x the median 0.01
    rc, r = _run(tmp_path, s, {"on": "fail"}, "jump")
    assert rc == 1 and not r.published
    fired = r.alerts["items"]
    assert (fired["alert"], fired["severity"]) == ("conflict_rate", "fail")
    assert (fired["rate"], fired["median_rate"], fired["runs"], fired["conflicts"]) == (
        0.5,
        0.01,
        30,
        KEYS,
    )
    (failure,) = [f for f in r.failures if "alerts.items/conflict_rate" in f]
    assert "table items" in failure and "median" in failure
    assert r.validation.suites["alerts.items"] is False

    # looked into: the rerun accepts it, publishes, and still says so
    rc, r = _run(tmp_path, s, {"on": "fail"}, "accepted", "--accept-alert")
    assert rc == 0 and r.published and r.failures == ()
    assert r.alerts["items"]["severity"] == "warn"
    (warning,) = [w for w in r.warnings if "alerts.items/conflict_rate" in w]
    assert "accepted with --accept-alert" in warning
    runs = json.loads((store / layout.date_report(D)).read_text())
    assert runs["run_id"] == "accepted"
