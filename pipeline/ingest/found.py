"""Whether a run has inputs at all, asked before it writes anything
(docs/operations.md#nothing-is-written-before-the-inputs-are-found): the store holds an
``exports/`` folder (one listing of one key), and some configured replica exported some
configured table, or its full copy, for the date (a manifest's existence, no more).
Reads only: a wrong ``store`` or ``--date`` fails in about a second, before the lease,
the ``runs`` row, the work folder or a Spark session, and the message says what was
looked for and what to change. ``allow_missing_exports`` does not lift it: it lets a
replica be missing from a date that others exported, not a date nobody exported."""

from __future__ import annotations

from datetime import date

from pipeline.core import layout
from pipeline.core.config import Config
from pipeline.core.errors import ExportError
from pipeline.storage.store import Store

#: how many of the latest dates that have manifests a message names
SHOWN_DATES = 5


def require_inputs(config: Config, store: Store, dt: date) -> None:
    """Raise :class:`ExportError` when the store has no ``exports/`` folder, or no manifest
    of ``dt`` (an export's or a replica's full copy) for any configured replica and table."""
    if not store.any_under(layout.EXPORTS):
        raise ExportError(
            f"no exports under {store.uri}/{layout.EXPORTS}/ — is `store` right? "
            "(cdr.yaml `store`, or --store)"
        )
    pairs = [(r, t) for t in config.tables for r in config.replica_ids]
    if any(has_manifest(store, r, t, dt) for r, t in pairs):
        return
    raise ExportError(no_manifest(config, store, dt))


def has_manifest(store: Store, replica: str, table: str, dt: date) -> bool:
    """Whether the replica's export of the table for ``dt``, or its full copy, has a
    manifest (``pipeline.ingest.manifests.find_export`` reads it later)."""
    return store.exists(layout.export_manifest(replica, table, dt)) or store.exists(
        f"{layout.replica_snapshot_dir(replica, table, dt)}/{layout.MANIFEST}"
    )


def no_manifest(config: Config, store: Store, dt: date) -> str:
    """What a run of ``dt`` looked for and did not find, with the latest dates that have
    manifests (a wrong ``--date`` shows)."""
    replicas, tables = config.replica_ids, list(config.tables)
    where = f"{store.uri}/{layout.export_manifest('<id>', '<table>', dt)}"
    said = (
        f"no manifest for {dt} under {where} (nor a replica's full copy under .../snapshot/"
        f"dt={dt}/) for any of the {_count(replicas, 'replica')} and "
        f"{_count(tables, 'table')}"
    )
    last = SHOWN_DATES
    dates = dates_with_manifests(config, store, last)
    if dates:
        said += (
            f"; the dates that have manifests: {', '.join(map(str, dates))}"
            f"{f' (the last {last})' if len(dates) == last else ''}: is --date right?"
        )
    else:
        said += (
            "; no date has a manifest there: an export is read only through its "
            f"{layout.MANIFEST} (docs/adapters.md)"
        )
    if config.allow_missing_exports:
        said += (
            ". allow_missing_exports lets a replica miss a date others exported, not a date "
            "nobody exported: a date with no changes still needs a manifest listing no files"
        )
    return said


def dates_with_manifests(config: Config, store: Store, last: int = SHOWN_DATES) -> list[date]:
    """The latest ``last`` dates for which some configured replica has a manifest of some
    configured table (an export's or a full copy's), oldest first: one listing of each
    replica's table folder (and its ``snapshot/``), then a manifest's existence per date
    from the latest down."""
    seen: set[date] = set()
    for r in config.replica_ids:
        for t in config.tables:
            base = f"{layout.EXPORTS}/replica={r}/table={t}"
            seen |= _dates(store.folders(base)) | _dates(store.folders(f"{base}/snapshot"))
    found: list[date] = []
    for d in sorted(seen, reverse=True):
        if len(found) == last:
            break
        if any(has_manifest(store, r, t, d) for t in config.tables for r in config.replica_ids):
            found.append(d)
    return sorted(found)


def _dates(folders: list[str]) -> set[date]:
    out = set()
    for name in folders:
        if not name.startswith("dt="):
            continue  # ``snapshot``, a stray folder
        try:
            out.add(date.fromisoformat(name.removeprefix("dt=")))
        except ValueError:
            continue
    return out


def _count(names: list[str] | tuple[str, ...], noun: str) -> str:
    return f"{len(names)} {noun}{'' if len(names) == 1 else 's'} ({', '.join(names)})"
