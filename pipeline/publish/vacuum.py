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

import json
import logging
import os
import socket
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any
from urllib.parse import unquote

from pipeline.core import layout
from pipeline.storage import lease
from pipeline.storage.lake import Lake
from pipeline.storage.lake_read import add_actions
from pipeline.storage.lake_retention import DV_PREFIX, DV_SUFFIX, deletion_vector_files
from pipeline.storage.runs_table import read_runs, retained_rows
from pipeline.storage.store import Store

log = logging.getLogger(__name__)


class Why(StrEnum):
    """Why a file goes: one value per rule of this module's docstring."""

    REPLACED = "replaced"  # a commit before the window removed it; no kept version holds it
    UNLOGGED = "unlogged"  # no commit the log holds added it (a failed attempt's)
    DELETION_VECTOR = "deletion_vector"  # no add action of the log refers to it
    RUN_TABLE = "run_table"  # a table of one run past the window, whole
    TAKEOVER = "takeover"  # a marker of a lease takeover older than the window
    STAGING = "staging"  # the staging folder of a release before delta-spark


@dataclass(frozen=True)
class Gone:
    """Files of one folder that go for one reason, said in words (``detail``)."""

    path: str
    why: Why
    detail: str
    keys: tuple[str, ...]

    def line(self) -> str:
        return f"  {self.path}: {len(self.keys)} file(s), {self.detail}"

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "why": self.why.value, "detail": self.detail,
                "files": list(self.keys)}  # fmt: skip


@dataclass
class VacuumResult:
    groups: list[Gone] = field(default_factory=list)  # what goes, and why
    kept: dict[str, int] = field(default_factory=dict)  # table path -> data files kept
    horizon: datetime | None = None  # the window's start
    retained_runs: int = 0  # the runs rows whose versions stay

    @property
    def removed(self) -> dict[str, list[str]]:
        """Table path -> the keys that go."""
        out: dict[str, list[str]] = {}
        for g in self.groups:
            out.setdefault(g.path, []).extend(g.keys)
        return out

    @property
    def files(self) -> int:
        return sum(len(g.keys) for g in self.groups)

    def summary(self, verb: str, where: str) -> str:
        """One line: how many files go, how many stay, and the window that decided."""
        since = f"{self.horizon:%Y-%m-%dT%H:%M:%SZ}" if self.horizon else "?"
        return (
            f"{verb} {self.files} file(s) from {where}/published; kept "
            f"{sum(self.kept.values())} data file(s) of {len(self.kept)} table(s): each "
            f"table's latest version, the versions of the window (since {since}) and those "
            f"{self.retained_runs} retained runs row(s) name"
        )


def table_paths(store: Store) -> list[str]:
    keys = store.list(layout.PUBLISHED)
    return sorted({k.split("/_delta_log/")[0] for k in keys if "/_delta_log/" in k})


def _when(ms: float) -> str:
    return f"{datetime.fromtimestamp(ms / 1000, UTC):%Y-%m-%dT%H:%M:%SZ}"


def _run_table(
    store: Store, path: str, table: Any, keep: set[str], horizon: datetime
) -> Gone | None:
    """All the keys of ``path`` if it is a table of one run (a failed run's log, a
    backfill's state) that no retained row keeps and that was last committed before the
    window; else None. Data files first, then the Delta log from its newest version
    down: a vacuum stopped halfway leaves a table that still reads, or strays the next
    vacuum removes."""
    run_id = layout.run_table_of(path)
    if run_id is None or run_id in keep:
        return None
    last = table.history(1)[0]["timestamp"]
    if last / 1000 >= horizon.timestamp():
        return None
    keys = store.list(path)
    data = sorted(k for k in keys if "/_delta_log/" not in k)
    logged = sorted((k for k in keys if "/_delta_log/" in k), reverse=True)
    detail = (
        f"the whole table of run {run_id}, its log included: last committed {_when(last)}, "
        "before the window, and no retained runs row is that run's"
    )
    return Gone(path, Why.RUN_TABLE, detail, tuple(data + logged))


def _log_actions(store: Store, path: str) -> tuple[int | None, dict[str, int]]:
    """The oldest commit the table's log still holds (None: none), and each file a
    commit removed with the version that removed it last (a file no kept version needs
    that no commit removed was never added by one: the latest version would hold it)."""
    removed: dict[str, int] = {}
    versions = []
    for key in sorted(store.list(f"{path}/_delta_log/")):
        name = key.rsplit("/", 1)[-1]
        if not (name.endswith(".json") and name[:-5].isdigit()):
            continue  # a checkpoint, a CRC, a temporary file
        v = int(name[:-5])
        versions.append(v)
        for line in store.read_bytes(key).decode().splitlines():
            action = json.loads(line) if line.strip() else {}
            if "remove" in action:
                removed[unquote(action["remove"]["path"])] = v
    return (min(versions) if versions else None), removed


def _reasons(
    store: Store, path: str, gone: list[str], when: dict[int, float], horizon: datetime
) -> list[Gone]:
    """``gone`` (keys of ``path``'s stale files) grouped by why each goes: the commit that
    replaced it (before the window), or none the log holds added it."""
    oldest, removed = _log_actions(store, path)
    groups: dict[tuple[Why, int | None], list[str]] = defaultdict(list)
    for key in gone:
        rel = key[len(path) + 1 :]
        if _is_deletion_vector(key):
            groups[(Why.DELETION_VECTOR, None)].append(key)
        elif rel in removed:
            groups[(Why.REPLACED, removed[rel])].append(key)
        else:
            groups[(Why.UNLOGGED, None)].append(key)
    since = f"{horizon:%Y-%m-%dT%H:%M:%SZ}"
    out = []
    for (why, v), keys in sorted(groups.items(), key=lambda g: (g[0][0], g[0][1] or 0)):
        if why is Why.REPLACED:
            at = f" ({_when(when[v])})" if v in when else ""
            detail = (
                f"replaced by version {v}{at}, before the window (since {since}); no version "
                "kept (the latest, the window's, a retained runs row's) holds them"
            )
        elif why is Why.DELETION_VECTOR:
            detail = "deletion vectors no add action of the table's log refers to"
        elif oldest:  # the log was trimmed: older commits are gone from it
            detail = (
                f"in no commit the log holds (versions {oldest} on): replaced before them, "
                "or written by an attempt that failed before its commit"
            )
        else:
            detail = (
                "in no commit of the table: written by an attempt that failed before its commit"
            )
        out.append(Gone(path, why, detail, tuple(keys)))
    return out


def _stale_files(
    lake: Lake, path: str, table: Any, named: set[int], horizon: datetime
) -> tuple[int, list[Gone]]:
    """(data files of ``path``, those that no version to keep needs, grouped by why)."""
    versions = {int(table.version())} | named
    history = table.history()
    when = {int(h["version"]): h.get("timestamp", 0) for h in history}
    recent = [v for v, ms in when.items() if ms / 1000 >= horizon.timestamp()]
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
    gone = [k for k in data if k[len(path) + 1 :] not in needed]
    return len(data), _reasons(lake.store, path, gone, when, horizon) if gone else []


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
    """What vacuum removes, and why (the caller holds the lease)."""
    lake = Lake(store)
    named: dict[str, set[int]] = {}
    retained = retained_rows(read_runs(lake), horizon)
    for row in retained:
        for path, version in row.versions.items():
            named.setdefault(path, set()).add(int(version))
    keep_logs_of = {r.run_id for r in retained}
    result = VacuumResult(horizon=horizon, retained_runs=len(retained))
    for path in table_paths(store):
        table = lake.table(path)
        if table is None:
            continue
        whole = _run_table(store, path, table, keep_logs_of, horizon)
        if whole is not None:
            groups = [whole]
        else:
            count, groups = _stale_files(lake, path, table, named.get(path, set()), horizon)
            result.kept[path] = count - sum(len(g.keys) for g in groups)
        for g in groups:
            log.info("vacuum %s: %d file(s), %s", path, len(g.keys), g.detail)
            result.groups.append(g)
            if not dry_run:
                store.delete(list(g.keys))
    old = [
        key
        for key, taker in lease.takeovers(store)
        if datetime.fromisoformat(taker.acquired_at) < horizon
    ]
    if old:  # markers of takeovers long done (vacuum holds the lease: none is current)
        detail = "markers of lease takeovers older than the window"
        result.groups.append(Gone(layout.LOCK_TAKEOVER, Why.TAKEOVER, detail, tuple(old)))
    staged = store.list(layout.STAGING)  # vacuum holds the lease: no run is publishing
    if staged:
        detail = "the staging of runs of a release before delta-spark (no run publishes now)"
        result.groups.append(Gone(layout.STAGING, Why.STAGING, detail, tuple(staged)))
    if old + staged and not dry_run:
        store.delete(old + staged)
    return result
