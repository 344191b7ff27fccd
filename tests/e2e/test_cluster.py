"""A real Spark cluster (issue 17): a standalone master and two workers on loopback (one
core each, started with pyspark's ``spark-class``), and ``cdr run --master spark://…`` on
it, its store on the S3 test server. The executors are JVMs of their own with Python
workers of their own; the run's work location is a folder the driver and the workers
share, and the ingest fetches the exports in the executors' tasks. The published tables
equal a ``local[*]`` run's of the same exports, and the S3 requests show who moved the
data: the driver and the workers sign with keys of their own (issue 47)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote

import pytest

from pipeline.app.cli import main
from pipeline.app.demo import DEMO_CONFIG
from pipeline.storage.store import open_store
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

    work = {"local": str(tmp_path / "work"), "cluster": s3_store.uri.rsplit("/", 1)[0] + "/work"}

    def args(name: str) -> list[str]:
        return [*run, "--config", str(tmp_path / f"{name}.yaml"), "--work-dir", work[name]]

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
    (tmp_path / "requests.json").write_text(json.dumps(requests, indent=0))
    assert p.returncode == 0, p.stderr[-3000:]
    mine = P.all_tables(open_store(local.as_uri()), (ids["local"],))
    remote = P.all_tables(s3_store, (ids["cluster"],))
    assert set(remote) == set(mine) and len(mine) > 10
    for path in mine:
        assert remote[path] == mine[path], path
    check_executors(worker_dirs, before=set())
    driver, worker = DRIVER_KEYS["AWS_ACCESS_KEY_ID"], WORKER_KEYS["AWS_ACCESS_KEY_ID"]
    assert {key for _, _, key in requests} == {driver, worker}
    store = [(m, k, key) for m, p, key in requests if (k := _under(p, "prod")) is not None]
    by_driver = [(m, k) for m, k, key in store if key == driver and _data(k)]
    assert by_driver == [], by_driver[:20]
    by_workers = [(m, k) for m, k, key in store if key == worker and _data(k)]
    assert any(m == "GET" and k.startswith("exports/") for m, k in by_workers)
    assert any(m == "PUT" and k.startswith("published/") for m, k in by_workers)
    # the work location: the executors stage the exports and write the run's outputs;
    # the driver never reads a staged export, and Spark's job commit completes the
    # uploads the executors made (S3A's magic committer), copying and deleting nothing.
    # The driver reads and writes no data file of the run's outputs: each output's schema
    # and rows are recorded beside its files (``spark.OUTPUT_INFO``), an output no task
    # wrote is its record alone, the driver's few rows of statistics are recorded whole,
    # and what the report counts of the outputs (the clock-skew evidence too) comes from
    # the tasks that wrote them or from a Spark job.
    work = [(_verb(m, p), k, key) for m, p, key in requests if (k := _under(p, "work")) is not None]
    wrote = [k for m, k, key in work if key == worker and m == "PUT"]
    for where in ("/staged/", "/fates/", "/state_pre/", "/snapshot/", "/ledger/"):
        assert any(where in k for k in wrote), where
    touched = {(m, _kind(k)) for m, k, key in work if key == driver and _data(k) and m != "HEAD"}
    assert {t for t in touched if t[0] != "COMPLETE"} == set(), touched


#: the key the driver's environment gives it
DRIVER_KEYS = {"AWS_ACCESS_KEY_ID": "cdr-driver", "AWS_SECRET_ACCESS_KEY": "cdr-driver-secret"}


def _verb(method: str, path: str) -> str:
    """A request's method, ``COMPLETE`` for the completion of a multipart upload (it moves
    no byte: the parts were uploaded by whoever started it)."""
    return "COMPLETE" if method == "POST" and "uploadId=" in path else method


def _under(path: str, prefix: str) -> str | None:
    """A request's object key under ``/<bucket>/<prefix>/``, or None."""
    parts = unquote(path.split("?")[0]).split("/", 3)
    return parts[3] if len(parts) == 4 and parts[2] == prefix else None


def _data(key: str) -> bool:
    """Whether a key is a data object: an export's file (not its manifest), a Delta
    table's data file or deletion vector (not its log), or a Parquet file of a run."""
    if key.startswith(("exports/", "base/")):
        return not key.endswith("/_manifest.json")
    return "/_delta_log/" not in key and key.endswith((".parquet", ".bin"))


def _kind(key: str) -> str:
    """What a work location's object is: ``staged``, or the run's output it belongs to."""
    parts = key.split("/")  # run=<id>/staged/... or run=<id>/resolved/<table>/<output>/file
    if parts[1] == "staged":
        return "staged"
    return parts[2] if parts[2] == "conflict_stats" else parts[3]
