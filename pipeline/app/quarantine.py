"""``cdr quarantine list | retry | dismiss`` (docs/operations.md#the-quarantine): an
operator's view of a table's quarantined events and their statuses, and the outcome that
reopens or dismisses one of them (read by the next run's ingest, ``pipeline.ingest.retry``).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import UTC, date, datetime
from typing import Any

import pyarrow as pa

from pipeline.core import layout
from pipeline.core.columns import DT, EVENT_ID, RUN_ID
from pipeline.core.errors import StageError
from pipeline.core.policy import RETRYABLE
from pipeline.ingest.retry import (
    MANUAL,
    OUTCOME_SCHEMA,
    OUTCOMES,
    Item,
    Status,
    outcome_row,
    read_outcomes,
    read_quarantine,
    statuses,
)
from pipeline.storage.lake import Lake
from pipeline.storage.runs_table import RunRow


def manual_outcome(lake: Lake, table: str, it: Item, status: Status, dt: date) -> None:
    """The CLI's outcome (``dismissed`` or ``reopened``) of ``it``, in partition ``dt``."""
    row = outcome_row(it, status, 0, f"{MANUAL}{uuid.uuid4().hex[:12]}")
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


def outcome_of(it: Item, action: str, retries: Mapping[str, int]) -> Status:
    """The outcome ``action`` (``retry`` or ``dismiss``) writes for ``it``; a StageError,
    naming why, when it would change nothing or cannot apply. ``retries`` is the config's
    ``retry``: an open event of a reason it retries is offered to the next run anyway."""
    if action == "dismiss":
        if it.status.closed:
            raise StageError(f"{it.event_id} is {it.status.value} already")
        return Status.DISMISSED
    if it.status is Status.RESOLVED:
        raise StageError(f"{it.event_id} is resolved already")
    if it.reason not in RETRYABLE:
        raise StageError(
            f"{it.event_id} was quarantined as {it.reason}, which a run cannot retry "
            "(fix the export and rerun its date)"
        )
    if it.status is Status.REOPENED or (it.status is Status.OPEN and retries.get(it.reason)):
        raise StageError(
            f"{it.event_id} is open already: the next run offers it again (nothing written; "
            "retry reopens an expired or dismissed event)"
        )
    return Status.REOPENED


def act(
    lake: Lake,
    runs: list[RunRow],
    table: str,
    event_id: str,
    action: str,
    retries: Mapping[str, int],
) -> str:
    """``cdr quarantine retry | dismiss``: the operator's outcome of one event, in the
    partition of the table's latest published run (the next run reads it). Refuses what
    the action cannot apply to or would not change, naming why (:func:`outcome_of`)."""
    q = read_quarantine(lake, table, None, [EVENT_ID, "reason", DT])
    it = statuses(q, read_outcomes(lake, table)).get(event_id)
    if it is None:
        raise StageError(f"table {table}: no quarantined event {event_id!r}")
    status = outcome_of(it, action, retries)
    dates = [r.dt for r in runs if r.published and table in r.tables()]
    if not dates:
        raise StageError(f"table {table} has no published run")
    manual_outcome(lake, table, it, status, max(dates))
    return status.value
