"""docs/rules.md#manual-decisions through Airflow: the ``replica_cdr_decide`` DAG records a
decision of a published conflict (``dag.test()``); the Conflicts page lists it, offers
the form to a user who may trigger that DAG and not to a viewer; the form's POST triggers
a run with the user as its triggering user, and refuses an anonymous, a read-only, a
cross-site or a forged request, and a malformed one."""

from __future__ import annotations

import re
import sys
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import unquote

import pytest

from tests.airflow.test_runs_page import _token
from tests.helpers import REPO
from tests.helpers import published as P
from tests.helpers.dagrun import dagbag
from tests.spark.test_decisions import D1, _cfg, _run, _the_conflict
from tests.spark.test_decisions import store as decisions_store  # noqa: F401 (a fixture)


@pytest.fixture
def published(tmp_path: Path, decisions_store, monkeypatch) -> tuple[Path, str]:  # noqa: F811
    """D1 published with its update_differ; the config's path in ``CDR_CONFIG``."""
    cfg = _cfg(tmp_path, decisions_store)
    assert _run(cfg, tmp_path, D1) == 0
    monkeypatch.setenv("CDR_CONFIG", str(cfg))
    return decisions_store, _the_conflict(decisions_store, D1)["conflict_id"]


@pytest.fixture
def client(airflow, published, monkeypatch):
    from airflow.api_fastapi.app import init_auth_manager
    from fastapi.testclient import TestClient

    init_auth_manager()  # as the API server does: a bad token is judged by it

    monkeypatch.setenv("AIRFLOW__API_AUTH__JWT_SECRET", "test-secret")
    monkeypatch.syspath_prepend(str(REPO / "plugins"))
    sys.modules.pop("cdr_plugin", None)
    import cdr_plugin

    return TestClient(cdr_plugin.app, base_url="http://airflow.test")


def test_the_dag_records_a_decision_and_the_page_lists_it(airflow, published, client):
    store, cid = published
    dag = dagbag().get_dag("replica_cdr_decide")
    conf = {"conflict_id": cid, "take": "local", "row": "", "why": "A is the record"}
    run = dag.test(logical_date=datetime(2026, 11, 25, tzinfo=UTC), run_conf=conf)
    assert {ti.task_id: ti.state for ti in run.get_task_instances()} == {"decide": "success"}
    (row,) = P.rows(store, "published/decisions")
    assert (row["conflict_id"], row["take"], row["why"]) == (cid, "local", "A is the record")

    viewer = client.get("/", headers=_token("viewer"))
    assert viewer.status_code == 200
    assert row["decision_id"] in viewer.text and f"pending: run {D1} again" in viewer.text
    assert "<form id='decide'" not in viewer.text  # a viewer may not trigger the DAG
    admin = client.get("/", headers=_token("admin"))
    assert "<form id='decide'" in admin.text


def _form(client) -> tuple[dict[str, str], str]:
    page = client.get("/", headers=_token("admin")).text
    token = re.search(r"name='token' value='([^']+)'", page).group(1)
    return _token("admin"), token


def test_the_form_triggers_the_dag_as_the_user(airflow, published, client):
    from airflow.models import DagRun
    from airflow.utils.session import create_session

    _, cid = published
    dag = dagbag().get_dag("replica_cdr_decide")  # the DAG in Airflow's database
    dag.test(
        logical_date=datetime(2026, 11, 24, tzinfo=UTC),
        run_conf={"conflict_id": cid, "take": "remote", "row": "", "why": "first"},
    )
    headers, token = _form(client)
    body = {"token": token, "conflict_id": cid, "take": "row", "row": '{"v": "agreed"}'}
    r = client.post(
        "/decide", data={**body, "why": "merged by hand"}, headers=headers, follow_redirects=False
    )
    assert r.status_code == 303, r.text
    run_id = unquote(r.headers["location"].partition("decided=")[2])
    with create_session() as session:
        run = session.query(DagRun).filter_by(dag_id="replica_cdr_decide", run_id=run_id).one()
        want = {"conflict_id": cid, "take": "row", "row": '{"v": "agreed"}'}
        assert run.conf == {**want, "why": "merged by hand"}  # the form's token not kept
        assert run.triggering_user_name == "u"


@pytest.mark.parametrize(
    ("who", "extra", "status"),
    [
        (None, {}, 401),  # anonymous
        ("viewer", {}, 403),  # read-only: may not trigger the DAG
        ("admin", {"Origin": "https://evil.example"}, 403),  # cross-site
        ("admin", {"Sec-Fetch-Site": "cross-site"}, 403),
        ("admin", {"forged": True}, 403),  # no valid token
        ("admin", {"conflict_id": "../etc"}, 422),
        ("admin", {"take": "row"}, 422),  # a row decision without its row
    ],
    ids=["anonymous", "viewer", "origin", "fetch-site", "forged", "bad-id", "no-row"],
)
def test_the_form_refuses(airflow, published, client, who, extra, status):
    _, cid = published
    _, token = _form(client)
    extra = dict(extra)
    headers = {} if who is None else _token(who)
    headers.update({k: extra.pop(k) for k in ("Origin", "Sec-Fetch-Site") if k in extra})
    if extra.pop("forged", False):
        token = "9999999999." + "0" * 64
    data = {"token": token, "conflict_id": cid, "take": "local", "row": "", "why": "x", **extra}
    r = client.post("/decide", data=data, headers=headers, follow_redirects=False)
    assert r.status_code == status, r.text
