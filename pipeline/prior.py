"""What a run starts from (formats.md "Outputs": Backfills, Each event once): the state
its table published for the latest date before it, checked against that run's ``runs``
row; else ``base/`` (a table new to the config, or the first run); else nothing. And the
event ids of the ledger's window, which the run does not resolve again.

Files are found through the Delta log of the pinned version, never by listing folders;
each is staged into the run's work folder (on ``file://`` read where it lies) and its
row count checked against the log, so that a deleted or truncated file stops the run.
"""

from __future__ import annotations

import json
import logging
import posixpath
import re
from dataclasses import dataclass, field
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline import layout
from pipeline.errors import PriorStateError, StoreError
from pipeline.lake import DT, Lake, add_actions
from pipeline.runs_table import RunRow
from pipeline.store import Store

log = logging.getLogger(__name__)


@dataclass
class Staged:
    """Files staged for Spark: local paths, with the row count the Delta log gives."""

    files: list[str] = field(default_factory=list)
    rows: int = 0


def _stage(store: Store, path: str, actions: list[dict], dest: Path) -> Staged:
    """Each file of ``actions`` downloaded into ``dest``, its row count checked."""
    out = Staged()
    dest.mkdir(parents=True, exist_ok=True)
    for a in actions:
        key = f"{path}/{a['path']}"
        local = dest / posixpath.basename(a["path"])
        try:
            store.download(key, local)
        except (StoreError, OSError):
            raise PriorStateError(f"{store.uri}/{key}: missing ({a['num_records']} rows)") from None
        try:
            rows = pq.ParquetFile(local).metadata.num_rows
        except (pa.ArrowInvalid, OSError) as e:
            raise PriorStateError(f"{store.uri}/{key}: not a readable Parquet file ({e})") from None
        if rows != a["num_records"]:
            raise PriorStateError(
                f"{store.uri}/{key}: {rows} rows, but the Delta log says {a['num_records']}"
            )
        out.files.append(str(local))
        out.rows += rows
    return out


def stage_state(store: Store, lake: Lake, run: RunRow, table: str, dest: Path) -> Staged:
    """The ``state`` partition of ``run.dt`` as ``run`` committed it, checked against its
    ``runs`` row: the version it names, the run id in that commit, the row count."""
    path = layout.table_path(table, layout.STATE)
    where = f"the state of {table} published for {run.dt} by run {run.run_id}"
    version = run.versions.get(path)
    if version is None:
        raise PriorStateError(f"{where}: its runs row names no version of {path}")
    try:
        t = lake.table(path, version)
    except StoreError as e:
        raise PriorStateError(f"{where}: {e}") from None
    if t is None:
        raise PriorStateError(f"{where}: {lake.uri(path)} has no Delta log")
    committed_by = (lake.commit_info(path, version) or {}).get("cdr.run_id")
    if committed_by != run.run_id:
        raise PriorStateError(
            f"{where}: version {version} of {path} was committed by {committed_by!r}"
        )
    expected = int(run.tables().get(table, {}).get("state_rows", -1))
    actions = add_actions(t, run.dt)
    found = sum(int(a["num_records"]) for a in actions)
    if expected >= 0 and found != expected:
        raise PriorStateError(f"{where}: the Delta log lists {found} rows, the runs row {expected}")
    staged = _stage(store, path, actions, dest)
    log.info("prior %s: %d state rows of %s (run %s)", table, staged.rows, run.dt, run.run_id)
    return staged


def ledger_window(dt: date, gc_grace_seconds: int) -> tuple[date, date]:
    """The dates ``[first, dt)`` whose ledger a run of ``dt`` reads (formats.md "Each event
    once"): a date counts when its start is within ``gc_grace_seconds`` before ``dt``'s.
    ``dt``'s own partition is out, so that a rerun of ``dt`` resolves its events again."""
    return dt - timedelta(days=gc_grace_seconds // 86400), dt


def stage_ledger(
    store: Store, lake: Lake, table: str, dt: date, gc_grace_seconds: int, dest: Path
) -> list[str]:
    """The ledger partitions of the window at the table's latest version, each into
    ``dest/dt=<D>/``; returns their dates."""
    path = layout.table_path(table, layout.LEDGER)
    t = lake.table(path)
    if t is None:
        return []
    first, end = ledger_window(dt, gc_grace_seconds)
    by_date: dict[date, list[dict]] = {}
    for a in add_actions(t):
        d = a[f"partition.{DT}"]
        if first <= d < end:
            by_date.setdefault(d, []).append(a)
    for d, actions in by_date.items():
        _stage(store, path, actions, dest / f"dt={d.isoformat()}")
    dates = sorted(d.isoformat() for d in by_date)
    if dates:
        log.info("ingest %s: the ledger of %s", table, ", ".join(dates))
    return dates


def stage_table(store: Store, lake: Lake, path: str, dest: Path) -> int:
    """A whole small table at its latest version (the CDC generations a run starts
    from), into ``dest``; returns its row count (0 when there is no such table)."""
    t = lake.table(path)
    return 0 if t is None else _stage(store, path, add_actions(t), dest).rows


# ---------------------------------------------------------------------- the earlier layout

_POINTER_RE = re.compile(r"dt=(\d{4}-\d{2}-\d{2})\.json$")


def legacy_prior(store: Store, table: str, dt: date) -> dict[str, Any] | None:
    """The earlier layout's pointer (``_runs/dt=<D>.json``) of the latest date before
    ``dt``, if the store was published by it."""
    best: date | None = None
    for key in store.list(layout.legacy_pointers_dir(table)):
        m = _POINTER_RE.search(key)
        if m and date.fromisoformat(m.group(1)) < dt:
            best = max(best or date.min, date.fromisoformat(m.group(1)))
    if best is None:
        return None
    key = f"{layout.legacy_pointers_dir(table)}/dt={best.isoformat()}.json"
    pointer: dict[str, Any] = json.loads(store.read_bytes(key))
    return pointer


def stage_legacy_state(store: Store, table: str, pointer: dict[str, Any], dest: Path) -> Staged:
    """The state an earlier-layout pointer names, whole: no file, an unreadable file or a
    row count other than the one its run recorded stops the run, naming it."""
    where = (
        f"table {table!r}: the prior state of {pointer['dt']} (run {pointer['run_id']}, "
        "earlier layout)"
    )
    fix = f"restore it, or rerun {pointer['dt']}"
    keys = [k for k in store.list(pointer["state"]) if k.endswith(".parquet")]
    if not keys:
        raise PriorStateError(f"{where} has no files at {store.uri}/{pointer['state']}: {fix}")
    out = Staged()
    dest.mkdir(parents=True, exist_ok=True)
    for key in keys:
        local = dest / posixpath.basename(key)
        store.download(key, local)
        try:
            out.rows += pq.ParquetFile(local).metadata.num_rows
        except Exception as e:  # pyarrow raises several types for a damaged footer
            raise PriorStateError(
                f"{where}: {store.uri}/{key} is unreadable ({e}): {fix}"
            ) from None
        out.files.append(str(local))
    expected = pointer.get("state_rows")  # absent in pointers published before it was kept
    if expected is not None and out.rows != expected:
        raise PriorStateError(
            f"{where} has {out.rows} rows in {len(keys)} file(s) at "
            f"{store.uri}/{pointer['state']}, but its run published {expected}: {fix}"
        )
    return out
