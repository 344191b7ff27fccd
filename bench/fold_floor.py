"""The floor of the row engine: the resolve stage with the Python fold of the contended
keys taken out, against the same stage whole and the bare window dedupe.

``bench/resolve_bench.py`` measures the resolve stage (the fetch included) against a
bare Spark window dedupe. This script runs, alternated in one Spark session on the same
staged input:

- ``baseline``: the bare window dedupe (``resolve_bench.baseline``);
- ``resolve``: the resolve stage as it is;
- ``floor``: the same stage, but each fold task drops its contended keys' groups instead
  of folding them in Python (``fold_task._Stream.fold_python`` does nothing, patched in
  the task's process). Everything else runs: the fetch, the shuffle by key and its sort,
  the Arrow stream to the Python tasks, the quiet rows and lone inserts written as Arrow
  columns, and the steps after the fold job (over fewer output rows).

``floor`` is the least any redesign of the contended keys' fold can cost, in any
language, inside this stage: what the fetch, the one shuffle and the rest cost
without it. Its outputs are incomplete: it is a measure, not a run.

    BENCH_RESOLVERS=timestamps .venv/bin/python bench/fold_floor.py 1000000
    BENCH_ROUNDS=1 .venv/bin/python bench/fold_floor.py 4000000
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from resolve_bench import CONFIG, baseline, measure, refetch, staged_input

import pipeline.resolve.engine


def _fold_function(floor: bool):
    """``fold_task.fold_function``; with ``floor``, the contended groups are dropped in the
    task. Python workers are reused, so each task sets the fold it needs."""

    def make(job, single_group: bool):
        from pipeline.resolve.fold_task import fold_function

        whole = fold_function(job, single_group)

        def run(batches):
            from pipeline.resolve import fold_task

            stream = fold_task._Stream
            kept = fold_task.__dict__.setdefault("_bench_fold_python", stream.fold_python)
            stream.fold_python = (lambda self, groups: None) if floor else kept
            yield from whole(batches)

        return run

    return make


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    rounds = int(os.environ.get("BENCH_ROUNDS", "2"))
    from pipeline.resolve.stage import resolve_stage
    from pipeline.spark.session import get_spark

    spark = get_spark("local[2]", app="cdr-bench")
    spark.range(1000).selectExpr("sum(id)").collect()  # warm the JVM
    root = Path(tempfile.mkdtemp(prefix="cdr-bench-"))
    whole_fold = pipeline.resolve.engine.fold_function
    try:
        config, ctx, stats = staged_input(CONFIG, n, root, spark)
        store = root / f"store-{n}"

        def resolve(floor: bool):
            def go() -> None:
                pipeline.resolve.engine.fold_function = _fold_function(floor)
                try:
                    refetch(spark, config, ctx)
                    resolve_stage(spark, config, ctx)
                finally:
                    pipeline.resolve.engine.fold_function = whole_fold

            return go

        runs: dict[str, list[float]] = {"baseline": [], "resolve": [], "floor": []}
        for _ in range(rounds):
            runs["baseline"].append(measure(lambda: baseline(spark, store, root / "b"))[0])
            runs["resolve"].append(measure(resolve(False))[0])
            runs["floor"].append(measure(resolve(True))[0])
        best = {k: min(v) for k, v in runs.items()}
        print(
            json.dumps(
                {
                    "n": n,
                    "records": stats["records"],
                    **{f"{k}_s": [round(x, 1) for x in v] for k, v in runs.items()},
                    "resolve_ratio": round(best["resolve"] / best["baseline"], 2),
                    "floor_ratio": round(best["floor"] / best["baseline"], 2),
                }
            ),
            flush=True,
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
