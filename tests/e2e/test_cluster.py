"""A real Spark cluster (issue 17): a standalone master and two workers on loopback (one
core each, started with pyspark's ``spark-class``), and ``cdr run --master spark://…`` on
it, its store on the S3 test server. The executors are JVMs of their own with Python
workers of their own; the run's work location is a folder the driver and the workers
share, and the ingest fetches the exports in the executors' tasks. The published tables
equal a ``local[*]`` run's of the same exports, and the S3 requests show who moved the
data: the driver and the workers sign with keys of their own (issue 47)."""

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
from tests.helpers.cluster import WORKER_KEYS, check_executors
from tests.helpers.faults import faulty_proxy

pytestmark = [pytest.mark.slow]
D = "2026-11-21"


def test_a_run_on_a_standalone_cluster_publishes_what_a_local_run_does(
    cluster: tuple[str, list[Path]], tmp_path: Path, spark, s3_endpoint, s3_store
):
    """The same exports, run in process on a file store and on the cluster with the store
    on S3 (through a proxy that logs every request and the key that signed it): the same
    tables. The driver signs with a key of its own, which never reads an export's file nor
    writes a table's data; the workers' key does both."""
    url, worker_dirs = cluster
    inputs = tmp_path / "inputs"
    # the demo's tables (row engine, a foreign key, a delta and a unique column); the CDC
    # log's stage is left out to keep the test short (its tasks are the same kind)
    config = {**DEMO_CONFIG, "cdc": {"enabled": False}}
    cfg = configs.write(tmp_path / "cdr.yaml", config, store=inputs)
    gen = ["generate", "--config", str(cfg), "--date", D, "--events", "800", "--seed", "5"]
    assert main(gen) == 0
    local = tmp_path / "local"
    shutil.copytree(inputs, local)
    configs.write(tmp_path / "local.yaml", config, store=local)
    for f in sorted(p for p in inputs.rglob("*") if p.is_file()):
        s3_store.upload(f, f.relative_to(inputs).as_posix())
    configs.write(tmp_path / "cluster.yaml", config, store=s3_store.uri)
    run = ["run", "--date", D, "--now", f"{D}T23:59:00Z", "--no-data-docs"]

    def args(name: str) -> list[str]:
        work = tmp_path / f"work-{name}"  # the cluster's: shared by the driver and workers
        return [*run, "--config", str(tmp_path / f"{name}.yaml"), "--work-dir", str(work)]

    ids = {"local": "run-in-process", "cluster": "run-on-the-cluster"}  # no column has them
    assert main([*args("local"), "--run-id", ids["local"]]) == 0
    cdr = Path(sys.executable).with_name("cdr")
    with faulty_proxy(s3_endpoint) as (endpoint, proxy):
        env = {
            **os.environ,
            "SPARK_LOCAL_IP": "127.0.0.1",
            "CDR_SHUFFLE_PARTITIONS": "4",
            "AWS_ENDPOINT_URL_S3": endpoint,
            **DRIVER_KEYS,
        }
        p = subprocess.run(
            [str(cdr), *args("cluster"), "--run-id", ids["cluster"], "--master", url],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        requests = proxy.requests()
    (tmp_path / "cluster-run.log").write_text(p.stderr)
    assert p.returncode == 0, p.stderr[-3000:]
    mine = P.all_tables(open_store(local.as_uri()), (ids["local"],))
    remote = P.all_tables(s3_store, (ids["cluster"],))
    assert set(remote) == set(mine) and len(mine) > 10
    for path in mine:
        assert remote[path] == mine[path], path
    check_executors(worker_dirs, before=set())
    driver, worker = DRIVER_KEYS["AWS_ACCESS_KEY_ID"], WORKER_KEYS["AWS_ACCESS_KEY_ID"]
    assert {key for _, _, key in requests} == {driver, worker}
    by_driver = [(m, p) for m, p, key in requests if key == driver and _data(p)]
    assert by_driver == [], by_driver[:20]
    by_workers = [(m, p) for m, p, key in requests if key == worker]
    assert any(m == "GET" and "/exports/" in p and _data(p) for m, p in by_workers)
    assert any(m == "PUT" and "/published/" in p and _data(p) for m, p in by_workers)


#: the key the driver's environment gives it
DRIVER_KEYS = {"AWS_ACCESS_KEY_ID": "cdr-driver", "AWS_SECRET_ACCESS_KEY": "cdr-driver-secret"}


def _data(path: str) -> bool:
    """Whether a request's path is a data object: an export's file (not its manifest), or
    a Delta table's data file or deletion vector (not its log)."""
    key = path.split("?")[0]
    if "/exports/" in key or "/base/" in key:
        return not key.endswith("/_manifest.json")
    return "/published/" in key and "/_delta_log/" not in key and key.endswith((".parquet", ".bin"))
