"""The Delta commits of tests/unit/test_lake.py (pipeline.lake, read back with deltalake and
DuckDB's delta extension) on the loopback S3 server."""

from __future__ import annotations

import pytest

import tests.unit.test_lake as unit
from tests.helpers.twins import store_tests

globals().update(store_tests(unit))  # the unit module's tests that take a store, on S3


@pytest.fixture(params=["s3"])
def store(request):
    return request.getfixturevalue(f"{request.param}_store")
