"""Airflow without Docker (issue 78, item 6): the recipe of docs/airflow.md's "On one
machine, without Docker", run as the page writes it. Its shell blocks run in bash from the
repository's root, as processes of their own, in an environment without the tests'
Airflow settings; the one change is ``AIRFLOW_HOME``, the test's folder instead of
``.airflow/`` (and for ``airflow standalone``, free ports instead of 8080 and its log
servers' own).

- ``airflow db migrate``, then ``airflow dags test replica_cdr`` on a night ``cdr
  generate`` wrote into a ``file://`` store: the night is published, every task
  succeeded, and ``cdr report`` prints the night's summary;
- ``airflow standalone`` in the same shell: the UI answers, ``admin`` logs in with the
  password it printed and kept where the page says, the DAG is there, paused, without an
  import error, and the Conflicts page's API lists the night.

The page's blocks are the one source of the commands: the test reads them from the page.
``airflow db migrate`` finds the session's migrated database (a copy), so that it has
nothing left to do."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import sqlite3
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline.storage.s3server import free_port
from pipeline.storage.store import open_store
from tests.helpers import REPO
from tests.helpers import published as P
from tests.helpers.airflow_env import use_database

pytestmark = pytest.mark.timeout(1200)

PAGE = REPO / "docs" / "airflow.md"
#: the line of the recipe the test changes: Airflow's home in the test's folder
HOME_LINE = "export AIRFLOW_HOME=$PWD/.airflow"
#: what the tests' own processes set that the recipe must not inherit (it sets its own)
_NOT_INHERITED = ("AIRFLOW", "CDR_CONFIG", "CDR_WORK_DIR", "CDR_WHATIF_DIR")
NIGHT = "2026-11-21"
#: where the page says the admin's password is kept
PASSWORDS = "simple_auth_manager_passwords.json.generated"


def block(name: str) -> str:
    """The page's shell block marked ``<!-- example: NAME -->`` (there is one)."""
    pattern = re.compile(rf"<!-- example: {name} -->\n```sh\n(.*?)```", re.S)
    (found,) = pattern.findall(PAGE.read_text())
    return found


def recipe(home: Path) -> str:
    text = block("airflow-local")
    assert HOME_LINE in text, f"{PAGE.name}'s recipe no longer sets AIRFLOW_HOME as expected"
    return text.replace(HOME_LINE, f"export AIRFLOW_HOME={shlex.quote(str(home))}")


def _environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(_NOT_INHERITED)}


@pytest.fixture(scope="module")
def night(tmp_path_factory, airflow_db) -> Iterator[tuple[Path, str]]:
    """The recipe run once: Airflow's home, and what it printed (stdout)."""
    home = tmp_path_factory.mktemp("local") / "airflow"
    use_database(airflow_db, home)
    done = subprocess.run(
        ["bash", "-e", "-c", recipe(home)],
        cwd=REPO,
        env=_environment(),
        capture_output=True,
        text=True,
        check=False,
    )
    said = f"{done.stdout[-4000:]}\n{done.stderr[-6000:]}"
    assert done.returncode == 0, said
    yield home, done.stdout


def test_the_page_has_the_recipe_and_it_runs_the_main_dag(tmp_path):
    text = recipe(tmp_path)
    for needed in (
        "AIRFLOW__CORE__DAGS_FOLDER",
        "AIRFLOW__CORE__PLUGINS_FOLDER",
        "CDR_CONFIG",
        "airflow db migrate",
        "airflow dags test replica_cdr",
    ):
        assert needed in text, needed
    assert "airflow standalone" in block("airflow-standalone")


def _states(db: Path) -> tuple[list[str], dict[str, str]]:
    """The DAG runs' states and each task's, from Airflow's database."""
    with sqlite3.connect(db) as con:
        runs = [s for (s,) in con.execute("SELECT state FROM dag_run WHERE dag_id = 'replica_cdr'")]
        tasks = dict(
            con.execute("SELECT task_id, state FROM task_instance WHERE dag_id = 'replica_cdr'")
        )
    return runs, tasks


def test_the_recipe_publishes_a_night(night):
    home, printed = night
    runs, tasks = _states(home / "airflow.db")
    assert runs == ["success"], printed[-4000:]
    assert {"plan", "wait_for_exports", "ingest", "resolve", "validate", "publish"} <= set(tasks)
    assert set(tasks.values()) == {"success"}, tasks
    store = open_store((home / "store").as_uri())
    (run,) = P.run_rows(store, NIGHT)
    report = P.report(store, NIGHT, run["run_id"])
    assert report is not None and report.status == "published"
    for table in ("products", "orders", "accounts"):
        assert P.snapshot_date(store, table) == NIGHT
        assert P.snapshot(store, table), table
    # the recipe's last line: the night's summary
    assert f"# Run of {NIGHT}: published" in printed, printed[-4000:]


def _standalone_script(home: Path, port: int) -> str:
    """The recipe's settings (its ``export`` lines and the venv), free ports, then the
    page's standalone block."""
    settings = [
        line
        for line in recipe(home).splitlines()
        if line.startswith(("export ", ". .venv/bin/activate"))
    ]
    ports = {
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
    }
    settings += [f"export {k}={shlex.quote(v)}" for k, v in ports.items()]
    return "\n".join([*settings, block("airflow-standalone")])


def _get(url: str, token: str | None = None, body: Any = None) -> Any:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = None if body is None else json.dumps(body).encode()
    with urllib.request.urlopen(urllib.request.Request(url, data, headers), timeout=30) as r:
        return json.load(r)


def _until(what: Any, timeout: float, proc: subprocess.Popen, log: Path) -> Any:
    """``what()`` once it stops raising an HTTP or connection error."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return what()
        except (OSError, urllib.error.HTTPError):
            assert proc.poll() is None, log.read_text()[-6000:]
            assert time.monotonic() < deadline, log.read_text()[-6000:]
            time.sleep(2)


def test_airflow_standalone_serves_the_ui_and_the_login_the_page_names(night):
    home, _ = night
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = home / "standalone.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(  # a group of its own: its services go with it
            ["bash", "-e", "-c", _standalone_script(home, port)],
            cwd=REPO,
            env=_environment(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _until(lambda: _get(f"{url}/api/v2/version"), 240, proc, log)
        password = json.loads((home / PASSWORDS).read_text())["admin"]
        assert f"Password for user 'admin': {password}" in log.read_text()
        login = {"username": "admin", "password": password}
        token = _get(f"{url}/auth/token", body=login)["access_token"]
        dag = _until(lambda: _get(f"{url}/api/v2/dags/replica_cdr", token), 180, proc, log)
        assert dag["is_paused"], dag
        assert _get(f"{url}/api/v2/importErrors", token)["import_errors"] == []
        assert NIGHT in {run["dt"] for run in _get(f"{url}/cdr/api/runs", token)}
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):  # its children may outlive it
            os.killpg(proc.pid, signal.SIGKILL)
