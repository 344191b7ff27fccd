"""An export's manifest, read and checked: an export is read only through its
``_manifest.json`` (docs/adapters.md); files beside it are ignored, but a folder holding
files and no manifest is an error (an upload in progress or broken). The manifest's
fields, format and options are checked, and every file entry names its ``rows`` and
``sha256`` (what ``pipeline.ingest.fetch`` checks each file against); a path that escapes
the export folder (``..``, absolute, another bucket) is refused. Also which manifests of
a date are still missing (what the DAG's sensor waits for)."""

from __future__ import annotations

import hashlib
import json
import posixpath
from datetime import date, timedelta
from typing import Any

from pipeline.core import layout
from pipeline.core.config import Config
from pipeline.core.errors import ExportError
from pipeline.ingest.adapters import check_options
from pipeline.rules.jsontext import not_utf8
from pipeline.storage.store import Store

#: the formats an export's manifest may name (CONTRIBUTING.md "Adding an adapter")
FORMATS = ("jsonl", "parquet", "debezium", "wal2json", "dms")

#: a replica's full copy and the base snapshot are rows of the table, not changes
ROW_FORMATS = ("jsonl", "parquet")


def safe_relpath(path: Any, where: str) -> str:
    """The manifest's file path, normalised; refuses anything outside the export folder."""
    if not isinstance(path, str) or not path.strip():
        raise ExportError(f"{where}: a file entry has no path")
    if "://" in path or path.startswith(("/", "\\")) or "\\" in path or ":" in path.split("/")[0]:
        raise ExportError(f"{where}: file path {path!r} escapes the export folder")
    norm = posixpath.normpath(path)
    if norm == "." or norm.startswith("../") or norm == ".." or "/../" in f"/{norm}/":
        raise ExportError(f"{where}: file path {path!r} escapes the export folder")
    return norm


def read_manifest(
    store: Store, folder: str, expect: dict[str, str], formats: tuple[str, ...] = FORMATS
) -> dict[str, Any]:
    """Parse and check ``folder/_manifest.json``: fields, format, options, file entries."""
    where = f"{store.uri}/{folder}/{layout.MANIFEST}"
    try:
        data = json.loads(store.read_bytes(f"{folder}/{layout.MANIFEST}"))
    except UnicodeDecodeError as e:
        raise ExportError(f"{where}: not UTF-8 ({not_utf8(e)})") from None
    except json.JSONDecodeError as e:
        raise ExportError(f"{where}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ExportError(f"{where}: expected a JSON object")
    for k, v in expect.items():
        if k in data and str(data[k]) != v:
            raise ExportError(f"{where}: {k} is {data[k]!r}, expected {v!r} for this folder")
    fmt = data.get("format")
    if fmt not in formats:
        raise ExportError(f"{where}: format {fmt!r} is not one of {', '.join(formats)}")
    data["options"] = check_options(fmt, data.get("options"), where)
    files = data.get("files")
    if not isinstance(files, list):
        raise ExportError(f"{where}: 'files' must be a list")
    seen = set()
    for i, f in enumerate(files):
        if not isinstance(f, dict):
            raise ExportError(f"{where}: files[{i}] must be an object")
        f["path"] = safe_relpath(f.get("path"), where)
        if f["path"] in seen:
            raise ExportError(f"{where}: file {f['path']!r} is listed twice")
        seen.add(f["path"])
        rows, sha = f.get("rows"), f.get("sha256")
        if not isinstance(rows, int) or isinstance(rows, bool) or rows < 0:
            raise ExportError(f"{where}: files[{i}].rows must be a count, got {rows!r}")
        if not isinstance(sha, str) or len(sha) != 64:
            raise ExportError(f"{where}: files[{i}].sha256 must be 64 hex digits")
    return data


def find_export(store: Store, folder: str, what: str) -> bool:
    """True when the export's manifest exists; an error when files exist without one."""
    if store.exists(f"{folder}/{layout.MANIFEST}"):
        return True
    if store.list(folder):
        raise ExportError(
            f"{store.uri}/{folder}: holds files but no {layout.MANIFEST} ({what}); an export "
            "is complete only when its manifest is written"
        )
    return False


def missing_manifests(config: Config, store: Store, dt: date) -> list[str]:
    """The manifests of ``dt`` not yet in the store, one per configured replica and table
    (what the DAG's sensor waits for). Missing exports are allowed by the config: none."""
    if config.allow_missing_exports:
        return []
    wanted = [layout.export_manifest(r, t, dt) for t in config.tables for r in config.replica_ids]
    return [key for key in wanted if not store.exists(key)]


def unpublished_dates(
    config: Config, store: Store, table: str, since: date, dt: date
) -> list[date]:
    """The dates strictly between ``since`` (the date of the state a run of ``dt`` starts
    from) and ``dt`` for which some replica exported ``table``: their events would be
    skipped."""
    out = []
    d = since + timedelta(days=1)
    while d < dt:
        if any(store.exists(layout.export_manifest(rep, table, d)) for rep in config.replica_ids):
            out.append(d)
        d += timedelta(days=1)
    return out


def manifest_digest(store: Store, folder: str) -> dict[str, str]:
    """The manifest's key and sha256, for the run's ``runs`` row: a later run can tell
    that an export changed after its date ran."""
    key = f"{folder}/{layout.MANIFEST}"
    return {"manifest": key, "sha256": hashlib.sha256(store.read_bytes(key)).hexdigest()}
