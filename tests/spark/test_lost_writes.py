"""docs/rules.md#lost-writes on generated nights: every conflict-log row's label is the one
the generator's own arrival times give (when each replica applied each event: its writer
had seen the other's write when it applied it before it wrote), and the run report counts
exactly the writes the concurrent conflicts lost. Three replicas, so that a third one's
export never decides; the second night's conflicts meet versions of the first."""

from __future__ import annotations

from datetime import date
from pathlib import Path

from pipeline.app.cli import main
from pipeline.app.generate import Arrivals, GenerateOptions, generate
from pipeline.core.config_load import parse_config
from pipeline.storage.store import FileStore
from tests.helpers import configs
from tests.helpers.reports import date_report, log_rows

NIGHTS = (date(2026, 11, 20), date(2026, 11, 21))
CONFIG = configs.config(
    {"items": configs.table({"id": "bigint", "qty": "int"})},
    replicas=("r1", "r2", "r3"),
    on_divergence="warn",
)


def _expected(row: dict, arrivals: Arrivals) -> str:
    """The label the arrival times give (an earlier night's version, or a base row, was
    applied everywhere before tonight)."""
    el, er = row["local_event_id"], row["remote_event_id"]
    a, b = row["local_origin"], row["remote_origin"]
    if el is None or a == b or el not in arrivals:
        return "sequential"
    b_saw = arrivals[el][b] < arrivals[er][b]
    a_saw = arrivals[er][a] < arrivals[el][a]
    if a_saw and b_saw:
        return "unknown"
    return "sequential" if a_saw or b_saw else "concurrent"


def test_labels_are_the_generators_arrival_order_and_the_lost_writes_are_counted(
    tmp_path: Path, spark
):
    root = tmp_path / "store"
    store = FileStore(root)
    cfg = configs.write(tmp_path / "cdr.yaml", CONFIG, store=root)
    config = parse_config({**CONFIG, "store": root.as_uri()})
    labels: dict[str, int] = {}
    for i, dt in enumerate(NIGHTS):
        arrivals: Arrivals = {}
        opts = GenerateOptions(events=240, conflict_rate=0.5, base_rows=20 * (i == 0), seed=i)
        generate(config, store, dt, opts, arrivals)
        run = ["run", "--config", str(cfg), "--date", dt.isoformat(), "--no-data-docs"]
        assert main([*run, "--work-dir", str(tmp_path / f"w{i}")]) == 0
        report = date_report(root, dt)
        assert report is not None
        rows = log_rows(root, report, "items", "conflicts")
        lost = set()
        for r in rows:
            if r["conflict_type"] in ("update_missing", "delete_missing"):
                assert r["concurrency"] == "n/a"
                continue
            assert r["concurrency"] == _expected(r, arrivals), r
            labels[r["concurrency"]] = labels.get(r["concurrency"], 0) + 1
            if r["concurrency"] == "concurrent" and r["outcome"] != "errored":
                applied = r["outcome"] in ("applied", "converted_to_insert", "converted_to_update")
                loser = r["local_event_id"] if applied else r["remote_event_id"]
                assert r["lost_event_id"] == loser, r
                lost.add(loser)
            else:
                assert r["lost_event_id"] is None, r
        s = report.tables["items"]
        assert s.lost_writes == len(lost)
        assert s.concurrency.get("concurrent", 0) == sum(
            r["concurrency"] == "concurrent" for r in rows
        )
    # both kinds met, and the origin rule's count is more than the writes lost
    assert labels.get("concurrent", 0) > 0 and labels.get("sequential", 0) > 0, labels
