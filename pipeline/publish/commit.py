"""Publishing (docs/outputs.md): every output of a run is committed to its Delta table
(``pipeline.storage.lake``) once the verdict is known, then the run's ``runs`` row, last.

A published run replaces its date's partition of every dated table (one commit per
table), rewrites the CDC description tables, and replaces ``state`` and ``snapshot`` only
if its date is not older than the newest published one (a backfill never moves them
back: its state goes to a table of its own). A failed run commits its logs to tables of
its own under ``_failed/run=<run_id>/``. A crash between two commits leaves every table
as after the previous run or as after this one, and no ``runs`` row: the retry of the
same run id commits the same partitions again. Each commit is checked against the Delta
log before the next step (:meth:`Committer._check_rows`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import date, datetime
from typing import TYPE_CHECKING, Any

from pipeline.core import layout
from pipeline.core.columns import DT, RUN_ID
from pipeline.core.config import Config
from pipeline.core.errors import StageError
from pipeline.core.progress import current as progress
from pipeline.core.report import RunReport
from pipeline.ingest.inplace import InPlace, checksum, merge_source, touched_in
from pipeline.spark.session import local_frame
from pipeline.storage import workpath
from pipeline.storage.lake import Files, Lake
from pipeline.storage.outputs import SPARK_SCHEMA_KEY, OutputInfo, output_record
from pipeline.storage.runs_table import RunRow, append, latest_date, now, read_runs
from pipeline.storage.targets import located, outputs
from pipeline.storage.workpath import WorkPath

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)


class Committer:
    """Commits the outputs of one run: the Parquet files of each output folder of its
    ``resolved`` folder, copied into their table by the executors and added to it as they
    are (:class:`pipeline.storage.lake.Files`)."""

    def __init__(self, lake: Lake, resolved: WorkPath, meta: dict[str, Any]):
        self.lake, self.resolved, self.meta = lake, resolved, meta

    def commit(self, folder: str, path: str, dt: date | None) -> int | None:
        """Commit the output ``folder`` (relative to ``resolved``) to table ``path``
        (replacing the ``dt`` partition, or the whole table); returns the version. An
        output with no rows (its record only: no task wrote a file of it) replaces an
        earlier run's partition with nothing, or creates its table empty; a run that wrote
        no such output at all (no foreign keys: no orphans) creates no table. A table whose
        latest commit is this run's (a retried publish) is left as it is."""
        lake, meta = self.lake, self.meta
        where = located(self.resolved, folder)
        record = InPlace.load(self.resolved / folder.split("/")[0])
        if record is not None and path in record.versions:
            return self._merge(folder, path, record)
        files = where.parquet_files()
        info = output_record(where)
        rows, schema = _output(info, files)
        current = lake.version(path)
        if not files and (current is None and schema is None):
            return None
        if current is not None:
            last = lake.commit_meta(path, current)
            if last.get(RUN_ID) == meta[RUN_ID] and "operation" not in last:
                log.info("commit %s: this run's commit is there already", path)
                if rows is not None:  # checked again: the attempt that made it may have died
                    before = current - 1 if current else None
                    merged = (lake.commit_info(path, current) or {}).get("operation") == "MERGE"
                    # a merge of an attempt that planned it (its files are not the rows)
                    self._check_rows(path, dt, current, rows, before, lake.rows if merged else None)
                return current
        frame: DataFrame | Files | None = None
        if current is not None and rows == 0:
            pass  # an empty output: the partition emptied, if it holds anything
        elif info is not None and (small := info.small_frame(lake.session())) is not None:
            frame = small  # a few rows the driver made, recorded with the output
        elif files and schema is not None:  # the files as they are, copied into the table
            self.resolved.attach(lake.session())
            frame = Files([str(f) for f in files], schema)
        elif files:  # written without a record of their schema: Spark infers it
            self.resolved.attach(lake.session())
            frame = lake.session().read.parquet(*map(str, files))
        elif rows:  # its record counts rows, and no file holds them: never published empty
            raise StageError(f"{where}: {rows} row(s) recorded, but no file of them is there")
        else:  # an output with no rows on a first night: its table, empty
            frame = Files([], schema)
        version = lake.commit(path, frame, meta, dt=dt).version
        log.info("commit %s%s: version %d", path, f" dt={dt}" if dt else "", version)
        if rows is not None and version != current:
            before = version - 1 if current is not None else None  # after any settling
            self._check_rows(path, dt, version, rows, before)
        return version

    def _merge(self, folder: str, path: str, record: InPlace) -> int:
        """Merge the output ``folder`` into table ``path`` in place (``pipeline.ingest.inplace``):
        the table must be at the version the run started from (or at this run's own
        commit: a retried publish), and holds the carried rows after (else restored)."""
        lake, meta = self.lake, self.meta
        expected = record.rows_of(path)
        current = lake.version(path)
        if current != record.versions[path]:
            last = lake.commit_meta(path, current) if current is not None else {}
            if last.get(RUN_ID) != meta[RUN_ID]:
                raise StageError(
                    f"commit {path}: at version {current}, but this run started from version "
                    f"{record.versions[path]}: another writer moved it since ingest; the "
                    "publish stops (a rerun of the date replaces the whole table)"
                )
            if "operation" not in last:  # this run's merge is there already
                log.info("commit %s: this run's merge is there already", path)
                assert current is not None
                self._check_rows(path, None, current, expected, current - 1, lake.rows)
                return current
        spark = lake.session()
        self.resolved.attach(spark)
        where = located(self.resolved, folder)
        files = where.parquet_files()
        info = output_record(where)
        assert info is not None, f"{where}: no record of its schema"
        rows = (
            spark.read.schema(info.schema).parquet(*map(str, files))
            if files
            else local_frame(spark, [], info.schema)
        )
        key = record.merge_key(path)
        touched = None  # a version of the history is never deleted
        if key == record.key:
            touched = touched_in(spark, self.resolved / folder.split("/")[0], path)
        version = lake.merge(path, merge_source(rows, touched, key), key, meta).version
        log.info("commit %s: merged in place, version %d", path, version)
        if version != current:
            self._check_rows(path, None, version, expected, version - 1, lake.rows)
            self._check_merged(path, version, rows)
        return version

    def _check_merged(self, path: str, version: int, rows: DataFrame) -> None:
        """The rows the merge wrote (the files it added) are the run's ``rows``, by count
        and checksum (``inplace.checksum``): else the version before is restored and the
        publish stops."""
        lake = self.lake
        cols = rows.columns
        want, got = checksum(rows, cols), checksum(lake.added_rows(path, version), cols)
        if want == got:
            return
        restored = lake.restore(path, version - 1, self.meta)
        raise StageError(
            f"commit {path}: the rows version {version} added ({got[0]}, checksum {got[1]}) "
            f"are not the run's ({want[0]}, checksum {want[1]}); version {version - 1} "
            f"restored as version {restored}: the publish stops, no published runs row "
            "names the version"
        )

    def _check_rows(
        self,
        path: str,
        dt: date | None,
        version: int,
        rows: int,
        before: int | None,
        count: Callable[[str, int], int] | None = None,
    ) -> None:
        """The committed version holds (in partition ``dt``) the rows the run wrote: by
        its Delta log (the commit replaced them: every file of them is new, so the files'
        record counts are the rows a reader finds), or by ``count`` (a merge: Delta's
        count of the version, deletion vectors applied, from the log alone). Else the
        table goes back to the version ``before`` it in a new commit and the publish
        stops, so that no ``runs`` row names the version. A table the commit created stays
        at that version, which no ``runs`` row names: a retry of the run finds it its own,
        checks it again and stops again."""
        lake = self.lake
        counted = count(path, version) if count else lake.written_rows(path, version, dt)
        if counted is None or counted == rows:
            return
        if before is None:
            undone = "a new table, which no runs row names"
        else:
            undone = f"version {before} restored as version {lake.restore(path, before, self.meta)}"
        raise StageError(
            f"commit {path}{f' dt={dt}' if dt else ''}: version {version} holds {counted} "
            f"rows by its Delta log, but the run counted {rows} ({undone}); the publish stops: "
            "no published runs row names the version"
        )


def _output(info: OutputInfo | None, files: list[WorkPath]) -> tuple[int | None, Any]:
    """An output's rows (None: not counted) and the Spark schema it was written with
    (None if nothing says it): as recorded beside its files (``info``), else what their
    footers say (an output written without that record)."""
    from pyspark.sql.types import StructType

    if info is not None:
        return info[1], info[0]
    rows, schema = 0, None
    for f in files:
        meta = workpath.metadata(f)  # the module's: a test counts the footers read
        rows += meta.num_rows
        said = (meta.metadata or {}).get(SPARK_SCHEMA_KEY)
        if schema is None and said:
            schema = StructType.fromJson(json.loads(said))
    return rows, schema


def publish_failed(committer: Committer, tables: list[str], dt: date) -> dict[str, int]:
    """The logs of a run that failed its gate, for inspection
    (docs/rules.md#fine-points), as tables of their own: the date's published logs
    stay as they are."""
    run_id = committer.meta[RUN_ID]
    batch = [
        (f"{t}/{kind}", layout.failed_output(run_id, t, kind), dt)
        for t in tables
        for kind in layout.LOGS
    ]
    return _in_parallel(committer, batch)


#: how many tables a publish commits at once: a small commit is mostly the driver's
#: planning and the log's state, which overlap with another table's
COMMIT_THREADS = 4


def _in_parallel(
    committer: Committer, batch: Sequence[tuple[str, str, date | None]]
) -> dict[str, int]:
    """Commit (folder, table, dt) triples at once, one table per thread; table -> version.
    Every commit is tried; the first failure is raised after all have ended."""
    if not batch:
        return {}
    with ThreadPoolExecutor(min(COMMIT_THREADS, len(batch)), "cdr-commit") as pool:
        futures = {
            path: pool.submit(committer.commit, folder, path, dt) for folder, path, dt in batch
        }
    versions, failed = {}, []
    for path, f in futures.items():
        try:
            v = f.result()
        except Exception as e:  # all are awaited; the first failure is raised below
            failed.append(e)
            continue
        if v is not None:
            versions[path] = v
    if failed:
        raise failed[0]
    return versions


def publish_tables(
    committer: Committer, config: Config, dt: date, runs: list[RunRow]
) -> dict[str, int]:
    """Commit every output of a validated run (``outputs``); returns table path ->
    version. In three steps, the tables of a step committed at once: the CDC description
    tables (a consumer finds a stream described before it reads it), the logs and the
    states, and the snapshots last, each only if its date is not older than the newest
    published one (a backfill never moves it back; its state goes to a table of its own,
    ``layout.backfill_state``)."""
    every = outputs(config)
    descriptions = {layout.cdc_table_dir(n) for n in layout.CDC_TABLES}
    steps: list[list[tuple[str, str, date | None]]] = [[], [], []]
    for o in every:
        t = o.folder.split("/")[0]
        newest = latest_date(runs, t)
        older = newest is not None and newest > dt  # a backfill
        path, step = o.path, 0 if o.path in descriptions else 1
        if o.path == layout.table_path(t, layout.SNAPSHOT):
            if older:
                log.info(
                    "publish %s: snapshot stays on %s (this run is for an earlier date)", t, newest
                )
                continue
            step = 2
        elif o.path == layout.table_path(t, layout.STATE) and older:
            path = layout.backfill_state(committer.meta[RUN_ID], t)  # state stays on newest
        steps[step].append((o.folder, path, dt if o.dated else None))
    versions: dict[str, int] = {}
    for what, batch in zip(
        ("CDC descriptions", "logs and states", "snapshots"), steps, strict=True
    ):
        if batch:
            n = len(batch)
            progress().step(f"committing the {what} ({n} table{'s' * (n != 1)})")
        versions.update(_in_parallel(committer, batch))
    return versions


def commit_meta(run_id: str, dt: date, verdict: str) -> dict[str, Any]:
    """What every commit of a run says about it (its commit info, ``cdr.*``)."""
    return {RUN_ID: run_id, DT: dt.isoformat(), "verdict": verdict}


def has_row(lake: Lake, run_id: str) -> bool:
    return any(r.run_id == run_id for r in read_runs(lake))


def record_run(lake: Lake, row: RunRow) -> None:
    """Append the run's ``runs`` row: its last commit."""
    version = append(lake, row)
    log.info("runs: %s %s (version %d)", row.run_id, row.status, version)


def run_row(
    run_id: str,
    dt: date,
    status: str,
    started: str,
    config_sha256: str | None,
    inputs: dict[str, Any] | None,
    report: RunReport | None,
    versions: dict[str, int],
    own: dict[str, Any] | None = None,
) -> RunRow:
    """The ``runs`` row of a run; ``inputs``: the staged tables (manifests, prior runs);
    ``report``: the run's (None: it stopped before publish). Its ``counts`` hold the
    report's table summaries whole (their headline counts: ``TableSummary.totals``) and
    ``own``, its conflicts by type, resolver and outcome (``stats.run_counts``:
    docs/operations.md#metrics adds them up)."""

    manifests: list[dict[str, Any]] = []
    priors: list[tuple[str, str]] = []
    for t, st in (inputs or {}).items():
        manifests += [{"table": t, **m} for m in st.get("manifests", [])]
        if st.get("prior"):
            priors.append((st["prior"][DT], st["prior"][RUN_ID]))
    verdict: dict[str, Any] = {}
    counts: dict[str, Any] = {}
    if report is not None:
        verdict = {
            "failures": list(report.failures),
            "warnings": list(report.warnings),
            "suites": dict(report.validation.suites),
        }
        counts["tables"] = {t: s.to_dict() for t, s in report.tables.items()}
        if report.cdc is not None:
            counts["cdc"] = report.cdc.to_dict()
        if report.now_us is not None:  # the run's clock: TTLs expire from it
            counts["now_us"] = report.now_us
        if report.seconds:  # docs/operations.md#metrics
            counts["seconds"] = dict(report.seconds)
        counts |= own or {}
    return RunRow(
        run_id=run_id,
        dt=dt,
        status=str(status),
        started_at=datetime.fromisoformat(started.replace("Z", "+00:00")) if started else now(),
        finished_at=now(),
        prior_run_id=max(priors)[1] if priors else None,
        config_sha256=config_sha256 or "",
        inputs=manifests,
        verdict=verdict,
        counts=counts,
        versions=versions,
    )
