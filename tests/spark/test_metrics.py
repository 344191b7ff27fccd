"""docs/operations.md#metrics in whole runs: two nights, then a rerun of the second, with
``metrics:`` set to a textfile and to an OTLP receiver on loopback. After each publish the
textfile reads back with Prometheus' parser; the counters are the two nights' sums, and
the rerun does not add to them; the receiver gets the same values."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from pipeline.app.cli import main
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


def _nights() -> tuple[dict, dict]:
    """Night 1: A inserts keys 1-3 and B inserts key 1 too, later (one insert_exists),
    and B's export holds an event with an op no format has (quarantined, malformed: open
    until dismissed). Night 2: A inserts keys 4-5."""
    a1, b1, a2 = "2026-11-21T09:00:00Z", "2026-11-21T10:00:00Z", "2026-11-22T09:00:00Z"
    night1 = {
        "A": {"items": [_insert("A", k, a1, f"a{k}") for k in (1, 2, 3)]},
        "B": {"items": [_insert("B", 1, b1, "b1"), {**_insert("B", 9, b1, "b9"), "op": "UPSERT"}]},
    }
    night2 = {"A": {"items": [_insert("A", k, a2, f"a{k}") for k in (4, 5)]}, "B": {"items": []}}
    return night1, night2


def _parsed(path: Path) -> dict[str, dict[tuple, float]]:
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(path.read_text()):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_metrics_after_each_publish_and_a_rerun_adds_nothing(tmp_path: Path):
    night1, night2 = _nights()
    store = tmp_path / "store"
    store.mkdir()
    S.write_exports(store, "2026-11-21", night1)
    S.write_exports(store, "2026-11-22", night2)
    textfile = tmp_path / "node_exporter" / "cdr.prom"
    with otlp_receiver() as otlp:
        config = configs.config({"items": ITEMS}, replicas=("A", "B"))
        config["metrics"] = {"prometheus_textfile": str(textfile), "otlp_endpoint": otlp.url}
        cfg = configs.write(tmp_path / "cdr.yaml", config, store=store)

        def run(day: str, run_id: str) -> dict[str, dict[tuple, float]]:
            args = ["run", "--config", str(cfg), "--date", day, "--run-id", run_id]
            assert main([*args, "--work-dir", str(tmp_path / "work"), "--no-data-docs"]) == 0
            return _parsed(textfile)

        first = run("2026-11-21", "n1")
        t = (("table", "items"),)
        assert first["cdr_run_events"] == {t: 5}
        assert first["cdr_events_total"] == {t: 5}
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
        assert second["cdr_run_events"] == {t: 2}
        assert second["cdr_events_total"] == {t: 7}
        assert second["cdr_conflicts_total"] == {conflict: 1}
        assert "cdr_run_conflicts" not in second  # the latest run had none
        assert second["cdr_quarantine_open"] == {(("reason", "malformed"), *t): 1}  # still open
        assert second["cdr_last_published_timestamp_seconds"][t] > published_at

        again = run("2026-11-22", "n2-again")
        assert again["cdr_events_total"] == second["cdr_events_total"]  # replaced, not added
        assert again["cdr_conflicts_total"] == second["cdr_conflicts_total"]

        assert len(otlp.bodies) == 3  # one export per publish
        sent = otlp.metrics()
        assert points(sent["cdr_events_total"]) == {t: 7}
        assert sent["cdr_events_total"].sum.is_monotonic
        assert points(sent["cdr_quarantine_open"]) == {(*t, ("reason", "malformed")): 1}
    assert [p.name for p in textfile.parent.iterdir()] == ["cdr.prom"]
