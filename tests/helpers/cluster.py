"""A real Spark cluster on loopback (issue 17): a standalone master and two workers, one
core each, started with pyspark's ``spark-class``, and what its executors did (the
standalone-cluster tests of tests/e2e/ and tests/airflow/; the fixture ``cluster`` is in
tests/conftest.py)."""

from __future__ import annotations

import json
import os
import re
import socket
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


@contextmanager
def standalone_cluster(root: Path) -> Iterator[tuple[str, list[Path]]]:
    """A master and two workers (one core each) started in ``root``, with credentials of
    their own (``WORKER_KEYS``): yields ``spark://127.0.0.1:<port>`` and the two workers'
    work folders (each executor writes its logs there)."""
    env = {  # the workers' own credentials (no endpoint: the driver tells where S3 is)
        **{k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
        **WORKER_KEYS,
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
