"""What the resolve stage's plans read: each output a table's fold gives (state, conflict
log, quarantine, divergence, fates, changes) is written from the persisted classification
and fold output, never by computing them again. Spark matches a persisted DataFrame by
its plan; a union of two DataFrames derived from one whose plan read the copies a second
time (the unique-value coupling did) silently stopped matching, and each write ran the
classification again: a 3-event run of a table with a unique constraint took 35 Spark
jobs to write its outputs. The other shapes here passed before the fix; they guard
against the same miss."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import scenarios as S
from test_scenarios import run_scenario

from pipeline import resolve


def files_read_again(df: Any) -> set[str]:
    """The relations over files among the leaves of ``df``'s plan once Spark has put the
    persisted DataFrames in (each one leaf, ``InMemoryRelation``): the classification
    reads the copies' files, so computing it again shows as one of them. Frames made on
    the driver (``LocalRelation``, ``LogicalRDD``) are not."""
    found: set[str] = set()
    todo = [df._jdf.queryExecution().withCachedData()]
    while todo:
        node = todo.pop()
        children = node.children()
        if children.isEmpty():
            found.add(node.getClass().getSimpleName())
        todo.extend(children.apply(i) for i in range(children.size()))
    return found & {"LogicalRelation", "DataSourceV2Relation", "HiveTableRelation"}


@pytest.mark.parametrize(
    "name",
    [
        "pg_multiple_unique_conflicts_apply",  # unique values couple keys
        "dw_transaction_scope",  # transactions admitted against the state
        "pg_delta_two_credits",  # delta columns
        "scylla_rule2_dead_beats_live",  # the cell engine
    ],
)
def test_the_fold_outputs_are_written_from_the_persisted_fold(
    name: str, tmp_path: Path, spark, monkeypatch
):
    written: dict[str, set[str]] = {}
    write = resolve._write

    def spy(df, path: Path, mode: str = "overwrite") -> None:
        written[path.name] = files_read_again(df)
        write(df, path, mode)

    monkeypatch.setattr(resolve, "_write", spy)
    s = json.loads((S.SCENARIOS / f"{name}.json").read_text())
    run_scenario(s, tmp_path)
    fold_outputs = {"state_pre", "conflicts", "quarantine", "divergence", "fates"}
    assert fold_outputs <= set(written), written
    assert {k: v for k, v in written.items() if k in fold_outputs and v} == {}
