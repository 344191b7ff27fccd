"""A whole ``cdr run`` as a user sees it, against a bare Spark job on the same exports
(issue 15: at most 3x).

Both run as new processes on the same ``cdr generate`` exports (the resolve bench's table,
3 replicas, 20% of keys contended, on a ``file://`` store), alternated, JVM start
included:

- ``cdr run``: ingest, fetch, resolve, validation (Great Expectations, no Data Docs),
  publish (Delta commits);
- the bare job (``bench/resolve_bench.py``'s baseline, in a process of its own): read the
  exported JSONL with Spark, keep the latest event per key, drop deletes, write Parquet.

    .venv/bin/python bench/whole_run.py 1000000        # 2 rounds
    BENCH_ROUNDS=3 .venv/bin/python bench/whole_run.py 1000000
    BENCH_FLOOR=1 .venv/bin/python bench/whole_run.py 1000000

With ``BENCH_FLOOR=1`` a third process runs each round: ``cdr run`` with the contended
keys' Python fold taken out (``bench/fold_floor.py``'s patch: each fold task drops those
groups). Its run fails validation (the dropped copies are not accounted for) and so
publishes only its logs: its time is a lower bound of any whole run whose contended keys'
fold costs nothing, in any language.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).parent))
from resolve_bench import CONFIG, D

ROOT = Path(__file__).resolve().parent.parent
PY = str(ROOT / ".venv" / "bin" / "python")
CDR = str(ROOT / ".venv" / "bin" / "cdr")
BARE = """
import sys
sys.path.insert(0, {bench!r})
from pathlib import Path
from resolve_bench import baseline
from pipeline.spark.session import get_spark
spark = get_spark("local[*]", app="bare")
baseline(spark, Path({store!r}), Path({out!r}))
spark.stop()
"""
FLOOR = """
import sys
sys.path.insert(0, {bench!r})
import pipeline.resolve.engine
from fold_floor import _fold_function
from pipeline.app.cli import main
pipeline.resolve.engine.fold_function = _fold_function(True)
main({argv!r})
"""


def timed(argv: list[str], env: dict[str, str], may_fail: bool = False) -> float:
    t = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if done.returncode != 0 and not may_fail:
        print(done.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"{argv[:2]} failed ({done.returncode})")
    return wall


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    rounds = int(os.environ.get("BENCH_ROUNDS", "2"))
    tmp = Path(tempfile.mkdtemp(prefix="cdr-whole-"))
    store = tmp / "store"
    cfg = tmp / "cdr.yaml"
    cfg.write_text(yaml.safe_dump({**CONFIG, "store": store.as_uri(), "on_divergence": "warn"}))
    gen = [CDR, "generate", "--config", str(cfg), "--date", D.isoformat(), "--events", str(n)]
    subprocess.run([*gen, "--conflict-rate", "0.2", "--files", "4", "--seed", "11"], check=True)
    env = {**os.environ, "CDR_DRIVER_MEMORY": "6g", "GX_ANALYTICS_ENABLED": "false"}
    bare = BARE.format(bench=str(ROOT / "bench"), store=str(store), out=str(tmp / "bare-out"))
    run = [CDR, "run", "--config", str(cfg), "--date", D.isoformat()]
    run += ["--work-dir", str(tmp / "work"), "--no-data-docs"]
    floor = FLOOR.format(bench=str(ROOT / "bench"), argv=run[1:])
    results: dict[str, list[float]] = {"bare": [], "cdr_run": []}
    if os.environ.get("BENCH_FLOOR"):
        results["floor"] = []
    for _ in range(rounds):
        results["bare"].append(timed([PY, "-c", bare], env))
        results["cdr_run"].append(timed(run, env))
        if "floor" in results:  # it fails validation (see the docstring)
            results["floor"].append(timed([PY, "-c", floor], env, may_fail=True))
    best = {k: min(v) for k, v in results.items()}
    out = {k: [round(x, 1) for x in v] for k, v in results.items()}
    ratios = {f"{k}_ratio": round(best[k] / best["bare"], 2) for k in best if k != "bare"}
    print(json.dumps({"n": n, **out, **ratios}))


if __name__ == "__main__":
    main()
