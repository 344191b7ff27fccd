"""A real Spark cluster on loopback (issue 17): a standalone master and two workers, one
core each, started with pyspark's ``spark-class``, and what its executors did (the
standalone-cluster tests of tests/e2e/ and tests/airflow/; the fixture ``cluster`` is in
tests/conftest.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyspark

SPARK_CLASS = Path(pyspark.__file__).parent / "bin" / "spark-class"


#: the access key of the workers' environment, which their executors sign with (the test
#: S3 server accepts any key; its requests show which one signed)
WORKER_KEYS = {"AWS_ACCESS_KEY_ID": "cdr-worker", "AWS_SECRET_ACCESS_KEY": "cdr-worker-secret"}


def _alive_workers(ui: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=2) as r:
            state = json.load(r)
    except (OSError, ValueError):  # not up yet
        return 0
    return sum(w["state"] == "ALIVE" for w in state.get("workers", []))


def _bound(log: Path, proc: subprocess.Popen, deadline: float) -> tuple[str, int]:
    """The master's URL and its web UI's port, as the master's log says it bound them."""
    while True:
        text = log.read_text()
        url = re.search(r"Starting Spark master at (spark://\S+)", text)
        ui = re.search(r"Successfully started service 'MasterUI' on port (\d+)", text)
        if url and ui:
            return url.group(1), int(ui.group(1))
        assert proc.poll() is None and time.monotonic() < deadline, text[-3000:]
        time.sleep(0.2)


@contextmanager
def standalone_cluster(root: Path) -> Iterator[tuple[str, list[Path]]]:
    """A master and two workers (one core each) started in ``root``, with credentials of
    their own (``WORKER_KEYS``): yields the master's ``spark://127.0.0.1:<port>`` and the
    two workers' work folders (each executor writes its logs there). Every port is the
    one the system gives (0), read back from the master's log: tests in other processes
    start clusters and services too, and a port picked free may be taken before it binds."""
    env = {  # the workers' own credentials (no endpoint: the driver tells where S3 is)
        **{k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
        **WORKER_KEYS,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_HOME": str(SPARK_CLASS.parent.parent),
        "SPARK_MASTER_OPTS": "-Dspark.master.rest.port=0",
    }
    master_log = root / "master.log"
    log = (root / "cluster.log").open("w")
    master = [str(SPARK_CLASS), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1"]
    with master_log.open("w") as out:
        procs = [
            subprocess.Popen(
                [*master, "--port", "0", "--webui-port", "0"],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        ]
    dirs = [root / f"worker-{i}" for i in range(2)]
    try:
        deadline = time.monotonic() + 90
        url, ui = _bound(master_log, procs[0], deadline)
        for d in dirs:
            worker = [str(SPARK_CLASS), "org.apache.spark.deploy.worker.Worker"]
            args = ["--host", "127.0.0.1", "--cores", "1", "--memory", "2g", "--work-dir", str(d)]
            procs.append(
                subprocess.Popen(
                    [*worker, url, *args, "--webui-port", "0"],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        while _alive_workers(ui) < 2:
            assert time.monotonic() < deadline, (root / "cluster.log").read_text()[-3000:]
            time.sleep(0.5)
        yield url, dirs
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)
        log.close()


def apps(worker_dirs: list[Path]) -> set[Path]:
    return {a for w in worker_dirs for a in w.glob("app-*")}


def check_executors(worker_dirs: list[Path], before: set[Path]) -> None:
    """The one application started since ``before``: each worker launched an executor JVM
    of its own for it (its command line and id in its log), and each ran tasks in Python
    workers it started itself."""
    (app,) = {a.name for a in apps(worker_dirs) - before}
    executors = [d for w in worker_dirs for d in w.glob(f"{app}/*") if d.is_dir()]
    logs = [(d / "stderr").read_text() for d in executors]
    ids = sorted(re.search(r'"--executor-id" "(\d+)"', t).group(1) for t in logs)  # type: ignore[union-attr]
    assert ids == ["0", "1"], [t[-2000:] for t in logs]
    for text in logs:
        assert "CoarseGrainedExecutorBackend" in text and "Running task" in text
        assert re.search(r"PythonRunner: Times: total = \d+, boot = \d+", text), text[-2000:]
