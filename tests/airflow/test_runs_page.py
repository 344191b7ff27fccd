"""The plugin's app (plugins/cdr_plugin.py, through FastAPI's test client) serves the
Conflicts page, its numbers as JSON and the Data Docs from the store, to Airflow users
who may read the runs; the page in a real browser is in
tests/airflow/test_airflow_services.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.store import FileStore
from tests.helpers import REPO, configs
from tests.spark.test_runs_page import _put, _report, runs_store


@pytest.fixture
def store(tmp_path: Path) -> FileStore:
    return runs_store(tmp_path)


@pytest.fixture
def client(airflow, store, tmp_path, monkeypatch):
    from fastapi.testclient import TestClient

    cfg = yaml.safe_load((REPO / "docker" / "cdr.yaml").read_text())  # the stack's config
    configs.write(tmp_path / "cdr.yaml", cfg, store=store.uri)
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
    _put(store, _report("2026-11-22", run="x", t={}))
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
