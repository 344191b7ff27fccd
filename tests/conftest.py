"""The tiers' markers, and the shared fixtures: one Spark session for the whole run (UI off,
few partitions), one real S3 HTTP server on loopback (moto's server mode, a child
process), an isolated Airflow, and a standalone Spark cluster per module that asks.

Each test is marked with its tier, the folder it is in (``unit``, ``spark``, ``e2e``,
``airflow``), so that ``-m`` selects by what a test needs."""

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

TESTS = Path(__file__).parent
TIERS = ("unit", "spark", "e2e", "airflow")


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        where = item.path.relative_to(TESTS).parts if item.path.is_relative_to(TESTS) else ()
        if where and where[0] in TIERS:
            item.add_marker(getattr(pytest.mark, where[0]))


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


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[tuple[str, list[Path]]]:
    """A standalone Spark master and two workers on loopback (tests/helpers/cluster.py):
    ``spark://127.0.0.1:<port>`` and the workers' work folders; one per module."""
    from tests.helpers.cluster import standalone_cluster

    with standalone_cluster(tmp_path_factory.mktemp("cluster")) as started:
        yield started
