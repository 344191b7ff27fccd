"""The store's lease of tests/unit/test_lease.py (pipeline.storage.lease: one writer at a time) on
the loopback S3 server (conditional puts)."""

from __future__ import annotations

import pytest

import tests.unit.test_lease as unit
from tests.helpers.twins import store_tests

globals().update(store_tests(unit))  # the unit module's tests that take a store, on S3


@pytest.fixture(params=["s3"])
def store(request):
    return request.getfixturevalue(f"{request.param}_store")
