"""Shared fixtures: one Spark session for the whole run (UI off, few partitions) and one
real S3 HTTP server on loopback (moto's server mode, a child process)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import deltalake  # noqa: F401  (loaded before duckdb, or the process aborts at exit)
import pytest

os.environ.setdefault("CDR_SHUFFLE_PARTITIONS", "2")
os.environ.setdefault("CDR_DRIVER_MEMORY", "2g")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")


@pytest.fixture(scope="session")
def spark():
    from pipeline.spark import get_spark

    session = get_spark("local[2]", app="cdr-tests")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    from pipeline.s3server import restore_env, s3_server, use_endpoint

    with s3_server() as endpoint:
        previous = use_endpoint(endpoint)
        yield endpoint
        restore_env(previous)


@pytest.fixture
def s3_store(s3_endpoint: str):
    """A fresh bucket on the loopback S3 server, as an ``s3://`` store."""
    import boto3

    from pipeline.store import open_store

    bucket = f"cdr-test-{uuid.uuid4().hex[:10]}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    return open_store(f"s3://{bucket}/prod")


@pytest.fixture
def file_store(tmp_path: Path):
    from pipeline.store import open_store

    root = tmp_path / "store"
    root.mkdir()
    return open_store(root.as_uri())


@pytest.fixture(scope="session")
def airflow_db(tmp_path_factory) -> Path:
    """One migrated Airflow database for the session; each Airflow gets a copy."""
    from tests.helpers.airflow_env import migrated_database

    return migrated_database(tmp_path_factory.mktemp("airflow-template"))


@pytest.fixture(scope="session")
def airflow(tmp_path_factory, airflow_db):
    """An isolated Airflow (its own home and SQLite database) for the tests that import
    Airflow in this process: requested before their first ``import airflow``."""
    from tests.helpers.airflow_env import setup_airflow

    return setup_airflow(tmp_path_factory.mktemp("airflow"), airflow_db)
