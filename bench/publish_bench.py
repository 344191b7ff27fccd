"""Publish-stage benchmark (issue 14): committing a run's outputs as Delta tables against
Spark writing the same rows as plain Parquet, in one run.

For each size N (event records across the exports of 3 replicas), this script generates
the exports with ``cdr generate`` into a ``file://`` store, runs ingest, resolve and
validate once, then alternates two rounds each of:

- the baseline: Spark reads every output the publish stage publishes (snapshot, state,
  conflicts, quarantine, divergence, ledger) from the run's work folder and writes each
  as plain Parquet under a folder of the store;
- the publish stage (``cdr publish`` of the same run, into an emptied ``published/``
  each round, as a run publishes once): every output's files copied into its Delta table
  by the executors and added to it as they are (one commit per table), the report and
  the ``runs`` row.

It prints the best wall seconds of each, the ratio publish / baseline (target: at most
1.5) and the publish stage's share of the whole run. The machine is shared: read the
ratio, not the seconds.

    .venv/bin/python bench/publish_bench.py            # N = 4M
    .venv/bin/python bench/publish_bench.py 1000000
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("CDR_DRIVER_MEMORY", "6g")
os.environ.setdefault("CDR_SHUFFLE_PARTITIONS", "8")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")

import yaml

from pipeline import stages
from pipeline.app.generate import GenerateOptions, generate
from pipeline.core import layout
from pipeline.core.config_load import parse_config
from pipeline.spark.session import get_spark
from pipeline.storage.context import RunContext
from pipeline.storage.store import open_store
from pipeline.storage.targets import located

sys.path.insert(0, str(Path(__file__).parent))
from resolve_bench import CONFIG, D

OUTPUTS = ("snapshot", "state", "conflicts", "quarantine", "divergence", "ledger")


def timed(fn) -> float:  # type: ignore[no-untyped-def]
    t = time.monotonic()
    fn()
    return time.monotonic() - t


def bench(n: int, rounds: int = 2) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="publish-bench-"))
    try:
        store_dir = tmp / "store"
        store_dir.mkdir()
        raw = {**CONFIG, "store": store_dir.as_uri()}
        (tmp / "cdr.yaml").write_text(yaml.safe_dump(raw))
        config = parse_config(raw)
        store = open_store(store_dir.as_uri())
        generate(config, store, D, GenerateOptions(events=n, conflict_rate=0.2, seed=7))
        spark = get_spark()
        opts = stages.RunOptions(work_dir=tmp / "work", run_id="bench", data_docs=False)
        times: dict[str, float] = {}
        ctx: RunContext | None = None

        def ingest() -> None:
            nonlocal ctx
            ctx = stages.ingest(config, D, opts)

        times["ingest"] = timed(ingest)
        assert ctx is not None
        times["resolve"] = timed(lambda: stages.resolve(config, ctx, spark))
        times["validate"] = timed(lambda: stages.validate(config, ctx))
        table = next(iter(config.tables))

        def baseline(i: int) -> None:
            for kind in OUTPUTS:
                folder = located(ctx.resolved, f"{table}/{kind}")
                if not folder.parquet_files():  # an output no task wrote (its record alone)
                    continue
                df = spark.read.parquet(str(folder))
                df.write.mode("overwrite").parquet(str(store_dir / f"plain-{i}/{kind}"))

        base = [timed(lambda i=i: baseline(i)) for i in range(rounds)]

        def publish() -> None:
            shutil.rmtree(store_dir / "published", ignore_errors=True)  # a run publishes once
            report = stages.publish(config, ctx, spark)
            assert report.status == "published"  # every output committed
            assert {layout.table_path(table, k) for k in OUTPUTS} <= set(report.versions or {})

        pub = [timed(publish) for _ in range(rounds)]
        whole = times["ingest"] + times["resolve"] + times["validate"] + min(pub)
        print(
            f"| {n:,} | {min(base):.2f} | {min(pub):.2f} | {min(pub) / min(base):.3f}x "
            f"| {100 * min(pub) / whole:.1f}% of {whole:.0f} s "
            f"(ingest {times['ingest']:.0f}, resolve {times['resolve']:.0f}, "
            f"validate {times['validate']:.0f}) |",
            flush=True,
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sizes = [int(a) for a in sys.argv[1:]] or [4_000_000]
    print("| records | Spark Parquet write s | publish s | ratio | publish share of the run |")
    print("|---|---|---|---|---|")
    for size in sizes:
        bench(size)
