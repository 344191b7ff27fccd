"""A small run as a user starts it: ``cdr run`` over 3 event records in a new process, JVM
start included (issue 15: at most 15 s), and its Spark jobs (at most 15 per table).

The exports are ``cdr generate``'s, for the resolve bench's table, on a ``file://`` store;
each round runs the same date again in a new process (a rerun: the same work), with
validation on and no Data Docs, once as it starts by default (the class-data archive
``make`` builds, a small run's JVM options: ``pipeline/spark/jvm.py``) and once with
``CDR_JVM_START=plain``, alternated. It prints each run's wall seconds, to the exit of
the ``cdr`` process (what a shell waits for) and to the end of its output (the JVM, a
child of the process, exits after it and holds the output open until then), and the CPU
seconds the machine spent meanwhile; then the Spark jobs of one
more run's one Spark application, from its event log (kept out of the timed runs: writing
it costs a second).

    .venv/bin/python bench/small_run.py            # 3 rounds
    .venv/bin/python bench/small_run.py 5
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).parent))
from resolve_bench import CONFIG, D
from whole_run import timed

ROOT = Path(__file__).resolve().parent.parent
CDR = str(ROOT / ".venv" / "bin" / "cdr")


def jobs_in(event_log: Path) -> int:
    """The Spark jobs an event log records (the run's one application)."""
    n = 0
    for f in event_log.rglob("*"):
        if not f.is_file():
            continue
        for line in f.read_text().splitlines():
            if '"Event":"SparkListenerJobStart"' in line:
                n += 1
    return n


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    tmp = Path(tempfile.mkdtemp(prefix="cdr-small-"))
    cfg = tmp / "cdr.yaml"
    cfg.write_text(yaml.safe_dump({**CONFIG, "store": (tmp / "store").as_uri()}))
    subprocess.run(
        [CDR, "generate", "--config", str(cfg), "--date", D.isoformat(), "--events", "3"],
        check=True,
        capture_output=True,
    )
    argv = [CDR, "run", "--config", str(cfg), "--date", D.isoformat()]
    argv += ["--work-dir", str(tmp / "work"), "--no-data-docs"]
    for i in range(rounds):
        for start in ("auto", "plain"):
            busy = busy_seconds()
            exited, closed = two_walls(argv, {**os.environ, "CDR_JVM_START": start})
            cpu = busy_seconds() - busy
            row = {"round": i, "jvm_start": start, "exit_s": round(exited, 1)}
            print(json.dumps({**row, "output_closed_s": round(closed, 1), "cpu_s": round(cpu, 1)}))
    events = tmp / "events"
    events.mkdir()
    logged = (
        f"--conf spark.eventLog.enabled=true --conf spark.eventLog.dir={events} "
        "--conf spark.eventLog.compress=false pyspark-shell"
    )
    timed(argv, {**os.environ, "PYSPARK_SUBMIT_ARGS": logged})
    print(json.dumps({"spark_jobs": jobs_in(events)}))


def two_walls(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Seconds to the process's exit, and to the end of its output."""
    t = time.perf_counter()
    p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert p.stdout is not None
    out: list[bytes] = []
    reader = threading.Thread(target=lambda: out.append(p.stdout.read()))  # type: ignore[union-attr]
    reader.start()
    p.wait()
    exited = time.perf_counter() - t
    reader.join()
    closed = time.perf_counter() - t
    if p.returncode != 0:
        raise SystemExit(f"{argv[:2]} failed ({p.returncode}): {out[0][-3000:].decode()}")
    return exited, closed


def busy_seconds() -> float:
    """The CPU seconds this machine has spent busy since it started (/proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    main()
