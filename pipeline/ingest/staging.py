"""Staging a downloaded export file in the run's work location, within its limits
(:class:`Limits`): JSONL (also gzipped), and the line formats of the adapters (wal2json,
Debezium), are staged as Parquet rows ``(replica, file, line, raw)`` (:data:`RAW_SCHEMA`)
so that Spark reads them in parallel and the quarantine can name the file and line of a
bad record; lines that are not records (wal2json's transaction framing, Kafka tombstones)
are counted as ``framing`` and not staged. Parquet exports are staged as they are. DMS CSV
files are parsed (pyarrow, every column as text, null kept apart from the empty string)
and staged as Parquet with their record numbers; a CSV record with the wrong number of
fields is staged as a malformed record, with its text. See ``pipeline.ingest.adapters``
for the mapping itself."""

from __future__ import annotations

import csv
import gzip
import hashlib
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from pipeline.core.columns import REPLICA
from pipeline.core.config import Config
from pipeline.core.errors import ExportError
from pipeline.ingest.adapters import SettingsCheck, check_dms_columns
from pipeline.rules.jsontext import LONG_LINE_KEPT, LongLine, long_line, not_utf8

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


def sha256_of(path: Path) -> str:
    """The file's SHA-256, in hex (what its manifest entry names)."""
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


def line_chunks(
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
        for first, lines in line_chunks(src, name, limits):
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


def parquet_rows(path: Path, name: str) -> int:
    try:
        return int(pq.ParquetFile(path).metadata.num_rows)
    except (pa.ArrowInvalid, OSError) as e:
        raise ExportError(f"{name}: not a readable Parquet file ({e})") from None


def _csv_header(src: Path, delimiter: str, name: str) -> list[str]:
    with src.open(newline="", encoding="utf-8", errors="replace") as f:
        try:
            return next(csv.reader(f, delimiter=delimiter), [])
        except csv.Error as e:  # e.g. a field over the reader's 128 KiB: no header
            raise ExportError(f"{name}: its first line is not a CSV header ({e})") from None


def stage_dms_csv(src: Path, dest: Path, name: str, options: dict[str, Any]) -> int:
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


def is_parquet(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(4) == b"PAR1"
