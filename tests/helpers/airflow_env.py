"""An isolated Airflow for the tests: its own AIRFLOW_HOME and SQLite database, the repo's
dags/ and plugins/, no examples. Must be set up before ``airflow`` is first imported."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO

BIN = Path(sys.executable).parent
# SQLite's busy timeout (default 5 s): the api-server, scheduler, dag-processor and CLI
# of the services test write to one database file.
SQLITE_CONNECT_ARGS = {"timeout": 120}


def airflow_environment(home: Path) -> dict[str, str]:
    return {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
        "AIRFLOW_CONN_SPARK_DEFAULT": '{"conn_type": "spark", "host": "local[2]"}',
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS": (
            "tests.helpers.airflow_env.SQLITE_CONNECT_ARGS"
        ),
        # the repository's root, for the line above (not tests/: tests/airflow/ would hide
        # the airflow package)
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    }


def migrated_database(home: Path) -> Path:
    """A freshly migrated Airflow database in ``home`` (``airflow db migrate`` takes most of
    a minute: the tests migrate once and copy the file)."""
    env = {**os.environ, **airflow_environment(home)}
    subprocess.run(
        [str(BIN / "airflow"), "db", "migrate"], check=True, env=env, capture_output=True
    )
    return home / "airflow.db"


def use_database(template: Path, home: Path) -> None:
    """Give ``home`` its own copy of a migrated database."""
    home.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(template, home / "airflow.db")


def setup_airflow(home: Path, template: Path) -> dict[str, str]:
    env = airflow_environment(home)
    use_database(template, home)
    os.environ.update(env)
    return env
