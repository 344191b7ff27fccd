"""The fixtures the Spark tier's modules share."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers import cdc_store


@pytest.fixture(scope="session")
def two_days(tmp_path_factory) -> dict[str, Any]:
    """A store with two published dates and a rerun of the second (``cdc_store``)."""
    return cdc_store.build(tmp_path_factory.mktemp("cdc"))
