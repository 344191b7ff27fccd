"""Exports that arrived, changed or went away after their date ran.

A run of ``D`` starts from the state published for an earlier date, which holds the events
of every export that date's run read. An export uploaded after that run (a replica that
was missing, allowed by ``allow_missing_exports``), or uploaded again with other contents,
is in no published state: the following nights would build on a state that misses it,
silently. So ingest compares the manifests of the dates it could still repair (the
ledger window, ``[D - gc_grace_seconds, D)`` and at least the day before, each with a
published run) with the
sha256 the ``runs`` table recorded for them, and stops naming the replica, table and date
to rerun. An operator may accept the difference instead (``--accept-late-exports``): the
run then records the manifests as it found them, so that the next nights do not ask again.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from datetime import date, timedelta
from typing import TYPE_CHECKING, Any

from pipeline.core import layout
from pipeline.core.errors import NotFoundError
from pipeline.storage.runs_table import RunRow, published_by_date

if TYPE_CHECKING:
    from pipeline.core.config import Config
    from pipeline.storage.store import Store


@dataclass(frozen=True)
class LateExport:
    """One export whose manifest is not what the published runs recorded for it."""

    replica: str
    table: str
    dt: date
    what: str  # arrived | changed
    run_id: str  # the published run of its date
    manifest: str  # its key in the store
    sha256: str  # of the manifest as it is now

    def __str__(self) -> str:
        return (
            f"replica {self.replica!r}, table {self.table!r}, {self.dt}: {self.what} after "
            f"its run {self.run_id}"
        )

    def record(self) -> dict[str, Any]:
        """The entry the accepting run's ``runs`` row keeps (``inputs``)."""
        return {"manifest": self.manifest, "sha256": self.sha256, "accepted": self.what}


def _recorded(runs: list[RunRow]) -> dict[str, str | None]:
    """Each manifest's sha256 as the published run that read (or accepted) it last
    recorded it."""
    out: dict[str, str | None] = {}
    for r in sorted(runs, key=RunRow.order):
        if r.published:
            out.update({m["manifest"]: m.get("sha256") for m in r.inputs})
    return out


def _sha256(store: Store, key: str) -> str | None:
    """The manifest's sha256, or None if there is none (one request either way)."""
    try:
        return hashlib.sha256(store.read_bytes(key)).hexdigest()
    except NotFoundError:
        return None


def find_late(config: Config, store: Store, runs: list[RunRow], dt: date) -> list[LateExport]:
    """The exports of the published dates in ``[dt - gc_grace_seconds, dt)`` (at least the
    day before) whose manifest is not the recorded one, for the tables and replicas those
    runs had. An export removed since is not reported: its events are in the state."""
    start = dt - timedelta(days=max(1, math.ceil(config.gc_grace_seconds / 86400)))
    recorded = _recorded(runs)
    out = []
    for d, run in sorted(published_by_date(runs).items()):
        if not start <= d < dt:
            continue
        for t, counts in sorted(run.tables().items()):
            if t not in config.tables:
                continue
            known = set(counts.get("replicas") or {}) | set(counts.get("missing_exports") or [])
            for rep in [r for r in config.replica_ids if r in known]:
                key = layout.export_manifest(rep, t, d)
                now, was = _sha256(store, key), recorded.get(key)
                if now is not None and now != was:  # gone is no news: its events are in
                    what = "arrived" if was is None else "changed"
                    out.append(LateExport(rep, t, d, what, run.run_id, key, now))
    return out


def late_error(late: list[LateExport]) -> str:
    earliest = min(x.dt for x in late)
    return (
        f"exports changed after their date ran: {'; '.join(map(str, late))}. The state "
        f"published since does not hold them: rerun {earliest} and the dates after it, in "
        "order, or pass --accept-late-exports to go on without them"
    )
