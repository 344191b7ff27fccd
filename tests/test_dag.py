"""The DAG under real Airflow: it imports cleanly in a DagBag, and ``dag.test()`` runs the
whole chain (ingest, resolve and validate under spark-submit, publish) against the S3
server on loopback."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime

import pytest
import yaml
from airflow_env import REPO, setup_airflow

pytestmark = pytest.mark.airflow


@pytest.fixture(scope="module")
def airflow(tmp_path_factory):
    return setup_airflow(tmp_path_factory.mktemp("airflow"))


def _dagbag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(REPO / "dags"))


def test_dagbag_imports_without_errors(airflow):
    bag = _dagbag()
    assert bag.import_errors == {}
    dag = bag.get_dag("replica_cdr")
    assert dag is not None
    assert [t.task_id for t in dag.topological_sort()] == [
        "ingest",
        "resolve",
        "validate",
        "publish",
    ]
    assert dag.max_active_runs == 1 and not dag.catchup


def _run_dag(s3_endpoint, s3_store, tmp_path, monkeypatch, **overrides) -> dict[str, str]:
    """``dag.test()`` of one nightly run of the demo config (with ``overrides``) over
    generated exports; returns the state of each task."""
    from pipeline.config import load_config
    from pipeline.demo import DEMO_CONFIG
    from pipeline.generate import GenerateOptions, generate

    cfg = dict(DEMO_CONFIG, store=s3_store.uri, **overrides)
    cfg_path = tmp_path / "cdr.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    config = load_config(cfg_path)
    generate(
        config,
        s3_store,
        datetime(2026, 11, 21).date(),
        GenerateOptions(events=3000, seed=3, base_rows=100),
    )
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

    dag = _dagbag().get_dag("replica_cdr")
    for task in dag.tasks:
        task.retries = 0  # a failure shows at once instead of waiting for the retry delay
    run = dag.test(logical_date=datetime(2026, 11, 22, 2, tzinfo=UTC))
    return {ti.task_id: ti.state for ti in run.get_task_instances()}


def test_dag_test_runs_the_whole_chain_against_s3(
    airflow, s3_endpoint, s3_store, tmp_path, monkeypatch
):
    states = _run_dag(s3_endpoint, s3_store, tmp_path, monkeypatch)
    assert states == {
        "ingest": "success",
        "resolve": "success",
        "validate": "success",
        "publish": "success",
    }, states
    for table in ("products", "orders", "accounts"):
        pointer = json.loads(s3_store.read_bytes(f"published/{table}/_latest.json"))
        assert pointer["dt"] == "2026-11-21" and pointer["rows"] > 0
        assert any(k.endswith(".parquet") for k in s3_store.list(pointer["snapshot"]))
    report = json.loads(s3_store.read_bytes("published/reports/dt=2026-11-21/run_report.json"))
    assert report["status"] == "published"
    assert os.environ.get("AIRFLOW_HOME")


def test_a_failed_gate_fails_the_validate_task(
    airflow, s3_endpoint, s3_store, tmp_path, monkeypatch
):
    """The generated replicas diverge: under ``on_divergence: fail`` the validate task
    fails on the convergence suite; publish still runs (all_done), publishes the logs,
    results and Data Docs, fails too, and no snapshot becomes visible."""
    states = _run_dag(s3_endpoint, s3_store, tmp_path, monkeypatch, on_divergence="fail")
    assert states == {
        "ingest": "success",
        "resolve": "success",
        "validate": "failed",
        "publish": "failed",
    }, states
    assert not s3_store.exists("published/orders/_latest.json")
    report = json.loads(s3_store.read_bytes("published/reports/dt=2026-11-21/run_report.json"))
    assert report["status"] == "failed"
    assert any("convergence." in f for f in report["failures"])
    assert s3_store.exists(report["validation"]["data_docs"])
