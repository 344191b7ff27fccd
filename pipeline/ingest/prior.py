"""What a run starts from (docs/outputs.md: Backfills, Each event once): the state
its table published for the latest date before it, checked against that run's ``runs``
row; else ``base/`` (a table new to the config, or the first run); else nothing. And the
event ids of the ledger's window, which the run does not resolve again.

Ingest *pins* each published table the run reads (:class:`pipeline.storage.lake_read.Pin`: its URI,
the version, the partitions), checked on the driver from the Delta log and one listing
of the table's folder: the version the ``runs`` row names, the run id in that commit,
every file the log names present at its size (a deleted or truncated file stops the
run, naming it). The executors read the pinned versions through Delta's reader
(``resolve.state.read_prior``, ``resolve.stage.read_ledger``); no byte of them goes
through the driver, and the row count the ``runs`` row recorded is checked as they read.
"""

from __future__ import annotations

import json
import logging
import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any

import pyarrow.parquet as pq

from pipeline.core import layout
from pipeline.core.columns import DT, RUN_ID
from pipeline.core.errors import PriorStateError, StoreError
from pipeline.storage.lake import Lake
from pipeline.storage.lake_read import Pin, add_actions
from pipeline.storage.runs_table import RunRow, retained_rows
from pipeline.storage.store import Store
from pipeline.storage.workpath import WorkPath, write_table

log = logging.getLogger(__name__)

#: the pins of a staged table
PRIOR_PIN = "prior.pin.json"
LEDGER_PIN = "ledger.pin.json"
HISTORY_PIN = "history.pin.json"


def _check_files(store: Store, path: str, actions: list[dict[str, Any]]) -> None:
    """Every file ``actions`` names is in the store at the size the log gives."""
    folders = {posixpath.dirname(a["path"]) for a in actions}
    sizes: dict[str, int] = {}
    for folder in folders:
        sizes |= store.sizes(f"{path}/{folder}".rstrip("/"))
    for a in actions:
        key = f"{path}/{a['path']}"
        if key not in sizes:
            raise PriorStateError(f"{store.uri}/{key}: missing ({a['num_records']} rows)")
        if sizes[key] != a["size_bytes"]:
            raise PriorStateError(
                f"{store.uri}/{key}: not the file the Delta log names ({sizes[key]} bytes, "
                f"the log says {a['size_bytes']})"
            )


def pin_state(
    store: Store, lake: Lake, run: RunRow, table: str, runs: Sequence[RunRow] = ()
) -> Pin:
    """The state of ``run.dt`` as ``run`` committed it, checked against its ``runs`` row:
    the version it names, the run id in that commit (another run's only when that run's
    own published row names the same version, a state ``run`` did not move: a merge with
    nothing to change, or an empty state left empty, makes no commit), its files. That
    version's partition of ``run.dt`` in a table partitioned by date (the layout before
    the state was one table), else the version whole."""
    where = f"the state of {table} published for {run.dt} by run {run.run_id}"
    path = state_path(run, table)
    if path is None:
        named = layout.table_path(table, layout.STATE)
        raise PriorStateError(f"{where}: its runs row names no version of {named}")
    version = run.versions[path]
    try:
        t = lake.table(path, version)
    except StoreError as e:
        raise PriorStateError(f"{where}: {e}") from None
    if t is None:
        raise PriorStateError(f"{where}: {lake.uri(path)} has no Delta log")
    # the state of a date: its partition of a table partitioned by date, else the version
    dated = DT in t.metadata().partition_columns
    rows = int(run.tables().get(table, {}).get("state_rows", -1))
    actions = add_actions(t, run.dt if dated else None)
    committed_by = lake.commit_meta(path, version).get(RUN_ID)
    # an empty state left empty makes no commit: the run names the version it found
    still_empty = rows == 0 and all(a.get("num_records") == 0 for a in actions)
    kept = any(
        r.run_id == committed_by and r.published and r.versions.get(path) == version for r in runs
    )
    if committed_by != run.run_id and not (still_empty or kept):
        raise PriorStateError(
            f"{where}: version {version} of {path} was committed by {committed_by!r}"
        )
    _check_files(store, path, actions)
    log.info("prior %s: the state of %s (run %s), version %d", table, run.dt, run.run_id, version)
    dates = (run.dt.isoformat(),) if dated else None
    return Pin(lake.spark_uri(path), version, dates, rows, where)


def refuse_outside_retention(
    runs: list[RunRow], run: RunRow, table: str, dt: date, days: int, at: datetime
) -> None:
    """docs/outputs.md#backfills: a run starts from a published state whose versions
    ``cdr vacuum`` keeps (:func:`pipeline.storage.runs_table.retained_rows` with the config's
    ``retention_days``, the longest window a vacuum may use); an older one is refused,
    naming the horizon, before anything reads it."""
    horizon = at - timedelta(days=days)
    if run.run_id in {r.run_id for r in retained_rows(runs, horizon)}:
        return
    raise PriorStateError(
        f"table {table!r}: a run of {dt} starts from the state of {run.dt} (run {run.run_id}, "
        f"finished {run.finished_at:%Y-%m-%d %H:%M} UTC), which is before the retention "
        f"horizon {horizon:%Y-%m-%d %H:%M} UTC (retention_days: {days}): `cdr vacuum` may "
        "have removed its versions. Backfills start from dates within the retention."
    )


def state_path(run: RunRow, table: str) -> str | None:
    """The table that holds the state ``run`` published for ``table``: ``state``, or the
    run's own if it ran for an older date than the newest (``layout.backfill_state``)."""
    for path in (layout.table_path(table, layout.STATE), layout.backfill_state(run.run_id, table)):
        if path in run.versions:
            return path
    return None


def ledger_window(dt: date, gc_grace_seconds: int) -> tuple[date, date]:
    """The dates ``[first, dt)`` whose ledger a run of ``dt`` reads
    (docs/outputs.md#each-event-once): a date counts when its start is within
    ``gc_grace_seconds`` before ``dt``'s. ``dt``'s own partition is out, so that a rerun of
    ``dt`` resolves its events again."""
    return dt - timedelta(days=gc_grace_seconds // 86400), dt


def pin_ledger(store: Store, lake: Lake, table: str, dt: date, gc_grace_seconds: int) -> Pin | None:
    """The ledger partitions of the window at the table's latest version (None when
    there are none)."""
    first, end = ledger_window(dt, gc_grace_seconds)
    path = layout.table_path(table, layout.LEDGER)
    found = pin_dates(store, lake, path, first, end - timedelta(days=1))
    if found is not None:
        log.info("ingest %s: the ledger of %s", table, ", ".join(found.dates or ()))
    return found


#: what a run's report says of a table whose ledger rows carry content digests (issue 49:
#: such a run's adapters made the stable event ids of docs/adapters.md)
DIGESTS = "ledger_digests"


def window_has_legacy_ids(runs: Sequence[RunRow], table: str, dates: Sequence[str]) -> bool:
    """Whether a date of the ledger's window was published by a run before issue 49 (its
    report does not say :data:`DIGESTS`): its adapters' event ids are the earlier ones."""
    last: dict[str, RunRow] = {}
    for r in runs:  # in commit order: the last published run of a date wrote its partition
        if r.published and table in r.tables():
            last[r.dt.isoformat()] = r
    return any(d in last and not last[d].tables()[table].get(DIGESTS) for d in dates)


def pin_dates(store: Store, lake: Lake, path: str, first: date, last: date) -> Pin | None:
    """The partitions of dated table ``path`` from ``first`` to ``last`` at the table's
    latest version, their files checked; None when it has none of them."""
    t = lake.table(path)
    if t is None:
        return None
    actions = [a for a in add_actions(t) if first <= a[f"partition.{DT}"] <= last]
    dates = sorted({a[f"partition.{DT}"].isoformat() for a in actions})
    if not dates:
        return None
    _check_files(store, path, actions)
    return Pin(lake.spark_uri(path), int(t.version()), tuple(dates))


def pin_table(store: Store, lake: Lake, path: str) -> Pin | None:
    """A whole table at its latest version (the history a run continues), or None."""
    t = lake.table(path)
    if t is None:
        return None
    _check_files(store, path, add_actions(t))
    return Pin(lake.spark_uri(path), int(t.version()))


def stage_small(lake: Lake, path: str, dest: WorkPath) -> int:
    """A small control table at its latest version (the CDC generations a run starts
    from), read through delta-rs' query engine into ``dest`` as one Parquet file;
    returns its row count (0 when there is no such table)."""
    data = lake.read(path)
    if data is None:
        return 0
    write_table(data, dest / "part-00000.parquet")
    return int(data.num_rows)


# ---------------------------------------------------------------------- the earlier layout


@dataclass
class Staged:
    """Files of the earlier (pre-Delta) layout staged for Spark, with their row count."""

    files: list[str] = field(default_factory=list)
    rows: int = 0


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


def stage_legacy_state(store: Store, table: str, pointer: dict[str, Any], dest: WorkPath) -> Staged:
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
    with dest.writing() as folder:
        for key in keys:
            local = folder / posixpath.basename(key)
            store.download(key, local)
            try:
                out.rows += pq.ParquetFile(local).metadata.num_rows
            except Exception as e:  # pyarrow raises several types for a damaged footer
                raise PriorStateError(
                    f"{where}: {store.uri}/{key} is unreadable ({e}): {fix}"
                ) from None
            out.files.append(str(dest / local.name))
    expected = pointer.get("state_rows")  # absent in pointers published before it was kept
    if expected is not None and out.rows != expected:
        raise PriorStateError(
            f"{where} has {out.rows} rows in {len(keys)} file(s) at "
            f"{store.uri}/{pointer['state']}, but its run published {expected}: {fix}"
        )
    return out
