"""docs/operations.md#a-quarantine-that-heals: the quarantine that heals.

With ``retry: {reason: N}``, what a run quarantined for a retryable reason
(:data:`pipeline.core.policy.RETRYABLE`) is offered again to each of the table's next N runs:

- ingest (:func:`stage`) reads the table's published quarantine and its outcomes, and
  stages the open events whose reason has a retry (their attempt number with them);
  ``future_timestamp`` and ``update_missing`` events are typed again, with the run's
  clock, into copies the resolve stage reads beside the night's (``retry/copies``);
- the resolve stage folds them with the night's events, then :func:`settle` takes their
  fates out of the night's accounting: an event applied or discarded is ``resolved``; one
  quarantined again keeps its first quarantine row (no new one), and at its last attempt
  is ``expired``. A ``fk_violation`` orphan row is put back by the foreign-key check when
  its parent is live and its key was not written since (``pipeline.resolve.stage``);
- the decisions go to ``published/<table>/quarantine_outcomes`` (by ``dt`` of the run
  that decided, so a rerun of a date replaces them); the quarantine rows are never
  rewritten. An event's status is its latest outcome, or ``open``.

``cdr quarantine retry`` reopens an event (an outcome ``reopened``: the next run offers
it again, its attempts counted afresh); ``dismiss`` closes an open one. Those rows carry
the date of the table's latest published run and a ``manual-`` run id, and a rerun of that
date keeps them.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.core import layout
from pipeline.core.columns import DT, EVENT_ID, FATE, REPLICA, RUN_ID
from pipeline.core.policy import RETRYABLE, Fate, QuarantineReason
from pipeline.storage.outputs import output_info, replace_output
from pipeline.storage.workpath import WorkPath, read_folder, read_table, write_table

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from pipeline.core.config import Config, Table
    from pipeline.storage.lake import Lake
    from pipeline.storage.runs_table import RunRow

log = logging.getLogger(__name__)

OUTCOMES = "quarantine_outcomes"  # layout.LOGS
MANUAL = "manual-"  # the run id prefix of the CLI's outcomes
OPEN = "open.parquet"  # ingest's: the ids of the events open before the run


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
_TYPED_AGAIN = (QuarantineReason.FUTURE_TIMESTAMP.value, QuarantineReason.UPDATE_MISSING.value)
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
            expired.append(_outcome(it, Status.EXPIRED, attempt - 1))
        else:
            offers.append((it, attempt, attempt == nights))
    _write(dest / "outcomes.parquet", kept + expired, OUTCOME_SCHEMA)
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


def _outcome(it: Item, status: Status, attempts: int, run_id: str = "") -> dict[str, Any]:
    return {
        RUN_ID: run_id,
        EVENT_ID: it.event_id,
        "reason": it.reason,
        "quarantined_dt": it.quarantined_dt,
        "status": status.value,
        "attempts": attempts,
    }


def _write(path: WorkPath, rows: list[dict[str, Any]], schema: pa.Schema) -> None:
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
    from pipeline.ingest.copies import CopyWriter
    from pipeline.rules.guards import TypingSpec

    ids = [it.event_id for it, _a, _l in offers]
    if not ids:  # most nights: no need to read the records
        _write(dest / "offers.parquet", [], OFFER_SCHEMA)
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
    _write(dest / "offers.parquet", out, OFFER_SCHEMA)
    spec = TypingSpec.of(config, table, now_us)
    by_replica: dict[str, list[dict[str, Any]]] = {}
    for o in out:
        if o["reason"] in _TYPED_AGAIN:
            by_replica.setdefault(o[REPLICA], []).append(o)
    with (dest / "copies").writing() as folder:
        for replica, group in sorted(by_replica.items()):
            path = folder / f"part-{replica}.parquet"
            what = f"quarantine of {group[0]['quarantined_dt']}"
            with CopyWriter(path, spec, replica, what) as w:
                for o in group:
                    w.line(None, o["event"])


def copies_of(staged_table: WorkPath) -> list[str]:
    """The typed copies ingest staged for the offered events (read with the night's)."""
    return [str(p) for p in (staged_table / "retry" / "copies").parquet_files()]


def offers_of(staged_table: WorkPath) -> list[dict[str, Any]]:
    p = staged_table / "retry" / "offers.parquet"
    return read_table(p).to_pylist() if p.is_file() else []


# ---------------------------------------------------------------------- resolve


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
    offered = [o for o in offers if o["reason"] in _TYPED_AGAIN]
    if not offered:
        return Settled()
    ids = pa.array([o[EVENT_ID] for o in offered], _S)
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
    _drop_requarantined(out / "quarantine", pa.array(sorted(set(ids.to_pylist()) - again), _S))
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
    return _outcome(it, status, o["attempt"])


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
    kept = staged_table / "retry" / "outcomes.parquet"
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
    _write(path, [*before, *[{**r, "table": table} for r in rows]], OUTCOME_SCHEMA)


#: the reason of an event open before the run whose staged ids carry none (an ingest of
#: an earlier release)
UNKNOWN_REASON = "unknown"


def open_after(spark: SparkSession, staged_table: WorkPath, out: WorkPath) -> dict[str, int]:
    """The table's quarantined events open after the run, by reason: those open before
    it, less those its outcomes closed, with those it quarantined (each event once: by
    the greatest of its reasons when the run gave it two). The quarantine's ids are
    counted by the executors, in one small job when it has rows."""
    from collections import Counter

    from pyspark.sql import functions as F

    from pipeline.storage.outputs import read_known

    before = staged_table / "retry" / OPEN
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


def manual_outcome(lake: Lake, table: str, it: Item, status: Status, dt: date) -> None:
    """The CLI's outcome (``dismissed`` or ``reopened``) of ``it``, in partition ``dt``."""
    row = _outcome(it, status, 0, f"{MANUAL}{uuid.uuid4().hex[:12]}")
    row.update(table=table, decided_at=datetime.now(UTC))
    cols = {f.name: [row.get(f.name)] for f in OUTCOME_SCHEMA}
    meta = {RUN_ID: row[RUN_ID], "operation": f"cdr quarantine {status.value}"}
    lake.write(
        layout.table_path(table, OUTCOMES),
        pa.table(cols, schema=OUTCOME_SCHEMA),
        meta,
        dt=dt,
        mode="append",
    )


# ---------------------------------------------------------------------- the CLI


def listing(lake: Lake, table: str, status: str | None = None) -> list[dict[str, Any]]:
    """``cdr quarantine list``: every quarantined event of the table with its status (a
    reopened one reads as open) and the latest attempts, oldest first."""
    q = read_quarantine(lake, table, None, [EVENT_ID, "reason", "detail", DT])
    outcomes = read_outcomes(lake, table)
    attempts = {}
    if outcomes is not None:
        for o in sorted(outcomes.to_pylist(), key=lambda o: (o[DT], o["decided_at"])):
            attempts[o[EVENT_ID]] = o["attempts"]
    detail = {r[EVENT_ID]: r["detail"] for r in q.to_pylist()}
    out = []
    for it in sorted(statuses(q, outcomes).values(), key=lambda i: (i.quarantined_dt, i.event_id)):
        shown = Status.OPEN if it.status is Status.REOPENED else it.status
        if status is None or shown.value == status:
            out.append(
                {
                    EVENT_ID: it.event_id,
                    "reason": it.reason,
                    "quarantined_dt": it.quarantined_dt.isoformat(),
                    "status": shown.value,
                    "attempts": attempts.get(it.event_id, 0),
                    "detail": detail.get(it.event_id),
                }
            )
    return out


def act(lake: Lake, runs: list[RunRow], table: str, event_id: str, action: str) -> str:
    """``cdr quarantine retry | dismiss``: the operator's outcome of one event, in the
    partition of the table's latest published run (the next run reads it). Refuses what
    the action cannot apply to, naming why."""
    from pipeline.core.errors import StageError

    q = read_quarantine(lake, table, None, [EVENT_ID, "reason", DT])
    it = statuses(q, read_outcomes(lake, table)).get(event_id)
    if it is None:
        raise StageError(f"table {table}: no quarantined event {event_id!r}")
    if action == "dismiss":
        if it.status.closed:
            raise StageError(f"{event_id} is {it.status.value} already")
        status = Status.DISMISSED
    else:
        if it.status is Status.RESOLVED:
            raise StageError(f"{event_id} is resolved already")
        if it.reason not in RETRYABLE:
            raise StageError(
                f"{event_id} was quarantined as {it.reason}, which a run cannot retry "
                "(fix the export and rerun its date)"
            )
        status = Status.REOPENED
    dates = [r.dt for r in runs if r.published and table in r.tables()]
    if not dates:
        raise StageError(f"table {table} has no published run")
    manual_outcome(lake, table, it, status, max(dates))
    return status.value
