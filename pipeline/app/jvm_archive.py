"""``cdr jvm-archive``: the class-data archive of ``pipeline.spark.jvm`` built by running a
small workload (a generated night through the whole pipeline) in a JVM that dumps the
classes it loaded, and the JVM's code-cache figures the build reports. It lives in
``app/`` because its workload is a whole run; how a driver uses the archive is
``pipeline.spark.jvm``'s.
"""

from __future__ import annotations

import logging
import os
import tempfile
from datetime import date
from pathlib import Path
from typing import Any

from pipeline.app.generate import GenerateOptions, generate
from pipeline.core.errors import StageError
from pipeline.spark.jvm import ARCHIVE_ENV, CODE_CACHE_HEADROOM, archive_path
from pipeline.spark.session import get_spark
from pipeline.storage.store import open_store

#: the archive's workload: the demo's tables (a foreign key, a unique and a delta
#: column, the CDC log) and a cell table, a few events each
WORKLOAD_EVENTS = 120


def build() -> Path:
    """``cdr jvm-archive``: run a small workload in a JVM that writes the classes it
    loaded to an archive when it exits, then put the archive in place (whole, or not at
    all: a JVM cannot start with a file cut short)."""

    target = archive_path()
    if target is None:
        raise StageError(f"{ARCHIVE_ENV}=off: no archive to build")
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(f".{target.name}.{os.getpid()}.part")
    part.unlink(missing_ok=True)
    quiet = logging.getLogger("pipeline")  # the workload's run is not the news
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        with tempfile.TemporaryDirectory(prefix="cdr-jvm-archive-") as tmp:
            spark = get_spark("local[*]", app="cdr-jvm-archive", small=True, dump=part)
            try:
                _workload(spark, Path(tmp))
                peak, size = code_cache(spark)
            finally:
                code = stop_jvm(spark)
        if peak > size * CODE_CACHE_HEADROOM:
            raise StageError(
                f"the archive's workload used {peak >> 20} MB of the driver's "
                f"{size >> 20} MB of code cache: raise -XX:ReservedCodeCacheSize in "
                "pipeline.spark.jvm.SMALL_RUN_OPTIONS"
            )
        if code != 0 or not part.is_file() or part.stat().st_size == 0:
            raise StageError(f"the JVM wrote no class-data archive (exit status {code})")
        os.replace(part, target)
        for old in target.parent.glob("jvm-classes-*.jsa"):  # for another JDK or jars
            if old != target:
                old.unlink(missing_ok=True)
    finally:
        quiet.setLevel(level)
        part.unlink(missing_ok=True)
    return target


def _workload(spark: object, tmp: Path) -> None:

    import yaml

    from pipeline.app.demo import DEMO_CONFIG  # deferred: loads moto, pydantic, pyspark, yaml
    from pipeline.core.config_load import load_config  # deferred: loads pydantic, yaml
    from pipeline.stages import (  # deferred: loads pyspark
        RunOptions,
        run,
    )

    store = tmp / "store"
    store.mkdir()
    tables: dict[str, Any] = {**DEMO_CONFIG["tables"]}  # type: ignore[dict-item]
    tables["stock"] = {
        "key": ["sku"],
        "columns": {"sku": "bigint", "label": "string", "qty": "int"},
        "policy": "scylla",
    }
    path = tmp / "cdr.yaml"
    path.write_text(yaml.safe_dump({**DEMO_CONFIG, "store": store.as_uri(), "tables": tables}))
    config = load_config(path)
    dt = date(2026, 1, 15)
    generate(config, open_store(store.as_uri()), dt, GenerateOptions(events=WORKLOAD_EVENTS))
    run(config, dt, RunOptions(work_dir=tmp / "work", data_docs=False), spark)  # type: ignore[arg-type]


def code_cache(spark: Any) -> tuple[int, int]:
    """The driver JVM's code cache: the most it held, and its size (bytes)."""
    beans = spark._jvm.java.lang.management.ManagementFactory.getMemoryPoolMXBeans()
    heaps = [b for b in beans if str(b.getName()).startswith(("CodeCache", "CodeHeap"))]
    return (
        sum(int(b.getPeakUsage().getUsed()) for b in heaps),
        sum(int(b.getUsage().getMax()) for b in heaps),
    )


def stop_jvm(spark: object) -> int:
    """Stop the session and wait for its JVM to exit (it writes the archive then);
    returns its exit status."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    spark.stop()  # type: ignore[attr-defined]
    proc = getattr(gateway, "proc", None)
    if proc is None:  # a JVM this process did not launch
        return 0
    proc.stdin.close()  # the gateway exits at the end of its input
    return int(proc.wait(timeout=600))
