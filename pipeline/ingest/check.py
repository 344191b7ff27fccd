"""``cdr check-export``: every manifest of a date checked as a run checks it, without
Spark (docs/operations.md#checking-an-export). For each configured replica and table
(and each replica's full copy, when there is one): the manifest is there (a missing one
is named, unless ``allow_missing_exports``), its fields, format, options and file paths
(``pipeline.ingest.manifests.read_manifest``) and what its format requires of the table
(``check_requirements``); each file is downloaded, its sha256 and line count checked and
staged in a temporary folder by the run's own code (``pipeline.ingest.fetch``'s
``check_and_stage``), and the first records of a JSONL or canonical Parquet export typed
by the run's guards (``pipeline.rules.guards``). The messages are the run's.

What it does not do: type every record (the run does, and quarantines what the guards
refuse), and map an adapter's records (wal2json, Debezium, DMS: on Spark, in the run);
their lines are staged as the run stages them, so a line that is not UTF-8 or too long,
or a DMS record with the wrong number of fields, is counted."""

from __future__ import annotations

import tempfile
from collections import Counter
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from pipeline.core import layout
from pipeline.core.columns import DT, REPLICA
from pipeline.core.config import Config
from pipeline.core.errors import ExportError
from pipeline.core.policy import QuarantineReason
from pipeline.ingest.adapters import check_requirements
from pipeline.ingest.copies import line_copy, long_line_copy, parquet_records, placed
from pipeline.ingest.fetch import FileTask, check_and_stage, download, plan_export
from pipeline.ingest.manifests import FORMATS, ROW_FORMATS, find_export, read_manifest
from pipeline.ingest.staging import Limits, line_chunks, parquet_rows
from pipeline.rules.guards import Typer, TypingSpec
from pipeline.rules.jsontext import LongLine
from pipeline.storage.context import resolve_now
from pipeline.storage.store import Store
from pipeline.storage.workpath import WorkPath

#: how many records of each file are typed, by default (``--records``)
RECORDS = 100

MALFORMED = QuarantineReason.MALFORMED.value

#: the columns in which the run's staging of an adapter's lines says why one is no record
#: (``pipeline.ingest.staging``: a line's ``bad``, a DMS CSV record's ``_bad_reason``)
_BAD_COLUMNS = ("bad", "_bad_reason")


@dataclass
class Quarantined:
    """The records the run would quarantine, among those read: a count and the first
    detail per reason."""

    counts: Counter[str] = field(default_factory=Counter)
    first: dict[str, str] = field(default_factory=dict)
    read: int = 0  # records typed or staged

    def add(self, reason: str | None, detail: str | None) -> None:
        self.read += 1
        if reason is not None:
            self.counts[reason] += 1
            self.first.setdefault(reason, detail or "")

    def said(self) -> str:
        return "; ".join(
            f"{n} {reason} (first: {self.first[reason]})" for reason, n in self.counts.items()
        )


@dataclass(frozen=True)
class ExportCheck:
    """One manifest checked: ``problem`` None when it is ok (or missing and allowed)."""

    replica: str
    table: str
    kind: str  # "export" or "snapshot"
    where: str  # the manifest's URI
    files: int = 0
    rows: int = 0
    problem: str | None = None
    missing: bool = False
    quarantined: Quarantined = field(default_factory=Quarantined)

    @property
    def name(self) -> str:
        what = "snapshot of " if self.kind == "snapshot" else ""
        return f"{what}replica {self.replica} table {self.table}"

    def line(self) -> str:
        if self.problem is not None:
            return f"{self.name}: {self.problem}"
        if self.missing:
            return f"{self.name}: missing, allowed (allow_missing_exports): {self.where}"
        text = f"{self.name}: ok, {self.files} file(s), {self.rows} row(s)"
        q = self.quarantined
        if q.counts:
            text += f"; of the {q.read} record(s) read, the run quarantines {q.said()}"
        return text

    def to_dict(self) -> dict[str, Any]:
        q = self.quarantined
        return {
            REPLICA: self.replica,
            "table": self.table,
            "kind": self.kind,
            "manifest": self.where,
            "ok": self.problem is None,
            "missing": self.missing,
            "files": self.files,
            "rows": self.rows,
            "problem": self.problem,
            "records_read": q.read,
            "quarantined": dict(q.counts),
            "first_reasons": dict(q.first),
        }


def check_date(config: Config, store: Store, dt: date, records: int = RECORDS) -> list[ExportCheck]:
    """Every manifest of ``dt``: each configured replica's export of each table, then the
    replicas' full copies that are there."""
    now_us = resolve_now(dt, None)
    out = []
    for tname in config.tables:
        spec = TypingSpec.of(config, config.tables[tname], now_us)
        for rep in config.replica_ids:
            folder = layout.export_dir(rep, tname, dt)
            out.append(_check(config, store, dt, spec, records, rep, tname, "export", folder))
        for rep in config.replica_ids:
            folder = layout.replica_snapshot_dir(rep, tname, dt)
            if store.exists(f"{folder}/{layout.MANIFEST}") or store.any_under(folder):
                out.append(_check(config, store, dt, spec, records, rep, tname, "snapshot", folder))
    return out


def _check(
    config: Config,
    store: Store,
    dt: date,
    spec: TypingSpec,
    records: int,
    rep: str,
    tname: str,
    kind: str,
    folder: str,
) -> ExportCheck:
    where = f"{store.uri}/{folder}/{layout.MANIFEST}"
    try:
        if not find_export(store, folder, f"replica {rep!r}, table {tname!r}"):
            problem = None if config.allow_missing_exports else _missing(where)
            return ExportCheck(rep, tname, kind, where, problem=problem, missing=True)
        formats = FORMATS if kind == "export" else ROW_FORMATS
        manifest = read_manifest(
            store, folder, {REPLICA: rep, "table": tname, DT: str(dt)}, formats
        )
        if kind == "export":
            check_requirements(manifest["format"], manifest["options"], config.tables[tname], where)
    except ExportError as e:
        return ExportCheck(rep, tname, kind, where, problem=str(e))
    q = Quarantined()
    with tempfile.TemporaryDirectory(prefix="cdr-check-") as tmp:
        staged, tasks = plan_export(
            store, folder, manifest, WorkPath.of(tmp), rep, tname, kind, Limits.of(config)
        )
        said = [_file(t, Path(tmp) / str(i), spec, records, q) for i, t in enumerate(tasks)]
    errors = [e for e in said if e is not None]
    problem = None
    if errors:
        problem = errors[0] + (f" (and {len(errors) - 1} more file(s))" if len(errors) > 1 else "")
    return ExportCheck(rep, tname, kind, where, len(tasks), staged.rows, problem, quarantined=q)


def _missing(where: str) -> str:
    return (
        f"missing: no {where}; the run stops on it (pass --allow-missing-exports, or set "
        "allow_missing_exports, to run without it)"
    )


def _file(
    task: FileTask, folder: Path, spec: TypingSpec, records: int, q: Quarantined
) -> str | None:
    """One file downloaded, checked and staged as the run does, its first ``records``
    typed; the error naming it, or None."""
    local = folder / "download"
    reader = _FirstRecords(spec, records, q)
    try:
        download(task, local)
        check_and_stage(task, local, folder / "staged" / "part.parquet", reader.read)
    except ExportError as e:
        return str(e)
    finally:
        local.unlink(missing_ok=True)
    if not (task.kind == "export" and task.format in ROW_FORMATS):
        _count_staged(folder / "staged", task.name, records, q)
    return None


class _FirstRecords:
    """The run's ``TypedReader`` for a JSONL or canonical Parquet export, but that types
    only the first records: every line (or row) is counted as the run counts it, the
    first ``records`` typed by the guards (``pipeline.ingest.copies``)."""

    def __init__(self, spec: TypingSpec, records: int, q: Quarantined):
        self.typer, self.records, self.q = Typer(spec), records, q

    def read(self, task: FileTask, local: Path | None, dest: Path) -> tuple[int, int]:
        if local is None:
            return 0, 0
        if task.format == "parquet":
            for number, fields, text in parquet_records(local):
                if number > self.records:
                    break
                self._add(task, number, self.typer.record(fields, text, task.replica))
            return parquet_rows(local, task.name), 0
        rows = 0
        for first, lines in line_chunks(local, task.name, task.limits):
            for i, ln in enumerate(lines):
                if isinstance(ln, LongLine):
                    rows += 1
                    if rows <= self.records:
                        copy = long_line_copy(self.typer, task.replica, ln, task.max_record_bytes)
                        self._add(task, first + i, copy)
                elif ln.strip():
                    rows += 1
                    if rows <= self.records:
                        copy = line_copy(self.typer, task.replica, ln.rstrip(b"\r"))
                        self._add(task, first + i, copy)
        return rows, 0

    def _add(self, task: FileTask, number: int, copy: dict[str, Any]) -> None:
        copy = placed(copy, task.replica, task.entry, number)
        self.q.add(copy["reason"], copy["detail"])


def _count_staged(folder: Path, name: str, records: int, q: Quarantined) -> None:
    """An adapter's lines (or a snapshot's rows) as the run staged them: those it staged
    as no record, with why, among the first ``records``."""
    n = 0
    for part in sorted(folder.rglob("*.parquet")):
        f = pq.ParquetFile(part)
        names = f.schema_arrow.names
        bad = next((c for c in _BAD_COLUMNS if c in names), None)
        if bad is None:
            continue
        line = "line" if "line" in names else "_line"
        t = f.read([line, bad])
        for number, why in zip(t[line].to_pylist(), t[bad].to_pylist(), strict=True):
            if n >= records:
                return
            n += 1
            q.add(None if why is None else MALFORMED, f"{name} line {number}: {why}")
