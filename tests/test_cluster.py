"""A real Spark cluster (issue 17): a standalone master and two workers on loopback (one
core each, started with pyspark's ``spark-class``), and ``cdr run --master spark://…`` on
it. The executors are JVMs of their own with Python workers of their own; the run's work
location is a folder the driver and the workers share, and the ingest fetches the
exports in the executors' tasks. The published tables equal a ``local[*]`` run's of the
same exports."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest
import yaml

from pipeline.cli import main
from pipeline.demo import DEMO_CONFIG
from pipeline.store import open_store
from tests.helpers import published as P
from tests.helpers.dagrun import asset_events, run_dag, xcom
from tests.helpers.scenarios import cdr_run_snapshots, snapshot_rows

pytestmark = [pytest.mark.spark, pytest.mark.slow]
D = "2026-11-21"
D_DAG = "2026-11-21"  # the night tests/dagrun.py generates and runs
SPARK_CLASS = Path(pyspark.__file__).parent / "bin" / "spark-class"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _alive_workers(ui: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=2) as r:
            state = json.load(r)
    except OSError:
        return 0
    return sum(w["state"] == "ALIVE" for w in state.get("workers", []))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[tuple[str, list[Path]]]:
    """``spark://127.0.0.1:<port>`` and the two workers' work folders (each executor
    writes its logs there)."""
    root = tmp_path_factory.mktemp("cluster")
    env = {  # no AWS_* settings: the tasks must bring the driver's
        **{k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_HOME": str(SPARK_CLASS.parent.parent),
    }
    port, ui = _free_port(), _free_port()
    log = (root / "cluster.log").open("w")
    master = [str(SPARK_CLASS), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1"]
    procs = [
        subprocess.Popen(
            [*master, "--port", str(port), "--webui-port", str(ui)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    ]
    dirs = [root / f"worker-{i}" for i in range(2)]
    for d in dirs:
        worker = [str(SPARK_CLASS), "org.apache.spark.deploy.worker.Worker"]
        args = ["--host", "127.0.0.1", "--cores", "1", "--memory", "2g", "--work-dir", str(d)]
        procs.append(
            subprocess.Popen(
                [*worker, f"spark://127.0.0.1:{port}", *args, "--webui-port", str(_free_port())],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
    try:
        deadline = time.monotonic() + 90
        while _alive_workers(ui) < 2:
            assert time.monotonic() < deadline, (root / "cluster.log").read_text()[-3000:]
            time.sleep(0.5)
        yield f"spark://127.0.0.1:{port}", dirs
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)
        log.close()


def test_a_run_on_a_standalone_cluster_publishes_what_a_local_run_does(
    cluster: tuple[str, list[Path]], tmp_path: Path, spark
):
    url, worker_dirs = cluster
    inputs = tmp_path / "inputs"
    cfg = tmp_path / "cdr.yaml"
    # the demo's tables (row engine, a foreign key, a delta and a unique column); the CDC
    # log's stage is left out to keep the test short (its tasks are the same kind)
    config = {**DEMO_CONFIG, "store": inputs.as_uri(), "cdc": {"enabled": False}}
    cfg.write_text(yaml.safe_dump(config, sort_keys=False))
    gen = ["generate", "--config", str(cfg), "--date", D, "--events", "800", "--seed", "5"]
    assert main(gen) == 0
    stores = {}
    for name in ("local", "cluster"):
        stores[name] = tmp_path / name
        shutil.copytree(inputs, stores[name])
        (tmp_path / f"{name}.yaml").write_text(
            yaml.safe_dump({**config, "store": stores[name].as_uri()}, sort_keys=False)
        )
    run = ["run", "--date", D, "--now", f"{D}T23:59:00Z", "--no-data-docs"]

    def args(name: str) -> list[str]:
        work = tmp_path / f"work-{name}"  # the cluster's: shared by the driver and workers
        return [*run, "--config", str(tmp_path / f"{name}.yaml"), "--work-dir", str(work)]

    ids = {"local": "run-in-process", "cluster": "run-on-the-cluster"}  # no column has them
    assert main([*args("local"), "--run-id", ids["local"]]) == 0
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "CDR_SHUFFLE_PARTITIONS": "4"}
    cdr = Path(sys.executable).with_name("cdr")
    p = subprocess.run(
        [str(cdr), *args("cluster"), "--run-id", ids["cluster"], "--master", url],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    (tmp_path / "cluster-run.log").write_text(p.stderr)
    assert p.returncode == 0, p.stderr[-3000:]
    local = P.all_tables(open_store(stores["local"].as_uri()), (ids["local"],))
    remote = P.all_tables(open_store(stores["cluster"].as_uri()), (ids["cluster"],))
    assert set(remote) == set(local) and len(local) > 10
    for path in local:
        assert remote[path] == local[path], path
    _check_executors(worker_dirs, before=set())


def _apps(worker_dirs: list[Path]) -> set[Path]:
    return {a for w in worker_dirs for a in w.glob("app-*")}


def _check_executors(worker_dirs: list[Path], before: set[Path]) -> None:
    """The one application started since ``before``: each worker launched an executor JVM
    of its own for it (its command line and id in its log), and each ran tasks in Python
    workers it started itself."""
    (app,) = {a.name for a in _apps(worker_dirs) - before}
    executors = [d for w in worker_dirs for d in w.glob(f"{app}/*") if d.is_dir()]
    logs = [(d / "stderr").read_text() for d in executors]
    ids = sorted(re.search(r'"--executor-id" "(\d+)"', t).group(1) for t in logs)  # type: ignore[union-attr]
    assert ids == ["0", "1"], [t[-2000:] for t in logs]
    for text in logs:
        assert "CoarseGrainedExecutorBackend" in text and "Running task" in text
        assert re.search(r"PythonRunner: Times: total = \d+, boot = \d+", text), text[-2000:]


@pytest.mark.airflow
def test_the_dags_spark_submit_task_runs_on_the_cluster(
    airflow, cluster: tuple[str, list[Path]], s3_endpoint, s3_store, tmp_path, monkeypatch, spark
):
    """The DAG's ``spark_default`` connection names the cluster, and the trigger's conf a
    subset, orders (which brings products, its foreign key's parent): every task
    succeeds, the resolve stage's Spark application ran on both workers (fetching the
    exports from S3 with the ``aws_default`` connection the workers' environment does
    not have), each published snapshot holds exactly the rows a ``local[*]`` ``cdr run``
    of the same exports publishes, and the run emitted one asset event for each table it
    published, none for accounts, with the run's counts and ``runs`` version."""
    url, worker_dirs = cluster
    before = _apps(worker_dirs)
    spark_conn = json.dumps({"conn_type": "spark", "host": url})
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", spark_conn)
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
    run, states = run_dag(s3_endpoint, s3_store, tmp_path, monkeypatch, {"tables": ["orders"]})
    assert set(states.values()) == {"success"}, states
    _check_executors(worker_dirs, before)
    assert not s3_store.exists("published/_lock")  # finish released the run's lease
    tables = ("products", "orders")
    for table in tables:
        assert P.snapshot_date(s3_store, table) == D_DAG
    assert P.snapshot_date(s3_store, "accounts") is None
    got = {t: snapshot_rows(s3_store, t) for t in tables}
    assert all(got.values())
    assert got == cdr_run_snapshots(s3_store, D_DAG, tmp_path, tables)
    report = json.loads(s3_store.read_bytes(f"published/reports/dt={D_DAG}/run_report.json"))
    assert report["status"] == "published"
    plan = xcom(run, "plan", "return_value")
    assert plan["date"] == D_DAG and report["run_id"] == plan["run_id"]
    link = f"/cdr/docs/{D_DAG}/{plan['run_id']}/index.html"
    assert xcom(run, "validate", "_link_DataDocsLink") == link
    events = asset_events(run)
    assert set(events) == {f"{s3_store.uri}/published/{t}/snapshot" for t in tables}
    (runs,) = [r for r in P.runs(s3_store) if r["run_id"] == plan["run_id"]]
    for table in tables:
        extra = events[f"{s3_store.uri}/published/{table}/snapshot"]
        counts = report["tables"][table]
        assert extra == {
            "run_id": plan["run_id"],
            "dt": D_DAG,
            "status": "published",
            "runs_version": P.table_version(s3_store, "published/runs"),
            "snapshot_version": runs["versions"][f"published/{table}/snapshot"],
            "rows": len(got[table]),
            "events": counts["events"],
            "applied": counts["applied"],
            "discarded": counts["discarded"],
            "duplicates": counts["duplicates"],
            "quarantined": sum(counts["quarantined"].values()),
            "conflicts": sum(n for c in counts["conflicts"].values() for n in c.values()),
            "divergent_keys": sum(counts["divergent_keys"].values()),
            "quarantine_open": sum(counts["quarantined"].values()),  # the first night
            "clock_skew_warnings": [],
        }, table
    assert sum(events[u]["conflicts"] for u in events) > 0  # the counts are not all zero
