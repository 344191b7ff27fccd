"""docs/operations.md#a-quarantine-that-heals: the quarantine that heals.

With ``retry: {reason: N}``, what a run quarantined for a retryable reason
(:data:`pipeline.core.policy.RETRYABLE`) is offered again to each of the table's next N runs:

- ingest (:func:`stage`, here) reads the table's published quarantine and its outcomes, and
  stages the open events whose reason has a retry (their attempt number with them);
  ``future_timestamp`` and ``update_missing`` events are typed again, with the run's
  clock, into copies the resolve stage reads beside the night's (``retry/copies``);
- the resolve stage folds them with the night's events, then ``pipeline.resolve.retry``
  takes their fates out of the night's accounting: an event applied or discarded is
  ``resolved``; one quarantined again keeps its first quarantine row (no new one), and at
  its last attempt is ``expired``. A ``fk_violation`` orphan row is put back by the
  foreign-key check when its parent is live and its key was not written since
  (``pipeline.resolve.foreign_keys``);
- the decisions go to ``published/<table>/quarantine_outcomes`` (by ``dt`` of the run
  that decided, so a rerun of a date replaces them); the quarantine rows are never
  rewritten. An event's status is its latest outcome, or ``open``.

``cdr quarantine retry`` reopens an event (an outcome ``reopened``: the next run offers
it again, its attempts counted afresh); ``dismiss`` closes an open one
(``pipeline.app.quarantine``). Those rows carry the date of the table's latest published
run and a ``manual-`` run id, and a rerun of that date keeps them.

This module holds what the three share (the statuses, the outcomes' and the offers'
schemas, the names of the staged files) and ingest's part.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import date
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.core import layout
from pipeline.core.columns import DT, EVENT_ID, REPLICA, RUN_ID
from pipeline.core.policy import RETRYABLE, QuarantineReason
from pipeline.ingest.copies import CopyWriter
from pipeline.rules.guards import TypingSpec
from pipeline.storage.workpath import WorkPath, write_table

if TYPE_CHECKING:
    from pipeline.core.config import Config, Table
    from pipeline.storage.lake import Lake
    from pipeline.storage.runs_table import RunRow

log = logging.getLogger(__name__)

OUTCOMES = "quarantine_outcomes"  # layout.LOGS
MANUAL = "manual-"  # the run id prefix of the CLI's outcomes
#: what ingest stages for the resolve stage, in the table's staged folder: under ``retry/``,
#: the ids of the events open before the run, the events offered again, the outcomes
#: decided at ingest, and the copies of the events typed again
STAGED = "retry"
OPEN = "open.parquet"
OFFERS = "offers.parquet"
DECIDED = "outcomes.parquet"
RETYPED = "copies"


class Status(StrEnum):
    OPEN = "open"
    RESOLVED = "resolved"  # applied, or decided (discarded) by a later run
    EXPIRED = "expired"  # its last attempt failed, or its key was written since (FK)
    DISMISSED = "dismissed"  # by an operator (``cdr quarantine dismiss``)
    REOPENED = "reopened"  # by an operator (``cdr quarantine retry``): open again

    @property
    def closed(self) -> bool:
        return self in (Status.RESOLVED, Status.EXPIRED, Status.DISMISSED)


_S, _D = pa.string(), pa.date32()
OUTCOME_SCHEMA = pa.schema(
    [
        (RUN_ID, _S),
        ("table", _S),
        (EVENT_ID, _S),
        ("reason", _S),
        ("quarantined_dt", _D),
        ("status", _S),
        ("attempts", pa.int32()),
        ("decided_at", pa.timestamp("us", tz="UTC")),
    ]
)
#: what ingest stages for the resolve stage: the events offered again
OFFER_SCHEMA = pa.schema(
    [
        (EVENT_ID, _S),
        (REPLICA, _S),
        ("reason", _S),
        ("quarantined_dt", _D),
        ("attempt", pa.int32()),
        ("last", pa.bool_()),
        ("event", _S),
    ]
)
#: the reasons whose events are typed again (with the run's clock) and folded again
TYPED_AGAIN = (QuarantineReason.FUTURE_TIMESTAMP.value, QuarantineReason.UPDATE_MISSING.value)
FK = QuarantineReason.FK_VIOLATION.value


@dataclass(frozen=True)
class Item:
    """One quarantined event and where it stands before a run."""

    event_id: str
    reason: str
    quarantined_dt: date
    status: Status
    since: date  # attempts count from the runs after this date (a reopen restarts them)


def statuses(quarantine: pa.Table, outcomes: pa.Table | None) -> dict[str, Item]:
    """Every quarantined event (by id; its first quarantine) with its status: its latest
    outcome by (``dt``, ``decided_at``), or open."""
    items: dict[str, Item] = {}
    rows = quarantine.select([EVENT_ID, "reason", DT]).to_pylist()
    for r in sorted(rows, key=lambda r: r[DT]):
        if r[EVENT_ID] is not None and r[EVENT_ID] not in items:
            items[r[EVENT_ID]] = Item(r[EVENT_ID], r["reason"], r[DT], Status.OPEN, r[DT])
    if outcomes is None:
        return items
    for o in sorted(outcomes.to_pylist(), key=lambda o: (o[DT], o["decided_at"])):
        it = items.get(o[EVENT_ID])
        if it is not None:
            status = Status(o["status"])
            since = o[DT] if status is Status.REOPENED else it.since
            items[it.event_id] = Item(it.event_id, it.reason, it.quarantined_dt, status, since)
    return items


def read_quarantine(lake: Lake, table: str, before: date | None, columns: list[str]) -> pa.Table:
    """The table's published quarantine (of the dates before ``before``)."""
    where = f"dt < DATE '{before.isoformat()}'" if before is not None else None
    got = lake.read(layout.table_path(table, "quarantine"), columns=columns, where=where)
    if got is None:
        return pa.table({c: pa.array([], _D if c == DT else _S) for c in columns})
    return got


def read_outcomes(lake: Lake, table: str) -> pa.Table | None:
    return lake.read(layout.table_path(table, OUTCOMES))


# ---------------------------------------------------------------------- ingest


def stage(
    config: Config,
    lake: Lake,
    runs: list[RunRow],
    table: Table,
    dt: date,
    now_us: int,
    dest: WorkPath,
) -> None:
    """Into ``dest``: the ids of the table's quarantined events open before the run
    (``open.parquet``), those offered to it (``offers.parquet``), those to type again
    (``copies/``), and the outcomes decided at ingest (an event past its attempts, the
    operator's rows of ``dt``, which a rerun keeps) in ``outcomes.parquet``."""
    quarantine = read_quarantine(lake, table.name, dt, [EVENT_ID, "reason", DT])
    if quarantine.num_rows == 0:
        return
    outcomes = read_outcomes(lake, table.name)
    kept = [] if outcomes is None else _manual_rows(outcomes, dt)
    before = None
    if outcomes is not None:  # what runs of earlier dates and the operator decided
        earlier = outcomes.filter(pc.less(outcomes[DT], dt))
        before = pa.concat_tables([earlier, pa.Table.from_pylist(kept, earlier.schema)])
    items = statuses(quarantine, before)
    open_items = [it for it in items.values() if not it.status.closed]
    open_items.sort(key=lambda it: it.event_id)
    ids = pa.array([it.event_id for it in open_items], _S)
    reasons = pa.array([it.reason for it in open_items], _S)
    write_table(pa.table({EVENT_ID: ids, "reason": reasons}), dest / OPEN)
    dates = sorted({r.dt for r in runs if r.published and table.name in r.tables()})
    offers, expired = [], []
    for it in open_items:
        nights = config.retry.get(it.reason) or (1 if it.status is Status.REOPENED else 0)
        if it.reason not in RETRYABLE or nights == 0:
            continue
        attempt = 1 + sum(1 for d in dates if it.since < d < dt)
        if attempt > nights:  # the config lowered its retries since
            expired.append(outcome_row(it, Status.EXPIRED, attempt - 1))
        else:
            offers.append((it, attempt, attempt == nights))
    write_rows(dest / DECIDED, kept + expired, OUTCOME_SCHEMA)
    _write_offers(config, lake, table, dt, now_us, offers, dest)
    log.info(
        "ingest %s: %d quarantined event(s) open, %d offered again",
        table.name,
        len(open_items),
        len(offers),
    )


def _manual_rows(outcomes: pa.Table, dt: date) -> list[dict[str, Any]]:
    """The operator's outcomes of ``dt`` itself: a rerun of ``dt`` keeps them."""
    rows = outcomes.filter(pc.equal(outcomes[DT], dt)).to_pylist()
    return [r for r in rows if str(r[RUN_ID]).startswith(MANUAL)]


def outcome_row(it: Item, status: Status, attempts: int, run_id: str = "") -> dict[str, Any]:
    """A row of :data:`OUTCOME_SCHEMA` (without the table and the time) of ``it``."""
    return {
        RUN_ID: run_id,
        EVENT_ID: it.event_id,
        "reason": it.reason,
        "quarantined_dt": it.quarantined_dt,
        "status": status.value,
        "attempts": attempts,
    }


def write_rows(path: WorkPath, rows: list[dict[str, Any]], schema: pa.Schema) -> None:
    """``rows`` as one Parquet file of ``schema`` (a field a row lacks: null)."""
    cols = {f.name: [r.get(f.name) for r in rows] for f in schema}
    write_table(pa.table(cols, schema=schema), path)


def _write_offers(
    config: Config,
    lake: Lake,
    table: Table,
    dt: date,
    now_us: int,
    offers: list[tuple[Item, int, bool]],
    dest: WorkPath,
) -> None:
    """The offers with the records their quarantine kept; the events to type again as
    copies of their replica, typed with this run's clock."""
    ids = [it.event_id for it, _a, _l in offers]
    if not ids:  # most nights: no need to read the records
        write_rows(dest / OFFERS, [], OFFER_SCHEMA)
        return
    rows = read_quarantine(lake, table.name, dt, [EVENT_ID, REPLICA, "event", DT])
    rows = rows.filter(pc.is_in(rows[EVENT_ID], pa.array(ids, _S)))
    first: dict[str, dict[str, Any]] = {}
    for r in sorted(rows.to_pylist(), key=lambda r: r[DT]):
        first.setdefault(r[EVENT_ID], r)
    out = [
        {
            EVENT_ID: it.event_id,
            REPLICA: first[it.event_id][REPLICA],
            "reason": it.reason,
            "quarantined_dt": it.quarantined_dt,
            "attempt": attempt,
            "last": last,
            "event": first[it.event_id]["event"],
        }
        for it, attempt, last in offers
    ]
    write_rows(dest / OFFERS, out, OFFER_SCHEMA)
    spec = TypingSpec.of(config, table, now_us)
    by_replica: dict[str, list[dict[str, Any]]] = {}
    for o in out:
        if o["reason"] in TYPED_AGAIN:
            by_replica.setdefault(o[REPLICA], []).append(o)
    with (dest / RETYPED).writing() as folder:
        for replica, group in sorted(by_replica.items()):
            path = folder / f"part-{replica}.parquet"
            what = f"quarantine of {group[0]['quarantined_dt']}"
            with CopyWriter(path, spec, replica, what) as w:
                for o in group:
                    w.line(None, o["event"])
