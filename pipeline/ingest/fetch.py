"""The files of a run's exports, fetched on Spark: ingest plans a :class:`FileTask` per
file from the manifests (:func:`plan_export`); :func:`fetch` (the resolve stage's first
Spark job) downloads each in a Spark task of its own (boto3 in the task, with the
executor's credentials, the file's bytes never on the driver), checks it against its
manifest entry (``rows``, ``sha256``; a mismatch names the file) and stages it in the
run's work location: a local folder (``local[*]``, or a mount every node shares) or an S3
prefix (``pipeline.storage.workpath``). An export's JSONL or Parquet records are typed
there (``pipeline.ingest.copies``); the other files are staged as
``pipeline.ingest.staging`` says."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.parquet as pq

from pipeline.core.config import Config
from pipeline.core.errors import ExportError, StoreError
from pipeline.ingest.adapters import FRAMING, FRAMING_STAGED, SettingsCheck, check_dms_columns
from pipeline.ingest.copies import COPIES, CopyWriter, parquet_records
from pipeline.ingest.inputs import StagedExport, load_inputs, save_inputs
from pipeline.ingest.staging import (
    Limits,
    is_parquet,
    line_chunks,
    parquet_rows,
    sha256_of,
    stage_dms_csv,
    stage_jsonl,
)
from pipeline.rules.guards import TypingSpec
from pipeline.rules.jsontext import LongLine
from pipeline.spark.session import task_settings
from pipeline.storage.context import RunContext
from pipeline.storage.store import Store, open_store
from pipeline.storage.workpath import WorkPath

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

#: the formats whose records are typed where a file is fetched (the adapters' formats are
#: mapped on Spark first: ``pipeline.ingest.copies``)
TYPED_FORMATS = ("jsonl", "parquet")

#: in the run's ``staged`` folder: the files ingest planned to fetch, and the mark that
#: ``fetch`` staged them all
PLAN = "fetch.json"
FETCHED = "fetched.json"


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
                download(task, local)
                typed = partial(_stage_copies, spec=spec)
                return (*check_and_stage(task, local, folder / dest.name, typed), None)
            finally:
                local.unlink(missing_ok=True)
    except ExportError as e:
        return 0, 0, str(e)


def download(task: FileTask, local: Path) -> None:
    """The file from the store to ``local``; one that cannot be read names the file."""
    try:
        open_store(task.store).download(task.key, local)
    except StoreError as e:
        raise ExportError(f"{task.name}: listed in the manifest but cannot be read ({e})") from None


#: what reads an export's JSONL or canonical Parquet records where they are fetched:
#: ``(task, the file or None for a file of no bytes, dest) -> (rows, specials)``; the run
#: types them all (``_stage_copies``), ``cdr check-export`` its first ones
#: (``pipeline.ingest.check``)
TypedReader = Callable[[FileTask, Path | None, Path], tuple[int, int]]


def check_and_stage(task: FileTask, local: Path, dest: Path, typed: TypedReader) -> tuple[int, int]:
    """The downloaded file checked against its manifest entry and staged (an export's
    JSONL or Parquet records by ``typed``); returns its framing lines and the copies of
    its typing that the driver settles. Spark-free: ``cdr check-export`` calls it too."""
    digest = sha256_of(local)
    if digest != task.sha256:
        raise ExportError(f"{task.name}: sha256 mismatch (manifest {task.sha256}, file {digest})")
    framing = specials = 0
    if local.stat().st_size == 0:  # no bytes: no records, in every format
        rows, specials = typed(task, None, dest) if _typed(task) else (0, 0)
    elif _typed(task):
        rows, specials = typed(task, local, dest)
    elif task.format == "parquet" or (task.format == "dms" and is_parquet(local)):
        rows = parquet_rows(local, task.name)
        if task.format == "dms":
            check_dms_columns(task.options, pq.read_schema(local).names, task.name)
            dest = dest.parent / "parquet" / dest.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        local.replace(dest)
    elif task.format == "dms":
        rows = stage_dms_csv(local, dest.parent / "csv" / dest.name, task.name, task.options)
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
            rows = parquet_rows(local, task.name)
            for number, fields, text in parquet_records(local):
                out.record(number, fields, text)
        elif local is not None:
            limit = task.max_record_bytes
            for first, lines in line_chunks(local, task.name, task.limits):
                numbered = []
                for i, ln in enumerate(lines):
                    if isinstance(ln, LongLine):
                        out.long_line(first + i, ln, limit)
                    elif ln.strip():
                        numbered.append((first + i, ln.rstrip(b"\r")))
                out.lines(numbered)
            rows = out.count  # its non-blank lines, each a copy
    return rows, out.specials  # counted as the writer closed


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
    settings = task_settings(spark)
    payload = [asdict(t) for t in tasks]
    rdd = spark.sparkContext.parallelize(payload, len(payload))
    return rdd.map(lambda t: _fetch_in_task(t, settings, specs.get(t["table"]))).collect()


def _fetch_in_task(
    task: dict[str, Any], settings: dict[str, str], spec: TypingSpec | None
) -> tuple[int, int, str | None]:
    os.environ.update(settings)
    return fetch_file(FileTask(**task), spec)
