"""The ``cdr`` Airflow plugin: a Conflicts page in the UI and the validate task's Data
Docs link.

- ``/cdr/``: per run (date) and table, conflicts by type and outcome with a chart,
  quarantined events, divergent keys and orphans, of the runs the ``runs`` table
  records, from their reports (``pipeline.runs``); listed in the UI's Browse menu as "Conflicts".
- ``/cdr/docs/<D>/<run id>/...``: the Data Docs of a run of date D, served from the store.
- ``/cdr/api/runs``: the same numbers as JSON.

The store comes from ``CDR_CONFIG`` (as for the DAG) and S3 credentials from the
environment or the ``aws_default`` connection.

Airflow does not authenticate plugin apps, so this one does: every route needs an Airflow
user allowed to read the runs of the ``replica_cdr`` DAG (Airflow's own dependency, so the
configured auth manager decides), but the Data Docs' ``static/`` files (public scripts,
styles and fonts). A Data Docs file is an HTML file from the bucket: it is served with a
``sandbox`` Content-Security-Policy, so its scripts run in an opaque origin and can
neither read Airflow's cookies nor call its API as the user; ``nosniff`` everywhere.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import mimetypes
import os
from datetime import date
from functools import cache
from pathlib import Path
from typing import Any, ClassVar

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.core_api.security import requires_access_dag
from airflow.plugins_manager import AirflowPlugin
from cdr_links import DataDocsLink, export_aws
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, Response

log = logging.getLogger(__name__)

DAG_ID = "replica_cdr"
#: the routes' guard: an Airflow user who may read the DAG's runs
READER = Depends(requires_access_dag("GET", DagAccessEntity.RUN, param_dag_id=DAG_ID))
#: a Data Docs file's headers: scripts run, sandboxed (no same-origin: no cookies, no API)
DOCS_HEADERS = {
    "Content-Security-Policy": "sandbox allow-scripts allow-popups",
    "X-Content-Type-Options": "nosniff",
}

app = FastAPI(title="cdr: conflicts and Data Docs", docs_url=None, redoc_url=None)


@app.middleware("http")
async def _nosniff(request: Request, call_next: Any) -> Response:
    response: Response = await call_next(request)
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response


@cache
def _store() -> Any:
    from pipeline.config import load_config
    from pipeline.store import open_store

    dags = Path(__file__).resolve().parent.parent / "dags"
    config = load_config(os.environ.get("CDR_CONFIG", str(dags.parent / "cdr.yaml")))
    if "AWS_ENDPOINT_URL_S3" not in os.environ and config.store.startswith("s3://"):
        from airflow.exceptions import AirflowNotFoundException
        from airflow.models.connection import Connection

        with contextlib.suppress(AirflowNotFoundException):
            export_aws(Connection.get_connection_from_secrets("aws_default"))
    return open_store(config.store)


def _reports() -> list[dict[str, Any]]:
    from pipeline.runs import list_reports

    return list_reports(_store())


@app.get("/", response_class=HTMLResponse, dependencies=[READER])
def conflicts_page(request: Request, dt: str | None = None) -> str:
    from pipeline.errors import StoreError
    from pipeline.lake import Lake
    from pipeline.runs import render_page
    from pipeline.stats import trends

    root = request.scope.get("root_path", "")
    try:
        last = trends(Lake(_store()))
    except StoreError as e:  # the page still shows the runs
        log.warning("conflicts page: cannot read the conflict statistics: %s", e)
        last = {}
    return render_page(_reports(), dt, root + "/docs/{dt}/{run_id}/index.html", last)


@app.get("/api/runs", dependencies=[READER])
def runs() -> list[dict[str, Any]]:
    from pipeline.runs import MalformedReport, table_runs

    out = []
    for r in _reports():
        run = {"dt": r["dt"], "run_id": r.get("run_id"), "status": r.get("status")}
        try:
            run["tables"] = [dataclasses.asdict(t) for t in table_runs(r)]
        except MalformedReport as e:
            run["error"] = f"this run's report cannot be read: {e}"
        out.append(run)
    return out


@app.get("/docs/{dt}/{run_id}/static/{path:path}")
def data_docs_static(dt: str, run_id: str, path: str) -> Response:
    """The Data Docs' scripts, styles, fonts and images: public files, served to anyone
    (a sandboxed page's requests carry no cookie), sandboxed too, readable cross-origin
    (its fonts are fetched with CORS from the page's opaque origin)."""
    response = _docs_file(dt, run_id, f"static/{path}", under="static/")
    response.headers["Access-Control-Allow-Origin"] = "*"
    return response


@app.get("/docs/{dt}/{run_id}/{path:path}", dependencies=[READER])
def data_docs(dt: str, run_id: str, path: str) -> Response:
    return _docs_file(dt, run_id, path)


def _docs_file(dt: str, run_id: str, path: str, under: str = "") -> Response:
    """A file of the run's Data Docs; ``under``: the folder it must be in once its path
    is normalised (``static/../index.html`` is not a static file)."""
    from pipeline import layout
    from pipeline.context import check_run_id
    from pipeline.errors import CdrError, ExportError, StoreError
    from pipeline.exports import safe_relpath

    try:
        date.fromisoformat(dt)
    except ValueError:
        raise HTTPException(404, f"{dt!r} is not a date") from None
    try:
        check_run_id(run_id)
    except CdrError as e:
        raise HTTPException(404, str(e)) from None
    try:
        rel = safe_relpath(path or "index.html", "Data Docs")
        if not rel.startswith(under):
            raise ExportError(f"Data Docs: {path!r} is not in {under}")
        key = f"{layout.validation_dir(date.fromisoformat(dt), run_id)}/data_docs/{rel}"
        body = _store().read_bytes(key)
    except (ExportError, StoreError) as e:
        raise HTTPException(404, str(e)) from None
    media = mimetypes.guess_type(rel)[0] or "application/octet-stream"
    return Response(body, media_type=media, headers=DOCS_HEADERS)


class CdrPlugin(AirflowPlugin):
    name = "cdr"
    fastapi_apps: ClassVar[list[dict[str, Any]]] = [
        {"app": app, "url_prefix": "/cdr", "name": "cdr conflicts"}
    ]
    external_views: ClassVar[list[dict[str, Any]]] = [
        {
            "name": "Conflicts",
            "href": "/cdr/",
            "destination": "nav",
            "category": "browse",
            "url_route": "cdr-conflicts",
        }
    ]
    operator_extra_links: ClassVar[list[Any]] = [DataDocsLink()]
