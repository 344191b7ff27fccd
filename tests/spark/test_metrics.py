"""docs/operations.md#metrics in whole runs: two nights, then a rerun of the second with
fewer conflicts and events (B's export sent again, shorter), with ``metrics:`` set to a
textfile and to an OTLP receiver on loopback. After each publish the textfile reads back
with Prometheus' parser; the counters add each published run's own work (E13): the rerun
adds what it resolved, no counter goes down, and ``cdr vacuum`` lowers none; the gauges
say what the date holds as published; the receiver gets the same values."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from pipeline.app.cli import main
from pipeline.publish.metrics import collect, textfile
from pipeline.storage.lake import Lake
from pipeline.storage.runs_table import read_runs
from pipeline.storage.store import open_store
from tests.helpers import configs
from tests.helpers import scenarios as S
from tests.helpers.otlp import otlp_receiver, points

ITEMS = {"key": ["id"], "columns": {"id": "bigint", "v": "string"}}


def _insert(r: str, k: int, ts: str, v: str) -> dict:
    return {
        "op": "INSERT",
        "key": {"id": k},
        "ts": ts,
        "origin": r,
        "event_id": f"{r}-{k}-{ts}",
        "seq": k,
        "after": {"id": k, "v": v},
    }


def _nights() -> tuple[dict, dict, dict]:
    """Night 1: A inserts keys 1-3 and B inserts key 1 too, later (one insert_exists),
    and B's export holds an event with an op no format has (quarantined, malformed: open
    until dismissed). Night 2: A inserts keys 4-5, and B too, later (two insert_exists);
    sent again, B's export of night 2 holds key 4 only (one)."""
    a1, b1 = "2026-11-21T09:00:00Z", "2026-11-21T10:00:00Z"
    a2, b2 = "2026-11-22T09:00:00Z", "2026-11-22T10:00:00Z"
    night1 = {
        "A": {"items": [_insert("A", k, a1, f"a{k}") for k in (1, 2, 3)]},
        "B": {"items": [_insert("B", 1, b1, "b1"), {**_insert("B", 9, b1, "b9"), "op": "UPSERT"}]},
    }
    night2 = {
        "A": {"items": [_insert("A", k, a2, f"a{k}") for k in (4, 5)]},
        "B": {"items": [_insert("B", k, b2, f"b{k}") for k in (4, 5)]},
    }
    again = {"B": {"items": [_insert("B", 4, b2, "b4")]}}
    return night1, night2, again


def _parsed(path: Path) -> dict[str, dict[tuple, float]]:
    return _parsed_text(path.read_text())


def _parsed_text(text: str) -> dict[str, dict[tuple, float]]:
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def _counters(got: dict[str, dict[tuple, float]]) -> dict[str, dict[tuple, float]]:
    names = ("cdr_conflicts_total", "cdr_events_total", "cdr_lost_writes_total")
    return {n: got.get(n, {}) for n in names}


def _grown(before: dict, after: dict) -> dict[str, dict[tuple, float]]:
    """Each counter sample's growth; a drop fails (Prometheus would read it as a reset)."""
    out: dict[str, dict[tuple, float]] = {}
    for name, samples in _counters(after).items():
        was = _counters(before)[name]
        assert set(was) <= set(samples), name  # no series goes away
        for labels, v in samples.items():
            assert v >= was.get(labels, 0), (name, labels, was.get(labels), v)
            if v != was.get(labels, 0):
                out.setdefault(name, {})[labels] = v - was.get(labels, 0)
    return out


def test_metrics_after_each_publish_and_a_rerun_adds_its_own(tmp_path: Path):
    night1, night2, again_b = _nights()
    store = tmp_path / "store"
    store.mkdir()
    S.write_exports(store, "2026-11-21", night1)
    S.write_exports(store, "2026-11-22", night2)
    textfile_at = tmp_path / "node_exporter" / "cdr.prom"
    with otlp_receiver() as otlp:
        config = configs.config({"items": ITEMS}, replicas=("A", "B"))
        config["metrics"] = {"prometheus_textfile": str(textfile_at), "otlp_endpoint": otlp.url}
        cfg = configs.write(tmp_path / "cdr.yaml", config, store=store)

        def run(day: str, run_id: str) -> dict[str, dict[tuple, float]]:
            args = ["run", "--config", str(cfg), "--date", day, "--run-id", run_id]
            assert main([*args, "--work-dir", str(tmp_path / "work"), "--no-data-docs"]) == 0
            return _parsed(textfile_at)

        first = run("2026-11-21", "n1")
        t = (("table", "items"),)
        assert first["cdr_run_events"] == {t: 5}
        assert first["cdr_events_total"] == {t: 5}
        assert first["cdr_lost_writes_total"] == {t: 1}
        conflict = (
            ("outcome", "converted_to_update"),  # B's later INSERT, applied as an update
            ("resolver", "latest_timestamp_wins"),
            *t,
            ("type", "insert_exists"),
        )
        assert first["cdr_run_conflicts"] == {conflict: 1}
        assert first["cdr_conflicts_total"] == {conflict: 1}
        assert first["cdr_run_quarantined"] == {(("reason", "malformed"), *t): 1}
        assert first["cdr_quarantine_open"] == {(("reason", "malformed"), *t): 1}
        stages = {dict(k)["stage"] for k in first["cdr_run_seconds"]}
        assert stages == {"ingest", "resolve", "validate", "publish"}
        assert all(v > 0 for v in first["cdr_run_seconds"].values())
        published_at = first["cdr_last_published_timestamp_seconds"][t]

        second = run("2026-11-22", "n2")
        assert second["cdr_run_events"] == {t: 4}
        assert second["cdr_run_conflicts"] == {conflict: 2}
        assert _grown(first, second) == {
            "cdr_events_total": {t: 4},
            "cdr_conflicts_total": {conflict: 2},
            "cdr_lost_writes_total": {t: 2},  # each B insert lost A's (concurrent)
        }
        assert second["cdr_quarantine_open"] == {(("reason", "malformed"), *t): 1}  # still open
        assert second["cdr_last_published_timestamp_seconds"][t] > published_at

        S.write_exports(store, "2026-11-22", again_b)  # B sends its export again, shorter
        again = run("2026-11-22", "n2-again")
        assert again["cdr_run_events"] == {t: 3}  # the date as published now
        assert again["cdr_run_conflicts"] == {conflict: 1}
        # the rerun's own work, added: no counter went down
        assert _grown(second, again) == {
            "cdr_events_total": {t: 3},
            "cdr_conflicts_total": {conflict: 1},
            "cdr_lost_writes_total": {t: 1},
        }
        assert again["cdr_conflicts_total"] == {conflict: 1 + 2 + 1}

        assert len(otlp.bodies) == 3  # one export per publish
        sent = otlp.metrics()
        assert points(sent["cdr_events_total"]) == {t: 5 + 4 + 3}
        assert sent["cdr_events_total"].sum.is_monotonic
        assert points(sent["cdr_quarantine_open"]) == {(*t, ("reason", "malformed")): 1}
    assert [p.name for p in textfile_at.parent.iterdir()] == ["cdr.prom"]

    assert main(["vacuum", "--config", str(cfg), "--retain-days", "0"]) == 0
    lake = Lake(open_store(store.as_uri()))
    after = _parsed_text(textfile(collect(lake)))
    assert _counters(after) == _counters(again)  # vacuum lowers no total
    # what the rerun's runs row keeps for them: its own, and n2's it replaced
    (row,) = [r for r in read_runs(lake) if r.run_id == "n2-again"]
    kind = ["items", "insert_exists", "latest_timestamp_wins", "converted_to_update"]
    assert row.counts["conflicts"] == [[*kind, 1]]
    assert row.counts["replaced_conflicts"] == [["n2", *kind, 2]]
