"""What both the DAG and the UI plugin use: the Data Docs link of the validate task and
the export of the ``aws_default`` connection for boto3. Light: imported at DAG parse."""

from __future__ import annotations

import os
from typing import Any

from airflow.sdk import BaseOperatorLink

DOCS_ROUTE = "/cdr/docs/{dt}/{run_id}/index.html"  # served by the plugin (cdr_plugin.py)


class DataDocsLink(BaseOperatorLink):
    """The validate task's button to its run's Great Expectations Data Docs, served from
    the store by the plugin. Computed when the task ends, passed or failed."""

    name = "Data Docs"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        pull = getattr(ti_key, "xcom_pull", None)  # the running task instance
        plan = pull(task_ids="plan") if pull else None
        if not plan or not plan.get("date") or not plan.get("run_id"):
            return ""
        return DOCS_ROUTE.format(dt=plan["date"], run_id=plan["run_id"])


def export_aws(conn: Any) -> None:
    """Put an ``aws`` connection's credentials and endpoint where boto3 reads them."""
    extra = conn.extra_dejson
    for var, value in (
        ("AWS_ACCESS_KEY_ID", conn.login),
        ("AWS_SECRET_ACCESS_KEY", conn.password),
        ("AWS_ENDPOINT_URL_S3", extra.get("endpoint_url")),
        ("AWS_DEFAULT_REGION", extra.get("region_name")),
    ):
        if value:
            os.environ[var] = value


def aws_env_from_connection() -> None:
    """In a task: export the ``aws_default`` connection, when there is one."""
    from airflow.sdk import Connection
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        export_aws(Connection.get("aws_default"))
    except AirflowNotFoundException:
        return
