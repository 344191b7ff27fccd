"""Cell-granularity resolve (the ``scylla`` preset) against the bare window dedupe.

A table of 8 columns with ``policy: scylla``; N event records across the exports of 3
replicas, 20% of keys contended (2-5 events close in time), 10% of writes with a TTL, 5%
writing a null. In ONE Spark session it alternates the baseline of
``bench/resolve_bench.py`` (``row_number()`` over the key by ts, keep the first, write
Parquet) and ``cdr resolve`` on the same staged input, and prints the best time of each,
events per second, peak memory and the ratio. The issue's target: within 3x.

    .venv/bin/python bench/cell_bench.py             # N = 4M
    BENCH_ROUNDS=1 .venv/bin/python bench/cell_bench.py 1000000
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from resolve_bench import baseline, measure, refetch, staged_input

from tests.helpers import configs  # resolve_bench put the repository's root on sys.path

COLUMNS = {
    "id": "bigint",
    "user_name": "string",
    "device": "string",
    "token": "string",
    "hits": "int",
    "score": "double",
    "price": "decimal(12,2)",
    "active": "boolean",
}
CONFIG = configs.config(
    {"sessions": configs.table(COLUMNS, policy="scylla")}, replicas=("r1", "r2", "r3")
)


def bench(n: int, root: Path, spark, rounds: int) -> dict:
    config, ctx, stats = staged_input(CONFIG, n, root, spark)

    from pipeline.resolve.stage import resolve_stage

    results: dict[str, list[tuple[float, int]]] = {"baseline": [], "resolve": []}
    summaries: list = []  # each round's RunSummary
    store = root / f"store-{n}"

    def resolve() -> None:
        refetch(spark, config, ctx)
        summaries.append(resolve_stage(spark, config, ctx))

    for _ in range(rounds):
        results["baseline"].append(
            measure(lambda: baseline(spark, store, root / "base-out", "sessions"))
        )
        results["resolve"].append(measure(resolve))
    best = {k: min(v, key=lambda x: x[0]) for k, v in results.items()}
    tbl = summaries[-1].tables["sessions"]
    records = stats["records"]
    shutil.rmtree(root / f"store-{n}")
    return {
        "records": records,
        "distinct_events": tbl.distinct_events,
        "conflicts": sum(sum(o.values()) for o in tbl.conflicts.values()),
        "discarded": tbl.discarded,
        "baseline_s": [round(x[0], 1) for x in results["baseline"]],
        "resolve_s": [round(x[0], 1) for x in results["resolve"]],
        "resolve_events_per_s": round(records / best["resolve"][0]),
        "baseline_peak_mb": best["baseline"][1] // 2**20,
        "resolve_peak_mb": best["resolve"][1] // 2**20,
        "ratio": round(best["resolve"][0] / best["baseline"][0], 2),
    }


def main() -> None:
    sizes = [int(a) for a in sys.argv[1:]] or [4_000_000]
    rounds = int(os.environ.get("BENCH_ROUNDS", "2"))
    from pipeline.spark.session import get_spark

    spark = get_spark("local[2]", app="cdr-cell-bench")
    spark.range(1000).selectExpr("sum(id)").collect()  # warm the JVM
    root = Path(tempfile.mkdtemp(prefix="cdr-cell-bench-"))
    try:
        for n in sizes:
            print(json.dumps({"n": n, **bench(n, root, spark, rounds)}), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
