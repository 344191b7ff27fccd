"""The driver's JVM start (``pipeline/spark/jvm.py``) without a JVM: a small run's options,
and the name of the class-data archive ``make`` builds. (A new driver started from the
archive, and from a damaged one: tests/spark/test_jvmstart.py.)"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import pytest

from pipeline.core.errors import StageError
from pipeline.spark import jars as spark_jars
from pipeline.spark import jvm as jvmstart


def test_driver_options_by_run_size_and_mode(monkeypatch, tmp_path: Path):
    archive = tmp_path / "a.jsa"
    monkeypatch.delenv(jvmstart.START_ENV, raising=False)
    small = jvmstart.driver_options(True, archive)
    assert f"-XX:SharedArchiveFile={archive}" in small
    assert set(jvmstart.SMALL_RUN_OPTIONS) <= set(small)
    large = jvmstart.driver_options(False, None)
    assert not any(o.startswith("-XX:") for o in large)  # a large run keeps the defaults
    assert "-Xlog:all=warning:stderr" in large  # stdout is the report's
    monkeypatch.setenv(jvmstart.START_ENV, "plain")
    assert jvmstart.driver_options(True, archive) == []
    monkeypatch.setenv(jvmstart.START_ENV, "fast")
    with pytest.raises(StageError, match=r"CDR_JVM_START='fast': use one of auto, plain"):
        jvmstart.driver_options(True, archive)


def test_a_small_nights_spark_submit_starts_its_driver_as_a_small_run(monkeypatch, tmp_path):
    """The DAG's resolve stage (spark-submit) gets a small run's options when ingest staged
    a small run, as ``cdr run`` does; a large night keeps the JVM's defaults."""
    archive = tmp_path / "a.jsa"
    monkeypatch.delenv(jvmstart.START_ENV, raising=False)
    monkeypatch.setattr(jvmstart, "usable_archive", lambda: archive)
    small = jvmstart.submit_conf(True)["spark.driver.extraJavaOptions"].split()
    assert set(jvmstart.SMALL_RUN_OPTIONS) <= set(small)
    assert f"-XX:SharedArchiveFile={archive}" in small
    large = jvmstart.submit_conf(False)["spark.driver.extraJavaOptions"].split()
    assert not set(jvmstart.SMALL_RUN_OPTIONS) & set(large)
    monkeypatch.setattr(jvmstart, "usable_archive", lambda: None)
    assert "spark.driver.extraJavaOptions" not in jvmstart.submit_conf(False)
    assert "-XX:TieredStopAtLevel=1" in jvmstart.submit_conf(True)["spark.driver.extraJavaOptions"]


def test_the_archive_is_named_by_the_jdk_build_and_sparks_jars(monkeypatch, tmp_path: Path, caplog):
    jdk, jars = tmp_path / "jdk", tmp_path / "jars"
    jdk.mkdir()
    jars.mkdir()
    (jdk / "release").write_text('JAVA_VERSION="17.0.15"\n')
    (jars / "spark-core.jar").write_bytes(b"x" * 10)
    monkeypatch.setenv("JAVA_HOME", str(jdk))
    monkeypatch.setattr(spark_jars, "spark_jars", lambda: jars)
    monkeypatch.delenv(jvmstart.ARCHIVE_ENV, raising=False)
    first = jvmstart.archive_path()
    assert first is not None and first.parent == Path(sys.prefix) / "share" / "cdr"
    (jdk / "release").write_text('JAVA_VERSION="17.0.16"\n')  # a JDK update
    second = jvmstart.archive_path()
    (jars / "hadoop-aws.jar").write_bytes(b"y")  # a jar added to the classpath
    third = jvmstart.archive_path()
    # pyspark installed again, the same jars: the JVM refuses an archive whose classpath
    # jars have other modification times (it loads every class from the jars again)
    os.utime(jars / "spark-core.jar", (1, 1))
    fourth = jvmstart.archive_path()
    assert len({first, second, third, fourth}) == 4
    monkeypatch.setenv(jvmstart.ARCHIVE_ENV, "off")
    assert jvmstart.archive_path() is None and jvmstart.usable_archive() is None
    monkeypatch.setenv(jvmstart.ARCHIVE_ENV, str(tmp_path / "none.jsa"))
    with caplog.at_level(logging.INFO, logger="pipeline.spark.jvm"):
        assert jvmstart.usable_archive() is None  # named, but not built
    assert "no class-data archive" in caplog.text and "cdr jvm-archive" in caplog.text


def test_a_local_master_reads_local_files_through_the_projects_file_system():
    """In local mode (a run of `cdr`, or the DAG's Spark stages under spark-submit with a
    `local[...]` master) the session uses the project's file system; a cluster's does not
    (its executors load file systems before the driver's jars)."""
    from pipeline.spark.session import LOCAL_FILE_SETTINGS, local_file_settings

    assert local_file_settings("local[2]") == LOCAL_FILE_SETTINGS
    assert local_file_settings("local") == LOCAL_FILE_SETTINGS
    assert local_file_settings("spark://master:7077") == {}
    assert local_file_settings("") == {}  # spark-submit without a master it could tell
