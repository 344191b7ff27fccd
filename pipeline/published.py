"""Publishing (formats.md "Outputs"): everything of a run goes under new ``run=<run_id>``
folders, the date's outputs under ``dt=<D>``, and the pointers move last.

Readers follow ``published/<table>/_latest.json``; it is replaced only after every file
of the run is in place, and it only moves forward in time: a rerun of an old date updates
that date's pointer (``_runs/dt=<D>.json``, which the next date's run reads its prior state
from) but leaves ``_latest.json`` on the newest date.
"""

from __future__ import annotations

import json
import logging
import re
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from pipeline import layout
from pipeline.store import Store, upload_tree

log = logging.getLogger(__name__)

DATED_OUTPUTS = ("conflicts", "quarantine", "divergence", "orphans")  # a failed run's too
LEDGER = "ledger"  # the final fates: a published run's only
_POINTER_RE = re.compile(r"dt=(\d{4}-\d{2}-\d{2})\.json$")


def find_prior_pointer(store: Store, table: str, dt: date) -> dict[str, Any] | None:
    """The pointer of the latest date before ``dt`` that published ``table``."""
    best: date | None = None
    for key in store.list(layout.pointers_dir(table)):
        m = _POINTER_RE.search(key)
        if m:
            d = date.fromisoformat(m.group(1))
            if d < dt and (best is None or d > best):
                best = d
    if best is None:
        return None
    return json.loads(store.read_bytes(layout.dated_pointer(table, best)))


def read_latest(store: Store, table: str) -> dict[str, Any] | None:
    key = layout.latest_pointer(table)
    if not store.exists(key):
        return None
    return json.loads(store.read_bytes(key))


def replace_dated(store: Store, src: Path, prefix: str, run_id: str) -> None:
    """Replace the contents of a ``dt=`` folder: new files first (named by run), then the
    old ones go."""
    before = set(store.list(prefix))
    written = []
    if src.exists():
        for f in sorted(src.rglob("*.parquet")):
            key = f"{prefix}/{run_id}-{f.name}"
            store.upload(f, key)
            written.append(key)
    store.delete(sorted(before - set(written)))


def replace_tree(store: Store, src: Path, prefix: str) -> None:
    """Make ``prefix`` hold what ``src`` holds: upload every file, then delete what an
    earlier run left there."""
    before = set(store.list(prefix))
    written = set()
    for f in sorted(p for p in src.rglob("*") if p.is_file()):
        key = f"{prefix}/{f.relative_to(src).as_posix()}"
        store.upload(f, key)
        written.add(key)
    store.delete(sorted(before - written))


def publish_inspection(
    store: Store, resolved: Path, tables: list[str], dt: date, run_id: str
) -> None:
    """The date's logs and ledger of the run that publishes it, replacing an earlier
    run's."""
    for t in tables:
        for kind in (*DATED_OUTPUTS, LEDGER):
            replace_dated(store, resolved / t / kind, layout.dated_output(t, kind, dt), run_id)


def publish_failed(store: Store, resolved: Path, tables: list[str], run_id: str) -> None:
    """The logs of a run that failed its gate, for inspection (semantics.md §12 "A failed
    run"), under ``_failed/run=<run_id>/``: the date's published logs stay as they are."""
    for t in tables:
        for kind in DATED_OUTPUTS:
            upload_tree(store, resolved / t / kind, layout.failed_output(run_id, t, kind))


def publish_cdc(store: Store, resolved: Path, tables: list[str], dt: date, run_id: str) -> None:
    """The CDC description tables, then each table's log of the date (before the
    snapshots' pointers move: a consumer finds a stream described before it reads it)."""
    cdc = resolved / "cdc"
    for name in layout.CDC_TABLES:
        replace_dated(store, cdc / name, layout.cdc_table_dir(name), run_id)
    for t in tables:
        replace_dated(store, cdc / t / "log", layout.cdc_log_dir(t, dt), run_id)


def publish_run(
    store: Store,
    resolved: Path,
    tables: list[str],
    dt: date,
    run_id: str,
    summaries: dict[str, dict[str, Any]],
) -> dict[str, dict[str, Any]]:
    """Upload snapshots and states under ``run=<run_id>``, then the pointers (with the
    row counts the next run checks its prior state against)."""
    pointers = {}
    for t in tables:
        n_snap = upload_tree(store, resolved / t / "snapshot", layout.snapshot_dir(t, run_id))
        upload_tree(store, resolved / t / "state", layout.state_dir(t, run_id))
        log.info("publish %s: %d snapshot file(s)", t, n_snap)
        pointers[t] = {
            "run_id": run_id,
            "dt": dt.isoformat(),
            "snapshot": layout.snapshot_dir(t, run_id),
            "state": layout.state_dir(t, run_id),
            "rows": summaries[t].get("rows", 0),
            "state_rows": summaries[t]["state_rows"],
            "published_at": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
        }
    for t, p in pointers.items():
        store.write_bytes(layout.dated_pointer(t, dt), json.dumps(p, indent=2).encode())
    for t, p in pointers.items():  # last: readers now see the new run
        latest = read_latest(store, t)
        if latest is None or date.fromisoformat(latest["dt"]) <= dt:
            store.write_bytes(layout.latest_pointer(t), json.dumps(p, indent=2).encode())
        else:
            log.info(
                "publish %s: _latest.json stays on %s (this run is for an earlier date)",
                t,
                latest["dt"],
            )
    return pointers
