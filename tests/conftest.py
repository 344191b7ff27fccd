"""Shared fixtures: one Spark session for the whole run (UI off, few partitions) and one
real S3 HTTP server on loopback (moto's server mode, a child process)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import deltalake  # noqa: F401  (loaded before duckdb, or the process aborts at exit)
import pytest

os.environ.setdefault("CDR_SHUFFLE_PARTITIONS", "2")
os.environ.setdefault("CDR_DRIVER_MEMORY", "2g")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")

#: how ``make test`` shares the suite between its two workers (pytest-xdist): each module
#: on one worker, so that its module fixtures start once, except the modules in SPREAD,
#: whose tests are many and independent; the modules in TOGETHER on the same worker. The
#: Airflow tests are together: their spark-submit tasks and services wait a lot, which
#: the other worker fills with the in-process Spark tests (two Airflows at once only slow
#: each other down).
SPREAD = {"tests/test_scenarios.py"}
TOGETHER = {"tests/test_airflow_services.py": "airflow", "tests/test_dag.py": "airflow"}


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """The scheduler of ``make test`` (``-n 2 --no-loadscope-reorder``): xdist's
    ``loadscope`` with the scopes above (xdist's ``xdist_group`` marks do not reach its
    scheduler under pytest 9)."""
    from xdist.scheduler import LoadScopeScheduling

    class Scopes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return nodeid if path in SPREAD else TOGETHER.get(path, path)

    return Scopes(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The Airflow tests first, then the other long ones (``slow``), so that neither
    worker is left alone with a long module at the end."""
    items.sort(
        key=lambda i: (not i.get_closest_marker("airflow"), not i.get_closest_marker("slow"))
    )


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
    from airflow_env import migrated_database

    return migrated_database(tmp_path_factory.mktemp("airflow-template"))


@pytest.fixture(scope="session")
def airflow(tmp_path_factory, airflow_db):
    """An isolated Airflow (its own home and SQLite database) for the tests that import
    Airflow in this process: requested before their first ``import airflow``."""
    from airflow_env import setup_airflow

    return setup_airflow(tmp_path_factory.mktemp("airflow"), airflow_db)
