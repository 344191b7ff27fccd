"""The Conflicts page: the numbers of the run reports per run and table (pipeline/runs.py)
and the plugin's app that serves them and the Data Docs from the store
(plugins/cdr_plugin.py, through FastAPI's test client; the page in a real browser is
in test_airflow_services.py)."""

from __future__ import annotations

import json
import sys
from datetime import date
from pathlib import Path

import pytest
import yaml

from pipeline.lake import Lake
from pipeline.published import run_row
from pipeline.runs import list_reports, render_page, table_runs
from pipeline.runs_table import append
from pipeline.store import FileStore
from tests.helpers import REPO
from tests.helpers.browser import render


def _report(dt: str, status: str = "published", run: str = "r", **tables) -> dict:
    return {
        "run_id": f"{dt}_{run}",
        "dt": dt,
        "started": f"{dt}T0{len(run)}:00:00+00:00",
        "status": status,
        "failures": [],
        "tables": tables,
    }


def _put(s: FileStore, report: dict, work: Path) -> None:
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
        report,
        {},
    )
    append(Lake(s), row, work)
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
    "orphans": 1,
    "clock_skew": {"eu-west": {"us-east": {"events": 7, "max_seconds": 88.25}}},
}


@pytest.fixture
def store(tmp_path: Path) -> FileStore:
    s = FileStore(tmp_path / "store")
    work = tmp_path / "work"
    for r in (
        _report("2026-11-20", products={"distinct_events": 3, "applied": 3}),
        _report("2026-11-20", "failed", run="rerun", products={}),  # a later failed rerun
        _report("2026-11-21", "failed", run="a", orders={}),
        _report("2026-11-21", "failed", run="bb", orders=ORDERS, **{"<b>x</b>": {}}),
    ):
        _put(s, r, work)
    docs = "published/reports/dt=2026-11-21/run=2026-11-21_bb/validation/data_docs/index.html"
    s.write_bytes(docs, b"<h1>docs")
    s.write_bytes("published/secret.json", b"{}")
    return s


def test_reports_newest_first_and_the_numbers_per_table(store):
    """A date's report is its published run's, even after a failed rerun; a date that no
    run published shows its latest failed run."""
    reports = list_reports(store)
    assert [(r["dt"], r["run_id"]) for r in reports] == [
        ("2026-11-21", "2026-11-21_bb"),
        ("2026-11-20", "2026-11-20_r"),
    ]
    orders = next(t for t in table_runs(reports[0]) if t.table == "orders")
    assert orders.conflict_total == 8 and orders.quarantined_total == 3
    assert orders.by_outcome() == {"converted_to_update": 5, "applied": 1, "skipped": 2}
    assert orders.divergent_keys == {"us-east": 3, "eu-west": 0, "eu-west (snapshot)": 4}
    assert orders.divergent_total == 7 and orders.orphans == 1
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
    assert [r["dt"] for r in list_reports(store)] == ["2026-11-21", "2026-11-20"]
    row = run_row("stopped", date(2026, 11, 22), "failed", "", None, None, None, {})
    append(Lake(store), row, tmp_path / "work")
    (stopped, *_) = list_reports(store)
    assert stopped["run_id"] == "stopped" and stopped["tables"] == {}
    assert stopped["failures"] == ["the run stopped before it published"]

    legacy = FileStore(tmp_path / "legacy")
    old = _report("2026-11-19", products={"distinct_events": 1, "applied": 1})
    legacy.write_bytes("published/reports/dt=2026-11-19/run_report.json", json.dumps(old).encode())
    assert [r["run_id"] for r in list_reports(legacy)] == [old["run_id"]]


def test_the_page_shows_one_run_with_its_chart_and_links(store):
    html = render_page(list_reports(store), None, docs_href="/cdr/docs/{dt}/{run_id}/index.html")
    assert "Run of 2026-11-21" in html and "failed" in html
    assert html.count("<rect") == 3 + 3  # orders: three outcomes; legend: three
    assert "<title>orders: converted_to_update 5</title>" in html
    assert "quarantined: malformed" in html and "divergent keys: eu-west (snapshot)" in html
    assert "/cdr/docs/2026-11-21/2026-11-21_bb/index.html" in html and "?dt=2026-11-20" in html
    assert "<b>x</b>" not in html and "&lt;b&gt;x&lt;/b&gt;" in html  # names are escaped
    skew = "<td>orders</td><td>eu-west</td><td>us-east</td><td class=n>7</td><td class=n>88.2</td>"
    assert skew in html  # E7: the pair, its events and the lag
    older = render_page(list_reports(store), "2026-11-20", docs_href="{dt}")
    assert "Run of 2026-11-20" in older and "orders" not in older
    assert "No run report" in render_page([], None, docs_href="{dt}")


@pytest.fixture
def client(airflow, store, tmp_path, monkeypatch):
    from fastapi.testclient import TestClient

    cfg = yaml.safe_load((REPO / "docker" / "cdr.yaml").read_text())
    cfg["store"] = store.uri
    (tmp_path / "cdr.yaml").write_text(yaml.safe_dump(cfg))
    monkeypatch.setenv("CDR_CONFIG", str(tmp_path / "cdr.yaml"))
    monkeypatch.setenv("AIRFLOW__API_AUTH__JWT_SECRET", "test-secret")
    monkeypatch.syspath_prepend(str(REPO / "plugins"))
    sys.modules.pop("cdr_plugin", None)
    import cdr_plugin

    return TestClient(cdr_plugin.app)


def _token(role: str | None) -> dict[str, str]:
    """The header of a user of Airflow's auth manager (the simple one here) with ``role``."""
    from airflow.api_fastapi.app import init_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    token = init_auth_manager().generate_jwt(SimpleAuthManagerUser(username="u", role=role))
    return {"Authorization": f"Bearer {token}"}


def test_the_plugin_serves_the_page_the_json_and_the_data_docs(client):
    client.headers.update(_token("viewer"))
    page = client.get("/", params={"dt": "2026-11-20"})
    assert page.status_code == 200 and "Run of 2026-11-20" in page.text
    assert page.headers["x-content-type-options"] == "nosniff"
    runs = client.get("/api/runs").json()
    assert [r["dt"] for r in runs] == ["2026-11-21", "2026-11-20"]
    assert runs[0]["tables"][1]["conflicts"]["update_deleted"] == {"skipped": 2}
    docs = client.get("/docs/2026-11-21/2026-11-21_bb/index.html")
    assert docs.status_code == 200 and docs.text == "<h1>docs"
    assert docs.headers["content-type"].startswith("text/html")
    # a file from the bucket, in Airflow's origin: its scripts run sandboxed, no sniffing
    assert docs.headers["content-security-policy"] == "sandbox allow-scripts allow-popups"
    assert docs.headers["x-content-type-options"] == "nosniff"


@pytest.mark.parametrize(
    "headers, status",
    [({}, 401), ({"Authorization": "Bearer not-a-token"}, 403), ("no-role", 403)],
    ids=["anonymous", "bad-token", "no-permission"],
)
@pytest.mark.parametrize("path", ["/", "/api/runs", "/docs/2026-11-21/2026-11-21_bb/index.html"])
def test_the_plugin_refuses_who_may_not_read_the_runs(client, headers, status, path):
    """Airflow does not authenticate plugin apps: this one asks Airflow's auth manager."""
    r = client.get(path, headers=_token(None) if headers == "no-role" else headers)
    assert r.status_code == status and "docs" not in r.text


def test_the_data_docs_static_files_need_no_login(client, store):
    """A sandboxed page's own requests carry no cookie: its public scripts and styles are
    served to anyone (sandboxed too), readable cross-origin for its fonts."""
    key = "published/reports/dt=2026-11-21/run=2026-11-21_bb/validation/data_docs"
    store.write_bytes(f"{key}/static/styles/x.css", b"h1{}")
    r = client.get("/docs/2026-11-21/2026-11-21_bb/static/styles/x.css")
    assert r.status_code == 200 and r.text == "h1{}"
    assert r.headers["access-control-allow-origin"] == "*"
    assert r.headers["content-security-policy"].startswith("sandbox")
    # a page reached through static/ is still a page: it needs the login
    for sneaky in ("static/..%2Findex.html", "static/x/..%2F..%2Findex.html"):
        r = client.get(f"/docs/2026-11-21/2026-11-21_bb/{sneaky}")
        assert r.status_code == 404 and "docs" not in r.text.replace("Data Docs", ""), sneaky


@pytest.mark.parametrize(
    "path, detail",
    [
        ("/docs/2026-11-22/2026-11-21_bb/index.html", "not found"),
        ("/docs/yesterday/2026-11-21_bb/index.html", "not a date"),
        ("/docs/2026-11-21/..%2F..%2F..%2F..%2Fsecret.json", "run id"),
        ("/docs/2026-11-21/2026-11-21_bb/..%2F..%2F..%2F..%2Fsecret.json", "escapes"),
        ("/docs/2026-11-21/..%2F..%2Fsecret/index.html", "run id"),
    ],
)
def test_the_plugin_serves_nothing_else(client, path, detail):
    r = client.get(path, headers=_token("viewer"))
    assert r.status_code == 404 and detail in r.json()["detail"]


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
    _put(store, report, tmp_path / "work2")
    html = render_page(list_reports(store), "2026-11-22", docs_href="/d/{dt}/{run_id}/")
    assert "<script>" not in html
    assert html.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 10


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[1, 2]",
        json.dumps(_report("2026-11-22", run="x", t={"applied": "<img src=x onerror=alert(1)>"})),
        json.dumps(_report("2026-11-22", run="x", t={"conflicts": {"x": {"applied": -1}}})),
        json.dumps(_report("2026-11-22", run="x", t=["not", "a", "table"])),
        json.dumps(
            _report("2026-11-22", run="x", t={"clock_skew": {"a": {"b": {"max_seconds": "9"}}}})
        ),
    ],
    ids=[
        "not-json",
        "not-an-object",
        "text-count",
        "negative-count",
        "table-not-a-mapping",
        "skew-not-seconds",
    ],
)
def test_a_malformed_report_is_an_error_row_not_a_failed_page(client, store, tmp_path, body):
    """The run's row is in, its report file is damaged: the page shows the run with the
    error, the other runs stay listed, and the JSON says which run cannot be read."""
    _put(store, _report("2026-11-22", run="x", t={}), tmp_path / "work2")
    key = "published/reports/dt=2026-11-22/run=2026-11-22_x/run_report.json"
    store.write_bytes(key, body if isinstance(body, bytes) else body.encode())
    client.headers.update(_token("viewer"))
    page = client.get("/", params={"dt": "2026-11-22"})
    assert page.status_code == 200 and "<img" not in page.text
    assert "cannot be read" in page.text or "is not" in page.text
    assert "?dt=2026-11-21" in page.text  # the other runs are still listed
    runs = {r["dt"]: r for r in client.get("/api/runs").json()}
    assert set(runs) == {"2026-11-22", "2026-11-21", "2026-11-20"}
    assert "tables" in runs["2026-11-21"]


def _stats_of_runs(s: FileStore, work: Path, days: int) -> None:
    """``published/conflict_stats`` as ``days`` runs left it (E6), one commit per date:
    orders with conflicts rising by date, products with none but a quarantine."""
    from datetime import timedelta

    import pyarrow as pa

    from pipeline import stats

    lake = Lake(s)
    first = date(2026, 10, 1)
    for i in range(days):
        dt = first + timedelta(days=i)
        run = f"{dt}_n"
        rows = [
            {"run_id": run, "table": "orders", "kind": "events", "count": 100},
            {
                "run_id": run,
                "table": "orders",
                "kind": "conflicts",
                "conflict_type": "update_differ",
                "resolver": "latest_timestamp_wins",
                "outcome": "applied",
                "count": i,
            },
            {
                "run_id": run,
                "table": "orders",
                "kind": "divergent_keys",
                "replica": "r1",
                "count": i % 3,
            },
            {"run_id": run, "table": "products", "kind": "events", "count": 5},
            {
                "run_id": run,
                "table": "products",
                "kind": "quarantined",
                "reason": "malformed",
                "count": 1,
            },
        ]
        lake.write(
            stats.PATH, pa.Table.from_pylist(rows, stats.SCHEMA), {"run_id": run}, dt=dt, work=work
        )


def test_the_trends_draw_each_tables_last_30_runs_in_chromium(store, tmp_path: Path):
    """E6: 32 runs in ``conflict_stats``; the page draws, per table, the last 30 (oldest
    on the left) with a line and a point per run for each series, each point naming its
    date and count; rendered by headless Chromium, with a screenshot kept beside the page."""
    from pipeline.stats import trends

    _stats_of_runs(store, tmp_path / "work", 32)
    last = trends(Lake(store))
    assert sorted(last) == ["orders", "products"]
    assert [p.dt for p in last["orders"]][:1] == ["2026-10-03"] and len(last["orders"]) == 30
    assert [p.conflicts for p in last["orders"]] == list(range(2, 32))
    assert {p.quarantined for p in last["products"]} == {1}
    page = tmp_path / "conflicts-trends.html"
    page.write_text(render_page(list_reports(store), None, "/d/{dt}/{run_id}", last))
    dom = render(page, tmp_path)
    for table in ("orders", "products"):
        svg = dom[dom.index(f'id="trend-{table}"') :]
        svg = svg[: svg.index("</svg>")]
        for kind in ("conflicts", "quarantined", "divergent_keys"):
            assert svg.count(f'<circle class="{kind}"') == 30, (table, kind)
        assert "2026-10-03" in svg and "2026-10-32" not in svg and "2026-11-01" in svg
    assert "<title>2026-11-01 conflicts: 31</title>" in dom
    assert (tmp_path / "conflicts-trends.png").stat().st_size > 10_000


def test_no_statistics_no_trends(store):
    from pipeline.stats import trends

    assert trends(Lake(store)) == {}
    assert "Trends" not in render_page(list_reports(store), None, "/d/{dt}/{run_id}", {})
