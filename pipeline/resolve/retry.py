"""The resolve stage's part of docs/operations.md#a-quarantine-that-heals: the events
ingest offered again (``pipeline.ingest.retry``) are read with the night's copies
(:func:`copies_of`, :func:`offers_of`); once folded, :func:`settle` takes their fates out
of the night's accounting, :func:`fk_outcomes` decides the orphan rows the foreign-key
check offered, and the run's outcomes go to ``quarantine_outcomes`` in the table's
folder (:func:`start_outcomes`, :func:`add_outcomes`); :func:`open_after` counts the
events still open after the run.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from pipeline.core.columns import EVENT_ID, FATE, REPLICA, RUN_ID
from pipeline.core.policy import Fate
from pipeline.ingest.retry import (
    DECIDED,
    FK,
    MANUAL,
    OFFERS,
    OPEN,
    OUTCOME_SCHEMA,
    OUTCOMES,
    RETYPED,
    STAGED,
    TYPED_AGAIN,
    Item,
    Status,
    outcome_row,
    write_rows,
)
from pipeline.storage.outputs import output_info, read_known, replace_output
from pipeline.storage.workpath import WorkPath, read_folder, read_table


def copies_of(staged_table: WorkPath) -> list[str]:
    """The typed copies ingest staged for the offered events (read with the night's)."""
    return [str(p) for p in (staged_table / STAGED / RETYPED).parquet_files()]


def offers_of(staged_table: WorkPath) -> list[dict[str, Any]]:
    """The events ingest offered again to the run (rows of ``OFFER_SCHEMA``)."""
    p = staged_table / STAGED / OFFERS
    return read_table(p).to_pylist() if p.is_file() else []


@dataclass(frozen=True)
class Settled:
    """The offered events' outcomes (rows of :data:`OUTCOME_SCHEMA` without run and
    time), and the retried events by what became of them (the report's ``retried``)."""

    outcomes: list[dict[str, Any]] = field(default_factory=list)
    retried: dict[str, int] = field(default_factory=dict)
    #: whether the run's fates and quarantine were rewritten (some event was offered)
    rewrote: bool = False


_RESOLVED_BY = {Fate.APPLIED.value: "applied", Fate.DISCARDED.value: "discarded"}


def settle(offers: list[dict[str, Any]], out: WorkPath) -> Settled:
    """What became of the offered events; ``out/fates`` rewritten to hold the fates of the
    night's own copies only (the accounting suite checks them against the exports). An
    offered event quarantined again keeps its first quarantine row: the night's is
    removed from ``out/quarantine``. Read on the driver, only when some event was
    offered."""
    offered = [o for o in offers if o["reason"] in TYPED_AGAIN]
    if not offered:
        return Settled()
    ids = pa.array([o[EVENT_ID] for o in offered], pa.string())
    every = read_folder(out / "fates")
    assert every is not None, "the fold writes its fates"
    fate_of: dict[str, str] = {}
    for r in every.filter(pc.is_in(every[EVENT_ID], ids)).to_pylist():
        if r[FATE] != Fate.DUPLICATE.value or r[EVENT_ID] not in fate_of:
            fate_of[r[EVENT_ID]] = r[FATE]
    mine = pc.fill_null(pc.is_in(every[EVENT_ID], ids), False)
    keep = _drop_offered_copies(every.filter(mine).to_pylist(), offered)
    own = pa.concat_tables(
        [every.filter(pc.invert(mine)), pa.Table.from_pylist(keep, every.schema)]
    )
    replace_output(out / "fates", own)
    # the night's own copy of an offered event (an export that sent it again) keeps its row
    again = {r[EVENT_ID] for r in keep if r[FATE] == Fate.QUARANTINED.value}
    _drop_requarantined(
        out / "quarantine", pa.array(sorted(set(ids.to_pylist()) - again), pa.string())
    )
    outcomes: list[dict[str, Any]] = []
    retried: dict[str, int] = {}
    for o in offered:
        status, what = _decided(fate_of.get(o[EVENT_ID]), o["last"])
        if status is not None:
            outcomes.append(_offer_outcome(o, status))
            retried[what] = retried.get(what, 0) + 1
    return Settled(outcomes, retried, rewrote=True)


def _decided(fate: str | None, last: bool) -> tuple[Status | None, str]:
    """An offered event's fate tonight as its outcome (None: still open)."""
    if fate in _RESOLVED_BY:
        return Status.RESOLVED, _RESOLVED_BY[fate]
    if fate == Fate.DUPLICATE.value:  # an earlier night's export brought it and it was resolved
        return Status.RESOLVED, "duplicate"
    if last and fate == Fate.QUARANTINED.value:
        return Status.EXPIRED, "expired"
    return None, ""


def _offer_outcome(o: Mapping[str, Any], status: Status) -> dict[str, Any]:
    it = Item(o[EVENT_ID], o["reason"], o["quarantined_dt"], Status.OPEN, o["quarantined_dt"])
    return outcome_row(it, status, o["attempt"])


def _drop_offered_copies(
    rows: list[dict[str, Any]], offered: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The fate rows left once one row per offered copy (its event and replica) is taken
    out, a duplicate's first: what the night's own exports held of those events."""
    left = list(rows)
    for o in offered:
        mine = [r for r in left if (r[EVENT_ID], r[REPLICA]) == (o[EVENT_ID], o[REPLICA])]
        if mine:
            dup = [r for r in mine if r[FATE] == Fate.DUPLICATE.value]
            left.remove((dup or mine)[0])
    return left


def _drop_requarantined(folder: WorkPath, ids: pa.Array) -> None:
    q = read_folder(folder)
    if q is None:
        return
    again = pc.fill_null(pc.is_in(q[EVENT_ID], ids), False)
    if pc.any(again).as_py():
        replace_output(folder, q.filter(pc.invert(again)))


def fk_outcomes(offers: list[dict[str, Any]], restored: set[str], written: set[str]) -> Settled:
    """The orphan rows offered to the foreign-key check: put back (``restored``), their
    key written since (``written``: expired, they cannot come back), or still open."""
    outcomes: list[dict[str, Any]] = []
    retried: dict[str, int] = {}
    for o in offers:
        if o["reason"] != FK:
            continue
        eid = o[EVENT_ID]
        if eid in restored:
            status, what = Status.RESOLVED, "applied"
        elif eid in written or o["last"]:
            status, what = Status.EXPIRED, "expired"
        else:
            continue
        outcomes.append(_offer_outcome(o, status))
        retried[what] = retried.get(what, 0) + 1
    return Settled(outcomes, retried)


def start_outcomes(
    staged_table: WorkPath, out: WorkPath, run_id: str, table: str, settled: Settled
) -> None:
    """The table's outcomes decided at ingest and those of the offered copies, into
    ``out/quarantine_outcomes`` (only when there are some)."""
    kept = staged_table / STAGED / DECIDED
    rows = read_table(kept).to_pylist() if kept.is_file() else []
    manual = [r for r in rows if str(r[RUN_ID]).startswith(MANUAL)]
    decided = [r for r in rows if not str(r[RUN_ID]).startswith(MANUAL)]
    _save(out, manual, table)
    add_outcomes(out, run_id, table, Settled([*decided, *settled.outcomes]))


def add_outcomes(out: WorkPath, run_id: str, table: str, settled: Settled) -> None:
    """More of the run's outcomes of one table."""
    now = datetime.now(UTC)
    _save(out, [{**r, RUN_ID: run_id, "decided_at": now} for r in settled.outcomes], table)


def _save(out: WorkPath, rows: list[dict[str, Any]], table: str) -> None:
    path = out / OUTCOMES / "part-00000.parquet"
    if not rows:
        return
    before = read_table(path).to_pylist() if path.is_file() else []
    write_rows(path, [*before, *[{**r, "table": table} for r in rows]], OUTCOME_SCHEMA)


#: the reason of an event open before the run whose staged ids carry none (an ingest of
#: an earlier release)
UNKNOWN_REASON = "unknown"


def open_after(spark: SparkSession, staged_table: WorkPath, out: WorkPath) -> dict[str, int]:
    """The table's quarantined events open after the run, by reason: those open before
    it, less those its outcomes closed, with those it quarantined (each event once: by
    the greatest of its reasons when the run gave it two). The quarantine's ids are
    counted by the executors, in one small job when it has rows."""
    before = staged_table / STAGED / OPEN
    still: dict[str, str] = {}
    if before.is_file():
        got_before = read_table(before)
        reasons = (
            got_before["reason"].to_pylist()
            if "reason" in got_before.column_names
            else [UNKNOWN_REASON] * got_before.num_rows
        )
        still = dict(zip(got_before[EVENT_ID].to_pylist(), reasons, strict=True))
    path = out / OUTCOMES / "part-00000.parquet"
    if path.is_file():
        rows = read_table(path, columns=[RUN_ID, EVENT_ID, "status"]).to_pylist()
        for r in rows:
            if Status(r["status"]).closed:
                still.pop(r[EVENT_ID], None)
    opened = Counter(still.values())
    info = output_info(out / "quarantine")
    if info is None or info[1] != 0:
        q = read_known(spark, out / "quarantine", "event_id string, reason string")
        known = F.col(EVENT_ID).isin(sorted(still)) if still else F.lit(False)
        events = q.where("event_id IS NOT NULL").groupBy(EVENT_ID).agg(F.max("reason").alias("r"))
        per_reason = events.groupBy("r").agg(
            F.count("*").alias("n"), F.collect_list(F.when(known, F.col(EVENT_ID))).alias("known")
        )
        for row in per_reason.collect():
            opened[row["r"]] += row["n"]
            for event_id in row["known"]:  # open before, quarantined again: once, by its new reason
                opened[still[event_id]] -= 1
    return {reason: n for reason, n in sorted(opened.items()) if n}
