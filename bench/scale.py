"""A night against the size of its table: ``cdr run`` and a bare Spark job, whole
processes, on tables of 100K, 1M and 4M rows and one night of 60K event records.

For each size the table is built once: ``cdr generate --base-rows N`` (a base snapshot
of N rows, and a small first night) and ``cdr run`` of that first date publish a state
of about N rows. Then, for a skewed night (``--skew 0.5``, the generator's default) and a
uniform one (``--skew 0``), ``cdr generate`` writes the night's 60K records (3 replicas,
2% of keys contended, new keys after the table's) into a copy of that store, and each
round copies that store again (not timed) and times, alternated, as new processes:

- ``cdr run`` of the night: ingest, resolve, validation (no Data Docs), publish;
- the bare job, in the project's own Spark session (``pipeline.spark.session.get_spark``): read
  the state table's latest version (through Delta's reader) and the night's JSONL exports,
  keep the latest version of each key (``row_number`` over the key by timestamp,
  the state row's ``_ts`` against the events' ``ts``), drop deleted keys, write the new
  state as Parquet.

It prints, per size and night, each round's seconds and the ratio ``cdr run`` / bare
(best of the rounds), and for each of the two the cost per million untouched rows: the
difference of the best times between two sizes divided by the millions of rows added.

    .venv/bin/python bench/scale.py                      # 100K, 1M, 4M; 2 rounds
    BENCH_ROUNDS=1 .venv/bin/python bench/scale.py 100000 1000000
    BENCH_POLICY=scylla BENCH_ROUNDS=1 .venv/bin/python bench/scale.py 100000 4000000
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers import configs  # noqa: E402

PY = str(ROOT / ".venv" / "bin" / "python")
CDR = str(ROOT / ".venv" / "bin" / "cdr")
D0, D1 = date(2026, 11, 20), date(2026, 11, 21)
NIGHT_RECORDS = 60_000
SIZES = (100_000, 1_000_000, 4_000_000)
NIGHTS = {"skewed": "0.5", "uniform": "0"}
#: ``BENCH_POLICY=scylla``: the table is a cell table (the generator then writes TTLs
#: and null cells too)
POLICY = {"policy": os.environ["BENCH_POLICY"]} if os.environ.get("BENCH_POLICY") else {}
CONFIG = configs.config(
    {"items": configs.table({**configs.ITEMS, "price": "decimal(12,2)"}, **POLICY)},
    replicas=("r1", "r2", "r3"),
    on_divergence="warn",
)

BARE = """
import sys
sys.path.insert(0, {root!r})
from bench.scale import bare
from pipeline.spark.session import get_spark
spark = get_spark("local[*]", app="bare")
bare(spark, {store!r}, {out!r})
spark.stop()
"""


def bare(spark, store_uri: str, out: str, table: str = "items") -> None:
    """The bare job: the state's latest version (through Delta's reader) and the night's
    JSONL in, the latest version of each key, deleted keys dropped, the new state's
    Parquet out."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from pipeline.core import layout
    from pipeline.resolve.state import TEXT_MAP
    from pipeline.storage.lake import Lake
    from pipeline.storage.store import open_store

    uri = Lake(open_store(store_uri)).spark_uri(layout.table_path(table, layout.STATE))
    state = spark.read.format("delta").load(uri)
    if "dt" in state.columns:  # a state partitioned by date: the newest date's
        state = state.where(F.col("dt") == state.agg(F.max("dt")).first()[0])
    values = [c for c in state.columns if not c.startswith("_") and c not in ("id", "dt")]
    prior = state.select(
        F.to_json(F.struct("id")).alias("key"),
        F.when(F.col("_deleted"), F.lit("DELETE")).otherwise(F.lit("STATE")).alias("op"),
        F.col("_ts").alias("ts"),
        F.to_json(F.struct(*values)).alias("after"),
    )
    root = store_uri.removeprefix("file://")
    raw = spark.read.text(f"{root}/exports/replica=*/table={table}/dt={D1}/*.jsonl*")
    t = F.from_json("value", TEXT_MAP)
    night = raw.select(t.alias("t")).select(
        F.col("t")["key"].alias("key"),
        F.col("t")["op"].alias("op"),
        F.col("t")["ts"].cast("bigint").alias("ts"),
        F.col("t")["after"].alias("after"),
    )
    w = Window.partitionBy("key").orderBy(F.col("ts").desc())
    (
        prior.unionByName(night)
        .withColumn("rn", F.row_number().over(w))
        .where("rn = 1 AND op != 'DELETE'")
        .drop("rn")
        .write.mode("overwrite")
        .parquet(out)
    )


def sh(argv: list[str], env: dict[str, str]) -> float:
    """Run a whole process; its wall seconds (it must succeed)."""
    t = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if done.returncode != 0:
        print(done.stdout[-2000:], done.stderr[-4000:], file=sys.stderr)
        raise SystemExit(f"{' '.join(argv[:3])} failed ({done.returncode})")
    return wall


def write_config(folder: Path) -> Path:
    return configs.write(folder / "cdr.yaml", CONFIG, store=folder / "store")


def build(size: int, folder: Path, env: dict[str, str]) -> dict[str, float]:
    """A published table of about ``size`` rows: a base snapshot and a small first night."""
    folder.mkdir(parents=True)
    cfg = write_config(folder)
    gen = [CDR, "generate", "--config", str(cfg), "--date", D0.isoformat()]
    took = {"generate": sh([*gen, "--base-rows", str(size), "--events", "3000"], env)}
    run = [CDR, "run", "--config", str(cfg), "--date", D0.isoformat(), "--no-data-docs"]
    took["run"] = sh([*run, "--work-dir", str(folder / "work")], env)
    shutil.rmtree(folder / "work")
    return took


def night(built: Path, folder: Path, skew: str, env: dict[str, str]) -> None:
    """A copy of the built store with the night's exports."""
    shutil.copytree(built / "store", folder / "store")
    cfg = write_config(folder)
    gen = [CDR, "generate", "--config", str(cfg), "--date", D1.isoformat()]
    sh([*gen, "--events", str(NIGHT_RECORDS), "--skew", skew, "--seed", "2"], env)


def rounds_of(folder: Path, rounds: int, env: dict[str, str]) -> dict[str, list[float]]:
    """``rounds`` alternated pairs on fresh copies of ``folder``'s store."""
    times: dict[str, list[float]] = {"bare": [], "cdr_run": []}
    trial = folder / "trial"
    for _ in range(rounds):
        for name in ("bare", "cdr_run"):
            shutil.rmtree(trial, ignore_errors=True)
            shutil.copytree(folder / "store", trial / "store")
            store = (trial / "store").as_uri()
            if name == "bare":
                code = BARE.format(root=str(ROOT), store=store, out=str(trial / "out"))
                times[name].append(sh([PY, "-c", code], env))
            else:
                cfg = write_config(trial)
                run = [CDR, "run", "--config", str(cfg), "--date", D1.isoformat()]
                run += ["--work-dir", str(trial / "work"), "--no-data-docs"]
                times[name].append(sh(run, env))
    shutil.rmtree(trial, ignore_errors=True)
    return times


def per_million(best: dict[int, float], sizes: list[int]) -> dict[str, float]:
    """Seconds per million rows added, between consecutive sizes and first to last."""
    out = {}
    pairs = [*itertools.pairwise(sizes), (sizes[0], sizes[-1])]
    for a, b in dict.fromkeys(pairs):
        if a != b:
            out[f"{a}->{b}"] = round((best[b] - best[a]) / ((b - a) / 1e6), 2)
    return out


def main() -> None:
    sizes = sorted(int(a) for a in sys.argv[1:]) or list(SIZES)
    rounds = int(os.environ.get("BENCH_ROUNDS", "2"))
    env = {**os.environ, "CDR_DRIVER_MEMORY": "6g", "GX_ANALYTICS_ENABLED": "false"}
    tmp = Path(tempfile.mkdtemp(prefix="cdr-scale-"))
    results: dict[str, dict[int, dict]] = {k: {} for k in NIGHTS}
    try:
        for size in sizes:
            built = tmp / f"built-{size}"
            took = build(size, built, env)
            print(f"built {size:,} rows: {json.dumps(took)}", flush=True)
            for kind, skew in NIGHTS.items():
                folder = tmp / f"{kind}-{size}"
                night(built, folder, skew, env)
                times = rounds_of(folder, rounds, env)
                best = {k: min(v) for k, v in times.items()}
                row = {k: [round(x, 1) for x in v] for k, v in times.items()}
                row["ratio"] = round(best["cdr_run"] / best["bare"], 2)
                results[kind][size] = {**row, "best": best}
                print(json.dumps({"night": kind, "rows": size, **row}), flush=True)
                shutil.rmtree(folder)
            shutil.rmtree(built)
        for kind, by_size in results.items():
            for name in ("cdr_run", "bare"):
                best = {s: r["best"][name] for s, r in by_size.items()}
                cost = per_million(best, sizes) if len(sizes) > 1 else {}
                print(json.dumps({"night": kind, "job": name, "s_per_million_rows": cost}))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
