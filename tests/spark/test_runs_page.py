"""The Conflicts page: the numbers of the run reports per run and table (pipeline/app/runs.py)
and the page they render, without Airflow. (The plugin's app that serves it:
tests/airflow/test_runs_page.py; its trends in a browser: tests/e2e/test_runs_page.py.)"""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

import pytest

from pipeline.app.runs import list_reports, render_page, table_runs
from pipeline.core.report import RunReport
from pipeline.publish.commit import run_row
from pipeline.storage.lake import Lake
from pipeline.storage.runs_table import append
from pipeline.storage.store import FileStore

pytestmark = pytest.mark.usefixtures("spark")  # the Delta tables are written by delta-spark


def _report(dt: str, status: str = "published", run: str = "r", **tables) -> dict:
    return {
        "run_id": f"{dt}_{run}",
        "dt": dt,
        "started": f"{dt}T0{len(run)}:00:00+00:00",
        "status": status,
        "failures": [],
        "tables": tables,
    }


def _put(s: FileStore, report: dict) -> None:
    """As publish writes it: the run's own report, its ``runs`` row, and a published
    run's copy for its date."""
    body = json.dumps(report).encode()
    s.write_bytes(
        f"published/reports/dt={report['dt']}/run={report['run_id']}/run_report.json", body
    )
    row = run_row(
        report["run_id"],
        date.fromisoformat(report["dt"]),
        report["status"],
        report["started"],
        None,
        None,
        RunReport.from_dict(report),
        {},
    )
    append(Lake(s), row)
    if report["status"] == "published":
        s.write_bytes(f"published/reports/dt={report['dt']}/run_report.json", body)


ORDERS = {
    "distinct_events": 40,
    "applied": 35,
    "discarded": 2,
    "conflicts": {
        "insert_exists": {"converted_to_update": 5, "applied": 1},
        "update_deleted": {"skipped": 2},
    },
    "quarantined": {"malformed": 2, "fk_violation": 1},
    "divergent_keys": {"us-east": 3, "eu-west": 0},
    "snapshot_divergent_keys": {"eu-west": 4},
    "divergent_causes": {"us-east": {"missing_events": 2, "apply_order": 1}},
    "arrived_late": {"us-east": 2},
    "repaired": 5,
    "orphans": 1,
    "clock_skew": {"eu-west": {"us-east": {"events": 7, "max_seconds": 88.25}}},
}


def runs_store(tmp_path: Path) -> FileStore:
    """A store with the reports and ``runs`` rows of three dates (a failed rerun among
    them), the Data Docs of one run, and a file the page must not serve."""
    import hashlib

    s = FileStore(tmp_path / "store")
    files = {"index.html": b"<h1>docs", "static/styles/x.css": b"h1{}"}
    bb = _report("2026-11-21", "failed", run="bb", orders=ORDERS, **{"<b>x</b>": {}})
    bb["validation"] = {
        "data_docs_files": {k: hashlib.sha256(v).hexdigest() for k, v in files.items()}
    }
    for r in (
        _report("2026-11-20", products={"distinct_events": 3, "applied": 3}),
        _report("2026-11-20", "failed", run="rerun", products={}),  # a later failed rerun
        _report("2026-11-21", "failed", run="a", orders={}),
        bb,
    ):
        _put(s, r)
    docs = "published/reports/dt=2026-11-21/run=2026-11-21_bb/validation/data_docs"
    for k, v in files.items():
        s.write_bytes(f"{docs}/{k}", v)
    s.write_bytes(f"{docs}/later.html", b"<script>steal()</script>")  # not the run's
    s.write_bytes("published/secret.json", b"{}")
    return s


@pytest.fixture
def store(tmp_path: Path) -> FileStore:
    return runs_store(tmp_path)


def test_reports_newest_first_and_the_numbers_per_table(store):
    """A date's report is its published run's, even after a failed rerun; a date that no
    run published shows its latest failed run."""
    reports = list_reports(store)
    assert [(r.dt, r.run_id) for r in reports] == [
        ("2026-11-21", "2026-11-21_bb"),
        ("2026-11-20", "2026-11-20_r"),
    ]
    orders = next(t for t in table_runs(reports[0]) if t.table == "orders")
    assert orders.conflict_total == 8 and orders.quarantined_total == 3
    assert orders.by_outcome() == {"converted_to_update": 5, "applied": 1, "skipped": 2}
    assert orders.divergent_keys == {"us-east": 3, "eu-west": 0, "eu-west (snapshot)": 4}
    # docs/rules.md#divergence-causes: a count a report gives without causes is unclassified
    assert orders.divergent_causes == {
        "us-east": {"missing_events": 2, "apply_order": 1},
        "eu-west (snapshot)": {"unclassified": 4},
    }
    assert (orders.repaired, orders.arrived_late) == (5, {"us-east": 2})
    # the headline count is the perspectives' (TableTotals), the snapshot's listed apart
    assert orders.divergent_total == 3 and orders.orphans == 1
    assert orders.clock_skew == (("eu-west", "us-east", 7, 88.25),)


def test_a_run_is_shown_once_its_runs_row_is_in(store, tmp_path: Path):
    """A report with no ``runs`` row (a run killed before its last commit) is not shown;
    a run that stopped before it wrote a report shows as its row says; a date of the
    earlier layout (a report copy, no runs table) still shows."""
    killed = _report("2026-11-22", products={"distinct_events": 9, "applied": 9})
    store.write_bytes(
        f"published/reports/dt=2026-11-22/run={killed['run_id']}/run_report.json",
        json.dumps(killed).encode(),
    )
    assert [r.dt for r in list_reports(store)] == ["2026-11-21", "2026-11-20"]
    row = run_row("stopped", date(2026, 11, 22), "failed", "", None, None, None, {})
    append(Lake(store), row)
    (stopped, *_) = list_reports(store)
    assert stopped.run_id == "stopped" and stopped.tables == {}
    assert stopped.failures == ("the run stopped before it published",)

    legacy = FileStore(tmp_path / "legacy")
    old = _report("2026-11-19", products={"distinct_events": 1, "applied": 1})
    legacy.write_bytes("published/reports/dt=2026-11-19/run_report.json", json.dumps(old).encode())
    assert [r.run_id for r in list_reports(legacy)] == [old["run_id"]]


def test_the_page_shows_one_run_with_its_chart_and_links(store):
    html = render_page(list_reports(store), None, docs_href="/cdr/docs/{dt}/{run_id}/index.html")
    assert "Run of 2026-11-21" in html and "failed" in html
    assert html.count("<rect") == 3 + 3  # orders: three outcomes; legend: three
    assert "<title>orders: converted_to_update 5</title>" in html
    assert "quarantined: malformed" in html
    for row in (
        "divergent keys: us-east, missing_events</td><td class=n>2",
        "divergent keys: eu-west (snapshot), unclassified</td><td class=n>4",
        "arrived late: us-east</td><td class=n>2",
        "repaired (cdr repair's changes)</td><td class=n>5",
    ):
        assert row in html, row
    assert "/cdr/docs/2026-11-21/2026-11-21_bb/index.html" in html and "?dt=2026-11-20" in html
    assert "<b>x</b>" not in html and "&lt;b&gt;x&lt;/b&gt;" in html  # names are escaped
    skew = "<td>orders</td><td>eu-west</td><td>us-east</td><td class=n>7</td><td class=n>88.2</td>"
    assert skew in html  # clock skew: the pair, its events and the lag
    older = render_page(list_reports(store), "2026-11-20", docs_href="{dt}")
    assert "Run of 2026-11-20" in older and "orders" not in older
    assert "No run report" in render_page([], None, docs_href="{dt}")


HOSTILE = "<script>alert(1)</script>"


def test_hostile_values_in_every_report_field_render_as_text(store, tmp_path: Path):
    """A report is a file in the bucket: every name and text in it is escaped."""
    bad = {
        "distinct_events": 1,
        "conflicts": {HOSTILE: {HOSTILE: 1}},
        "quarantined": {HOSTILE: 1},
        "divergent_keys": {HOSTILE: 1},
        "snapshot_divergent_keys": {HOSTILE: 1},
        "clock_skew": {HOSTILE: {HOSTILE: {"events": 1, "max_seconds": 1.0}}},
    }
    report = _report("2026-11-22", status=HOSTILE, run="x", **{HOSTILE: bad})
    report["failures"] = [HOSTILE]
    _put(store, report)
    html = render_page(list_reports(store), "2026-11-22", docs_href="/d/{dt}/{run_id}/")
    assert "<script>" not in html
    assert html.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 10


def test_no_statistics_no_trends(store):
    from pipeline.storage.stats import trends

    assert trends(Lake(store)) == {}
    assert "Trends" not in render_page(list_reports(store), None, "/d/{dt}/{run_id}", {})
