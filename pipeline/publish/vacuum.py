"""``cdr vacuum`` (docs/outputs.md): remove the data files of the published Delta
tables that no version a reader may still ask for needs.

The window is the config's ``retention_days`` (``--retain-days N`` may shorten it, never
lengthen it: every table keeps its log that long, ``pipeline.storage.lake_retention``). A
file stays if it belongs to
- the latest version of its table,
- any version committed within the window, or the version that was current at its start
  (time travel to any moment of the window),
- any version a retained ``runs`` row names (``runs_table.retained_rows``): a row
  finished within the window (a backfill starts from a date within it), and the run each
  table was last published by, now (the state the next run starts from) and when the
  window began.

Everything else under a table's folder goes: files of versions replaced before the window
(an older run of a rerun date), and files no commit ever registered (an attempt that
failed before its commit). The tables of one run, the logs of a failed run
(``_failed/run=<id>/``) and the state of a backfill (``_backfills/run=<id>/``), go whole,
Delta log included, once their last commit is older than the window and no retained row
is that run's (a run past the window, or one killed before its row went in).
Takeover markers of the lease older than the window go too, and the staging folders
runs of releases before delta-spark left (``published/_staging/``). Vacuum holds the
store's lease while it works, so that no run is committing files it would take for
strays. A deletion vector file (``deletion_vector_*.bin``) goes when no add action of
its table's log refers to it (the log holds every version a reader can ask for, and a
little more). The published tables' Delta logs are left whole.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from pipeline.core import layout
from pipeline.storage import lease
from pipeline.storage.lake import Lake
from pipeline.storage.lake_read import add_actions
from pipeline.storage.lake_retention import DV_PREFIX, DV_SUFFIX, deletion_vector_files
from pipeline.storage.runs_table import read_runs, retained_rows
from pipeline.storage.store import Store

log = logging.getLogger(__name__)


@dataclass
class VacuumResult:
    removed: dict[str, list[str]] = field(default_factory=dict)  # table path -> keys
    kept: dict[str, int] = field(default_factory=dict)  # table path -> data files kept

    @property
    def files(self) -> int:
        return sum(len(v) for v in self.removed.values())


def table_paths(store: Store) -> list[str]:
    keys = store.list(layout.PUBLISHED)
    return sorted({k.split("/_delta_log/")[0] for k in keys if "/_delta_log/" in k})


def _run_table(store: Store, path: str, table: Any, keep: set[str], horizon: datetime) -> list[str]:
    """All the keys of ``path`` if it is a table of one run (a failed run's log, a
    backfill's state) that no retained row keeps and that was last committed before the
    window; else none. Data files first, then the Delta log from its newest version
    down: a vacuum stopped halfway leaves a table that still reads, or strays the next
    vacuum removes."""
    run_id = layout.run_table_of(path)
    if run_id is None or run_id in keep:
        return []
    if table.history(1)[0]["timestamp"] / 1000 >= horizon.timestamp():
        return []
    keys = store.list(path)
    data = sorted(k for k in keys if "/_delta_log/" not in k)
    return data + sorted((k for k in keys if "/_delta_log/" in k), reverse=True)


def _stale_files(
    lake: Lake, path: str, table: Any, named: set[int], horizon: datetime
) -> tuple[int, list[str]]:
    """(data files of ``path``, those that no version to keep needs)."""
    versions = {int(table.version())} | named
    recent = [
        int(h["version"])
        for h in table.history()
        if h.get("timestamp", 0) / 1000 >= horizon.timestamp()
    ]
    if recent and min(recent) > 0:
        recent.append(min(recent) - 1)  # the version current at the horizon
    versions |= set(recent)
    needed: set[str] = set()
    for v in versions:
        at = lake.table(path, v)
        if at is not None:
            needed |= {a["path"] for a in add_actions(at)}
    needed |= deletion_vector_files(lake.store, path)
    data = [
        k
        for k in lake.store.list(path)
        if k.startswith(f"{path}/")
        and "/_delta_log/" not in k
        and (k.endswith(".parquet") or _is_deletion_vector(k))
    ]
    return len(data), [k for k in data if k[len(path) + 1 :] not in needed]


def _is_deletion_vector(key: str) -> bool:
    name = key.rsplit("/", 1)[-1]
    return name.startswith(DV_PREFIX) and name.endswith(DV_SUFFIX)


def vacuum(
    store: Store, retain_days: int, now: datetime | None = None, dry_run: bool = False
) -> VacuumResult:
    if retain_days < 0:
        raise ValueError("--retain-days must be 0 or more")
    now = now or datetime.now(UTC)
    horizon = now - timedelta(days=retain_days)
    holder = f"vacuum-{now.strftime('%Y%m%dT%H%M%SZ')}-{socket.gethostname()}-{os.getpid()}"
    held = lease.acquire(store, holder, lease.SECONDS)
    try:
        with lease.Heartbeat(store, holder, held.epoch, lease.SECONDS):
            return _vacuum(store, horizon, dry_run)
    finally:
        lease.release(store, holder, held.epoch)


def _vacuum(store: Store, horizon: datetime, dry_run: bool) -> VacuumResult:
    """What vacuum removes (the caller holds the lease)."""
    lake = Lake(store)
    named: dict[str, set[int]] = {}
    retained = retained_rows(read_runs(lake), horizon)
    for row in retained:
        for path, version in row.versions.items():
            named.setdefault(path, set()).add(int(version))
    keep_logs_of = {r.run_id for r in retained}
    result = VacuumResult()
    for path in table_paths(store):
        table = lake.table(path)
        if table is None:
            continue
        gone = _run_table(store, path, table, keep_logs_of, horizon)
        if gone:
            log.info("vacuum %s: a table of one run past the window", path)
        else:
            count, gone = _stale_files(lake, path, table, named.get(path, set()), horizon)
            result.kept[path] = count - len(gone)
            if gone:
                log.info("vacuum %s: %d file(s) no retained version needs", path, len(gone))
        if gone:
            result.removed[path] = gone
            if not dry_run:
                store.delete(gone)
    old = [
        key
        for key, taker in lease.takeovers(store)
        if datetime.fromisoformat(taker.acquired_at) < horizon
    ]
    if old:  # markers of takeovers long done (vacuum holds the lease: none is current)
        result.removed[layout.LOCK_TAKEOVER] = old
        if not dry_run:
            store.delete(old)
    staged = store.list(layout.STAGING)  # vacuum holds the lease: no run is publishing
    if staged:
        result.removed[layout.STAGING] = staged
        if not dry_run:
            store.delete(staged)
    return result
