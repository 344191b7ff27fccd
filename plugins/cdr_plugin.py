"""The ``cdr`` Airflow plugin: a Conflicts page in the UI and the validate task's Data
Docs link.

- ``/cdr/``: per run (date) and table, conflicts by type and outcome with a chart,
  quarantined events, divergent keys and orphans, of the runs the ``runs`` table
  records, from their reports (``app.runs``); listed in the UI's Browse menu as "Conflicts".
- ``/cdr/docs/<D>/<run id>/...``: the Data Docs of a run of date D, served from the store:
  the files the run wrote, by their sha256 (the list in its report), and no other.
- ``/cdr/api/runs``: the same numbers as JSON.
- The page lists the manual decisions (docs/rules.md#manual-decisions) with their status,
  and shows a user who may trigger ``replica_cdr_decide`` the form that does:
  ``POST /cdr/decide`` needs that permission, a same-site request (``Sec-Fetch-Site``,
  ``Origin``) and the form's token (an HMAC of the user and an hour, keyed like the
  grants), since Airflow's session cookie would go with a forged one.

The store comes from ``CDR_CONFIG`` (as for the DAG) and S3 credentials from the
environment or the ``aws_default`` connection.

Airflow does not authenticate plugin apps, so this one does: every route needs an Airflow
user allowed to read the runs of the ``replica_cdr`` DAG (Airflow's own dependency, so the
configured auth manager decides). A Data Docs page is served in a ``sandbox``: its scripts
run in an opaque origin and can neither read Airflow's cookies nor call its API as the
user, and its own requests (scripts, styles, fonts) carry no cookie either. So a logged-in
request for a run's Data Docs is redirected to a *grant* path,
``/cdr/docs/<D>/<run id>/grant/<expiry>.<hmac>/...``, valid for that run and an hour
(an HMAC keyed by Airflow's JWT secret), under which the pages and their files are
served. The policy (:data:`DOCS_POLICY`) allows what the pages need and nothing else: no
request to another origin (``connect-src 'none'``, every source ``'self'``), no form and
no popup (the sandbox allows neither; ``form-action 'none'`` besides), no plugin.
``nosniff`` everywhere.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import hmac
import logging
import mimetypes
import os
import re
import time
from datetime import date
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import quote

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag
from airflow.plugins_manager import AirflowPlugin
from cdr_links import DataDocsLink, export_aws
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

if TYPE_CHECKING:
    from pipeline import RunReport

log = logging.getLogger(__name__)

DAG_ID = "replica_cdr"
#: the routes' guard: an Airflow user who may read the DAG's runs
READER = Depends(requires_access_dag("GET", DagAccessEntity.RUN, param_dag_id=DAG_ID))
#: docs/rules.md#manual-decisions: the DAG the decision form triggers, and the form's
#: guard: an Airflow user who may trigger its runs
DECIDE_DAG = "replica_cdr_decide"
EDITOR = Depends(requires_access_dag("POST", DagAccessEntity.RUN, param_dag_id=DECIDE_DAG))
#: how long the decision form's anti-forgery token lasts (seconds)
FORM_SECONDS = 3600
#: a form token as :func:`_form_token` writes it
FORM_TOKEN = re.compile(r"[0-9]{1,12}\.[0-9a-f]{64}")
TAKES = ("local", "remote", "row")
CONFLICT_ID = re.compile(r"[0-9a-f]{32}")
#: a Data Docs file's policy: its scripts run sandboxed (an opaque origin: no cookie, no
#: API), they and the styles, images and fonts come from the run's files only (inline ones
#: included: Great Expectations writes them; Vega compiles its charts with ``eval``), and
#: nothing leaves: no fetch, form, popup, plugin or frame elsewhere
DOCS_POLICY = "; ".join(
    [
        "sandbox allow-scripts",
        "default-src 'none'",
        "script-src 'self' 'unsafe-inline' 'unsafe-eval'",
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data:",
        "font-src 'self' data:",
        "connect-src 'none'",
        "form-action 'none'",
        "frame-ancestors 'self'",
        "base-uri 'none'",
    ]
)
DOCS_HEADERS = {
    "Content-Security-Policy": DOCS_POLICY,
    "X-Content-Type-Options": "nosniff",
    # the grant in the path is the key: sent nowhere, kept in no shared cache
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "private, max-age=300",
}
#: a grant as :func:`_grant` writes it: its expiry (seconds) and the HMAC's hex
GRANT = re.compile(r"[0-9]{1,12}\.[0-9a-f]{64}")
#: how long a grant to read a run's Data Docs lasts (seconds)
GRANT_SECONDS = 3600
#: what every refused Data Docs request says (never the store, never why in detail)
NOT_SERVED = "not a file of this run's Data Docs"

app = FastAPI(title="cdr: conflicts and Data Docs", docs_url=None, redoc_url=None)


@app.middleware("http")
async def _nosniff(request: Request, call_next: Any) -> Response:
    response: Response = await call_next(request)
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response


@cache
def _store() -> Any:
    from pipeline import load_config, open_store  # deferred: the task's, not the DAG's parse

    dags = Path(__file__).resolve().parent.parent / "dags"
    config = load_config(os.environ.get("CDR_CONFIG", str(dags.parent / "cdr.yaml")))
    if "AWS_ENDPOINT_URL_S3" not in os.environ and config.store.startswith("s3://"):
        from airflow.exceptions import AirflowNotFoundException
        from airflow.models.connection import Connection

        with contextlib.suppress(AirflowNotFoundException):
            export_aws(Connection.get_connection_from_secrets("aws_default"))
    return open_store(config.store)


def _reports() -> list[RunReport]:
    from pipeline import list_reports  # deferred: the task's, not the DAG's parse

    return list_reports(_store())


@app.get("/", response_class=HTMLResponse, dependencies=[READER])
def conflicts_page(request: Request, user: GetUserDep, dt: str | None = None) -> str:
    from pipeline import DecideForm  # deferred: the task's, not the DAG's parse
    from pipeline import conflicts_page as page  # deferred: the task's, not the DAG's parse

    root = request.scope.get("root_path", "")
    form = None
    if _may_decide(user):
        token = _form_token(user.get_name(), int(time.time()) + FORM_SECONDS)
        form = DecideForm(root + "/decide", token)
    docs = root + "/docs/{dt}/{run_id}/index.html"
    return page(_store(), dt, docs, form)


def _may_decide(user: Any) -> bool:
    """The user may trigger ``replica_cdr_decide`` (the auth manager decides)."""
    from airflow.api_fastapi.app import get_auth_manager

    return get_auth_manager().is_authorized_dag(
        method="POST",
        access_entity=DagAccessEntity.RUN,
        details=DagDetails(id=DECIDE_DAG),
        user=user,
    )


def _form_token(user: str, expires: int) -> str:
    """The decision form's anti-forgery token: the user's, for an hour (an HMAC keyed like
    the grants)."""
    mac = hmac.new(_secret(), f"decide/{user}/{expires}".encode(), hashlib.sha256)
    return f"{expires}.{mac.hexdigest()}"


def _same_site(request: Request) -> None:
    """Refuse a request another site made the browser send (its cookie is Airflow's)."""
    from urllib.parse import urlsplit  # deferred: the task's, not the DAG's parse

    fetched = request.headers.get("sec-fetch-site")
    origin = request.headers.get("origin")
    cross = fetched is not None and fetched not in ("same-origin", "none")
    if origin is not None and urlsplit(origin).netloc != request.headers.get("host"):
        cross = True
    if cross:
        raise HTTPException(403, "a decision is taken from the Conflicts page only")


@app.post("/decide", dependencies=[EDITOR])
async def decide(request: Request, user: GetUserDep) -> Response:
    """The decision form: checked here, then recorded by a run of ``replica_cdr_decide``
    (its task holds the store's lease; Airflow records who triggered it)."""
    _same_site(request)
    form = await request.form()
    token = str(form.get("token", ""))
    expires = int(token.partition(".")[0]) if FORM_TOKEN.fullmatch(token) else 0
    if expires < time.time() or not hmac.compare_digest(
        token.encode(), _form_token(user.get_name(), expires).encode()
    ):
        raise HTTPException(403, "the form expired or is not this user's: open the page again")
    conf = {k: str(form.get(k, "")).strip() for k in ("conflict_id", "take", "row", "why")}
    if not CONFLICT_ID.fullmatch(conf["conflict_id"]):
        raise HTTPException(422, "conflict_id: the conflict log's conflict_id (32 hex digits)")
    if conf["take"] not in TAKES or not conf["why"] or (conf["take"] == "row") != bool(conf["row"]):
        raise HTTPException(422, "take local, remote or row (with a row), and a reason")
    run_id = _trigger(conf, user.get_name())
    root = request.scope.get("root_path", "")
    return RedirectResponse(f"{root}/?decided={quote(run_id)}", status_code=303)


def _trigger(conf: dict[str, str], user: str) -> str:
    from airflow.api.common.trigger_dag import trigger_dag
    from airflow.exceptions import DagNotFound
    from airflow.utils.types import DagRunTriggeredByType

    try:
        run = trigger_dag(
            DECIDE_DAG, triggered_by=DagRunTriggeredByType.UI, triggering_user_name=user, conf=conf
        )
    except DagNotFound:
        raise HTTPException(503, f"the {DECIDE_DAG} DAG is not loaded") from None
    assert run is not None
    return str(run.run_id)


@app.get("/api/runs", dependencies=[READER])
def runs() -> list[dict[str, Any]]:
    from pipeline import MalformedReport, table_runs  # deferred: the task's, not the DAG's parse

    out = []
    for r in _reports():
        run: dict[str, Any] = {
            "dt": r.dt,
            "run_id": r.run_id or None,
            "status": str(r.status) or None,
        }
        try:
            run["tables"] = [dataclasses.asdict(t) for t in table_runs(r)]
        except MalformedReport as e:
            run["error"] = f"this run's report cannot be read: {e}"
        out.append(run)
    return out


@app.get("/docs/{dt}/{run_id}/grant/{grant}/{path:path}")
def data_docs(dt: str, run_id: str, grant: str, path: str) -> Response:
    """A file of a run's Data Docs, under a grant (:func:`data_docs_entry`)."""
    if not _granted(dt, run_id, grant):
        raise HTTPException(403, "this link to the Data Docs expired: open them again")
    return _docs_file(dt, run_id, path)


@app.get("/docs/{dt}/{run_id}/{path:path}", dependencies=[READER])
def data_docs_entry(request: Request, dt: str, run_id: str, path: str) -> Response:
    """A logged-in reader's way in: the same file under a grant of an hour."""
    _check_run(dt, run_id)
    rel = _relpath(path)
    root = request.scope.get("root_path", "")
    grant = _grant(dt, run_id, int(time.time()) + GRANT_SECONDS)
    to = f"{root}/docs/{dt}/{run_id}/grant/{grant}/{quote(rel)}"
    return RedirectResponse(to, status_code=303, headers={"Referrer-Policy": "no-referrer"})


def _relpath(path: str) -> str:
    """``path`` inside the Data Docs, normalised; one that leaves them is not served."""
    from pipeline import ExportError, safe_relpath  # deferred: the task's, not the DAG's parse

    try:
        return safe_relpath(path or "index.html", "Data Docs")
    except ExportError:
        raise HTTPException(404, NOT_SERVED) from None


def _secret() -> bytes:
    """The grants' key: derived from Airflow's JWT secret (shared by its API servers)."""
    from airflow.configuration import conf

    secret = conf.get("api_auth", "jwt_secret", fallback="") or ""
    if not secret:
        raise HTTPException(503, "Airflow's [api_auth] jwt_secret is not set")
    return hmac.new(secret.encode(), b"cdr data docs grant", hashlib.sha256).digest()


def _grant(dt: str, run_id: str, expires: int) -> str:
    mac = hmac.new(_secret(), f"{dt}/{run_id}/{expires}".encode(), hashlib.sha256)
    return f"{expires}.{mac.hexdigest()}"


def _granted(dt: str, run_id: str, grant: str) -> bool:
    if not GRANT.fullmatch(grant):
        return False
    expires = int(grant.partition(".")[0])
    return expires >= time.time() and hmac.compare_digest(
        grant.encode(), _grant(dt, run_id, expires).encode()
    )


def _check_run(dt: str, run_id: str) -> None:
    from pipeline import CdrError, check_run_id  # deferred: the task's, not the DAG's parse

    try:
        canonical = date.fromisoformat(dt).isoformat() == dt  # one spelling of a date
    except ValueError:
        canonical = False
    if not canonical:
        raise HTTPException(404, f"{dt[:40]!r} is not a date (YYYY-MM-DD)")
    try:
        check_run_id(run_id)
    except CdrError as e:
        raise HTTPException(404, str(e)) from None


def _listed(dt: str, run_id: str) -> dict[str, str]:
    """The Data Docs files the run wrote, by sha256, from its report ({}: none); a run's
    listing, once found, is kept (a run's report is written once)."""
    key = (dt, run_id)
    if key not in _LISTINGS:
        found = _read_listing(dt, run_id)
        if not found:
            return found
        if len(_LISTINGS) > 256:
            _LISTINGS.clear()
        _LISTINGS[key] = found
    return _LISTINGS[key]


_LISTINGS: dict[tuple[str, str], dict[str, str]] = {}


def _read_listing(dt: str, run_id: str) -> dict[str, str]:
    from pipeline import RunReport, StoreError, layout  # deferred: the task's, not the DAG's parse

    try:
        body = _store().read_bytes(layout.run_report(date.fromisoformat(dt), run_id))
        report = RunReport.from_json(body)  # MalformedReport is a ValueError
    except (StoreError, ValueError) as e:
        log.info("Data Docs of %s %s: no report (%s)", dt, run_id, e)
        return {}
    return dict(report.validation.data_docs_files or {})


def _docs_file(dt: str, run_id: str, path: str) -> Response:
    """A file of the run's Data Docs: one the run's report lists, with the content it
    lists (a file written into the bucket later, or changed, is not served)."""
    from pipeline import StoreError, layout  # deferred: the task's, not the DAG's parse

    _check_run(dt, run_id)
    rel = _relpath(path)
    digest = _listed(dt, run_id).get(rel)
    if digest is None:
        raise HTTPException(404, NOT_SERVED)
    key = f"{layout.validation_dir(date.fromisoformat(dt), run_id)}/data_docs/{rel}"
    try:
        body = _store().read_bytes(key)
    except StoreError as e:
        log.warning("Data Docs of %s %s: %s cannot be read: %s", dt, run_id, rel, e)
        raise HTTPException(404, NOT_SERVED) from None
    if hashlib.sha256(body).hexdigest() != digest:
        log.warning("Data Docs of %s %s: %s changed since the run wrote it", dt, run_id, rel)
        raise HTTPException(404, NOT_SERVED)
    media = mimetypes.guess_type(rel)[0] or "application/octet-stream"
    # its fonts are fetched with CORS, from the page's opaque origin ("null")
    return Response(
        body, media_type=media, headers={**DOCS_HEADERS, "Access-Control-Allow-Origin": "null"}
    )


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
