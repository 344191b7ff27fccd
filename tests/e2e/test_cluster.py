"""A real Spark cluster (issue 17): a standalone master and two workers on loopback (one
core each, started with pyspark's ``spark-class``), and ``cdr run --master spark://…`` on
it. The executors are JVMs of their own with Python workers of their own; the run's work
location is a folder the driver and the workers share, and the ingest fetches the
exports in the executors' tasks. The published tables equal a ``local[*]`` run's of the
same exports."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.demo import DEMO_CONFIG
from pipeline.store import open_store
from tests.helpers import configs
from tests.helpers import published as P
from tests.helpers.cluster import check_executors

pytestmark = [pytest.mark.slow]
D = "2026-11-21"


def test_a_run_on_a_standalone_cluster_publishes_what_a_local_run_does(
    cluster: tuple[str, list[Path]], tmp_path: Path, spark
):
    url, worker_dirs = cluster
    inputs = tmp_path / "inputs"
    # the demo's tables (row engine, a foreign key, a delta and a unique column); the CDC
    # log's stage is left out to keep the test short (its tasks are the same kind)
    config = {**DEMO_CONFIG, "cdc": {"enabled": False}}
    cfg = configs.write(tmp_path / "cdr.yaml", config, store=inputs)
    gen = ["generate", "--config", str(cfg), "--date", D, "--events", "800", "--seed", "5"]
    assert main(gen) == 0
    stores = {}
    for name in ("local", "cluster"):
        stores[name] = tmp_path / name
        shutil.copytree(inputs, stores[name])
        configs.write(tmp_path / f"{name}.yaml", config, store=stores[name])
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
    check_executors(worker_dirs, before=set())
