"""``cdr decide`` (docs/rules.md#manual-decisions): record an operator's decision of one
conflict of the published conflict logs, or withdraw one, under the store's lease; and
the runs that must run again for it to take effect (``--rerun`` starts them in order).

A decision is checked before it is written: its conflict is in a published conflict log
of a row table, of a type a decision can answer, not decided already; a ``--row`` is a
JSON object whose every column fits the table (a refusal names the column)."""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any

import pyarrow as pa

from pipeline.core import layout
from pipeline.core.columns import CONFLICT_ID, DT, KEY, RUN_ID
from pipeline.core.config import Config
from pipeline.core.errors import StageError
from pipeline.core.policy import ConflictType, Granularity
from pipeline.core.report import Status
from pipeline.ingest import decisions as table_
from pipeline.rules.custom import RowMisfit
from pipeline.rules.decisions import DECIDABLE, Take, typed_row
from pipeline.storage import lease
from pipeline.storage.lake import Lake
from pipeline.storage.runs_table import later_dates, read_runs
from pipeline.storage.store import open_store

_ID = re.compile(r"^[0-9a-f]{32}$")
_DECISION_ID = re.compile(r"^d-[0-9a-f]{12}$")


@dataclass(frozen=True)
class Decided:
    """What ``cdr decide`` did: the decision's row and the dates to run again, in order."""

    row: Mapping[str, Any]
    reruns: tuple[date, ...]

    def to_dict(self) -> dict[str, Any]:
        row = {
            k: v.isoformat() if isinstance(v, date | datetime) else v for k, v in self.row.items()
        }
        return {"decision": row, "rerun": [d.isoformat() for d in self.reruns]}


def find_conflict(lake: Any, config: Config, conflict_id: str) -> tuple[str, dict[str, Any]]:
    """The table and the published conflict-log row of ``conflict_id``."""
    if not _ID.match(conflict_id):
        raise StageError(f"--conflict-id {conflict_id!r} is not a conflict id (32 hex digits)")
    for t in config.tables:
        path = layout.table_path(t, "conflicts")
        log = lake.table(path)
        if log is None or CONFLICT_ID not in pa.schema(log.schema().to_arrow()).names:
            continue  # no conflict yet, or only ones an earlier release logged (no ids)
        got = lake.read(path, where=f"{CONFLICT_ID} = '{conflict_id}'")
        if got is not None and got.num_rows:
            return t, got.to_pylist()[0]
    found = _of_a_stopped_night(lake, config, conflict_id)
    if found is not None:
        return found
    raise StageError(
        f"no conflict {conflict_id} in the conflict logs of {', '.join(config.tables)} "
        "(cdr decide answers a conflict of a published run, or of a run an `error` "
        "resolver stopped)"
    )


def _of_a_stopped_night(
    lake: Any, config: Config, conflict_id: str
) -> tuple[str, dict[str, Any]] | None:
    """docs/rules.md#manual-decisions: a conflict of a failed run's own conflict log (a
    night an ``error`` resolver stopped: its failure names the id), newest run first,
    with the run's date."""
    failed = [r for r in read_runs(lake) if r.status == Status.FAILED]
    for run in reversed(failed):
        for t in config.tables:
            path = layout.failed_output(run.run_id, t, "conflicts")
            if lake.table(path) is None:
                continue
            got = lake.read(path, where=f"{CONFLICT_ID} = '{conflict_id}'")
            if got is not None and got.num_rows:
                return t, {**got.to_pylist()[0], DT: run.dt}
    return None


def check(config: Config, table: str, conflict: Mapping[str, Any], take: Take, row: Any) -> Any:
    """The decision's row, typed, once every rule allows it (a StageError names the rule)."""
    t = config.tables[table]
    ctype = ConflictType(conflict["conflict_type"])
    if t.granularity is Granularity.CELL:
        raise StageError(
            f"table {table} resolves cells (docs/rules.md#cell-rules): a decision answers "
            "a row conflict"
        )
    allowed = DECIDABLE.get(ctype)
    if allowed is None:
        raise StageError(
            f"conflict {conflict[CONFLICT_ID]} is {ctype.value}: a decision answers "
            f"{', '.join(c.value for c in DECIDABLE)}"
        )
    if take not in allowed:
        raise StageError(f"a {ctype.value} conflict takes local or remote, not a row")
    if take is not Take.ROW:
        return None
    if t.column_groups:
        raise StageError(f"table {table} has column_groups: a decision takes local or remote")
    if '"_deleted":true' in (conflict["local_row"] or ""):
        raise StageError("the local version is a tombstone: a decision takes local or remote")
    if not isinstance(row, dict):
        raise StageError("--row must be a JSON object of the table's columns")
    keys = [c for c in row if c in t.key]
    if keys:
        raise StageError(
            f"--row names the key column(s) {', '.join(keys)}: a decision keeps the "
            "conflict's key; give the value columns only"
        )
    try:
        typed_row(t, row)
    except RowMisfit as err:
        raise StageError(f"table {table}: --row does not fit: {err}") from err
    return row


def parse_row(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise StageError(f"--row is not JSON: {err}") from err


def record(
    lake: Any, config: Config, conflict_id: str, take: Take, row_text: str | None, why: str, by: str
) -> dict[str, Any]:
    """Check and write one decision (the caller holds the lease); returns its row."""
    table, conflict = find_conflict(lake, config, conflict_id)
    row = check(config, table, conflict, take, parse_row(row_text))
    dt = conflict[DT]
    taken = [d for d in table_.active(table_.read(lake, dt)) if d[CONFLICT_ID] == conflict_id]
    if taken:
        raise StageError(
            f"conflict {conflict_id} is decided already ({taken[0]['decision_id']}): "
            "withdraw that decision first"
        )
    local, remote = table_.digests(conflict)
    out = {
        "decision_id": f"d-{uuid.uuid4().hex[:12]}",
        CONFLICT_ID: conflict_id,
        "table": table,
        KEY: conflict[KEY],
        DT: dt,
        "take": take.value,
        "row": None if row is None else json.dumps(row),
        "why": why,
        "by": by,
        "at": datetime.now(UTC),
        "local_digest": local,
        "remote_digest": remote,
        "withdrawn_at": None,
    }
    _write(lake, dt, [out], f"cdr decide {out['decision_id']}", mode="append")
    return out


def withdraw(lake: Any, decision_id: str) -> dict[str, Any]:
    """Mark one decision withdrawn (its row stays, with ``withdrawn_at``): its date's
    partition rewritten in one commit."""
    if not _DECISION_ID.match(decision_id):
        raise StageError(f"--withdraw {decision_id!r} is not a decision id (d-<12 hex digits>)")
    found = table_.read(lake, where=f"decision_id = '{decision_id}'")
    if not found:
        raise StageError(f"no decision {decision_id}")
    if found[0]["withdrawn_at"] is not None:
        raise StageError(f"decision {decision_id} is withdrawn already")
    dt = found[0][DT]
    rows = table_.read(lake, dt)
    now = datetime.now(UTC)
    for r in rows:
        if r["decision_id"] == decision_id:
            r["withdrawn_at"] = now
            withdrawn = r
    _write(lake, dt, rows, f"cdr decide --withdraw {decision_id}", mode="overwrite")
    return withdrawn


def _write(lake: Any, dt: date, rows: list[dict[str, Any]], operation: str, mode: str) -> None:
    cols = {f.name: [r[f.name] for r in rows] for f in table_.SCHEMA}
    meta = {RUN_ID: f"decide-{uuid.uuid4().hex[:12]}", "operation": operation}
    lake.write(layout.DECISIONS, pa.table(cols, schema=table_.SCHEMA), meta, dt=dt, mode=mode)


def reruns(runs: list[Any], tables: Iterable[str], dt: date) -> tuple[date, ...]:
    """The dates to run again, in order, for a decision of ``dt`` to reach the published
    state: ``dt``, then every later date published for the config's ``tables`` (each
    starts from the state of the one before: ``stages.run_then_later`` runs them)."""

    return (dt, *later_dates(runs, tables, dt))


def decide_conflict(
    config: Config,
    *,
    conflict_id: str | None = None,
    take: str | None = None,
    row: str | None = None,
    why: str | None = None,
    by: str,
    withdraw_id: str | None = None,
) -> Decided:
    """``cdr decide`` and the ``replica_cdr_decide`` DAG's task: record (``take`` local or
    remote, or a ``row``) or withdraw one decision under the store's lease; returns it and
    the dates to run again."""

    if withdraw_id is None:
        if conflict_id is None or (take is None) == (row is None):
            raise StageError("a decision needs a conflict id and either a take or a row")
        if not (why or "").strip():
            raise StageError("a decision needs a reason (--why): it is kept with it")
    assert config.store
    store = open_store(config.store)
    holder = f"decide-{os.getpid()}"
    held = lease.acquire(store, holder, 600)  # no run publishes meanwhile
    lake = Lake(store, config.retention_days, lease.Fence(store, holder, held.epoch))
    try:
        if withdraw_id is not None:
            out = withdraw(lake, withdraw_id)
        else:
            assert conflict_id is not None and why is not None
            chosen = Take.ROW if row is not None else Take(take or "")
            out = record(lake, config, conflict_id, chosen, row, why.strip(), by)
        return Decided(out, reruns(read_runs(lake), config.tables, out["dt"]))
    finally:
        lease.release(store, holder, held.epoch)
