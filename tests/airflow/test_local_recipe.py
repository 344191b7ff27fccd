"""Airflow without Docker (issue 78, item 6): the recipe of docs/airflow.md's "On one
machine, without Docker", run as the page writes it. Its shell block runs in bash from the
repository's root, as subprocesses of its own (``airflow db migrate``, then ``airflow dags
test replica_cdr`` on a night ``cdr generate`` wrote into a ``file://`` store), in an
environment without the tests' Airflow settings; the one change is ``AIRFLOW_HOME``, the
test's folder instead of ``.airflow/``. The night is published and every task succeeded.

The page's block is the one source of the commands: the test reads it from the page.
``airflow db migrate`` finds the session's migrated database (a copy), so that it has
nothing left to do."""

from __future__ import annotations

import os
import re
import shlex
import sqlite3
import subprocess
from pathlib import Path

import pytest

from pipeline.storage.store import open_store
from tests.helpers import REPO
from tests.helpers import published as P
from tests.helpers.airflow_env import use_database

pytestmark = pytest.mark.timeout(1200)

PAGE = REPO / "docs" / "airflow.md"
_BLOCK = re.compile(r"<!-- example: airflow-local -->\n```sh\n(.*?)```", re.S)
#: the recipe's line the test changes: Airflow's home in the test's folder
HOME_LINE = "export AIRFLOW_HOME=$PWD/.airflow"
#: what the tests' own processes set that the recipe must not inherit (it sets its own)
_NOT_INHERITED = ("AIRFLOW", "CDR_CONFIG", "CDR_WORK_DIR", "CDR_WHATIF_DIR")
NIGHT = "2026-11-21"


def recipe() -> str:
    """The page's shell block (there is one)."""
    (block,) = _BLOCK.findall(PAGE.read_text())
    assert HOME_LINE in block, (
        f"{PAGE.name}'s recipe no longer sets AIRFLOW_HOME as the test expects"
    )
    return block


def test_the_page_has_the_recipe_and_it_runs_the_main_dag():
    block = recipe()
    for needed in (
        "AIRFLOW__CORE__DAGS_FOLDER",
        "AIRFLOW__CORE__PLUGINS_FOLDER",
        "CDR_CONFIG",
        "airflow db migrate",
        "airflow dags test replica_cdr",
    ):
        assert needed in block, needed


def _states(db: Path) -> tuple[list[str], dict[str, str]]:
    """The DAG runs' states and each task's, from Airflow's database."""
    with sqlite3.connect(db) as con:
        runs = [s for (s,) in con.execute("SELECT state FROM dag_run WHERE dag_id = 'replica_cdr'")]
        tasks = dict(
            con.execute("SELECT task_id, state FROM task_instance WHERE dag_id = 'replica_cdr'")
        )
    return runs, tasks


def test_the_recipe_publishes_a_night(tmp_path, airflow_db):
    home = tmp_path / "airflow"
    use_database(airflow_db, home)
    script = recipe().replace(HOME_LINE, f"export AIRFLOW_HOME={shlex.quote(str(home))}")
    env = {k: v for k, v in os.environ.items() if not k.startswith(_NOT_INHERITED)}
    done = subprocess.run(
        ["bash", "-e", "-c", script],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    said = f"{done.stdout[-4000:]}\n{done.stderr[-6000:]}"
    assert done.returncode == 0, said
    runs, tasks = _states(home / "airflow.db")
    assert runs == ["success"], said
    assert {"plan", "wait_for_exports", "ingest", "resolve", "validate", "publish"} <= set(tasks)
    assert set(tasks.values()) == {"success"}, tasks
    store = open_store((home / "store").as_uri())
    (run,) = P.run_rows(store, NIGHT)
    assert P.report(store, NIGHT, run["run_id"]).status == "published"  # type: ignore[union-attr]
    for table in ("products", "orders", "accounts"):
        assert P.snapshot_date(store, table) == NIGHT
        assert P.snapshot(store, table), table
