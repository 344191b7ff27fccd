"""What ``history: true`` costs a run's publishing (issue 18's target: at most 1.5x), on the
resolve bench's input (``bench/resolve_bench.py``: 3 replicas, every event exported by
each, 20% of keys contended), in one Spark session, alternating the two configs.

A round resolves the run (into an emptied ``published/``), then times what publishing
takes from the resolved run. Printed: ``ratio_commit``, the publish stage itself
(``stages.publish``: the Delta commits, the report, the ``runs`` row); ``ratio_publish``,
everything after the resolve stage: the history stage (``history.history_stage``, the
Spark job that builds the table from the run's changes, in the resolve task) and the
publish stage (delta-spark's commits), against the publish stage without history; the
history stage's
share of the resolve stage; ``ratio_resolve``, what recording the changes (which the
history needs, as the CDC log does) costs the resolve stage; and
``ratio_resolve_and_publish``, all of it: the resolve stage and everything after it.

    .venv/bin/python bench/history_bench.py 4000000
    BENCH_ROUNDS=1 .venv/bin/python bench/history_bench.py 1000000
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("CDR_DRIVER_MEMORY", "6g")
os.environ.setdefault("CDR_SHUFFLE_PARTITIONS", "8")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")

from resolve_bench import CONFIG, bench_config, staged_input

from pipeline import stages
from pipeline.core import layout
from pipeline.core.config import Config
from pipeline.core.config_load import parse_config
from pipeline.storage.context import RunContext

HISTORY = bench_config(history=True)


def one_round(spark, config: Config, ctx: RunContext, store: Path) -> dict[str, float]:  # type: ignore[no-untyped-def]
    from pipeline.changes.history import history_stage
    from pipeline.resolve.stage import resolve_stage, save_summary
    from pipeline.validate.stage import measure_stage

    shutil.rmtree(store / layout.PUBLISHED, ignore_errors=True)  # a run publishes once
    t = time.perf_counter()
    summary = resolve_stage(spark, config, ctx)
    resolved = time.perf_counter()
    if config.tables["items"].history is not None:
        summary = history_stage(spark, config, ctx, summary)
        save_summary(ctx, summary)
    built = time.perf_counter()
    measure_stage(spark, config, ctx, summary)
    assert stages.validate(config, ctx).passed
    judged = time.perf_counter()
    report = stages.publish(config, ctx, spark)
    done = time.perf_counter()
    assert report.status == "published"
    return {
        "resolve": round(resolved - t, 1),
        "history": round(built - resolved, 1),
        "commit": round(done - judged, 1),
        "publish": round((built - resolved) + (done - judged), 1),
        "rows": summary.tables["items"].history.get("rows", 0),
    }


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 4_000_000
    rounds = int(os.environ.get("BENCH_ROUNDS", "2"))
    from pipeline.spark.session import get_spark

    spark = get_spark("local[2]", app="cdr-history-bench")
    spark.range(1000).selectExpr("sum(id)").collect()  # warm the JVM
    root = Path(tempfile.mkdtemp(prefix="cdr-history-bench-"))
    try:
        config, ctx, stats = staged_input(CONFIG, n, root, spark)
        store = root / f"store-{n}"
        configs = {"plain": config, "history": parse_config({**HISTORY, "store": config.store})}
        runs: dict[str, list[dict[str, float]]] = {k: [] for k in configs}
        for _ in range(rounds):
            for name, cfg in configs.items():
                runs[name].append(one_round(spark, cfg, ctx, store))
        best = {k: {m: min(r[m] for r in v) for m in v[0]} for k, v in runs.items()}
        plain, hist = best["plain"], best["history"]
        print(
            json.dumps(
                {
                    "n": n,
                    "records": stats["records"],
                    "rounds": runs,
                    "history_rows": hist["rows"],
                    "ratio_commit": round(hist["commit"] / plain["commit"], 2),
                    "ratio_publish": round(hist["publish"] / plain["publish"], 2),
                    "history_share_of_resolve": round(hist["history"] / hist["resolve"], 2),
                    "ratio_resolve": round(hist["resolve"] / plain["resolve"], 2),
                    "ratio_resolve_and_publish": round(
                        (hist["resolve"] + hist["publish"]) / (plain["resolve"] + plain["publish"]),
                        2,
                    ),
                }
            ),
            flush=True,
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
