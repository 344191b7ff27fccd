"""The run report's counts of the row engine, as the fold's tasks count what they write
and tally their events (``pipeline.resolve.report_counts``), against the same counts taken
again from the outputs those tasks wrote (``Facts.counted``); the tasks' tally against the Spark
job that makes it for the cell engine and for the events two tasks saw."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.core import layout
from pipeline.core.policy import Fate
from pipeline.resolve import engine
from pipeline.resolve import stage as resolve
from pipeline.resolve.report_counts import Facts, split_events, tally, write_ledger
from pipeline.spark.frames import FATES
from pipeline.storage.workpath import WorkPath
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
    assert settled == [["B-002", "C-002"]]  # the disputes split_events found
    assert fast.repeated == 1 and not fast.disputed  # folded again: none left
    assert fast.events["quarantined"] == 2  # C-003, and the record without an id
    assert fast.replicas["A"]["duplicate"] == 1


def _scenario_with_a_repeat() -> dict[str, Any]:
    s = json.loads((GOLDEN / "differing_copies.json").read_text())
    a = s["exports"]["A"]["t"]
    a.append({**a[0], "seq": 7})  # A exported A-001 twice
    return s


def test_an_event_two_tasks_saw_is_counted_again_by_spark(tmp_path: Path, spark, monkeypatch):
    """When ``split_events`` finds an event whose copies two tasks' files hold (and no
    dispute), the events' counts and the ledger are made again by ``write_ledger``: they
    equal the outputs counted again, and the ledger holds each final event once."""
    seen: list[tuple[Facts, Facts, list[str]]] = []
    resolve_rows, find = resolve.resolve_rows, engine.split_events
    again: list[int] = []

    def split(spark_: Any, out: Any) -> tuple[list[str], bool]:
        disputed, _ = find(spark_, out)
        again.append(1)
        return disputed, True  # as if some event had copies in two tasks' files

    def both(spark_: Any, config: Any, table: Any, copies: Any, prior: Any, run: Any) -> Facts:
        facts = resolve_rows(spark_, config, table, copies, prior, run)
        ledger = spark_.read.parquet(str(run.out / layout.LEDGER)).collect()
        seen.append((facts, Facts.counted(spark_, run.out), [r["event_id"] for r in ledger]))
        return facts

    monkeypatch.setattr(engine, "split_events", split)
    monkeypatch.setattr(resolve, "resolve_rows", both)
    got, failed = S.run_scenario(_scenario_with_a_repeat(), tmp_path)
    assert not failed and got["status"] == "published", got
    [(fast, recounted, ledger)] = seen
    assert again and fast == recounted and fast.repeated == 1
    assert ledger and len(ledger) == len(set(ledger))


def _fates(rng: random.Random, n: int) -> pa.Table:
    """Copies of a few events: several replicas, a replica's repeated copy, duplicates
    beside other fates, records without an event id."""
    fates = [f.value for f in Fate]
    rows = []
    for _ in range(n):
        event = rng.choice([None, *[f"e{i}" for i in range(n // 3)]])
        fate = rng.choice([*fates, Fate.DUPLICATE.value])
        digest, differs = rng.randrange(4), fate == Fate.DUPLICATE.value and rng.random() < 0.5
        rows.append((event, rng.choice("ABC"), fate, rng.random() < 0.3, digest, differs))
    names = ("event_id", "replica", "fate", "chosen", "digest", "differs")
    return pa.Table.from_pylist([dict(zip(names, r, strict=True)) for r in rows])


@pytest.mark.parametrize("seed", range(4))
def test_the_tasks_tally_equals_the_spark_job(seed: int, tmp_path: Path, spark):
    """``report_counts.tally`` (a fold task's, in pyarrow) and ``write_ledger`` (Spark) find the
    same events' counts and the same ledger pairs on the same fates."""
    fates = _fates(random.Random(seed), 60)
    out = WorkPath.of(tmp_path)
    (tmp_path / "fates").mkdir()
    pq.write_table(fates, tmp_path / "fates" / "part-0.parquet")
    pairs, counts = tally(fates)
    by_spark = write_ledger(spark, out, "run", "t")
    assert sorted(counts, key=repr) == sorted(by_spark.counts, key=repr)
    ledger = spark.read.parquet(str(tmp_path / layout.LEDGER)).collect()
    assert pairs.to_pylist() == sorted(
        ({"event_id": r["event_id"], "fate": r["fate"], "digest": r["digest"]} for r in ledger),
        key=lambda r: (r["event_id"], r["fate"]),
    )
    assert pairs["event_id"].to_pylist() == sorted(pairs["event_id"].to_pylist())


def test_split_events_finds_the_events_two_files_hold(tmp_path: Path, spark):
    """An event whose copies are in two tasks' files is split; one chosen in two is
    disputed; one whose copies are all in one file is neither."""
    folder = tmp_path / "fates"
    folder.mkdir()
    task_a = [("x", "A", "applied", True, 1, False), ("y", "A", "applied", True, 2, False)]
    task_a.append(("z", "A", "applied", True, 3, False))
    task_b = [
        ("x", "B", "duplicate", False, 1, False),
        ("y", "B", "applied", True, 2, False),
        ("z", "B", "applied", False, 3, False),
    ]
    for name, rows in (("a", task_a), ("b", task_b)):
        t = pa.Table.from_pylist([dict(zip(FATES.names, r, strict=True)) for r in rows])
        pq.write_table(t, folder / f"part-{name}.parquet")
    pq.write_table(t.slice(0, 0), folder / "part-c.parquet")
    assert split_events(spark, WorkPath.of(tmp_path)) == (["y"], True)
    (folder / "part-b.parquet").unlink()
    assert split_events(spark, WorkPath.of(tmp_path)) == ([], False)


def test_the_clock_skew_evidence_is_counted_by_the_tasks_and_added_up() -> None:
    """clock skew: each task counts its evidence per pair of replicas with its largest lag
    (``skew_counts``); the report's evidence adds the tasks' counts and keeps the largest
    lag, as counting every row of the evidence at once does."""
    from pipeline.resolve.fold_task import _counted
    from pipeline.resolve.report_counts import skew_counts

    rnd = random.Random(3)
    rows = [
        {"behind": rnd.choice("AB"), "ahead": rnd.choice("BC"), "lag_us": rnd.randint(1, 9_000_000)}
        for _ in range(60)
    ]
    whole: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows:
        pair = whole.setdefault(r["behind"], {}).setdefault(r["ahead"], {"events": 0})
        pair["events"] += 1
        pair["max_seconds"] = max(pair.get("max_seconds", 0), r["lag_us"] / 1_000_000)
    counts = []
    for task in (rows[:25], rows[25:], []):  # three tasks, one without evidence
        mine = _counted("skew", pa.Table.from_pylist(task, _SKEW))
        counts += [("skew", c["a"], c["b"], c["c"], c["rows"]) for c in mine]
        assert sum(c["rows"] for c in mine) == len(task)  # the output's rows, as before
    assert Facts.of(counts).clock_skew == whole
    assert Facts.of([]).clock_skew == {}
    assert len(skew_counts(pa.Table.from_pylist(rows, _SKEW))) == sum(map(len, whole.values()))


_SKEW = pa.schema([("behind", pa.string()), ("ahead", pa.string()), ("lag_us", pa.int64())])


def test_the_tasks_digests_say_when_an_event_may_be_split_or_disputed() -> None:
    """``may_split``: false for tasks whose events differ (records without an id aside),
    true when two tasks hold an event, or one task chose an event under two keys."""
    from pipeline.resolve.report_counts import may_split, task_events

    def fates(*rows: tuple[str | None, str, bool]) -> pa.Table:
        cols = ("event_id", "replica", "chosen")
        return pa.Table.from_pylist([dict(zip(cols, r, strict=True)) for r in rows])

    a = task_events(fates(("e1", "A", True), ("e1", "B", False), (None, "A", False)))
    b = task_events(fates(("e2", "A", True), ("e3", "B", True), (None, "A", False)))
    assert not may_split([a, b]) and not may_split([a]) and not may_split([])
    assert may_split([a, b, task_events(fates(("e3", "C", False)))])  # e3 in two tasks
    assert may_split([task_events(fates(("e4", "A", True), ("e4", "B", True)))])  # disputed
    assert not may_split([task_events(fates(("e4", "A", True), ("e4", "B", False)))])


def test_a_night_no_event_of_which_two_tasks_saw_runs_no_split_job(
    tmp_path: Path, spark, monkeypatch
) -> None:
    """The common night: the tasks' digests show no event in two tasks, and the job that
    looks for them (``split_events``) does not run; the counts are still exact."""
    seen: list[Facts] = []
    resolve_rows = resolve.resolve_rows

    def counted(spark_: Any, config: Any, table: Any, copies: Any, prior: Any, run: Any) -> Facts:
        facts = resolve_rows(spark_, config, table, copies, prior, run)
        assert replace(facts, clock_skew={}) == Facts.counted(spark_, run.out)
        seen.append(facts)
        return facts

    def refused(*_: Any) -> Any:
        raise AssertionError("split_events ran")

    monkeypatch.setattr(engine, "split_events", refused)
    monkeypatch.setattr(resolve, "resolve_rows", counted)
    s = json.loads((GOLDEN / "before_image_detection.json").read_text())
    got, failed = S.run_scenario(s, tmp_path)
    assert not failed and got["status"] == "published", got
    assert seen and all(f.events for f in seen)
