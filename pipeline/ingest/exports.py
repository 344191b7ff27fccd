"""Ingest: find each configured replica's export for the date through its manifest, check
it, and plan its files; ``fetch`` (the resolve stage's first Spark job) fetches, verifies
and stages them in Spark tasks (docs/adapters.md).

Guarantees:
- an export is read only through its ``_manifest.json``; files beside it are ignored, but
  a folder holding files and no manifest is an error (an upload in progress or broken);
- every file is checked against the manifest's ``rows`` and ``sha256`` before anything is
  read, and a mismatch names the file;
- a path that escapes the export folder (``..``, absolute, another bucket) is refused;
- a missing export of a configured replica fails the ingest, naming it, unless
  ``allow_missing_exports`` is set (then the replica counts as having exported nothing).

Where the bytes go: ingest reads manifests only. Each file is downloaded by a Spark task
(boto3 in the task, with the executor's credentials), checked, and staged in the run's
work location: a local folder (``local[*]``, or a mount every node shares) or an S3
prefix (``pipeline.storage.workpath``).
JSONL (also gzipped), and the line formats of the adapters (wal2json, Debezium), are staged
as Parquet rows ``(replica, file, line, raw)`` so that Spark reads them in parallel and the
quarantine can name the file and line of a bad record; lines that are not records
(wal2json's transaction framing, Kafka tombstones) are counted as ``framing`` and not
staged. Parquet exports are staged as they are. DMS CSV files are parsed in the task
(pyarrow, every column as text, null kept apart from the empty string) and staged as
Parquet with their record numbers; a CSV record with the wrong number of fields is staged
as a malformed record, with its text. See ``pipeline.ingest.adapters`` for the mapping itself.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
import posixpath
import re
import zlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import date, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from pipeline.core import layout
from pipeline.core.columns import DT, REPLICA, RUN_ID
from pipeline.core.config import Config, UnknownExportPolicy
from pipeline.core.errors import ExportError, StoreError
from pipeline.ingest import inplace, pending, prior, retry
from pipeline.ingest.adapters import (
    FRAMING,
    FRAMING_STAGED,
    SettingsCheck,
    check_dms_columns,
    check_options,
    check_requirements,
)
from pipeline.ingest.copies import COPIES, CopyWriter, parquet_records
from pipeline.rules.guards import LONG_LINE_KEPT, LongLine, TypingSpec, long_line, not_utf8
from pipeline.storage.context import RunContext
from pipeline.storage.store import Store, open_store
from pipeline.storage.workpath import WorkPath

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from pipeline.storage.lake import Lake
    from pipeline.storage.runs_table import RunRow

log = logging.getLogger(__name__)

FORMATS = ("jsonl", "parquet", "debezium", "wal2json", "dms")
#: a replica's full copy and the base snapshot are rows of the table, not changes
ROW_FORMATS = ("jsonl", "parquet")
#: the formats whose records are typed where a file is fetched (the adapters' formats are
#: mapped on Spark first: ``pipeline.ingest.copies``)
TYPED_FORMATS = ("jsonl", "parquet")
#: a staged line of an adapter's export or a JSONL snapshot: ``bad`` says why the line is
#: no text (not UTF-8: ``raw`` then holds its bytes escaped), else null
RAW_SCHEMA = pa.schema(
    [
        (REPLICA, pa.string()),
        ("file", pa.string()),
        ("line", pa.int64()),
        ("raw", pa.string()),
        ("bad", pa.string()),
    ]
)
_CHUNK = 32 << 20
#: in the run's ``staged`` folder: the files ingest planned to fetch, and the mark that
#: ``fetch`` staged them all
PLAN = "fetch.json"
FETCHED = "fetched.json"


@dataclass
class StagedExport:
    replica: str
    format: str
    rows: int  # what the manifest counts: lines (or CSV records, Parquet rows)
    files: list[str]
    watermark: str | None = None
    framing: int = 0  # lines that are no record (wal2json's B and C, Kafka tombstones)
    options: dict[str, Any] = field(default_factory=dict)
    #: typed copies the driver settles or that change their key, as the fetch's typing
    #: counted them (``copies.special_count``); None: not counted (an adapter's export)
    specials: int | None = None

    @property
    def records(self) -> int:
        """The records the export holds: each ends applied, discarded or quarantined."""
        return self.rows - self.framing


@dataclass
class StagedTable:
    """What ingest found for one table; saved as ``staged/inputs.json``."""

    exports: dict[str, StagedExport] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    base_rows: int | None = None
    prior: dict[str, Any] | None = None  # the pointer of the run whose state we start from
    snapshots: dict[str, int] = field(default_factory=dict)  # replica -> rows of its full copy
    ledger: list[str] = field(default_factory=list)  # the dates of the ledger window staged
    #: a run of the window wrote the adapters' ids of before issue 49 (its ledger rows
    #: have no digest): they are matched too (docs/adapters.md "Upgrading")
    legacy_ids: bool = False
    manifests: list[dict[str, Any]] = field(default_factory=list)  # key, sha256 (runs row)
    start: str = ""  # what the run starts from, for the report
    late_exports: list[str] = field(default_factory=list)  # accepted (``pipeline.ingest.late``)

    @property
    def records(self) -> int:
        """How much resolve reads: the export records, the state it starts from and the
        replicas' full copies (what sizes the run's Spark settings)."""
        prior = max(0, (self.prior or {}).get("state_rows", 0))
        exported = sum(e.rows for e in self.exports.values())
        return exported + prior + (self.base_rows or 0) + sum(self.snapshots.values())


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


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


#: a gzipped file may always decompress to this much, whatever its size
EXPANSION_FLOOR = 64 << 20


@dataclass(frozen=True)
class Limits:
    """How much of an export file is read: a line over ``record_bytes`` is malformed
    (not read whole); a gzipped file that decompresses to more than ``expansion`` times
    its size (and :data:`EXPANSION_FLOOR`) is refused. None: no limit."""

    record_bytes: int | None = None
    expansion: int | None = None

    @staticmethod
    def of(config: Config) -> Limits:
        return Limits(config.max_record_bytes, config.max_expansion)

    def budget(self, path: Path) -> int | None:
        """The most bytes the gzipped file at ``path`` may decompress to."""
        if self.expansion is None:
            return None
        return max(self.expansion * path.stat().st_size, EXPANSION_FLOOR)


def _is_gzip(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(2) == b"\x1f\x8b"


def _long(head: bytes, length: int) -> LongLine:
    line = LongLine(head[:LONG_LINE_KEPT])
    line.length = length
    return line


def _line_chunks(
    path: Path, name: str, limits: Limits | None = None, chunk_size: int = _CHUNK
) -> Iterator[tuple[int, list[bytes]]]:
    """(first line number, lines) in chunks; a truncated or corrupt gzip names the file.
    A line longer than ``limits.record_bytes`` comes as a :class:`LongLine`, without being
    held whole: the reader holds at most that many bytes of a line and one chunk. A gzip
    that decompresses to more than ``limits.expansion`` times its size is refused as it
    is read, naming the file (a decompression bomb: it would fill the work volume)."""
    limits = limits or Limits()
    limit, gz = limits.record_bytes, _is_gzip(path)
    budget = limits.budget(path) if gz else None
    opener = gzip.open if gz else open
    line_no, read = 1, 0
    try:
        with opener(path, "rb") as f:
            rest = b""
            head, length = b"", -1  # a long line whose end is not read yet (length >= 0)
            while chunk := f.read(chunk_size):
                read += len(chunk)
                if budget is not None and read > budget:
                    raise ExportError(
                        f"{name}: decompresses to more than {budget:,} bytes, "
                        f"{limits.expansion} times its {path.stat().st_size:,} "
                        "(max_expansion): refused as a decompression bomb. If the export is "
                        "genuine, raise max_expansion in the config"
                    )
                if length >= 0:
                    end = chunk.find(b"\n")
                    part = chunk if end < 0 else chunk[:end]
                    head += part[: LONG_LINE_KEPT - len(head)]
                    length += len(part)
                    if end < 0:
                        continue
                    yield line_no, [_long(head, length)]
                    line_no, length, chunk = line_no + 1, -1, chunk[end + 1 :]
                lines = (rest + chunk).split(b"\n")
                rest = lines.pop()
                if limit is not None:
                    lines = [ln if len(ln) <= limit else _long(ln, len(ln)) for ln in lines]
                    if len(rest) > limit:
                        head, length, rest = rest[:LONG_LINE_KEPT], len(rest), b""
                yield line_no, lines
                line_no += len(lines)
            if length >= 0:
                yield line_no, [_long(head, length)]
            elif rest:
                yield line_no, [rest]
    except (EOFError, OSError, zlib.error) as e:
        raise ExportError(
            f"{name}: cannot be read to its end ({e}); the file is truncated or corrupt"
        ) from None


def _as_strings(lines: list[bytes], limit: int | None) -> tuple[pa.Array, pa.Array]:
    """The lines as text, and why each is not (null: it is)."""
    if not any(isinstance(b, LongLine) for b in lines):
        try:
            return pa.array(lines, pa.binary()).cast(pa.string()), pa.nulls(len(lines), pa.string())
        except pa.ArrowInvalid:
            pass
    texts: list[str] = []
    bad: list[str | None] = []
    for b in lines:  # not UTF-8, or too long: kept with its bytes escaped, never replaced
        texts.append(b.decode("utf-8", "backslashreplace"))
        if isinstance(b, LongLine):
            bad.append(long_line(b, limit))
            continue
        try:
            b.decode("utf-8")
            bad.append(None)
        except UnicodeDecodeError as e:
            bad.append(f"not valid UTF-8 ({not_utf8(e)})")
    return pa.array(texts, pa.string()), pa.array(bad, pa.string())


def stage_jsonl(
    src: Path,
    dest: Path,
    replica: str,
    name: str,
    framing: re.Pattern[bytes] | None = None,
    limits: Limits | None = None,
    keep_framing: bool = False,
    settings: SettingsCheck | None = None,
) -> tuple[int, int]:
    """Write the file's non-blank lines as raw rows, but those that match ``framing``
    (unless ``keep_framing``: they are counted, and staged all the same); return
    (non-blank lines, framing lines). A line over ``limits.record_bytes`` is staged with
    its first bytes and the reason (``bad``). ``settings``: the export settings its first
    record must show (refused otherwise, naming the file and line)."""
    limits = limits or Limits()
    limit = limits.record_bytes
    dest.parent.mkdir(parents=True, exist_ok=True)
    rows = skipped = 0
    with pq.ParquetWriter(dest, RAW_SCHEMA) as w:
        for first, lines in _line_chunks(src, name, limits):
            keep = [
                (first + i, ln if isinstance(ln, LongLine) else ln.rstrip(b"\r"))
                for i, ln in enumerate(lines)
                if ln.strip()
            ]
            rows += len(keep)
            if settings is not None and not settings.done:
                for number, ln in keep:
                    if settings.done:
                        break
                    if not isinstance(ln, LongLine):
                        settings.feed(number, ln)
            if framing is not None:
                records = [k for k in keep if not framing.match(k[1])]
                skipped += len(keep) - len(records)
                keep = keep if keep_framing else records
            if not keep:
                continue
            n = len(keep)
            texts, bad = _as_strings([k[1] for k in keep], limit)
            w.write_table(
                pa.table(
                    [
                        pa.array([replica] * n, pa.string()),
                        pa.array([name] * n, pa.string()),
                        pa.array([k[0] for k in keep], pa.int64()),
                        texts,
                        bad,
                    ],
                    schema=RAW_SCHEMA,
                )
            )
    return rows, skipped


def _parquet_rows(path: Path, name: str) -> int:
    try:
        return int(pq.ParquetFile(path).metadata.num_rows)
    except (pa.ArrowInvalid, OSError) as e:
        raise ExportError(f"{name}: not a readable Parquet file ({e})") from None


def _csv_header(src: Path, delimiter: str, name: str) -> list[str]:
    import csv

    with src.open(newline="", encoding="utf-8", errors="replace") as f:
        try:
            return next(csv.reader(f, delimiter=delimiter), [])
        except csv.Error as e:  # e.g. a field over the reader's 128 KiB: no header
            raise ExportError(f"{name}: its first line is not a CSV header ({e})") from None


def _stage_dms_csv(src: Path, dest: Path, name: str, options: dict[str, Any]) -> int:
    """A DMS CSV file as text columns plus ``_line``; a record with the wrong number of
    fields, or not UTF-8, is staged with its text in ``_bad`` and the problem in
    ``_bad_reason``. Returns the number of records. DMS writes one record per line, so
    lines are records (a blank line is a malformed one)."""
    bad: list[tuple[str, str]] = []

    def invalid(row: Any) -> str:
        bad.append(
            (str(row.text), f"expected {row.expected_columns} fields, found {row.actual_columns}")
        )
        return "skip"

    delimiter = options.get("delimiter", ",")
    header = options.get("header", options.get("columns") is None)
    names = _csv_header(src, delimiter, name) if header else list(options["columns"])
    if not names or len(set(names)) != len(names):
        raise ExportError(f"{name}: the CSV's columns {names} are empty or repeated")
    check_dms_columns(options, names, name)
    read = pcsv.ReadOptions(
        column_names=names, skip_rows=1 if header else 0, block_size=_CHUNK, use_threads=False
    )
    parse = pcsv.ParseOptions(
        delimiter=delimiter,
        newlines_in_values=False,
        ignore_empty_lines=False,
        invalid_row_handler=invalid,
    )
    t, not_text = _read_csv(src, name, read, parse, options.get("null_value", ""), bad)
    good, rejected = _line_numbers(src, header, [b[0] for b in bad], t.num_rows, name)
    if not_text:
        t, good = _set_aside(src, t, good, not_text, bad, rejected)
    t = t.append_column("_line", pa.array(good, pa.int64()))
    if bad:
        extra = pa.table(
            {
                "_line": pa.array(rejected, pa.int64()),
                "_bad": pa.array([b[0] for b in bad], pa.string()),
                "_bad_reason": pa.array([b[1] for b in bad], pa.string()),
            }
        )
        t = pa.concat_tables([t, extra], promote_options="default")
    dest.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(t, dest)
    return t.num_rows


def _read_csv(
    src: Path,
    name: str,
    read: pcsv.ReadOptions,
    parse: pcsv.ParseOptions,
    null: str,
    bad: list[tuple[str, str]],
) -> tuple[pa.Table, dict[int, str]]:
    """The CSV's records as text; a file with bytes that are not UTF-8 is read again as
    bytes, and the records (by place) that hold them are returned with why."""

    def read_as(kind: pa.DataType) -> pa.Table:
        convert = pcsv.ConvertOptions(
            column_types={c: kind for c in read.column_names},
            null_values=[null],
            strings_can_be_null=True,
            quoted_strings_can_be_null=False,
        )
        return pcsv.read_csv(src, read_options=read, parse_options=parse, convert_options=convert)

    try:
        try:
            return read_as(pa.string()), {}
        except pa.ArrowInvalid as e:
            if "invalid UTF8" not in str(e):
                raise
        bad.clear()  # the rows it rejected come again
        t = read_as(pa.binary())
        return t, _not_text(t)
    except (pa.ArrowInvalid, OSError) as e:
        raise ExportError(f"{name}: not a readable CSV file ({e})") from None


def _set_aside(
    src: Path,
    t: pa.Table,
    good: list[int],
    not_text: dict[int, str],
    bad: list[tuple[str, str]],
    rejected: list[int],
) -> tuple[pa.Table, list[int]]:
    """The records that are not UTF-8 moved from ``t`` (bytes) to ``bad`` (their lines'
    text, escaped); returns the rest as text and their line numbers."""
    lines = src.read_bytes().split(b"\n")
    for i, why in not_text.items():
        bad.append((lines[good[i] - 1].rstrip(b"\r").decode("utf-8", "backslashreplace"), why))
        rejected.append(good[i])
    keep = [i not in not_text for i in range(t.num_rows)]
    text = pa.schema([(c, pa.string()) for c in t.column_names])
    return t.filter(pa.array(keep)).cast(text), [g for g, k in zip(good, keep, strict=True) if k]


def _not_text(t: pa.Table) -> dict[int, str]:
    """The records (by place) of a CSV read as bytes that are not UTF-8, and why."""
    out: dict[int, str] = {}
    for name in t.column_names:
        for i, v in enumerate(t.column(name).to_pylist()):
            if v is None or i in out:
                continue
            try:
                v.decode("utf-8")
            except UnicodeDecodeError as e:
                out[i] = f"not valid UTF-8 (column {name}: {not_utf8(e)})"
    return dict(sorted(out.items()))


def _line_numbers(
    src: Path, header: bool, bad: list[str], parsed: int, name: str
) -> tuple[list[int], list[int]]:
    """The line numbers of the parsed records and of the rejected ones (``bad``, their
    texts in order): pyarrow gives rejected records in order, but not their lines."""
    lines = src.read_bytes().split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    good, rejected, j = [], [], 0
    for number in range(2 if header else 1, len(lines) + 1):
        text = lines[number - 1].rstrip(b"\r").decode("utf-8", "replace")
        if j < len(bad) and text == bad[j]:
            rejected.append(number)
            j += 1
        else:
            good.append(number)
    if len(good) != parsed or j != len(bad):
        raise ExportError(f"{name}: a value holds a line break; DMS CSV is one record per line")
    return good, rejected


@dataclass(frozen=True)
class FileTask:
    """One file of an export, to fetch, check and stage in a Spark task (``fetch``).
    Planned by ingest from the manifest; ``dest`` is in the run's work folder, which the
    driver and the executors share."""

    store: str  # the store's URI
    key: str  # the file's key in the store
    entry: str  # its path in the manifest
    sha256: str
    rows: int
    format: str
    options: dict[str, Any]
    dest: str  # the staged file: its key in the work location
    replica: str
    table: str
    kind: str  # "export" (its framing lines count), "snapshot" or "base"
    max_record_bytes: int | None = None  # a longer line is malformed, not read whole
    work: str = ""  # the work location's root (``WorkPath.root``)
    max_expansion: int | None = None  # a gzipped file decompresses to this many times its size

    @property
    def name(self) -> str:
        return f"{self.store}/{self.key}"

    @property
    def limits(self) -> Limits:
        return Limits(self.max_record_bytes, self.max_expansion)


def plan_export(
    store: Store,
    folder: str,
    manifest: dict[str, Any],
    dest: WorkPath,
    replica: str,
    table: str,
    kind: str = "export",
    limits: Limits | None = None,
) -> tuple[StagedExport, list[FileTask]]:
    """What an export holds by its manifest, and a task per file to fetch it, reading
    within ``limits`` (none: no limit)."""
    limits = limits or Limits()
    fmt = manifest["format"]
    options = manifest.get("options", {})
    tasks = []
    for i, entry in enumerate(manifest["files"]):
        # an export's records are typed in the task (copies/); DMS: CSV or Parquet, which
        # the task finds out (dms/csv or dms/parquet)
        typed = kind == "export" and fmt in TYPED_FORMATS
        target = dest / (COPIES if typed else fmt) / f"part-{i:05d}.parquet"
        tasks.append(
            FileTask(
                store.uri,
                f"{folder}/{entry['path']}",
                entry["path"],
                entry["sha256"].lower(),
                entry["rows"],
                fmt,
                options,
                target.key,
                replica,
                table,
                kind,
                limits.record_bytes,
                target.root,
                limits.expansion,
            )
        )
    rows = sum(t.rows for t in tasks)
    files = [t.entry for t in tasks]
    return StagedExport(replica, fmt, rows, files, manifest.get("watermark"), 0, options), tasks


def fetch_file(task: FileTask, spec: TypingSpec | None = None) -> tuple[int, int, str | None]:
    """Download, verify and stage one file (in a Spark task, on any machine: staged into
    the work location, a local folder or S3); an export's records are typed there
    (``spec``, ``pipeline.ingest.copies``). Returns (its framing lines, the copies its typing
    counted that the driver settles (``copies.special_count``), None), or (0, 0, the
    error naming the file): an error is the driver's to raise, with the file's name, not
    a task's traceback."""
    dest = WorkPath(task.work, task.dest)
    try:
        with dest.parent.writing() as folder:  # uploaded from there, on S3
            local = folder / f".{dest.name}.download"
            try:
                try:
                    open_store(task.store).download(task.key, local)
                except StoreError as e:
                    raise ExportError(
                        f"{task.name}: listed in the manifest but cannot be read ({e})"
                    ) from None
                return (*_check_and_stage(task, local, folder / dest.name, spec), None)
            finally:
                local.unlink(missing_ok=True)
    except ExportError as e:
        return 0, 0, str(e)


def _check_and_stage(
    task: FileTask, local: Path, dest: Path, spec: TypingSpec | None
) -> tuple[int, int]:
    """The downloaded file checked against its manifest entry and staged; returns its
    framing lines and the copies of its typing that the driver settles."""
    digest = _sha256(local)
    if digest != task.sha256:
        raise ExportError(f"{task.name}: sha256 mismatch (manifest {task.sha256}, file {digest})")
    framing = specials = 0
    if local.stat().st_size == 0:  # no bytes: no records, in every format
        rows, specials = _stage_copies(task, None, dest, spec) if _typed(task) else (0, 0)
    elif _typed(task):
        rows, specials = _stage_copies(task, local, dest, spec)
    elif task.format == "parquet" or (task.format == "dms" and _is_parquet(local)):
        rows = _parquet_rows(local, task.name)
        if task.format == "dms":
            check_dms_columns(task.options, pq.read_schema(local).names, task.name)
            dest = dest.parent / "parquet" / dest.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        local.replace(dest)
    elif task.format == "dms":
        rows = _stage_dms_csv(local, dest.parent / "csv" / dest.name, task.name, task.options)
    else:
        rows, framing = stage_jsonl(
            local,
            dest,
            task.replica,
            task.entry,
            FRAMING.get(task.format),
            task.limits,
            task.format in FRAMING_STAGED,
            SettingsCheck(task.format, task.options, task.name) if task.kind == "export" else None,
        )
    if rows != task.rows:
        raise ExportError(f"{task.name}: {rows} rows, but the manifest says {task.rows}")
    return framing, specials


def _typed(task: FileTask) -> bool:
    return task.kind == "export" and task.format in TYPED_FORMATS


def _stage_copies(
    task: FileTask, local: Path | None, dest: Path, spec: TypingSpec | None
) -> tuple[int, int]:
    """An export's records typed and written as copies (``pipeline.ingest.copies``); returns its
    rows (JSONL: its non-blank lines) and the copies the driver settles. ``local`` None: a
    file of no bytes."""
    assert spec is not None, f"{task.name}: an export is typed where it is fetched"
    rows = 0
    with CopyWriter(dest, spec, task.replica, task.entry) as out:
        if local is not None and task.format == "parquet":
            rows = _parquet_rows(local, task.name)
            for number, fields, text in parquet_records(local):
                out.record(number, fields, text)
        elif local is not None:
            limit = task.max_record_bytes
            for first, lines in _line_chunks(local, task.name, task.limits):
                numbered = []
                for i, ln in enumerate(lines):
                    if isinstance(ln, LongLine):
                        out.long_line(first + i, ln, limit)
                    elif ln.strip():
                        numbered.append((first + i, ln.rstrip(b"\r")))
                out.lines(numbered)
            rows = out.count  # its non-blank lines, each a copy
    return rows, out.specials  # counted as the writer closed


def _is_parquet(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(4) == b"PAR1"


def _find_export(store: Store, folder: str, what: str) -> bool:
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


def ingest(
    config: Config,
    store: Store,
    ctx: RunContext,
    allow_missing: bool,
    accept_late: bool = False,
    backfill: bool = False,
) -> dict[str, StagedTable]:
    """Stage every export of ``ctx.dt``, the state the run starts from (or the base
    snapshot), the ledger window and the CDC generations. An earlier date's export that
    arrived or changed after its run stops the run, unless ``accept_late``; so does a
    state to start from that was built on a run since replaced, and a run of a date with
    later published dates unless ``backfill`` (they run after it, in order)."""
    from pipeline.ingest import decisions, lacked
    from pipeline.ingest.late import find_late, late_error
    from pipeline.storage.lake import Lake
    from pipeline.storage.runs_table import read_runs

    lake = Lake(store)
    runs = read_runs(lake)
    late = find_late(config, store, runs, ctx.dt)
    if late and not accept_late:
        raise ExportError(late_error(late))
    refuse_a_broken_chain(config, runs, ctx, backfill)
    save_notices(ctx, unknown_exports(config, store))
    out: dict[str, StagedTable] = {}
    gaps: list[str] = []
    tasks: list[FileTask] = []
    for tname in config.tables:
        st = out[tname] = _stage_exports(config, store, ctx, tname, tasks)
        _stage_snapshots(config, store, ctx, tname, st, tasks)
        _stage_start(config, store, lake, runs, ctx, tname, st, gaps, tasks)
        _pin_read_tables(config, store, lake, runs, ctx, tname, st)
        retry.stage(
            config,
            lake,
            runs,
            config.tables[tname],
            ctx.dt,
            ctx.now_us,
            ctx.staged / tname / "retry",
        )
    decisions.stage(lake, ctx.dt, config.tables, ctx.staged)
    lacked.stage(lake, ctx.dt, config.gc_grace_seconds, config.tables, ctx.staged)
    _refuse_gaps_and_missing(config, store, ctx, out, gaps, allow_missing)
    for x in late:
        log.warning("ingest: accepted: %s", x)
        out[x.table].manifests.append(x.record())
        out[x.table].late_exports.append(str(x))
    if config.cdc.enabled:
        name = "cdc_generation_descriptions"
        prior.stage_small(lake, layout.cdc_table_dir(name), ctx.staged / "cdc" / name)
    save_inputs(ctx, out)
    save_plan(ctx, tasks)
    return out


def _refuse_gaps_and_missing(
    config: Config,
    store: Store,
    ctx: RunContext,
    out: dict[str, StagedTable],
    gaps: list[str],
    allow_missing: bool,
) -> None:
    """Stop on a date skipped since a table's state (``gaps``), and on a missing export
    unless allowed."""
    if gaps:
        raise ExportError(
            f"cannot run {ctx.dt}: {'; '.join(gaps)}. Each date starts from the state of the "
            "date before it: run (or rerun) those dates first, in order"
        )
    missing_all = [f"replica {r!r} table {t!r}" for t, st in out.items() for r in st.missing]
    if missing_all and not (allow_missing or config.allow_missing_exports):
        raise ExportError(
            f"no export for {ctx.dt}: {', '.join(missing_all)} (looked for "
            f"exports/replica=<id>/table=<table>/dt={ctx.dt}/{layout.MANIFEST} in {store.uri}); "
            "pass --allow-missing-exports to run without them"
        )


#: what ingest tells the run's report beside the tables (in ``staged``)
NOTICES = "notices.json"


def unknown_exports(config: Config, store: Store) -> list[str]:
    """docs/operations.md#a-loud-quarantine: a warning per folder of ``exports/`` that no
    configured replica's exports are in (they are not read); with ``on_unknown_export:
    fail`` the run stops (:class:`ExportError`), naming them. One listing of the level."""
    known = {f"replica={r}" for r in config.replica_ids}
    unknown = [f for f in store.folders("exports") if f not in known]
    if not unknown:
        return []
    said = [
        f"{store.uri}/exports/{f}/ holds exports of a replica the config does not name "
        f"(replicas: {', '.join(config.replica_ids)}): they are not read; add it to "
        "`replicas`, or move the folder away"
        for f in unknown
    ]
    if config.on_unknown_export is UnknownExportPolicy.FAIL:
        raise ExportError("; ".join(said) + " (on_unknown_export: fail)")
    for w in said:
        log.warning("ingest: %s", w)
    return said


def save_notices(ctx: RunContext, notices: list[str]) -> None:
    (ctx.staged / NOTICES).write_text(json.dumps(notices))


def load_notices(ctx: RunContext) -> list[str]:
    """What ingest told the run's report (none from a run staged before notices)."""
    p = ctx.staged / NOTICES
    return list(json.loads(p.read_text())) if p.is_file() else []


def refuse_a_broken_chain(
    config: Config, runs: list[RunRow], ctx: RunContext, backfill: bool
) -> None:
    """docs/operations.md#reruns-and-backfills: every date starts from the state of the
    one before, so a run of ``ctx.dt`` is refused (:class:`ExportError`, naming the dates
    and the command) when a table's state to start from was built on a run since replaced
    (``runs_table.replaced_under``), and, unless it is a ``backfill`` (the later dates run
    after it, in order) or a dry run, when dates after it are published: running it alone
    would leave them built on the run it replaces."""
    from pipeline.storage.runs_table import later_dates, replaced_under

    for t in config.tables:
        replaced = replaced_under(runs, t, ctx.dt)
        if replaced is not None:
            raise ExportError(f"cannot run {ctx.dt}: {replaced}, then {ctx.dt}")
    later = later_dates(runs, config.tables, ctx.dt)
    if later and not backfill and not ctx.dry_run:
        dates = ", ".join(map(str, later))
        raise ExportError(
            f"cannot run {ctx.dt} alone: {dates} {'was' if len(later) == 1 else 'were'} "
            f"published after it, each built on the state of the date before. Run it with "
            f"them, in order: `cdr run --date {ctx.dt} --then-later` (under Airflow: a "
            f"backfill from {ctx.dt} to {later[-1]})"
        )


def _pin_read_tables(
    config: Config,
    store: Store,
    lake: Lake,
    runs: list[RunRow],
    ctx: RunContext,
    tname: str,
    st: StagedTable,
) -> None:
    """The published tables the run reads besides its prior state, pinned: the ledger's
    window, the lines the run it starts from left waiting (``pipeline.ingest.pending``) and
    (history) the history the run rewrites whole."""
    ledger = prior.pin_ledger(store, lake, tname, ctx.dt, config.gc_grace_seconds)
    if ledger is not None:
        ledger.save(ctx.staged / tname / prior.LEDGER_PIN)
        st.ledger = list(ledger.dates or ())
        st.legacy_ids = prior.window_has_legacy_ids(runs, tname, st.ledger)
    if st.prior is not None and DT in st.prior:
        pending.pin(store, lake, tname, dt_of(st.prior), ctx.staged / tname)
    if config.tables[tname].history is not None:
        history = prior.pin_table(store, lake, layout.table_path(tname, layout.HISTORY))
        if history is not None:
            history.save(ctx.staged / tname / prior.HISTORY_PIN)


def _stage_exports(
    config: Config, store: Store, ctx: RunContext, tname: str, tasks: list[FileTask]
) -> StagedTable:
    """Each replica's export of the table for the run's date (a missing one is noted)."""
    st = StagedTable()
    for rep in config.replica_ids:
        folder = layout.export_dir(rep, tname, ctx.dt)
        if not _find_export(store, folder, f"replica {rep!r}, table {tname!r}"):
            st.missing.append(rep)
            continue
        manifest = read_manifest(
            store, folder, {REPLICA: rep, "table": tname, DT: ctx.dt.isoformat()}
        )
        where = f"{store.uri}/{folder}/{layout.MANIFEST}"
        check_requirements(manifest["format"], manifest["options"], config.tables[tname], where)
        st.manifests.append(_manifest_digest(store, folder))
        dest = ctx.staged / tname / f"replica={rep}"
        staged, files = plan_export(
            store, folder, manifest, dest, rep, tname, "export", Limits.of(config)
        )
        st.exports[rep] = staged
        tasks += files
        log.info(
            "ingest %s/%s: %d %s line(s) in %d file(s)",
            rep,
            tname,
            staged.rows,
            staged.format,
            len(files),
        )
    return st


def _stage_snapshots(
    config: Config,
    store: Store,
    ctx: RunContext,
    tname: str,
    st: StagedTable,
    tasks: list[FileTask],
) -> None:
    """The replicas' optional full copies of the table, compared after the resolve."""
    for rep in config.replica_ids:
        folder = layout.replica_snapshot_dir(rep, tname, ctx.dt)
        if _find_export(store, folder, f"snapshot of replica {rep!r}, table {tname!r}"):
            manifest = read_manifest(
                store,
                folder,
                {REPLICA: rep, "table": tname, DT: ctx.dt.isoformat()},
                ROW_FORMATS,
            )
            st.manifests.append(_manifest_digest(store, folder))
            dest = ctx.staged / tname / f"snapshot={rep}"
            snapshot, files = plan_export(
                store, folder, manifest, dest, rep, tname, "snapshot", Limits.of(config)
            )
            st.snapshots[rep] = snapshot.rows
            tasks += files
            log.info("ingest %s/%s: snapshot of %d rows", rep, tname, st.snapshots[rep])


def _manifest_digest(store: Store, folder: str) -> dict[str, str]:
    """The manifest's key and sha256, for the run's ``runs`` row: a later run can tell
    that an export changed after its date ran."""
    key = f"{folder}/{layout.MANIFEST}"
    return {"manifest": key, "sha256": hashlib.sha256(store.read_bytes(key)).hexdigest()}


def _pin_prior(
    config: Config,
    store: Store,
    lake: Lake,
    runs: list[RunRow],
    run: RunRow,
    ctx: RunContext,
    tname: str,
    st: StagedTable,
) -> None:
    """The published state ``run`` names, pinned; and whether the run merges the table
    in place (``pipeline.ingest.inplace``)."""
    pin = prior.pin_state(store, lake, run, tname, runs)
    pin.save(ctx.staged / tname / prior.PRIOR_PIN)
    st.prior = {DT: run.dt.isoformat(), RUN_ID: run.run_id, "state_rows": pin.rows}
    st.start = f"the state of {run.dt} (run {run.run_id}, {pin.rows} rows)"
    plan = inplace.plan(config, lake, runs, run, pin, tname, ctx.dt, ctx.now_us)
    if plan.record is not None:
        st.prior[inplace.STAGED_KEY] = plan.record.to_json()
        st.start += ", merged in place"
    else:
        log.info("ingest %s: the whole table is replaced (%s)", tname, plan.why_not)


def _stage_start(
    config: Config,
    store: Store,
    lake: Lake,
    runs: list[RunRow],
    ctx: RunContext,
    tname: str,
    st: StagedTable,
    gaps: list[str],
    tasks: list[FileTask],
) -> None:
    """What the table starts from (docs/outputs.md#backfills): the state published for the
    latest date before the run's, within the retention and checked against that run's
    ``runs`` row; on a store of the earlier layout, its pointer (once); else ``base/`` (a
    table new to the config, or the first run); else nothing."""
    from pipeline.storage.runs_table import latest_published, now

    dest = ctx.staged / tname / "prior"
    run = latest_published(runs, tname, ctx.dt)
    if run is not None:
        prior.refuse_outside_retention(runs, run, tname, ctx.dt, config.retention_days, now())
        _pin_prior(config, store, lake, runs, run, ctx, tname, st)
    elif not runs and (pointer := prior.legacy_prior(store, tname, ctx.dt)) is not None:
        staged = prior.stage_legacy_state(store, tname, pointer, dest)
        log.warning(
            "ingest %s: %s has no runs table; starting from the earlier layout's state of %s "
            "(run %s, %d rows), once: this run publishes in the Delta layout",
            tname,
            store.uri,
            pointer[DT],
            pointer[RUN_ID],
            staged.rows,
        )
        st.prior = {DT: pointer[DT], RUN_ID: pointer[RUN_ID], "state_rows": staged.rows}
        st.start = f"the state of {pointer['dt']} in the earlier layout (run {pointer['run_id']})"
    elif _find_export(store, base := layout.base_dir(tname), "base snapshot"):
        manifest = read_manifest(store, base, {"table": tname}, ROW_FORMATS)
        st.manifests.append(_manifest_digest(store, base))
        dest = ctx.staged / tname / "base"
        staged_base, files = plan_export(
            store, base, manifest, dest, "base", tname, "base", Limits.of(config)
        )
        tasks += files
        st.base_rows = staged_base.rows
        st.start = f"base/ ({staged_base.rows} rows): no published run had this table"
        log.info("ingest base/%s: %d rows", tname, staged_base.rows)
    else:
        st.start = "empty: no published run had this table, and there is no base/"
    if st.prior is not None:
        skipped = unpublished_dates(config, store, tname, dt_of(st.prior), ctx.dt)
        if skipped:
            gaps.append(
                f"table {tname!r} was last published for {st.prior['dt']}, but "
                f"{', '.join(map(str, skipped))} has exports that no published run applied"
            )
        log.info("ingest %s: starts from %s", tname, st.start)


def save_inputs(ctx: RunContext, tables: dict[str, StagedTable]) -> None:
    data = {t: asdict(s) for t, s in tables.items()}
    (ctx.staged / "inputs.json").write_text(json.dumps(data, indent=2))


def load_inputs(ctx: RunContext) -> dict[str, StagedTable]:
    p = ctx.staged / "inputs.json"
    data = json.loads(p.read_text())
    out = {}
    for t, s in data.items():
        exports = {r: StagedExport(**e) for r, e in s["exports"].items()}
        out[t] = StagedTable(
            exports,
            s["missing"],
            s["base_rows"],
            s["prior"],
            snapshots=s.get("snapshots", {}),
            ledger=s.get("ledger", []),
            legacy_ids=s.get("legacy_ids", False),
            manifests=s.get("manifests", []),
            start=s.get("start", ""),
            late_exports=s.get("late_exports", []),
        )
    return out


def save_plan(ctx: RunContext, tasks: list[FileTask]) -> None:
    (ctx.staged / PLAN).write_text(json.dumps([asdict(t) for t in tasks], indent=1))


def fetch(spark: SparkSession, config: Config, ctx: RunContext) -> None:
    """Fetch, check and stage every file ingest planned, one Spark task per file (boto3
    in the task, the file's bytes never on the driver; an export's records typed there),
    then count the framing lines into ``inputs.json``. Any file's error stops the run,
    naming the file (the first, in the manifests' order). Once per run: a retry of the
    resolve stage finds them staged."""
    done = ctx.staged / FETCHED
    if done.exists():
        return
    tasks = [FileTask(**t) for t in json.loads((ctx.staged / PLAN).read_text())]
    specs = {
        t: TypingSpec.of(config, config.tables[t], ctx.now_us) for t in {x.table for x in tasks}
    }
    results = fetch_files(spark, tasks, specs) if tasks else []
    errors = [error for _, _, error in results if error]
    if errors:
        more = f" (and {len(errors) - 1} more file(s))" if len(errors) > 1 else ""
        raise ExportError(errors[0] + more)
    inputs = load_inputs(ctx)
    for st in inputs.values():
        for export in st.exports.values():
            export.framing = 0
            export.specials = 0 if export.format in TYPED_FORMATS else None
    for t, (framing, specials, _) in zip(tasks, results, strict=True):
        if t.kind == "export":
            export = inputs[t.table].exports[t.replica]
            export.framing += framing
            if export.specials is not None:
                export.specials += specials
    save_inputs(ctx, inputs)
    done.write_text(json.dumps({"files": len(tasks)}))
    log.info("fetch: %d file(s) checked and staged in Spark tasks", len(tasks))


def fetch_files(
    spark: SparkSession, tasks: list[FileTask], specs: dict[str, TypingSpec]
) -> list[tuple[int, int, str | None]]:
    """``fetch_file`` of each task in a Spark task of its own, results in the tasks' order.
    Where S3 is goes with the tasks (an executor's environment is not the driver's); the
    driver's keys only where they may travel (``spark.task_settings``): on a cluster the
    executors sign with their own credentials."""
    from pipeline.spark.session import task_settings

    settings = task_settings(spark)
    payload = [asdict(t) for t in tasks]
    rdd = spark.sparkContext.parallelize(payload, len(payload))
    return rdd.map(lambda t: _fetch_in_task(t, settings, specs.get(t["table"]))).collect()


def _fetch_in_task(
    task: dict[str, Any], settings: dict[str, str], spec: TypingSpec | None
) -> tuple[int, int, str | None]:
    os.environ.update(settings)
    return fetch_file(FileTask(**task), spec)


def dt_of(pointer: dict[str, Any]) -> date:
    return date.fromisoformat(pointer[DT])
