"""The DAG under ``dag.test()``: a DagBag of the repo's dags/, the demo config written
for a store, one nightly run over generated exports, and the run's XComs. Shared by the
DAG tests (tests/airflow/test_dag.py) and the DAG on a standalone cluster
(tests/airflow/test_cluster.py)."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.helpers import REPO, configs

GENERATED = {"events": 1500, "seed": 3, "base_rows": 100}


def dagbag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(REPO / "dags"))


def write_config(path: Path, store: str, **overrides: Any) -> Path:
    from pipeline.app.demo import DEMO_CONFIG

    return configs.write(path, DEMO_CONFIG, store=store, **overrides)


def run_dag(
    s3_endpoint, s3_store, tmp_path, monkeypatch, conf: dict | None = None, **overrides
) -> tuple[Any, dict[str, str]]:
    """``dag.test()`` of one nightly run of the demo config (with ``overrides``) over
    generated exports; returns the run and the state of each task."""
    from pipeline.app.generate import GenerateOptions, generate
    from pipeline.core.config_load import load_config

    cfg_path = write_config(tmp_path / "cdr.yaml", s3_store.uri, **overrides)
    config = load_config(cfg_path)
    generate(config, s3_store, datetime(2026, 11, 21).date(), GenerateOptions(**GENERATED))
    monkeypatch.setenv(
        "AIRFLOW_CONN_AWS_DEFAULT",
        json.dumps(
            {
                "conn_type": "aws",
                "login": os.environ["AWS_ACCESS_KEY_ID"],
                "password": os.environ["AWS_SECRET_ACCESS_KEY"],
                "extra": {"endpoint_url": s3_endpoint, "region_name": "us-east-1"},
            }
        ),
    )
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3")  # the connection must bring it
    monkeypatch.setenv("CDR_CONFIG", str(cfg_path))
    monkeypatch.setenv("CDR_WORK_DIR", str(tmp_path / "work"))

    dag = dagbag().get_dag("replica_cdr")
    for task in dag.tasks:
        task.retries = 0  # a failure shows at once instead of waiting for the retry delay
    run = dag.test(logical_date=datetime(2026, 11, 22, 2, tzinfo=UTC), run_conf=conf)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_endpoint)
    return run, {ti.task_id: ti.state for ti in run.get_task_instances()}


def xcom(run, task_id: str, key: str) -> Any:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row = session.scalars(
            XComModel.get_many(run_id=run.run_id, dag_ids=run.dag_id, task_ids=task_id, key=key)
        ).first()
        return None if row is None else XComModel.deserialize_value(row)


def asset_events(run) -> dict[str, dict[str, Any]]:
    """The asset events ``run`` emitted: asset URI -> the event's ``extra``."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    query = (
        select(AssetModel.uri, AssetEvent.extra)
        .join(AssetEvent, AssetEvent.asset_id == AssetModel.id)
        .where(AssetEvent.source_dag_id == run.dag_id, AssetEvent.source_run_id == run.run_id)
    )
    with create_session() as session:
        rows = session.execute(query).all()
    assert len({uri for uri, _ in rows}) == len(rows), rows  # one event per asset
    return {uri: dict(extra) for uri, extra in rows}
