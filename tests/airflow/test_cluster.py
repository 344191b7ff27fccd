"""The DAG on a real Spark cluster (issue 17): the ``spark_default`` connection names a
standalone master with two workers on loopback (tests/helpers/cluster.py), and the
DAG's spark-submit task runs the resolve stage there; the published tables equal a
``local[*]`` run's of the same exports. (``cdr run --master`` on it:
tests/e2e/test_cluster.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.core.report import RunReport
from tests.helpers import published as P
from tests.helpers.cluster import apps, check_executors
from tests.helpers.dagrun import asset_events, run_dag, xcom
from tests.helpers.scenarios import cdr_run_snapshots, snapshot_rows

pytestmark = [pytest.mark.slow]
D_DAG = "2026-11-21"  # the night tests/helpers/dagrun.py generates and runs


def test_the_dags_spark_submit_task_runs_on_the_cluster(
    airflow, cluster: tuple[str, list[Path]], s3_endpoint, s3_store, tmp_path, monkeypatch, spark
):
    """The DAG's ``spark_default`` connection names the cluster, and the trigger's conf a
    subset, orders (which brings products, its foreign key's parent): every task
    succeeds, the resolve stage's Spark application ran on both workers (fetching the
    exports from S3 with the workers' own keys, at the endpoint of the ``aws_default``
    connection, which their environment does not have), each published snapshot holds
    exactly the rows a ``local[*]`` ``cdr run``
    of the same exports publishes, and the run emitted one asset event for each table it
    published, none for accounts, with the run's counts and ``runs`` version."""
    url, worker_dirs = cluster
    before = apps(worker_dirs)
    spark_conn = json.dumps({"conn_type": "spark", "host": url})
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", spark_conn)
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
    run, states = run_dag(s3_endpoint, s3_store, tmp_path, monkeypatch, {"tables": ["orders"]})
    assert set(states.values()) == {"success"}, states
    check_executors(worker_dirs, before)
    assert not s3_store.exists("published/_lock")  # finish released the run's lease
    tables = ("products", "orders")
    for table in tables:
        assert P.snapshot_date(s3_store, table) == D_DAG
    assert P.snapshot_date(s3_store, "accounts") is None
    got = {t: snapshot_rows(s3_store, t) for t in tables}
    assert all(got.values())
    assert got == cdr_run_snapshots(s3_store, D_DAG, tmp_path, tables)
    report = RunReport.from_json(
        s3_store.read_bytes(f"published/reports/dt={D_DAG}/run_report.json")
    )
    assert report.status == "published"
    plan = xcom(run, "plan", "return_value")
    assert plan["date"] == D_DAG and report.run_id == plan["run_id"]
    link = f"/cdr/docs/{D_DAG}/{plan['run_id']}/index.html"
    assert xcom(run, "validate", "_link_DataDocsLink") == link
    events = asset_events(run)
    assert set(events) == {f"{s3_store.uri}/published/{t}/snapshot" for t in tables}
    (runs,) = [r for r in P.runs(s3_store) if r["run_id"] == plan["run_id"]]
    for table in tables:
        extra = events[f"{s3_store.uri}/published/{table}/snapshot"]
        counts = report.tables[table]
        assert extra == {
            "run_id": plan["run_id"],
            "dt": D_DAG,
            "status": "published",
            "runs_version": P.table_version(s3_store, "published/runs"),
            "snapshot_version": runs["versions"][f"published/{table}/snapshot"],
            "rows": len(got[table]),
            "events": counts.events,
            "applied": counts.applied,
            "discarded": counts.discarded + counts.errored,  # an error resolver's: discarded
            "duplicates": counts.duplicates,
            "quarantined": sum(counts.quarantined.values()),
            "conflicts": sum(n for c in counts.conflicts.values() for n in c.values()),
            "divergent_keys": sum(counts.divergent_keys.values()),
            "quarantine_open": sum(counts.quarantined.values()),  # the first night
            "clock_skew_warnings": [],
            "alert": None,  # no alerts configured
        }, table
    assert sum(events[u]["conflicts"] for u in events) > 0  # the counts are not all zero
