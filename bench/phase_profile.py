"""Where a ``cdr run`` spends its time (issue 15, "measure first"): for each phase of a
run, its seconds and its Spark jobs, at a given size.

The phases are the pipeline's own functions (below), wrapped for the run: each call sets
a Spark job group named after its phase, so the event log attributes every job to the
innermost phase that ran it; seconds are the phase's own (its sub-phases' taken out).
One table (the resolve bench's, 3 replicas, ``postgres`` policy with perspectives),
generated exports of N event records on a ``file://`` store, a whole run: ingest,
resolve, validate (Great Expectations, no Data Docs), publish. The first size pays the
JVM's warm-up: pass a small size first to see a warm run. Spark is lazy: a phase's
seconds include the work of the earlier phases whose DataFrames its first action
computes (the fold job computes the shuffle of the typed copies).

    .venv/bin/python bench/phase_profile.py 3 3 1000000
    BENCH_TABLE=cells .venv/bin/python bench/phase_profile.py 1000000   # cell_bench's table
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

os.environ.setdefault("CDR_DRIVER_MEMORY", "6g")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")

import yaml

from pipeline import stages
from pipeline.app.generate import GenerateOptions, generate
from pipeline.changes import cdc
from pipeline.core.config_load import parse_config
from pipeline.ingest import copies, fetch
from pipeline.resolve import engine, foreign_keys, snapshots
from pipeline.resolve import stage as resolve
from pipeline.resolve.cells import stage as cell_stage
from pipeline.spark.session import get_spark
from pipeline.storage.store import open_store
from pipeline.validate import stage as validation

sys.path.insert(0, str(Path(__file__).parent))
from resolve_bench import CONFIG, D

if os.environ.get("BENCH_TABLE") == "cells":
    from cell_bench import CONFIG

#: (module, function, phase): the phases a run goes through, outermost first
PHASES = [
    (stages, "ingest", "ingest"),
    (stages, "resolve", "resolve (rest)"),
    (fetch, "fetch", "fetch and type exports (Spark tasks)"),
    (copies, "read_copies", "read copies"),
    (engine, "with_seen", "ledger dedupe"),
    (engine, "resolve_rows", "row engine (rest)"),
    (engine, "split_special", "special copies and key changes"),
    (engine, "coupled_keys", "coupled keys"),
    (engine, "fold", "fold and write (one job)"),
    (cell_stage, "_settled", "cell engine: resolve and persist, disputes"),
    (resolve, "_write", "writes (cell engine, snapshot)"),
    (engine, "split_events", "events two fold tasks saw"),
    (engine, "write_ledger", "ledger (row engine: only for events two tasks saw)"),
    (resolve, "write_ledger", "ledger (cell engine)"),
    (resolve, "_table_counts", "counts"),
    (foreign_keys, "check_foreign_keys", "foreign keys"),
    (snapshots, "compare_snapshots", "snapshot comparison"),
    (cdc, "cdc_stage", "CDC log"),
    (validation, "measure_stage", "validate: measure (Spark, in the resolve job)"),
    (stages, "validate", "validate (rest)"),
    (validation, "_read", "validate: reads"),
    (validation, "judge_stage", "validate: judge (GX, no Spark)"),
    (stages, "publish", "publish"),
]

own: dict[str, float] = defaultdict(float)
calls: dict[str, int] = defaultdict(int)
_stack: list[list[Any]] = []  # [phase, started, time in sub-phases]


def _wrap(fn: Any, phase: str) -> Any:
    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        sc = get_spark().sparkContext
        _stack.append([phase, time.perf_counter(), 0.0])
        sc.setJobGroup(phase, phase)
        try:
            return fn(*args, **kwargs)
        finally:
            name, started, inner = _stack.pop()
            spent = time.perf_counter() - started
            own[name] += spent - inner
            calls[name] += 1
            if _stack:
                _stack[-1][2] += spent
                sc.setJobGroup(_stack[-1][0], _stack[-1][0])
            else:
                sc.setJobGroup("driver", "driver")

    return wrapped


def _instrument() -> None:
    """Wrap each phase where it is defined and wherever it was imported by name."""
    for module, name, phase in PHASES:
        original = getattr(module, name)
        wrapped = _wrap(original, phase)
        if isinstance(module, type):  # a method
            setattr(module, name, wrapped)
            continue
        for m in list(sys.modules.values()):
            if getattr(m, "__name__", "").startswith("pipeline") and (
                getattr(m, name, None) is original
            ):
                setattr(m, name, wrapped)


def _jobs(log_dir: Path) -> dict[str, int]:
    """Spark jobs per job group, from the event log of the session."""
    out: dict[str, int] = defaultdict(int)
    for f in log_dir.rglob("events_*"):  # a folder per session, files that roll over
        for line in f.open():
            if not line.endswith("\n"):
                continue  # being written
            e = json.loads(line)
            if e["Event"] == "SparkListenerJobStart":
                out[e.get("Properties", {}).get("spark.jobGroup.id") or "driver"] += 1
    return out


def profile(n: int, events_dir: Path) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="phase-profile-"))
    try:
        raw = {**CONFIG, "store": (tmp / "store").as_uri()}
        config = parse_config(raw)
        (tmp / "store").mkdir()
        store = open_store(raw["store"])
        generate(config, store, D, GenerateOptions(events=n, conflict_rate=0.2, seed=7))
        (tmp / "cdr.yaml").write_text(yaml.safe_dump(raw))
        opts = stages.RunOptions(work_dir=tmp / "work", run_id=f"p{n}", data_docs=False)
        own.clear()
        calls.clear()
        before = _jobs(events_dir)
        started = time.perf_counter()
        stages.run(config, D, opts, get_spark())
        whole = time.perf_counter() - started
        jobs = {k: v - before.get(k, 0) for k, v in _jobs(events_dir).items()}
        print(f"\n{n:,} event records: {whole:.1f} s, {sum(jobs.values())} Spark jobs\n")
        print("| phase | calls | own s | Spark jobs |")
        print("|---|---|---|---|")
        for _m, _f, phase in PHASES:
            if calls.get(phase):
                print(f"| {phase} | {calls[phase]} | {own[phase]:.2f} | {jobs.get(phase, 0)} |")
        print(
            f"| outside the phases | | {whole - sum(own.values()):.2f} | {jobs.get('driver', 0)} |"
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    events_dir = Path(tempfile.mkdtemp(prefix="phase-profile-events-"))
    # settings to try come in PYSPARK_SUBMIT_ARGS too: "--conf k=v pyspark-shell"
    tried = os.environ.get("PYSPARK_SUBMIT_ARGS", "").replace("pyspark-shell", "")
    os.environ["PYSPARK_SUBMIT_ARGS"] = (  # read when the JVM starts, in get_spark()
        f"{tried} --conf spark.eventLog.enabled=true --conf spark.eventLog.compress=false "
        f"--conf spark.eventLog.dir={events_dir.as_uri()} "
        "pyspark-shell"
    )
    get_spark()
    _instrument()
    for size in [int(a) for a in sys.argv[1:]] or [3, 3, 1_000_000]:
        profile(size, events_dir)
    get_spark().stop()  # the event log is closed before its folder goes
    shutil.rmtree(events_dir, ignore_errors=True)
