"""The typed copies of a table's events: every record of every export, read and guarded
once (``pipeline.rules.guards``) and written as Parquet with one explicit schema
(``frames.copy_schema``), in ``staged/<table>/replica=<id>/copies/``.

Where they are written: a JSONL or canonical Parquet export is typed in the Spark task
that fetches the file (``pipeline.ingest.fetch``); the formats an adapter maps (wal2json, Debezium,
DMS) are mapped on Spark, and their canonical records typed in Arrow batches of the same
function (:func:`type_adapted`), written once per run. The resolve stage reads them with
their schema (``pipeline.resolve.read``): nothing parses a record twice, and no Spark plan
holds a JSON parse or a type's cast.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.core.columns import AFTER, BEFORE, EVENT_ID, KEY, OP, ORIGIN, REPLICA, SEQ, TS, TXID
from pipeline.core.policy import REPAIR_ORIGIN
from pipeline.ingest.blocks import BlockTyper
from pipeline.rules.guards import Typer, TypingSpec
from pipeline.rules.jsontext import JsonNumber, LongLine, long_line, not_utf8, text_of

if TYPE_CHECKING:
    from pipeline.core.config import Table

#: a replica's typed copies, under its staged folder, and the lines of its export that
#: wait for their transaction's commit (``pipeline.ingest.pending``)
COPIES = "copies"
WAITING = "waiting"
_BATCH = 8192


def arrow_schema(table: Table) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    from pipeline.spark.frames import (
        copy_schema,
    )  # deferred: pyspark; cdr check-export types records without it

    return to_arrow_schema(copy_schema(table), timezone="UTC")


def line_copy(typer: Typer, replica: str, text: bytes) -> dict[str, Any]:
    """A JSONL line (without its end of line) typed by the guards; one that is not UTF-8
    is malformed, kept with its bytes escaped, never replaced."""
    try:
        line = text.decode("utf-8")
    except UnicodeDecodeError as e:
        detail = f"not valid UTF-8 ({not_utf8(e)})"
        return typer.malformed_line(text.decode("utf-8", "backslashreplace"), replica, detail)
    return typer.line(line, replica)


def long_line_copy(typer: Typer, replica: str, head: LongLine, limit: int | None) -> dict[str, Any]:
    """A line over ``max_record_bytes``: malformed, with its first bytes."""
    raw = head.decode("utf-8", "backslashreplace")
    return typer.malformed_line(raw, replica, long_line(head, limit))


def placed(copy: dict[str, Any], replica: str, file: str, number: int | None) -> dict[str, Any]:
    """A typed copy with its replica, file and line, its detail naming them (:func:`located`)."""
    copy[REPLICA], copy["file"], copy["line"] = replica, file, number
    return located(copy)


def columns_table(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    """Rows (dicts) as an Arrow table, column by column: a struct is built from its
    children's arrays (Arrow's row converter costs several times more per nested value)."""
    arrays = []
    for f in schema:
        values = [r[f.name] for r in rows]
        if pa.types.is_struct(f.type):
            children = [
                pa.array([None if v is None else v[c.name] for v in values], c.type) for c in f.type
            ]
            mask = pa.array([v is None for v in values], pa.bool_())
            arrays.append(pa.StructArray.from_arrays(children, fields=list(f.type), mask=mask))
        else:
            arrays.append(pa.array(values, f.type))
    return pa.Table.from_arrays(arrays, schema=schema)


class CopyWriter:
    """Typed copies of one file, written in batches to one local Parquet file."""

    def __init__(self, dest: Path, spec: TypingSpec, replica: str, file: str):
        self.typer, self.replica, self.file = Typer(spec), replica, file
        self.schema = arrow_schema(spec.table)
        self.blocks = BlockTyper(self.typer, self.schema)
        dest.parent.mkdir(parents=True, exist_ok=True)
        self._writer = pq.ParquetWriter(dest, self.schema)
        self._rows: list[dict[str, Any]] = []
        self.count = 0
        self.specials = 0  # copies ``shuffle.split_special`` brings to the driver

    def line(self, number: int | None, text: str) -> None:
        self._add(number, self.typer.line(text, self.replica))

    def lines(self, numbered: list[tuple[int, bytes]]) -> None:
        """JSONL lines (line number, text without its end of line): the clean ones typed
        by blocks (``pipeline.ingest.blocks``), the others one by one."""
        clean, rest = self.blocks.split(numbered, self.replica, self.file)
        if clean is not None and clean.num_rows:
            self._flush()
            self._write(clean)
            self.count += clean.num_rows
        for number, text in rest:
            self._add(number, line_copy(self.typer, self.replica, text))

    def long_line(self, number: int, head: LongLine, limit: int | None) -> None:
        """A line over ``max_record_bytes``: malformed, with its first bytes."""
        self._add(number, long_line_copy(self.typer, self.replica, head, limit))

    def record(self, number: int | None, fields: dict[str, Any], source: str) -> None:
        self._add(number, self.typer.record(fields, source, self.replica))

    def _add(self, number: int | None, copy: dict[str, Any]) -> None:
        self._rows.append(placed(copy, self.replica, self.file, number))
        self.count += 1
        if len(self._rows) >= _BATCH:
            self._flush()

    def _flush(self) -> None:
        if self._rows:
            self._write(columns_table(self._rows, self.schema))
            self._rows = []

    def _write(self, copies: pa.Table) -> None:
        self._writer.write_table(copies)
        self.specials += special_count(copies)

    def close(self) -> None:
        self._flush()
        self._writer.close()

    def __enter__(self) -> CopyWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def located(copy: dict[str, Any]) -> dict[str, Any]:
    """A quarantined copy's detail names its file and line (``<file> line <n>: ``), unless
    it does already (an adapter's own reasons: ``<format> record at <file>:<n>: ``)."""
    detail, line = copy["detail"], copy["line"]
    if detail is not None and line is not None:
        where = f"{copy['file']}:{line}: "
        if where not in detail[: len(where) + 40]:
            copy["detail"] = f"{copy['file']} line {line}: {detail}"
    return copy


def special_count(copies: pa.Table) -> int:
    """The typed copies ``shuffle.split_special`` brings to the driver: a TRUNCATE, a
    record without an event id, a repair, or a change of its key (the same rule, in
    pyarrow, for the tasks that type the copies)."""
    special = pc.or_kleene(pc.is_null(copies[EVENT_ID]), pc.equal(copies[OP], "TRUNCATE"))
    special = pc.or_kleene(special, pc.equal(copies[ORIGIN], REPAIR_ORIGIN))
    brought = pc.or_kleene(special, pc.is_valid(copies["new_key"]))
    return int(pc.sum(pc.fill_null(brought, False)).as_py() or 0)


# ---------------------------------------------------------------------- canonical Parquet


def _json_value(v: Any) -> Any:
    """A Parquet value as the JSON value it stands for (a number keeps its digits)."""
    if v is None or isinstance(v, bool | str):
        return v
    if isinstance(v, int | float):
        return JsonNumber(repr(v) if isinstance(v, float) else str(v))
    if isinstance(v, Decimal):
        return JsonNumber(format(v, "f"))
    if isinstance(v, datetime):
        return v.isoformat().replace("+00:00", "Z") + ("" if v.tzinfo else "Z")
    if isinstance(v, date):
        return v.isoformat()
    if isinstance(v, bytes):
        return base64.b64encode(v).decode()
    if isinstance(v, Mapping):
        return {str(k): _json_value(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_json_value(x) for x in v]
    return str(v)


def parquet_records(path: Path) -> Iterator[tuple[int, dict[str, Any], str]]:
    """A canonical Parquet export's rows: (row number, the record as JSON values, its
    JSON text). ``key``, ``new_key``, ``after`` and ``before`` may be structs or JSON text
    (the typing reads either)."""
    f = pq.ParquetFile(path)
    number = 0
    for batch in f.iter_batches(batch_size=_BATCH):
        for row in _rows(batch, number + 1):
            number += 1
            fields = {k: _json_value(v) for k, v in row.items()}
            yield number, fields, text_of(fields) or ""


def _rows(batch: pa.RecordBatch, first: int) -> list[dict[str, Any]]:
    """The batch's rows (the first is the file's row ``first``) as Python values; a row
    holding a value Python cannot hold (a timestamp or date past year 9999) becomes a
    record the guards quarantine, saying so."""
    try:
        return batch.to_pylist()
    except (ValueError, OverflowError):
        pass
    rows = []
    for i in range(batch.num_rows):
        try:
            rows.append(batch.slice(i, 1).to_pylist()[0])
        except (ValueError, OverflowError) as e:
            problem = f"a value Python cannot hold, a date or time past year 9999? ({e})"
            rows.append({"_malformed": problem, "_source": f"Parquet row {first + i}"})
    return rows


# ---------------------------------------------------------------------- adapted records


def type_adapted(
    spec: TypingSpec,
) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """For ``mapInArrow``: an adapter's canonical records (``replica, file, line, raw``)
    as typed copies."""
    schema = arrow_schema(spec.table)
    typer = Typer(spec)

    def run(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            rows = []
            for r in batch.to_pylist():
                copy = typer.line(r["raw"], r[REPLICA])
                copy[REPLICA], copy["file"], copy["line"] = r[REPLICA], r["file"], r["line"]
                rows.append(located(copy))
            yield from columns_table(rows, schema).to_batches()

    return run


# ---------------------------------------------------------------- copies that differ

#: the ``differing_copies`` log (``layout.LOGS``): every copy of an event that one replica's
#: export holds more than once in different versions, and every copy of an event an
#: earlier night resolved whose content differs from the copy that stood for it then
#: (``pipeline.resolve.ledger``), where it is (``file``, ``line``, ``seq``); ``standing`` marks the
#: one that stood (``shuffle.standing_order``), ``record`` is the copy as it was read,
#: ``digest`` its content digest and ``ledger_digest`` the one the ledger holds
_S, _L = pa.string(), pa.int64()
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def copy_record(r: Mapping[str, Any], columns: tuple[str, ...]) -> dict[str, Any]:
    """A typed copy (``frames.copy_schema``, as a dict) as a canonical record (docs/adapters.md),
    for an operator to read: the images hold the columns the record gave."""
    out: dict[str, Any] = {OP: r[OP], KEY: r[KEY]}
    if r["new_key"] is not None:
        out["new_key"] = r["new_key"]
    for image in (AFTER, BEFORE):
        values = r[image] or {}
        given = {
            c: values[c] for c, has in zip(columns, r[f"{image}_has"] or (), strict=False) if has
        }
        if given:
            out[image] = given
    ts = None if r[TS] is None else _EPOCH + timedelta(microseconds=r[TS])
    out.update(ts=ts, origin=r[ORIGIN], event_id=r[EVENT_ID], seq=r[SEQ])
    if r[TXID] is not None:
        out[TXID] = r[TXID]
    return out
