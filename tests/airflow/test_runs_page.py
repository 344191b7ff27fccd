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

from pipeline.storage.store import FileStore
from tests.helpers import REPO, configs
from tests.spark.test_runs_page import _put, _report, runs_store


@pytest.fixture
def store(tmp_path: Path) -> FileStore:
    return runs_store(tmp_path)


@pytest.fixture
def client(airflow, store, tmp_path, monkeypatch):
    from airflow.api_fastapi.app import init_auth_manager
    from fastapi.testclient import TestClient

    init_auth_manager()  # as the API server does: a bad token is judged by it

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
    docs = client.get("/docs/2026-11-21/2026-11-21_bb/index.html")  # to a grant, then the file
    assert docs.status_code == 200 and docs.text == "<h1>docs"
    assert "/docs/2026-11-21/2026-11-21_bb/grant/" in str(docs.url)
    assert docs.headers["content-type"].startswith("text/html")
    # a file from the bucket, in Airflow's origin: its scripts run sandboxed, nothing
    # leaves, no sniffing
    policy = docs.headers["content-security-policy"]
    assert policy.startswith("sandbox allow-scripts;") and "allow-popups" not in policy
    for directive in ("default-src 'none'", "connect-src 'none'", "form-action 'none'"):
        assert directive in policy
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


def test_the_data_docs_are_served_under_a_grant_of_the_run_and_an_hour(client, monkeypatch):
    """A sandboxed page's own requests carry no cookie: a logged-in reader is sent to a
    grant path of the run, under which its scripts and styles are served; a grant of
    another run, a forged one or an expired one serves nothing, and nothing is served
    without a login or a grant."""
    import time

    import cdr_plugin

    entry = client.get(
        "/docs/2026-11-21/2026-11-21_bb/static/styles/x.css",
        headers=_token("viewer"),
        follow_redirects=False,
    )
    assert entry.status_code == 303
    granted = entry.headers["location"]
    assert granted.startswith("/docs/2026-11-21/2026-11-21_bb/grant/")
    r = client.get(granted)  # no login: the grant is the key
    assert r.status_code == 200 and r.text == "h1{}"
    assert r.headers["access-control-allow-origin"] == "null"  # the page's opaque origin
    assert r.headers["referrer-policy"] == "no-referrer"  # the grant is sent nowhere
    grant = granted.split("/")[5]
    for other in (
        "/docs/2026-11-21/2026-11-21_a/grant/{g}/index.html",  # another run
        "/docs/2026-11-21/2026-11-21_bb/grant/{g}0/index.html",  # forged
        "/docs/2026-11-21/2026-11-21_bb/grant/1.{g}/index.html",  # expired long ago
        "/docs/2026-11-21/2026-11-21_bb/grant/\u00b2.{g}/index.html",  # not a digit to int()
        "/docs/2026-11-21/2026-11-21_bb/grant/" + "9" * 5000 + ".{g}/index.html",
    ):
        r = client.get(other.format(g=grant))
        assert r.status_code == 403 and "docs" not in r.text.replace("Data Docs", ""), other
    later = time.time() + cdr_plugin.GRANT_SECONDS + 1
    monkeypatch.setattr(cdr_plugin.time, "time", lambda: later)
    assert client.get(granted).status_code == 403  # an hour later
    assert client.get("/docs/2026-11-21/2026-11-21_bb/static/styles/x.css").status_code == 401


def test_only_the_files_the_run_wrote_are_served_as_it_wrote_them(client, store):
    """The run's report lists its Data Docs files by sha256: a page written into the
    bucket later, or a listed file changed since, is not served, and no refusal names the
    store."""
    client.headers.update(_token("viewer"))
    key = "published/reports/dt=2026-11-21/run=2026-11-21_bb/validation/data_docs"
    assert client.get("/docs/2026-11-21/2026-11-21_bb/index.html").status_code == 200
    store.write_bytes(f"{key}/index.html", b"<h1>docs, changed")
    for path in ("later.html", "index.html", "missing.html", "static/..%2F..%2Frun_report.json"):
        r = client.get(f"/docs/2026-11-21/2026-11-21_bb/{path}")
        assert r.status_code == 404, path
        assert r.json()["detail"] == "not a file of this run's Data Docs", path
        assert store.uri not in r.text and "store" not in r.text


@pytest.mark.parametrize(
    "path, detail",
    [
        ("/docs/2026-11-22/2026-11-21_bb/index.html", "not a file"),
        ("/docs/yesterday/2026-11-21_bb/index.html", "not a date"),
        ("/docs/20261121/2026-11-21_bb/index.html", "not a date"),  # one spelling of a date
        ("/docs/2026-11-21/..%2F..%2F..%2F..%2Fsecret.json", "run id"),
        ("/docs/2026-11-21/2026-11-21_bb/..%2F..%2F..%2F..%2Fsecret.json", "not a file"),
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
