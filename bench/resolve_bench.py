"""Resolve-stage benchmark against a bare Spark window dedupe, on the same staged input.

For each size N (event records across the exports of 3 replicas, 20% of keys written by
several replicas), this script generates the exports with ``cdr generate``, ingests them,
then in ONE Spark session alternates two runs each of:

- the baseline: read the staged exports, ``row_number()`` over the key by ``ts`` desc,
  keep the first, drop deletes, write Parquet;
- the resolve stage (``cdr resolve``): parse, dedupe, type, guard, fold with every rule,
  perspectives and divergence, write every output.

It prints wall seconds (best of the runs), events per second, peak memory of the process
tree (driver, JVM, Python workers), and the ratio resolve / baseline. Machines here are
shared and noisy: read the ratio, not the seconds.

    .venv/bin/python bench/resolve_bench.py            # N = 1M and 4M
    BENCH_RESOLVERS=timestamps .venv/bin/python bench/resolve_bench.py 4000000
    .venv/bin/python bench/resolve_bench.py 200000     # one size
    BENCH_ROUNDS=1 .venv/bin/python bench/resolve_bench.py 4000000
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from datetime import date
from pathlib import Path

import psutil

os.environ.setdefault("CDR_DRIVER_MEMORY", "6g")
os.environ.setdefault("CDR_SHUFFLE_PARTITIONS", "8")
# the repository's root, for tests.helpers.configs (the one config builder)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.app.generate import GenerateOptions, generate
from pipeline.core.config import Config
from pipeline.core.config_load import parse_config
from pipeline.ingest.exports import ingest
from pipeline.ingest.fetch import fetch
from pipeline.storage.context import RunContext, resolve_now
from pipeline.storage.store import open_store
from tests.helpers import configs

D = date(2026, 11, 21)
ITEM_COLUMNS = {**configs.ITEMS, "price": "decimal(12,2)", "note": "string"}
#: the postgres preset's resolvers; with BENCH_RESOLVERS=timestamps, every resolver that can
#: be timestamp-based is (the preset's update_deleted is skip); update_missing and
#: delete_missing have no timestamp-based resolver (docs/rules.md#resolvers)
RESOLVERS = (
    {"update_deleted": "latest_timestamp_wins"}
    if os.environ.get("BENCH_RESOLVERS") == "timestamps"
    else {}
)


def bench_config(columns: dict[str, str] = ITEM_COLUMNS, **table: object) -> dict:
    """The benchmarks' config: one row table ``items`` (``columns``, the resolvers of
    BENCH_RESOLVERS, then ``table``'s settings) of three replicas, divergence a warning."""
    items = configs.table(columns, **({"resolvers": RESOLVERS} if RESOLVERS else {}), **table)
    return configs.config({"items": items}, replicas=("r1", "r2", "r3"), on_divergence="warn")


CONFIG = bench_config()


class PeakMemory:
    """Samples the RSS of this process and all its children (the JVM, Python workers)."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            total = 0
            for p in [me, *me.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    total += p.memory_info().rss
            self.peak = max(self.peak, total)
            time.sleep(0.2)

    def __enter__(self) -> PeakMemory:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()


def baseline(spark, store: Path, out: Path, table: str = "items") -> None:
    """The bare job: read the exported JSONL files, keep the latest event per key, drop
    deletes, write Parquet."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from pipeline.resolve.state import TEXT_MAP

    raw = spark.read.text(
        str(store / "exports" / "replica=*" / f"table={table}" / "dt=*" / "*.jsonl*")
    )
    top = F.from_json("value", TEXT_MAP)
    ev = raw.select(top.alias("t")).select(
        F.col("t")["key"].alias("key"),
        F.col("t")["op"].alias("op"),
        F.col("t")["ts"].cast("bigint").alias("ts"),
        F.col("t")["after"].alias("after"),
    )
    w = Window.partitionBy("key").orderBy(F.col("ts").desc())
    (
        ev.withColumn("rn", F.row_number().over(w))
        .where("rn = 1")
        .where("op != 'DELETE'")
        .drop("rn")
        .write.mode("overwrite")
        .parquet(str(out))
    )


def measure(fn) -> tuple[float, int]:
    with PeakMemory() as mem:
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t, mem.peak


def staged_input(cfg: dict, n: int, root: Path, spark) -> tuple[Config, RunContext, dict]:
    """The input every benchmark runs on: ``cdr generate`` of N records of ``cfg`` (20% of
    keys contended) into a file store under ``root``, then ingested and fetched (staged).
    The stats also hold the seconds of both steps; the store is ``root/store-N``."""
    store_dir = root / f"store-{n}"
    store_dir.mkdir(parents=True)
    config = parse_config({**cfg, "store": store_dir.as_uri()})
    store = open_store(store_dir.as_uri())
    t = time.perf_counter()
    stats = generate(
        config, store, D, GenerateOptions(events=n, conflict_rate=0.2, files=4, seed=11)
    )
    stats["generate_s"] = time.perf_counter() - t
    ctx = RunContext.create(root / f"work-{n}", D, resolve_now(D, None), "bench")
    ctx.save()
    t = time.perf_counter()
    ingest(config, store, ctx, allow_missing=False)
    fetch(spark, config, ctx)
    stats["ingest_s"] = time.perf_counter() - t
    return config, ctx, stats


def alternate(spark, configs: dict[str, Config], ctx: RunContext, rounds: int) -> tuple[dict, dict]:
    """The resolve stage of each config on the same staged input, the configs alternated,
    ``rounds`` times: each config's seconds per round, and its last summary of ``items``."""
    from pipeline.resolve.stage import resolve_stage

    seconds: dict[str, list[float]] = {k: [] for k in configs}
    summaries = {}
    for _ in range(rounds):
        for name, cfg in configs.items():
            t = time.perf_counter()
            refetch(spark, cfg, ctx)
            summary = resolve_stage(spark, cfg, ctx)
            seconds[name].append(round(time.perf_counter() - t, 1))
            summaries[name] = summary.tables["items"]
    return seconds, summaries


def refetch(spark, config: Config, ctx: RunContext) -> None:
    """Fetch the exports again (the fetch types every record: it is part of what the
    resolve stage pays, measured with it)."""
    (ctx.staged / "fetched.json").unlink()
    for d in ctx.staged.glob("*/replica=*/copies"):
        d.rmtree()
    fetch(spark, config, ctx)


def bench(
    n: int, root: Path, spark, rounds: int = int(os.environ.get("BENCH_ROUNDS", "2"))
) -> dict:
    config, ctx, stats = staged_input(CONFIG, n, root, spark)

    from pipeline.resolve.stage import resolve_stage

    results: dict[str, list[tuple[float, int]]] = {"baseline": [], "resolve": []}
    summaries: list = []  # each round's RunSummary
    store = root / f"store-{n}"

    def resolve() -> None:
        refetch(spark, config, ctx)
        summaries.append(resolve_stage(spark, config, ctx))

    for _ in range(rounds):
        results["baseline"].append(measure(lambda: baseline(spark, store, root / "base-out")))
        results["resolve"].append(measure(resolve))
    best = {k: min(v, key=lambda x: x[0]) for k, v in results.items()}
    records = stats["records"]
    tbl = summaries[-1].tables["items"]
    out = {
        "records": records,
        "distinct_events": tbl.distinct_events,
        "conflicts": sum(sum(o.values()) for o in tbl.conflicts.values()),
        "divergent_keys": sum(tbl.divergent_keys.values()),
        "generate_s": round(stats["generate_s"], 1),
        "ingest_s": round(stats["ingest_s"], 1),
        "baseline_s": [round(x[0], 1) for x in results["baseline"]],
        "resolve_s": [round(x[0], 1) for x in results["resolve"]],
        "baseline_events_per_s": round(records / best["baseline"][0]),
        "resolve_events_per_s": round(records / best["resolve"][0]),
        "baseline_peak_mb": best["baseline"][1] // 2**20,
        "resolve_peak_mb": best["resolve"][1] // 2**20,
        "ratio": round(best["resolve"][0] / best["baseline"][0], 2),
    }
    shutil.rmtree(root / f"store-{n}")
    return out


def main() -> None:
    sizes = [int(a) for a in sys.argv[1:]] or [1_000_000, 4_000_000]
    from pipeline.spark.session import get_spark

    spark = get_spark("local[2]", app="cdr-bench")
    spark.range(1000).selectExpr("sum(id)").collect()  # warm the JVM
    root = Path(tempfile.mkdtemp(prefix="cdr-bench-"))
    try:
        for n in sizes:
            r = bench(n, root, spark)
            print(json.dumps({"n": n, **r}), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
