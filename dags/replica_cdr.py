"""replica_cdr: the nightly conflict detection and resolution run.

Thin by design: every task calls a function of ``pipeline`` (or ``cdr`` under spark-submit);
nothing heavy happens at import time. The run for date D is triggered at 02:00 UTC on D+1.

Settings (environment of the Airflow workers):
- ``CDR_CONFIG``: path of cdr.yaml (default: ``cdr.yaml`` beside the dags folder);
- ``CDR_WORK_DIR``: local folder the tasks of a run share (default ``$AIRFLOW_HOME/cdr-work``);
- connection ``spark_default``: the Spark master (``local[*]``, or ``spark://host:7077``);
- connection ``aws_default`` (optional): S3 credentials and ``endpoint_url`` for the store.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from pathlib import Path

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import dag, task

DAGS = Path(__file__).resolve().parent
CONFIG = os.environ.get("CDR_CONFIG", str(DAGS.parent / "cdr.yaml"))
WORK_DIR = os.environ.get(
    "CDR_WORK_DIR", str(Path(os.environ.get("AIRFLOW_HOME", "/tmp")) / "cdr-work")
)
ENTRY = str(DAGS.parent / "pipeline" / "jobs" / "spark_entry.py")
# D is the day before the run's logical date: the nightly run processes yesterday.
DATE = "{{ macros.ds_add(ds, -1) }}"


def _aws_env() -> None:
    """Export the ``aws_default`` connection, when there is one, for boto3."""
    from airflow.sdk import Connection
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        conn = Connection.get("aws_default")
    except AirflowNotFoundException:
        return
    extra = conn.extra_dejson
    for var, value in (
        ("AWS_ACCESS_KEY_ID", conn.login),
        ("AWS_SECRET_ACCESS_KEY", conn.password),
        ("AWS_ENDPOINT_URL_S3", extra.get("endpoint_url")),
        ("AWS_DEFAULT_REGION", extra.get("region_name")),
    ):
        if value:
            os.environ[var] = value


def _cli(command: str, date: str, *extra: str) -> int:
    from pipeline.cli import main

    return main([command, "--config", CONFIG, "--date", date, "--work-dir", WORK_DIR, *extra])


def _fail_on(rc: int, what: str) -> None:
    if rc != 0:
        raise RuntimeError(f"cdr {what} failed (exit {rc}); the reason is the line above")


@dag(
    dag_id="replica_cdr",
    schedule="0 2 * * *",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args={
        "retries": 2,
        "retry_delay": timedelta(minutes=2),
        "retry_exponential_backoff": True,
    },
    tags=["cdr"],
)
def replica_cdr():
    @task
    def ingest(ds=None) -> str:
        from datetime import date, timedelta

        d = (date.fromisoformat(ds) - timedelta(days=1)).isoformat()
        _aws_env()
        _fail_on(_cli("ingest", d), "ingest")
        return d

    resolve = SparkSubmitOperator(
        task_id="resolve",
        conn_id="spark_default",
        application=ENTRY,
        name="cdr-resolve",
        application_args=["resolve", "--config", CONFIG, "--date", DATE, "--work-dir", WORK_DIR],
        conf={"spark.sql.session.timeZone": "UTC", "spark.ui.showConsoleProgress": "false"},
    )
    validate = SparkSubmitOperator(
        task_id="validate",
        conn_id="spark_default",
        application=ENTRY,
        name="cdr-validate",
        application_args=["validate", "--config", CONFIG, "--date", DATE, "--work-dir", WORK_DIR],
        conf={"spark.sql.session.timeZone": "UTC", "spark.ui.showConsoleProgress": "false"},
    )

    @task(trigger_rule="all_done")  # a failed gate still publishes the run's logs
    def publish(d: str) -> None:
        _aws_env()
        _fail_on(_cli("publish", d), "publish")

    d = ingest()
    d >> resolve >> validate >> publish(d)


replica_cdr()
