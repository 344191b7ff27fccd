"""The CDC and validate stages against the resolve stage of the same run, on the
foundation's input.

The input of ``bench/resolve_bench.py`` (one row table, 3 replicas, every event exported
by every replica, 20% of keys contended), with ``cdc.enabled`` (16 vnodes, 4 shards,
pre- and post-images). In ONE Spark session and on the same staged input it runs:

- ``resolve off``: the resolve stage with the CDC log off (what the change capture
  costs is the difference with the next one);
- ``resolve``: the resolve stage with the CDC log on (it records every change);
- ``cdc``: the CDC stage of that run (tokens, streams, timeuuids, images, batches, the
  sorted log and the description tables);
- ``validate``: the validate stage of that run (every Great Expectations suite, the CDC
  replay on Spark, the Data Docs).

A small run first warms the JVM up on the same plans. It prints wall seconds, peak
memory of the process tree and the ratios. The issues' targets: the CDC stage under 50%
of the resolve stage; the validate stage reported beside it. Machines here are shared
and noisy: read the ratios.

    .venv/bin/python bench/cdc_bench.py               # N = 4M
    .venv/bin/python bench/cdc_bench.py 1000000
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from resolve_bench import CONFIG, measure, staged_input

CDC = {"enabled": True, "vnodes": 16, "shards": 4, "preimage": True, "postimage": True}


def bench(n: int, root: Path, spark) -> dict:
    from pipeline.changes.cdc import cdc_stage
    from pipeline.resolve.stage import resolve_stage
    from pipeline.validate.stage import validate_stage

    config, ctx, stats = staged_input({**CONFIG, "cdc": CDC}, n, root, spark)
    off = dataclasses.replace(config, cdc=dataclasses.replace(config.cdc, enabled=False))

    summaries: list = []
    resolve_off = measure(lambda: resolve_stage(spark, off, ctx))
    resolve_on = measure(lambda: summaries.append(resolve_stage(spark, config, ctx)))
    cdc: dict = {}
    cdc_run = measure(lambda: cdc.update(cdc_stage(spark, config, ctx, summaries[0])))
    summary = dataclasses.replace(summaries[0], cdc=cdc)
    verdict: list = []
    validate_run = measure(lambda: verdict.append(validate_stage(spark, config, ctx, summary)))
    tbl = summary.tables["items"]
    shutil.rmtree(root / f"store-{n}")
    return {
        "records": stats["records"],
        "distinct_events": tbl.distinct_events,
        "applied": tbl.applied,
        "log_rows": cdc["tables"]["items"]["log_rows"],
        "resolve_off_s": round(resolve_off[0], 1),
        "resolve_s": round(resolve_on[0], 1),
        "cdc_s": round(cdc_run[0], 1),
        "capture_overhead": round(resolve_on[0] / resolve_off[0] - 1, 3),
        "cdc_over_resolve": round(cdc_run[0] / resolve_on[0], 3),
        "validate_s": round(validate_run[0], 1),
        "validate_over_resolve": round(validate_run[0] / resolve_on[0], 3),
        "suites": len(verdict[0].suites),
        "failed_checks": verdict[0].failures,
        "resolve_peak_mb": resolve_on[1] // 2**20,
        "cdc_peak_mb": cdc_run[1] // 2**20,
        "validate_peak_mb": validate_run[1] // 2**20,
    }


def main() -> None:
    sizes = [int(a) for a in sys.argv[1:]] or [4_000_000]
    from pipeline.spark.session import get_spark

    spark = get_spark("local[2]", app="cdr-bench")
    spark.range(1000).selectExpr("sum(id)").collect()  # warm the JVM
    root = Path(tempfile.mkdtemp(prefix="cdr-bench-"))
    try:
        bench(60_000, root, spark)  # warm-up: the JIT has seen every plan once
        for n in sizes:
            t = time.perf_counter()
            r = bench(n, root, spark)
            print(json.dumps({"n": n, **r, "total_s": round(time.perf_counter() - t)}), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
