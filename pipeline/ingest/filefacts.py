"""What a manifest says of each file, measured: its ``rows`` as the fetch counts them
(docs/adapters.md: the line formats' non-blank lines, a DMS CSV's records, a Parquet
file's rows) and its ``sha256``. ``cdr manifest`` writes them (pipeline.ingest.seal);
the fetch checks a file against them (pipeline.ingest.fetch)."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.ingest.staging import (
    is_parquet,
    line_chunks,
    parquet_rows,
    sha256_of,
    stage_dms_csv,
)
from pipeline.storage.store import Store


@dataclass(frozen=True)
class FileFacts:
    rows: int
    sha256: str

    def entry(self, path: str) -> dict[str, Any]:
        """The manifest's entry of the file at ``path`` (relative to its folder)."""
        return {"path": path, "rows": self.rows, "sha256": self.sha256}


def count_rows(local: Path, fmt: str, options: dict[str, Any], name: str) -> int:
    """The file's rows as the fetch counts them for ``fmt`` (an unreadable file is an
    ExportError naming ``name``)."""
    if local.stat().st_size == 0:
        return 0
    if fmt == "parquet" or (fmt == "dms" and is_parquet(local)):
        return parquet_rows(local, name)
    if fmt == "dms":  # the CSV's records as staging reads them, its columns checked
        with tempfile.TemporaryDirectory(prefix="cdr-rows-") as tmp:
            return stage_dms_csv(local, Path(tmp) / "rows.parquet", name, options)
    return sum(1 for _first, lines in line_chunks(local, name) for ln in lines if ln.strip())


def file_facts(store: Store, key: str, fmt: str, options: dict[str, Any]) -> FileFacts:
    """The rows and sha256 of the store's object ``key`` (read once, from a local copy
    unless the store is a folder)."""
    name = f"{store.uri}/{key}"
    local = store.local_path(key)
    if local is not None:
        return FileFacts(count_rows(local, fmt, options, name), sha256_of(local))
    with tempfile.TemporaryDirectory(prefix="cdr-facts-") as tmp:
        path = Path(tmp) / "object"
        store.download(key, path)
        return FileFacts(count_rows(path, fmt, options, name), sha256_of(path))
