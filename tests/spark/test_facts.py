"""The run report's counts of the row engine, as the fold's tasks count what they write
and the ledger's job observes the events (``pipeline.facts``), against the same counts
taken again from the outputs those tasks wrote (``Facts.counted``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline import engine, resolve
from pipeline.facts import Facts
from tests.helpers import GOLDEN
from tests.helpers import scenarios as S
from tests.helpers.sparkjobs import settled_disputes


def test_the_folds_counts_equal_the_outputs_counted_again(tmp_path: Path, spark, monkeypatch):
    """Copies under different keys (folded again), a replica's repeated copy, a record
    without an event id and a malformed one: every count agrees."""
    s = json.loads((GOLDEN / "differing_copies.json").read_text())
    a, b = s["exports"]["A"]["t"], s["exports"]["B"]["t"]
    a.append({**a[0], "seq": 7})  # A exported A-001 twice
    b.append({**b[1], "seq": 7, "event_id": None})  # no event id: quarantined on its own
    seen: list[tuple[Facts, Facts]] = []
    resolve_rows = resolve.resolve_rows

    def both(spark_: Any, config: Any, table: Any, copies: Any, prior: Any, run: Any) -> Facts:
        facts = resolve_rows(spark_, config, table, copies, prior, run)
        seen.append((facts, Facts.counted(spark_, run.out)))
        return facts

    monkeypatch.setattr(resolve, "resolve_rows", both)
    settled = settled_disputes(monkeypatch, engine)
    got, failed = S.run_scenario(s, tmp_path)
    assert not failed and got["status"] == "published", got
    [(fast, again)] = seen
    assert fast == again
    assert settled == [["B-002", "C-002"]]  # the disputes the ledger's job found
    assert fast.repeated == 1 and not fast.disputed  # folded again: none left
    assert fast.events["quarantined"] == 2  # C-003, and the record without an id
    assert fast.replicas["A"]["duplicate"] == 1
