"""The published tables as Delta Lake tables (docs/outputs.md), written by delta-spark.

delta-spark is the one writer of every table: a run's outputs (Parquet in its work
folder) go into their tables, one commit per table (a dated table's partition replaced; an
undated one replaced whole, or appended to). Output files are added as they are
(:class:`Files`): the executors copy them into the table's folder with their statistics
read from their footers, and the commit adds them; rows made elsewhere are written by
Delta's writer. A replace takes the files it removes from the checksum file of the version
it starts from (``pipeline/spark/java/Replace.java``: Delta's own overwrite would first
reconstruct the table's state with Spark jobs); Delta's ``replaceWhere`` does it when the
checksum lists no files (files added as they are take Delta's scan of the state then).
Every table is created with deletion vectors on and the writer's retention
(:data:`FEATURES`, ``pipeline.storage.lake_retention``), checked at each commit. The run
id, date and verdict go in each commit's ``userMetadata`` (JSON;
``pipeline.storage.lake_read.meta_of`` also reads the ``cdr.*`` commit info keys of
tables an older release wrote with delta-rs). A run's commits are fenced by its lease
(:class:`pipeline.storage.lease.Fence`).

:class:`Lake` reads too (``pipeline.storage.lake_read``: a table at a version, through a
Delta reader).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from pipeline.core import layout
from pipeline.core.columns import DT, RUN_ID
from pipeline.core.errors import CdrError, LockedError, StoreError
from pipeline.storage.lake_read import LakeReader, add_actions
from pipeline.storage.lake_retention import retention_properties
from pipeline.storage.lease import Fence, holder
from pipeline.storage.store import Store

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)

#: what the log store's refusal of a commit starts with (``FencedLogStore.NOT_HELD``)
LEASE_NOT_HELD = "cdr: the lease is not held"
#: held while a commit sets the session's commit metadata (commits run in threads)
_SESSION_METADATA = threading.Lock()

#: the column of :meth:`Lake.merge`'s rows that says the key's row goes
DROP = "_drop"
#: the table features every table is created with, and checked at every commit
FEATURES = {"delta.enableDeletionVectors": "true"}


def _where(dt: date | None) -> tuple[str | None, str | None, str | None]:
    """A commit's partition for ``Replace.java``: its column, its value and the predicate
    that names it (None each: the whole table)."""
    if dt is None:
        return None, None, None
    return DT, dt.isoformat(), f"{DT} = DATE'{dt.isoformat()}'"


@dataclass(frozen=True)
class Files:
    """Rows a run's tasks wrote already: Parquet files (Spark URIs) of ``schema``.
    Committed as they are (:meth:`Lake.commit`): the executors copy them into the table,
    which adds them, and no row is decoded again."""

    uris: list[str]
    schema: StructType

    def frame(self, spark: SparkSession) -> DataFrame:
        """Their rows, read by the executors with the schema they were written with."""
        return spark.read.schema(self.schema).parquet(*self.uris)


@dataclass(frozen=True)
class Commit:
    """One commit of one table: where, and the version it made."""

    path: str  # the table's key in the store, e.g. published/orders/state
    version: int


class Lake(LakeReader):
    """The Delta tables under one store's ``published/`` folder, read and written. A
    writer gives the config's ``retention_days`` (every table it creates carries that
    retention, and an existing table that does not gets it at its next commit, by a commit
    of its own just before), its run's :class:`~pipeline.storage.lease.Fence`, and its
    Spark session (or a function that makes one: a process that only reads starts no
    JVM)."""

    def __init__(
        self,
        store: Store,
        retention_days: int | None = None,
        fence: Fence | None = None,
        spark: SparkSession | Callable[[], SparkSession] | None = None,
    ):
        super().__init__(store, spark)
        self.properties = retention_properties(retention_days) if retention_days else {}
        self.fence = fence  # a run's writes: every commit checked against its lease

    # ------------------------------------------------------------------ writing

    def commit(
        self,
        path: str,
        frame: DataFrame | Files | None,
        meta: dict[str, Any],
        *,
        dt: date | None = None,
        mode: str = "overwrite",
        version: int | None = None,
    ) -> Commit:
        """Write ``frame`` (rows, or :class:`Files` of them) into the table in one commit.
        ``dt``: the table is partitioned by ``dt`` and the commit replaces that partition
        (``mode="overwrite"``) or adds to it (``"append"``); without it, ``overwrite``
        replaces the whole table. ``frame`` None: the table's partition (or the table)
        emptied. ``version``: the commit makes exactly that version (from
        :meth:`next_version`) or fails.

        Replacing a partition that holds no file is an append: Delta then needs no state
        of the table (which costs it a few Spark jobs over the whole log), and a night's
        first commit of its date costs the night. The partition is looked up in the log
        the commit starts from; a writer that appends there while another commits the same
        partition is one whose lease was lost, which the fence reports."""
        self.session()  # s3a pointed at the store
        t = self.table(path)
        if t is not None and self._settle(path, meta, t):
            t = self.table(path)
        current = None if t is None else int(t.version())
        if version is not None and version != (current + 1 if current is not None else 0):
            raise LockedError(f"{path}: at version {current}, not {version - 1}: another writer")
        # an undated commit over a table partitioned by date (a store of the layout before
        # the state was one table): the table's layout changes, whatever it holds
        relayout = t is not None and mode == "overwrite" and dt is None
        relayout = relayout and DT in t.metadata().partition_columns
        if mode == "overwrite" and t is not None and not relayout and not add_actions(t, dt):
            mode = "append"  # nothing to replace
            if frame is None:
                log.debug("commit %s: %s empty already, no commit", path, dt or "the table")
                return Commit(path, int(t.version()))
        if frame is None:
            if t is None:
                raise ValueError(f"{path}: a new table needs rows or a schema")
            frame = self.frame(path).where("false")
            frame = frame.drop(DT) if relayout else frame
        meta = self._fenced(path, meta)
        self._write(path, frame, meta, dt, mode, new=t is None, relayout=relayout)
        got = self.version(path)
        assert got is not None
        if version is not None and got != version:
            raise self._lost(path, version)
        if got == current:  # nothing to add or remove (an empty partition emptied): no commit
            log.debug("commit %s: nothing changed, still version %d", path, got)
            return Commit(path, got)
        self._read_back(path, got)
        log.debug("commit %s v%d", path, got)
        return Commit(path, got)

    def _write(
        self,
        path: str,
        frame: DataFrame | Files,
        meta: dict[str, Any],
        dt: date | None,
        mode: str,
        new: bool,
        relayout: bool = False,
    ) -> None:
        from pyspark.sql import functions as F

        text = json.dumps(meta, sort_keys=True, default=str)
        if isinstance(frame, Files):
            if not relayout and self._adopt(path, frame, dt, mode, text):
                return
            frame = frame.frame(self.session())  # another schema: Delta's writer merges it
        if dt is not None and DT not in frame.columns:
            frame = frame.withColumn(DT, F.lit(dt))
        if (
            mode == "overwrite"
            and not new
            and not relayout
            and self._replace(path, frame, dt, text)
        ):
            return
        writer = frame.write.format("delta").mode(mode)
        if relayout:  # Delta's overwrite of the schema and the partitioning (none)
            writer = writer.option("overwriteSchema", "true")
        else:
            writer = writer.option("mergeSchema", "true")
        writer = writer.option("userMetadata", text)
        if dt is not None:
            writer = writer.partitionBy(DT)
            if mode == "overwrite":
                writer = writer.option("replaceWhere", _where(dt)[2])
        if new:
            for k, v in {**FEATURES, **self.properties}.items():
                writer = writer.option(k, v)
        for k, v in self._lease_settings().items():  # for the log store's check
            writer = writer.option(k, v)
        try:
            writer.save(self.spark_uri(path))
        except Exception as e:  # py4j's and Spark's errors: one line, naming the table
            raise self._failed(path, e) from None

    def _replace(self, path: str, frame: DataFrame, dt: date | None, meta: str) -> bool:
        """Replace the table's files (of partition ``dt``) by ``frame`` with the files to
        remove taken from the checksum of the version read (``pipeline/spark/java/Replace.java``),
        which spares Delta's scan of the table's state; False (nothing done) when that
        checksum lists no files or the schema changes: then Delta's own overwrite."""
        session = self.session()._jsparkSession
        return self._replace_class(
            path,
            lambda replace: replace.replace(
                session, self.spark_uri(path), frame._jdf, self._lease_settings(), *_where(dt), meta
            ),
        )

    def _adopt(self, path: str, files: Files, dt: date | None, mode: str, meta: str) -> bool:
        """Add ``files`` to the table as they are, copied into its folder by the executors
        (``pipeline/spark/java/Replace.java``), removing the partition's (or the table's) files
        with ``mode="overwrite"``, or creating the table; False (nothing done) when the
        schema differs."""
        from pyspark.sql.types import DateType, StructField, StructType

        schema = files.schema
        if dt is not None and DT not in schema.names:
            schema = StructType([*schema.fields, StructField(DT, DateType())])
        session = self.session()._jsparkSession
        settings = self._lease_settings()
        created = {**FEATURES, **self.properties}
        return self._replace_class(
            path,
            lambda replace: replace.adopt(
                session,
                self.spark_uri(path),
                files.uris,
                schema.json(),
                settings,
                created,
                mode == "overwrite",
                *_where(dt),
                meta,
            ),
        )

    def _replace_class(self, path: str, call: Callable[[Any], int]) -> bool:
        """One commit of ``pipeline/spark/java/Replace.java`` (``call`` of the class); False when
        it did nothing (it returned -1). Its failure: one line naming the table."""
        session = self.session()
        jvm = session.sparkContext._jvm
        assert jvm is not None
        # the JVM thread of this Python thread (a publish commits from several) has no
        # active session of its own; Delta's scan of the table's state needs one (a
        # version whose checksum lists no files, as after a RESTORE)
        jvm.org.apache.spark.sql.SparkSession.setActiveSession(session._jsparkSession)
        try:
            version = call(jvm.cdr.delta.Replace)
        except Exception as e:  # as the writer's: one line, naming the table
            raise self._failed(path, e) from None
        return bool(version >= 0)

    def _failed(self, path: str, e: Exception) -> CdrError:
        text = str(e)
        if LEASE_NOT_HELD in text:  # the log store's check, just before the commit file
            if self.fence is not None:
                try:
                    self.fence.before(path)  # raises naming the run that holds it now
                except LockedError as lost:
                    return lost
            return self._lost(path, None)
        if (
            "ConcurrentAppend" in text
            or "ConcurrentModification" in text
            or "ProtocolChanged" in text
        ):
            return self._lost(path, None)
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        # py4j's first line names only the call; the JVM's exception and its cause follow
        said = [x for x in lines if ("Exception" in x or "Error" in x) and not x.startswith("at ")]
        first = said[-1] if said else (lines[0] if lines else type(e).__name__)
        return StoreError(f"{self.uri(path)}: the Delta commit failed ({first[:500]})")

    def _settle(self, path: str, meta: dict[str, Any], t: Any) -> bool:
        """Give an existing table (``t``, its log) the writer's retention and the project's
        features if its own differ: a commit of their own, fenced like the others. True if
        it committed."""
        config = t.metadata().configuration
        wanted = {**FEATURES, **self.properties}
        if all(config.get(k) == v for k, v in wanted.items()):
            return False
        log.info("%s: table properties set to %s", path, wanted)
        props = ", ".join(f"'{k}' = '{v}'" for k, v in wanted.items())
        sql = f"ALTER TABLE {{table}} SET TBLPROPERTIES ({props})"
        self._sql_commit(path, meta, "set the table properties", sql)
        return True

    def restore(self, path: str, version: int, meta: dict[str, Any]) -> int:
        """Make the table's content that of ``version`` again, in a new commit fenced like
        the others (Delta's ``RESTORE``; its files stay, so every version still reads);
        returns the new version."""
        sql = f"RESTORE TABLE {{table}} TO VERSION AS OF {int(version)}"
        return self._sql_commit(path, meta, f"restored version {version}", sql)

    def _sql_commit(self, path: str, meta: dict[str, Any], operation: str, sql: str) -> int:
        """One SQL statement on the table (``{table}`` in ``sql``) as a commit of the run
        ``meta`` names, its ``operation`` said (a retried publish does not take it for one
        of the run's own output commits), read back; returns its version."""
        statement = sql.replace("{table}", f"delta.`{self.spark_uri(path)}`")
        info = {**self._fenced(path, meta), "operation": operation}
        with self._session_commit(path, info) as spark:
            spark.sql(statement)
        return self._committed(path)

    def merge(self, path: str, rows: DataFrame, key: Sequence[str], meta: dict[str, Any]) -> Commit:
        """``rows`` merged into the existing table by ``key`` in one commit (Delta's MERGE:
        the rows it replaces or deletes are marked in deletion vectors, no file holding
        none of them is rewritten): a row whose ``DROP`` column is true deletes its key's
        row, any other (false or null) replaces it or is added. Fenced and read back like
        every commit, the table's properties settled first; the ``DROP`` column is not
        written. A merge that changes nothing makes no commit (the version stays)."""
        from delta.tables import DeltaTable

        t = self.table(path)
        if t is not None:
            self._settle(path, meta, t)
        before = self.version(path)
        on = " AND ".join(f"t.`{c}` <=> s.`{c}`" for c in key)
        drop = f"coalesce(s.`{DROP}`, false)"
        values: dict[str, str | Column] = {f"`{c}`": f"s.`{c}`" for c in rows.columns if c != DROP}
        # the source is files of the run's work folder, read again as they are: Delta
        # need not copy it first (its ``auto`` copies any source that is not Delta)
        once = {"spark.databricks.delta.merge.materializeSource": "none"}
        with self._session_commit(path, self._fenced(path, meta), once) as spark:
            (
                DeltaTable.forPath(spark, self.spark_uri(path))
                .alias("t")
                .merge(rows.alias("s"), on)
                .whenMatchedDelete(drop)
                .whenMatchedUpdate(set=values)
                .whenNotMatchedInsert(condition=f"NOT {drop}", values=values)
                .execute()
            )
        if before is not None and self.version(path) == before:  # nothing changed: no commit
            return Commit(path, before)
        return Commit(path, self._committed(path))

    @contextmanager
    def _session_commit(
        self, path: str, info: dict[str, Any], conf: dict[str, str] | None = None
    ) -> Iterator[SparkSession]:
        """The session set for one commit of ``path`` that takes no writer options (SQL,
        Delta's table API): its metadata, the log store's lease check and ``conf``, for that
        commit only (one table's at a time); a failure is one line naming the table."""
        spark = self.session()
        settings = {
            "spark.databricks.delta.commitInfo.userMetadata": json.dumps(
                info, sort_keys=True, default=str
            ),
            **self._lease_settings(),
            **(conf or {}),
        }
        with _SESSION_METADATA:
            for k, v in settings.items():
                spark.conf.set(k, v)
            try:
                yield spark
            except Exception as e:
                raise self._failed(path, e) from None
            finally:
                for k in settings:
                    spark.conf.unset(k)

    def _committed(self, path: str) -> int:
        """The version a commit just made, read back (this run's, its lease still held)."""
        got = self.version(path)
        assert got is not None
        self._read_back(path, got)
        return got

    def next_version(self, path: str, meta: dict[str, Any]) -> int:
        """The version the next commit of ``path`` makes, its properties settled first:
        for a commit whose rows record their own version (the ``runs`` table)."""
        t = self.table(path)
        if t is None:
            return 0
        self._settle(path, meta, t)
        return int(self.version(path) or 0) + 1

    def _fenced(self, path: str, meta: dict[str, Any]) -> dict[str, Any]:
        """The commit's metadata with the run's lease epoch, the lease checked just before."""
        if self.fence is None:
            return meta
        self.fence.before(path)
        return {**meta, RUN_ID: self.fence.run_id, "epoch": self.fence.epoch}

    def _lease_settings(self) -> dict[str, str]:
        """The Hadoop settings that make the log store check the run's lease just before
        it puts a commit file (``FencedLogStore``); none for an unfenced writer."""
        if self.fence is None:
            return {}
        return {
            "fs.cdr.lease.path": self.spark_uri(layout.LOCK),
            "fs.cdr.lease.run_id": self.fence.run_id,
            "fs.cdr.lease.epoch": self.fence.epoch,
        }

    def _read_back(self, path: str, version: int) -> None:
        """The version just committed read back: this run's, and the lease still its."""
        if self.fence is None:
            return
        meta = self.commit_meta(path, version)
        self.fence.after(path, version, meta.get(RUN_ID), meta.get("epoch"))

    def _lost(self, path: str, version: int | None) -> LockedError:
        """Another writer committed first: one line naming the table and the holder."""
        now = holder(self.store)
        who = "nobody holds the lease" if now is None else f"the lease is held by {now.describe()}"
        at = f"version {version}" if version is not None else "its next version"
        return LockedError(f"{path}: another writer committed {at} first; {who}")

    def write(
        self,
        path: str,
        data: pa.Table,
        meta: dict[str, Any],
        *,
        dt: date | None = None,
        mode: str = "overwrite",
        version: int | None = None,
    ) -> Commit:
        """A small table made on the driver (the ``runs`` table, an outcome of the
        quarantine): its rows handed to Spark, then committed like a run's outputs."""
        body = data.drop_columns([DT]) if dt is not None and DT in data.column_names else data
        frame = self.session().createDataFrame(body).coalesce(1)  # a few rows: one file
        return self.commit(path, frame, meta, dt=dt, mode=mode, version=version)
