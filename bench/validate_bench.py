"""The validate stage's row checks: Great Expectations running each SQL check on Spark
(its ``unexpected_rows_expectation``: a count, then a collect of the rows) against the
product's way (``Project.validate_all``: every check of the run in one Spark query, GX
judging the counts), in the same Spark session, on the same resolved run.

The run: the compose stack's config (``docker/cdr.yaml``: 3 tables, foreign keys, CDC)
on a ``file://`` store, ``cdr generate`` of N events, ingested and resolved in this
process. Each way runs ``rounds`` times after one warm-up round of each; the median is
reported, and the two ways must agree on every check's count.

    .venv/bin/python bench/validate_bench.py [events] [rounds]
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import Any

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("CDR_SHUFFLE_PARTITIONS", "2")

import yaml

from pipeline.app.cli import main
from pipeline.core.config_load import load_config
from pipeline.resolve.stage import load_summary
from pipeline.spark.session import get_spark
from pipeline.storage.context import RunContext
from pipeline.validate.stage import Frames
from pipeline.validate.suites import SUITES, Project, is_row_suite, load_template, render_suite

ROOT = Path(__file__).resolve().parent.parent
D = "2026-11-21"


def resolved_run(tmp: Path, events: int) -> tuple[Any, RunContext]:
    config = yaml.safe_load((ROOT / "docker" / "cdr.yaml").read_text())
    config["store"] = (tmp / "store").as_uri()
    (tmp / "cdr.yaml").write_text(yaml.safe_dump(config))
    base = ["--config", str(tmp / "cdr.yaml"), "--date", D]
    work = ["--work-dir", str(tmp / "work"), "--run-id", "bench"]
    assert main(["generate", *base, "--events", str(events), "--seed", "1"]) == 0
    assert main(["ingest", *base, *work]) == 0
    assert main(["resolve", *base, *work]) == 0
    ctx = RunContext.load(tmp / "work", date.fromisoformat(D), "bench")
    return ctx.config(load_config(tmp / "cdr.yaml")), ctx


def gx_on_spark(root: Path, batches: list[tuple[Any, dict[str, Any]]]) -> list[int]:
    """GX's own way: each suite as written, validated on its Spark DataFrame."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="file", project_root_dir=str(root))
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    source = context.data_sources.add_spark(name="spark", persist=False)
    batch = source.add_dataframe_asset(name="batch").add_batch_definition_whole_dataframe("all")
    counts = []
    for df, suite in batches:
        context.suites.add_or_update(gx.ExpectationSuite(**suite))
        vd = context.validation_definitions.add_or_update(
            gx.ValidationDefinition(
                name=suite["name"], data=batch, suite=context.suites.get(suite["name"])
            )
        )
        result = vd.run(batch_parameters={"dataframe": df}, result_format="COMPLETE")
        counts += [r.result["observed_value"] for r in result.results]
    return counts


def main_bench(events: int, rounds: int) -> None:
    spark = get_spark()
    with tempfile.TemporaryDirectory() as tmp:
        config, ctx = resolved_run(Path(tmp), events)
        frames = Frames(spark, config, ctx, load_summary(ctx))
        batches = []
        for name in SUITES:
            template = load_template(name)
            for table in config.tables.values():
                suite = render_suite(template, table)
                if is_row_suite(suite):
                    batches.append((frames.batch(template["meta"]["batch"], table), suite))
        checks = sum(len(s["expectations"]) for _, s in batches)
        project = Project(Path(tmp) / "p", Path(tmp) / "docs")

        def ours() -> list[int]:
            return [c.observed for cs in project.validate_all(batches) for c in cs]

        times: dict[str, list[float]] = {"gx": [], "ours": []}
        for i in range(rounds + 1):
            started = time.perf_counter()
            want = gx_on_spark(Path(tmp) / f"gx{i}", batches)
            gx_s = time.perf_counter() - started
            started = time.perf_counter()
            got = ours()
            ours_s = time.perf_counter() - started
            assert got == want, (got, want)
            if i:  # the first round warms up
                times["gx"].append(gx_s)
                times["ours"].append(ours_s)
    gx_s, ours_s = statistics.median(times["gx"]), statistics.median(times["ours"])
    print(
        f"{events} events, {len(batches)} row suites, {checks} checks: "
        f"GX on Spark {gx_s:.1f} s, one query + GX on the counts {ours_s:.1f} s, "
        f"ratio {ours_s / gx_s:.2f} (median of {rounds})"
    )


if __name__ == "__main__":
    main_bench(
        int(sys.argv[1]) if len(sys.argv) > 1 else 30, int(sys.argv[2]) if len(sys.argv) > 2 else 3
    )
