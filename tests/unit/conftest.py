"""tests/unit/: no Spark and no services. The shared fixtures that start them refuse here,
and so does a Spark session started any other way (a stage or ``cdr run`` in process):
such a test belongs in tests/spark/ (or tests/e2e/, tests/airflow/)."""

from __future__ import annotations

import pytest


def _refuse(what: str) -> None:
    pytest.fail(f"{what} in tests/unit/: this test belongs in tests/spark/, e2e/ or airflow/")


@pytest.fixture(scope="session")
def spark():
    _refuse("the Spark session")


@pytest.fixture(scope="session")
def s3_endpoint():
    _refuse("the S3 server")


@pytest.fixture(scope="session")
def airflow_db():
    _refuse("Airflow")


@pytest.fixture(scope="session")
def airflow():
    _refuse("Airflow")


@pytest.fixture(scope="module")
def cluster():
    _refuse("a Spark cluster")


@pytest.fixture(autouse=True)
def _no_spark_session(monkeypatch: pytest.MonkeyPatch) -> None:
    from pyspark.sql import SparkSession

    def refused(self: SparkSession.Builder) -> SparkSession:
        _refuse("a Spark session")
        raise AssertionError  # not reached

    monkeypatch.setattr(SparkSession.Builder, "getOrCreate", refused)
