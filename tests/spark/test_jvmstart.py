"""The driver's JVM start (``pipeline/spark/jvm.py``): the class-data archive ``make``
builds, and a damaged archive that must not stop a run.

The two process tests start a new driver JVM each (about 5 s): the archive's point is
what a new process does, which the shared session cannot show."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pipeline.spark import jvm as jvmstart

#: a new process starts a small run's session and runs one job, and prints its code
#: cache's size; the JVM logs where each class came from
START = (
    "from pipeline.spark.session import get_spark; "
    "from pipeline.app.jvm_archive import code_cache; "
    "s = get_spark(small=True); s.range(3).count(); print(code_cache(s)[1])"
)


def _start(tmp_path: Path, **env: str) -> tuple[str, str, str]:
    """Start a driver in a new process; returns where SparkContext's class came from
    (the class-load log of the driver's JVM, ``JDK_JAVA_OPTIONS``), the stdout and the
    stderr."""
    logs = tmp_path / "classes"
    logs.mkdir(parents=True)
    done = subprocess.run(
        [sys.executable, "-c", START],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={
            **os.environ,
            **env,
            "JDK_JAVA_OPTIONS": f"-Xlog:class+load=info:file={logs}/jvm-%p.log",
        },
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for log in logs.glob("jvm-*.log"):
        for line in log.read_text().splitlines():
            if " org.apache.spark.SparkContext source: " in line:
                return line.split(" source: ", 1)[1], done.stdout, done.stderr
    raise AssertionError("no driver JVM loaded SparkContext")


def test_a_new_driver_maps_sparks_classes_from_the_archive(tmp_path: Path):
    archive = jvmstart.usable_archive()
    assert archive is not None, "no class-data archive: `make test` builds it (cdr jvm-archive)"
    source, stdout, _ = _start(tmp_path / "archive")
    assert source == "shared objects file (top)"  # the archive on top of the JDK's own
    # the first JIT tier alone would reserve a client VM's 48 MB, which a small run of many
    # tables fills (Spark passes -XX:+IgnoreUnrecognizedVMOptions: a misspelt flag is lost)
    assert int(stdout.split()[-1]) >= 240 << 20
    source, _, _ = _start(tmp_path / "plain", CDR_JVM_START="plain")
    assert "/pyspark/jars/spark-core" in source  # read from its jar


def test_a_damaged_archive_is_refused_and_the_driver_starts_without_it(tmp_path: Path):
    """A file cut short stops the JVM before Spark starts (it cannot be mapped): the
    driver starts again without it, and says so."""
    archive = jvmstart.usable_archive()
    assert archive is not None, "no class-data archive: `make test` builds it (cdr jvm-archive)"
    cut = tmp_path / "cut.jsa"
    with archive.open("rb") as f:
        cut.write_bytes(f.read(1 << 20))
    source, _, stderr = _start(tmp_path, CDR_JVM_ARCHIVE=str(cut))
    assert "/pyspark/jars/spark-core" in source
    assert f"the JVM did not start with {cut}; starting it without" in stderr
    assert not list(tmp_path.glob("hs_err*"))  # its crash report is not left where it ran
