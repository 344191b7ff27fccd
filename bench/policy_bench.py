"""The resolve stage with a policy extension against the same stage without it, on the same
input, alternated in one Spark session (issue 18's targets: ``order_by`` and two column
groups, each at most 1.2x).

The input is the resolve bench's (``bench/resolve_bench.py``: 3 replicas, every event
exported by each, 20% of keys contended) with one more column, ``updated_at``, which
``cdr generate`` fills with each change's own time for an ``order_by`` table. The plain
run reads the same exports with ``updated_at`` as an ordinary column.

    .venv/bin/python bench/policy_bench.py 4000000
    BENCH_ROUNDS=1 .venv/bin/python bench/policy_bench.py 1000000
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

COLUMNS = {**ITEM_COLUMNS, "updated_at": "timestamp"}
PLAIN = bench_config(COLUMNS)
VARIANTS = {
    "order_by": {"order_by": "updated_at"},
    "column_groups": {"column_groups": {"stock": ["qty", "price"], "label": ["name", "note"]}},
}


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 4_000_000
    rounds = int(os.environ.get("BENCH_ROUNDS", "1"))
    from pipeline.spark.session import get_spark

    spark = get_spark("local[2]", app="cdr-policy-bench")
    spark.range(1000).selectExpr("sum(id)").collect()  # warm the JVM
    root = Path(tempfile.mkdtemp(prefix="cdr-policy-bench-"))
    try:
        ordered = bench_config(COLUMNS, **VARIANTS["order_by"])
        config, ctx, stats = staged_input(ordered, n, root, spark)  # generated with values
        configs = {"plain": parse_config({**PLAIN, "store": config.store}), "order_by": config}
        for name, extra in VARIANTS.items():
            if name not in configs:
                variant = bench_config(COLUMNS, **extra)
                configs[name] = parse_config({**variant, "store": config.store})
        seconds, summaries = alternate(spark, configs, ctx, rounds)
        quarantined = {k: sum(s.quarantined.values()) for k, s in summaries.items()}
        best = {k: min(v) for k, v in seconds.items()}
        print(
            json.dumps(
                {
                    "n": n,
                    "records": stats["records"],
                    "seconds": seconds,
                    "quarantined": quarantined,
                    **{f"ratio_{k}": round(best[k] / best["plain"], 2) for k in VARIANTS},
                }
            ),
            flush=True,
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
