"""Sealing a night (docs/sealing.md): the objects a CDC tool wrote for a replica, a table
and a date, copied into the export's folder and listed in a ``_manifest.json`` written
with a conditional create.

The layout (:data:`pipeline.core.sources.LAYOUTS`) says which objects belong to the date
and whether the date is sealed. The objects are copied (a server-side copy on S3, a hard
link in a folder) because a manifest's paths stay inside its folder
(:func:`pipeline.ingest.manifests.safe_relpath`); the manifest's rows and sha256 are the
copies'. Sealing is idempotent: a manifest that lists the same files is left alone; one
that lacks some of the date's objects is refused, unless ``late``, which adds them (never
drops one) with a conditional replace and names the dates to rerun, as the late-export
flow (:mod:`pipeline.ingest.late`) will ask at the next run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

from pipeline.core import layout
from pipeline.core.config import Config
from pipeline.core.errors import ExportError
from pipeline.core.sources import Plan, Source, plan
from pipeline.ingest.adapters import check_options
from pipeline.ingest.filefacts import file_facts
from pipeline.ingest.manifests import FORMATS, read_manifest, safe_relpath
from pipeline.storage.lake import Lake
from pipeline.storage.runs_table import later_dates, published_dates, read_runs
from pipeline.storage.store import Store


@dataclass(frozen=True)
class Sealed:
    """What sealing one export did: ``sealed`` (the manifest is written), ``unchanged``
    (it was, with these files), ``late`` (files added), ``waiting`` (not sealed yet) or
    ``would seal`` (a dry run)."""

    replica: str
    table: str
    dt: date
    status: str
    why: str
    files: tuple[str, ...] = ()  # the files this call listed in the manifest
    rerun: tuple[date, ...] = ()  # late: the published dates to run again, in order

    def line(self) -> str:
        head = f"{self.replica}/{self.table} {self.dt}: {self.status}"
        n = f" {len(self.files)} file(s)" if self.status in ("sealed", "late", "would seal") else ""
        text = f"{head}{n} ({self.why})"
        if self.status == "late":
            text += "; " + rerun_advice(self.dt, self.rerun)
        return text


def rerun_advice(dt: date, rerun: tuple[date, ...]) -> str:
    """What to do after a late file was added, in the late-export flow's words."""
    if not rerun:
        return f"{dt} has not been published yet: its run will read the new files"
    dates = ", ".join(map(str, rerun))
    return (
        f"the state published since does not hold them: rerun {dates} in order "
        f"(cdr run --date {dt} --then-later), or pass --accept-late-exports to the next "
        "run to go on without them"
    )


def _where(config: Config, replica: str) -> str:
    return f"replicas[{config.replica_ids.index(replica)}].source"


def _source(config: Config, replica: str) -> Source:
    if replica not in config.sources:
        with_source = ", ".join(config.sources) or "none"
        raise ExportError(
            f"replica {replica!r} has no source in the config (replicas with one: "
            f"{with_source}); its manifests are uploaded, not sealed (docs/sealing.md)"
        )
    src = config.sources[replica]
    if src.format not in FORMATS:
        raise ExportError(
            f"{_where(config, replica)}.format: {src.format!r} is not one of {', '.join(FORMATS)}"
        )
    return src


def plan_export(
    config: Config, store: Store, replica: str, table: str, dt: date, now: datetime, by_hand: bool
) -> Plan:
    """The tool's objects of ``dt`` for the table, and whether ``dt`` is sealed."""
    src = _source(config, replica)
    folder = src.folder(table)
    keys = [k.removeprefix(folder + "/") for k in store.list(folder)]
    return plan(src, keys, dt, now, by_hand)


def _nothing_there(config: Config, store: Store, replica: str, table: str, p: Plan) -> str:
    src = config.sources[replica]
    return (
        f"no object of layout {src.layout} under {store.uri}/{src.folder(table)} "
        f"({p.why}): is {_where(config, replica)}.prefix (or .tables.{table}) right?"
    )


def _copy_and_measure(
    store: Store, src: Source, table: str, folder: str, files: tuple[str, ...]
) -> list[dict[str, Any]]:
    """Each file copied into the export's folder, with its manifest entry."""
    out = []
    for rel in files:
        path = safe_relpath(rel, f"{store.uri}/{folder}")
        store.copy(f"{src.folder(table)}/{rel}", f"{folder}/{path}")
        out.append(file_facts(store, f"{folder}/{path}", src.format, dict(src.options)).entry(path))
    return out


def _rerun(store: Store, table: str, dt: date) -> tuple[date, ...]:
    runs = read_runs(Lake(store))
    if dt not in published_dates(runs, table):
        return ()
    return (dt, *later_dates(runs, [table], dt))


def seal_export(
    config: Config,
    store: Store,
    replica: str,
    table: str,
    dt: date,
    now: datetime,
    *,
    late: bool = False,
    by_hand: bool = False,
    dry_run: bool = False,
) -> Sealed:
    """Seal one export (docs/sealing.md); an ExportError when it cannot (nothing under
    the prefix, a manifest that lacks objects without ``late``, a lost race)."""
    if table not in config.tables:
        raise ExportError(f"no table {table!r} in the config (tables: {', '.join(config.tables)})")
    src = _source(config, replica)
    options = check_options(src.format, dict(src.options), f"{_where(config, replica)}.options")
    p = plan_export(config, store, replica, table, dt, now, by_hand)
    if p.objects == 0:
        raise ExportError(_nothing_there(config, store, replica, table, p))
    folder = layout.export_dir(replica, table, dt)
    mkey = f"{folder}/{layout.MANIFEST}"
    held = store.read_token(mkey)
    if held is not None:
        return _against(config, store, src, (replica, table, dt), p, held[1], late, dry_run)
    if not p.sealed:
        return Sealed(replica, table, dt, "waiting", p.why)
    if dry_run:
        return Sealed(replica, table, dt, "would seal", p.why, p.files)
    manifest = {
        "replica": replica,
        "table": table,
        "dt": dt.isoformat(),
        "format": src.format,
        "options": options,
        "files": _copy_and_measure(store, src, table, folder, p.files),
    }
    if not store.create(mkey, json.dumps(manifest, indent=1).encode()):
        raise ExportError(f"{store.uri}/{mkey} was written by another sealer meanwhile: run again")
    return Sealed(replica, table, dt, "sealed", p.why, p.files)


def _against(
    config: Config,
    store: Store,
    src: Source,
    export: tuple[str, str, date],
    p: Plan,
    token: str,
    late: bool,
    dry_run: bool,
) -> Sealed:
    """An export whose manifest exists: the same files (nothing to do), or more (refused,
    or with ``late`` added by a conditional replace)."""
    replica, table, dt = export
    folder = layout.export_dir(replica, table, dt)
    mkey = f"{folder}/{layout.MANIFEST}"
    expect = {"replica": replica, "table": table, "dt": dt.isoformat()}
    have = read_manifest(store, folder, expect)
    if have["format"] != src.format:
        raise ExportError(
            f"{store.uri}/{mkey}: format {have['format']!r}, but {_where(config, replica)} "
            f"writes {src.format!r}: it was not sealed from this source"
        )
    listed = {f["path"] for f in have["files"]}
    new = tuple(f for f in p.files if safe_relpath(f, mkey) not in listed)
    if not new:
        return Sealed(replica, table, dt, "unchanged", f"{len(listed)} file(s), already sealed")
    if not late:
        raise ExportError(
            f"{store.uri}/{mkey} is sealed without {len(new)} object(s) of {dt} that arrived "
            f"since (e.g. {src.folder(table)}/{new[0]}): pass --late to add them (the runs "
            "that read it are then rerun, or accepted: docs/sealing.md#late-objects)"
        )
    if dry_run:
        return Sealed(replica, table, dt, "would seal", f"late: {len(new)} new", new)
    have["files"] = [*have["files"], *_copy_and_measure(store, src, table, folder, new)]
    if not store.replace_if(mkey, json.dumps(have, indent=1).encode(), token):
        raise ExportError(f"{store.uri}/{mkey} changed while the late files were added: run again")
    rerun = _rerun(store, table, dt)
    return Sealed(replica, table, dt, "late", f"{len(new)} object(s) added", new, rerun)


def seal_date(
    config: Config,
    store: Store,
    dt: date,
    now: datetime,
    replicas: tuple[str, ...] = (),
    tables: tuple[str, ...] = (),
    **how: bool,
) -> list[Sealed]:
    """Seal ``dt`` for every replica with a source and every table (or those named);
    ``how``: :func:`seal_export`'s ``late``, ``by_hand``, ``dry_run``."""
    names = replicas or tuple(config.sources)
    return [
        seal_export(config, store, r, t, dt, now, **how)
        for r in names
        for t in tables or tuple(config.tables)
    ]


def seal_for_run(config: Config, store: Store, dt: date, now: datetime) -> list[str]:
    """The DAG's ``seal`` task: every export of ``dt`` with a source sealed, one line each.
    One still waiting is an ExportError, unless missing exports are allowed (the run goes
    on without it; sealed later, it is a late export)."""
    done = seal_date(config, store, dt, now)
    waiting = [s.line() for s in done if s.status == "waiting"]
    if waiting and not config.allow_missing_exports:
        raise ExportError(f"not sealed yet: {'; '.join(waiting)}")
    return [s.line() for s in done]


def waiting_for(config: Config, store: Store, dt: date, now: datetime) -> list[str]:
    """What the DAG's sensor waits for before ``dt`` can run: each manifest of a replica
    without a source that is not in the store yet, and each export of a replica with one
    that is neither sealed nor sealable (why, in words). Missing exports allowed: none."""
    if config.allow_missing_exports:
        return []
    out = []
    for t in config.tables:
        for r in config.replica_ids:
            key = layout.export_manifest(r, t, dt)
            if store.exists(key):
                continue
            if r not in config.sources:
                out.append(key)
                continue
            p = plan_export(config, store, r, t, dt, now, False)
            if not p.sealed or p.objects == 0:
                out.append(f"{r}/{t} {dt}: {p.why}")
    return out
