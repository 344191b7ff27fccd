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
from typing import Any

import deltalake  # noqa: F401  (loaded before duckdb, or the process aborts at exit)
import pytest

os.environ.setdefault("CDR_SHUFFLE_PARTITIONS", "2")
os.environ.setdefault("CDR_DRIVER_MEMORY", "2g")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")

TESTS = Path(__file__).parent
TIERS = ("unit", "spark", "e2e", "airflow")


def _tier(path: Path) -> str | None:
    where = path.relative_to(TESTS).parts if path.is_relative_to(TESTS) else ()
    return where[0] if where and where[0] in TIERS else None


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if (tier := _tier(item.path)) is not None:
            item.add_marker(getattr(pytest.mark, tier))


#: each tier's seconds (setup, call and teardown of its tests) and tests run
_TIER_TIME: dict[str, list[float]] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    tier = _tier(Path(report.fspath).resolve()) or "other"
    seconds, tests = _TIER_TIME.setdefault(tier, [0.0, 0])
    _TIER_TIME[tier] = [seconds + report.duration, tests + (report.when == "call")]


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Each tier's minutes, for CI's log (a session fixture's start counts in the tier of
    the first test that asks for it)."""
    if _TIER_TIME:
        parts = [f"{t} {s / 60:.1f} min ({n} tests)" for t, (s, n) in _TIER_TIME.items()]
        terminalreporter.write_line("tiers: " + ", ".join(parts))


@pytest.fixture(scope="session")
def spark():
    from pipeline.spark.session import get_spark

    session = get_spark("local[2]", app="cdr-tests")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    from pipeline.storage.s3server import restore_env, s3_server, use_endpoint

    with s3_server() as endpoint:
        previous = use_endpoint(endpoint)
        yield endpoint
        restore_env(previous)


@pytest.fixture
def s3_store(s3_endpoint: str):
    """A fresh bucket on the loopback S3 server, as an ``s3://`` store."""
    import boto3

    from pipeline.storage.store import open_store

    bucket = f"cdr-test-{uuid.uuid4().hex[:10]}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    return open_store(f"s3://{bucket}/prod")


@pytest.fixture
def file_store(tmp_path: Path):
    from pipeline.storage.store import open_store

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
