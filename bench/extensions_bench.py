"""The resolve stage of a table with ``merge`` columns and a custom resolver against the same
stage without them, on the same input, alternated in one Spark session (issue 51's target:
at most 1.3x).

The input is the resolve bench's (``bench/resolve_bench.py``: 3 replicas, every event
exported by each, 20% of keys contended). The variants: ``merge: {qty: max, price: min}``;
``insert_exists`` and ``update_differ`` resolved by ``bench/resolvers.py:latest`` (the
function is called for every such conflict, twice in the converged fold: once more with
the sides swapped, the asymmetry check); and both.

    .venv/bin/python bench/extensions_bench.py 1000000
    BENCH_ROUNDS=2 .venv/bin/python bench/extensions_bench.py 1000000
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("CDR_DRIVER_MEMORY", "6g")
os.environ.setdefault("CDR_SHUFFLE_PARTITIONS", "8")

from resolve_bench import ITEM_COLUMNS, alternate, bench_config, staged_input

from pipeline.core.config_load import parse_config

CUSTOM = {"python": "bench.resolvers:latest"}
VARIANTS: dict[str, dict] = {
    "merge": {"merge": {"qty": "max", "price": "min"}},
    "custom": {"resolvers": {"insert_exists": CUSTOM, "update_differ": CUSTOM}},
}
VARIANTS["merge_custom"] = {**VARIANTS["merge"], **VARIANTS["custom"]}


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    rounds = int(os.environ.get("BENCH_ROUNDS", "1"))
    from pipeline.spark.session import get_spark

    spark = get_spark("local[2]", app="cdr-extensions-bench")
    spark.range(1000).selectExpr("sum(id)").collect()  # warm the JVM
    root = Path(tempfile.mkdtemp(prefix="cdr-extensions-bench-"))
    try:
        config, ctx, stats = staged_input(bench_config(ITEM_COLUMNS), n, root, spark)
        configs = {"plain": config}
        for name, extra in VARIANTS.items():
            variant = bench_config(ITEM_COLUMNS, **extra)
            configs[name] = parse_config({**variant, "store": config.store})
        seconds, summaries = alternate(spark, configs, ctx, rounds)
        counts = {
            name: {
                "conflicts": sum(sum(o.values()) for o in s.conflicts.values()),
                "quarantined": sum(s.quarantined.values()),
                "asymmetric": dict(s.asymmetric),
            }
            for name, s in summaries.items()
        }
        best = {k: min(v) for k, v in seconds.items()}
        print(
            json.dumps(
                {
                    "n": n,
                    "records": stats["records"],
                    "seconds": seconds,
                    "counts": counts,
                    **{f"ratio_{k}": round(best[k] / best["plain"], 2) for k in VARIANTS},
                }
            ),
            flush=True,
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
