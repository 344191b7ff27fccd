"""The DAG's resolve task on a small night: ``spark-submit`` of the resolve stage as the
``SparkStage`` operator submits it (``pipeline.submit_conf``), with a small run's JVM
options (what the DAG passes since issue 52 when ingest staged a small run, as ``cdr run``
decides) against without them, alternated, whole processes.

The night is ``cdr generate``'s 300 events of the demo config on a ``file://`` store,
ingested once; each round resolves the same run again. It prints each run's wall seconds
and the CPU seconds of the ``spark-submit`` process tree (its driver's JVM included), and
the medians' ratios. In CI the suite is CPU-bound: the CPU seconds are the figure that
counts there.

    .venv/bin/python bench/submit_resolve.py        # 3 rounds
    .venv/bin/python bench/submit_resolve.py 5
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from pipeline import ENTRY, submit_conf  # noqa: E402
from pipeline.app.demo import DEMO_CONFIG  # noqa: E402

BIN = ROOT / ".venv" / "bin"
D = "2026-11-21"


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    tmp = Path(tempfile.mkdtemp(prefix="cdr-submit-"))
    cfg = tmp / "cdr.yaml"
    cfg.write_text(yaml.safe_dump({**DEMO_CONFIG, "store": (tmp / "store").as_uri()}))
    common = ["--config", str(cfg), "--date", D, "--work-dir", str(tmp / "work")]
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}  # spark-submit's
    quiet = {"check": True, "capture_output": True, "env": env}
    subprocess.run([BIN / "cdr", "generate", *common[:4], "--events", "300"], **quiet)
    subprocess.run([BIN / "cdr", "ingest", *common, "--run-id", "bench"], **quiet)
    runs: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    for i in range(rounds):
        for small in (True, False):
            conf = {**submit_conf(small), "spark.sql.session.timeZone": "UTC"}
            argv = [str(BIN / "spark-submit"), "--master", "local[2]"]
            for k, v in conf.items():
                argv += ["--conf", f"{k}={v}"]
            argv += [str(ENTRY), "resolve", *common, "--run-id", "bench"]
            cpu, start = children_cpu(), time.monotonic()
            subprocess.run(argv, **quiet)
            wall, cpu = time.monotonic() - start, children_cpu() - cpu
            runs[small].append((wall, cpu))
            print(
                json.dumps(
                    {"round": i, "small": small, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1)}
                )
            )
    (sw, sc), (lw, lc) = (
        (statistics.median(w for w, _ in runs[s]), statistics.median(c for _, c in runs[s]))
        for s in (True, False)
    )
    print(json.dumps({"wall_ratio": round(sw / lw, 2), "cpu_ratio": round(sc / lc, 2)}))


if __name__ == "__main__":
    main()
