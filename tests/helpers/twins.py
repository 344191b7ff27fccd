"""Tests collected twice: those of a ``tests/unit/`` module that take a ``store`` (a file
store there) are collected again in a ``tests/spark/`` module whose ``store`` fixture is a
bucket on the loopback S3 server, so that one test body covers both stores."""

from __future__ import annotations

import inspect
from types import ModuleType
from typing import Any


def store_tests(module: ModuleType) -> dict[str, Any]:
    """The test functions of ``module`` that take the ``store`` fixture, by name (for the
    twin module's ``globals()``: pytest collects them there, with that module's store)."""
    return {
        name: f
        for name, f in vars(module).items()
        if name.startswith("test_")
        and inspect.isfunction(f)
        and "store" in inspect.signature(f).parameters
    }
