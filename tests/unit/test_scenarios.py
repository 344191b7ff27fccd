"""The scenario machinery without a run: one scenario in four runs on Parquet exports, a
missing shared folder fails under CI, and the comparison with ``expect`` is exact and
typed by the schema. (Every scenario through ``cdr run``: tests/e2e/test_scenarios.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import scenarios as S


def test_one_scenario_in_four_runs_on_parquet_exports():
    paths = S.scenario_files()
    formats = [S.scenario_format(p, json.loads(p.read_text())) for p in paths]
    assert formats.count("parquet") >= len(paths) // 5, formats


def test_a_missing_scenario_folder_fails_under_ci(tmp_path: Path, monkeypatch):
    """Outside CI a checkout without shared/scenarios runs the golden files only; under
    CI=true it is an error, so that the suite cannot shrink unnoticed."""
    monkeypatch.setattr(S, "SCENARIOS", tmp_path / "missing")
    monkeypatch.delenv("CI", raising=False)
    assert S.scenario_files() == sorted(S.GOLDEN.glob("*.json"))
    monkeypatch.setenv("CI", "true")
    with pytest.raises(RuntimeError, match="no shared scenarios"):
        S.scenario_files()


def test_the_comparison_is_exact_and_typed_by_the_schema():
    """A published value matches an expected one only with the column's type and text:
    ``"1"`` is not ``1``, ``1.10`` keeps its scale, a string column's ``"007"`` stays text."""
    from decimal import Decimal

    table = {"columns": {"id": "bigint", "amount": "decimal(10,2)", "code": "string"}}
    expected = [{"id": 1, "amount": "1.10", "code": "007"}]
    assert S.multiset([{"id": 1, "amount": Decimal("1.10"), "code": "007"}]) == S.multiset(
        expected, table
    )
    for wrong in (
        {"id": "1", "amount": Decimal("1.10"), "code": "007"},  # text where a bigint is
        {"id": 1, "amount": Decimal("1.1"), "code": "007"},  # the scale lost
        {"id": 1, "amount": 1.1, "code": "007"},  # a float where a decimal is
        {"id": 1, "amount": Decimal("1.10"), "code": 7},  # a number where text is
    ):
        assert S.multiset([wrong]) != S.multiset(expected, table), wrong
