"""The published tables as Delta Lake tables (formats.md "Outputs"), written with delta-rs.

The resolve stage writes each output as Parquet files in the run's work folder, and its
Spark tasks put them under the folder of their table (``pipeline.uploads``); a commit
(:meth:`Lake.commit_uploaded`) registers them with one Delta commit: add actions with the
files' statistics, and, for a dated table, the removal of every file of the date's
partition (a rerun replaces the date whole). Small tables made on the driver (the
``runs`` table) are put there by :meth:`Lake.commit` itself. Every commit carries the run
id, the date and the verdict in its commit info.

Readers take a table at a version; the pipeline's own Spark reads a table through the
file list of the version it pins (:meth:`Lake.files`), never by listing the folder,
which still holds the files of older versions until ``cdr vacuum``.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.errors import LockedError, NotFoundError, StoreError
from pipeline.store import Store

if TYPE_CHECKING:
    from deltalake import DeltaTable

    from pipeline.lease import Fence
    from pipeline.uploads import Upload

log = logging.getLogger(__name__)

#: the partition column of dated tables
DT = "dt"
#: the Delta table properties that keep a table's log (and its removed files, for a
#: Delta vacuum) as long as the runs ``cdr vacuum`` keeps: checkpoints and log clean-up
#: never remove a version a retained ``runs`` row names
RETENTION_PROPERTIES = ("delta.logRetentionDuration", "delta.deletedFileRetentionDuration")


def retention_properties(days: int) -> dict[str, str]:
    """The table properties of a retention of ``days`` (config ``retention_days``)."""
    return dict.fromkeys(RETENTION_PROPERTIES, f"interval {days} days")


@dataclass(frozen=True)
class Commit:
    """One commit of one table: where, and the version it made."""

    path: str  # the table's key in the store, e.g. published/orders/state
    version: int
    files: int
    rows: int


def storage_options(uri: str) -> dict[str, str]:
    """delta-rs' options for the store, from the environment boto3 reads (endpoint,
    region, keys): one configuration for both clients. Commits use S3's conditional
    writes (``If-None-Match``), so that two writers can never both make a version."""
    if not uri.startswith("s3://"):
        return {}
    env = os.environ
    opts = {"conditional_put": "etag"}
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    if endpoint:
        opts["AWS_ENDPOINT_URL"] = endpoint
        if endpoint.startswith("http://"):
            opts["AWS_ALLOW_HTTP"] = "true"
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        if env.get(name):
            opts[name] = env[name]
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    opts["AWS_REGION"] = region or "us-east-1"
    return opts


def file_stats(path: Path) -> tuple[int, str]:
    """The file's row count and Delta statistics (numRecords, and min, max and null count
    of the top-level primitive columns), from its Parquet footer alone."""
    meta = pq.ParquetFile(path).metadata
    rows = meta.num_rows
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    schema = meta.schema.to_arrow_schema()
    for i, field in enumerate(schema):
        if pa.types.is_nested(field.type) or pa.types.is_binary(field.type):
            continue
        lo = hi = None
        n_null = 0
        ok = True
        for g in range(meta.num_row_groups):
            col = meta.row_group(g).column(i)
            st = col.statistics
            if st is None or not st.has_null_count:
                ok = False
                break
            n_null += st.null_count
            if st.has_min_max:
                lo = st.min if lo is None else min(lo, st.min)
                hi = st.max if hi is None else max(hi, st.max)
        if not ok:
            continue
        nulls[field.name] = n_null
        if lo is not None and _plain(lo) and _plain(hi):
            mins[field.name], maxs[field.name] = _json_value(lo), _json_value(hi)
    stats = {"numRecords": rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls}
    return rows, json.dumps(stats, default=str)


def _plain(v: Any) -> bool:
    return isinstance(v, int | float | str | bool | date) and not (
        isinstance(v, float) and v != v  # NaN
    )


def _json_value(v: Any) -> Any:
    if isinstance(v, date):
        return v.isoformat()
    return v


def add_actions(table: Any, dt: date | None = None) -> list[dict[str, Any]]:
    """The add actions (``path``, ``num_records``, ``partition.dt``, ...) of a loaded table
    version: the files a reader of that version reads (of partition ``dt``)."""
    actions: list[dict[str, Any]] = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    if dt is not None:
        return [a for a in actions if a.get(f"partition.{DT}") == dt]
    return actions


def parquet_files(folder: Path) -> list[Path]:
    """The data files Spark (or pyarrow) wrote in ``folder``, without its markers."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.glob("*.parquet") if not p.name.startswith((".", "_")))


class Lake:
    """The Delta tables under one store's ``published/`` folder. A writer gives the
    config's ``retention_days``: every table it creates carries that retention, and an
    existing table that does not (an older store, a changed setting) gets it at its next
    commit, by a commit of its own just before."""

    def __init__(self, store: Store, retention_days: int | None = None, fence: Fence | None = None):
        self.store = store
        self.options = storage_options(store.uri)
        self.properties = retention_properties(retention_days) if retention_days else {}
        self.fence = fence  # a run's writes: every commit checked against its lease

    def uri(self, path: str) -> str:
        """The table's URI for delta-rs (a local path on ``file://``)."""
        local = self.store.local_path(path)
        return str(local) if local is not None else f"{self.store.uri}/{path}"

    def table(self, path: str, version: int | None = None) -> Any:
        """The table at ``version`` (default: its latest), or None if it does not exist."""
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            return DeltaTable(self.uri(path), version=version, storage_options=self.options)
        except TableNotFoundError:
            return None
        except OSError as e:
            raise StoreError(f"{self.uri(path)}: cannot read the Delta table ({e})") from None

    def version(self, path: str) -> int | None:
        t = self.table(path)
        return None if t is None else int(t.version())

    def files(self, path: str, version: int | None = None, dt: date | None = None) -> list[str]:
        """The data files of the table at ``version`` (of partition ``dt``), as URIs a
        reader opens (local paths on ``file://``)."""
        t = self.table(path, version)
        if t is None:
            return []
        filters = [(DT, "=", dt.isoformat())] if dt is not None else None
        return list(t.file_uris(partition_filters=filters))

    def read(
        self, path: str, version: int | None = None, dt: date | None = None, columns: Any = None
    ) -> pa.Table | None:
        """A small table (or one partition of it) read whole, with pyarrow."""
        t = self.table(path, version)
        if t is None:
            return None
        filters = [(DT, "=", dt.isoformat())] if dt is not None else None
        return t.to_pyarrow_table(partitions=filters, columns=columns)

    # ------------------------------------------------------------------ writing

    def _put(self, src: Path, path: str, rel: str) -> None:
        self.store.upload(src, f"{path}/{rel}")

    def commit(
        self,
        path: str,
        files: list[Path],
        schema: pa.Schema | None,
        meta: dict[str, Any],
        *,
        dt: date | None = None,
        mode: str = "overwrite",
        version: int | None = None,
    ) -> Commit:
        """Put ``files`` (local Parquet, without the ``dt`` column) into the table and
        commit them in one version. ``dt``: the table is partitioned by ``dt`` and the
        commit replaces that partition (``mode="overwrite"``) or adds to it
        (``"append"``); without it, ``overwrite`` replaces the whole table. ``schema`` is
        the files' schema (None without files: the table's own); a dated table adds ``dt``
        (a date) to it. ``version``: the commit makes exactly that version (from
        :meth:`next_version`) or fails, never a later one."""
        table = self.table(path)
        full = self._full_schema(path, table, schema, dt)
        actions, rows = self._put_files(path, files, meta, dt)
        return self._commit_actions(path, table, full, actions, rows, meta, dt, mode, version)

    def next_version(self, path: str, meta: dict[str, Any]) -> int:
        """The version the next commit of ``path`` makes, its retention settled first: for
        a commit whose rows record their own version (the ``runs`` table)."""
        table = self.table(path)
        if table is None:
            return 0
        self._set_properties(path, table, meta)
        return int(table.version()) + 1

    def commit_uploaded(
        self,
        path: str,
        uploads: list[Upload],
        schema: pa.Schema | None,
        meta: dict[str, Any],
        *,
        dt: date | None = None,
    ) -> Commit:
        """Commit files the resolve stage's tasks put in the run's staging folder
        (``pipeline.uploads``), replacing the ``dt`` partition (or the table): the store
        copies each under ``path`` (publish moves no byte of them), then one commit
        registers them. A table whose latest version is this run's commit of these files
        (a retried publish) is left as it is; a staged file that is gone stops the commit,
        naming it."""
        table = self.table(path)
        full = self._full_schema(path, table, schema, dt)
        rows = sum(u.rows for u in uploads)
        if self._committed_already(path, table, uploads, meta, dt):
            assert table is not None
            log.info("commit %s: this run's files are committed already", path)
            return Commit(path, int(table.version()), len(uploads), rows)
        from deltalake.transaction import AddAction

        self._copy_in(path, uploads)
        partition = {DT: dt.isoformat()} if dt is not None else {}
        actions = [AddAction(u.rel, u.size, partition, u.mtime_ms, True, u.stats) for u in uploads]
        return self._commit_actions(path, table, full, actions, rows, meta, dt, "overwrite")

    def _copy_in(self, path: str, uploads: list[Upload]) -> None:
        """The staged files copied under ``path`` by the store (a few at once)."""
        from concurrent.futures import ThreadPoolExecutor

        def copy(u: Upload) -> None:
            try:
                self.store.copy(u.key, f"{path}/{u.rel}")
            except NotFoundError:
                raise StoreError(
                    f"{self.store.uri}/{u.key}: the file the resolve stage uploaded for "
                    f"{path} is gone; resolve the run again"
                ) from None

        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(copy, uploads))

    def _full_schema(
        self, path: str, table: DeltaTable | None, schema: pa.Schema | None, dt: date | None
    ) -> pa.Schema:
        """The files' schema (the table's own when None), with ``dt`` for a dated table."""
        if schema is None:
            if table is None:
                raise ValueError(f"{path}: a new table needs a schema")
            schema = pa.schema(table.schema().to_arrow())
            if dt is not None:
                schema = schema.remove(schema.get_field_index(DT))
        return schema.append(pa.field(DT, pa.date32())) if dt is not None else schema

    def _committed_already(
        self,
        path: str,
        table: DeltaTable | None,
        uploads: list[Upload],
        meta: dict[str, Any],
        dt: date | None,
    ) -> bool:
        if table is None:
            return False
        info = self.commit_info(path, int(table.version())) or {}
        if info.get("cdr.run_id") != meta.get("run_id"):
            return False
        return {a["path"] for a in add_actions(table, dt)} == {u.rel for u in uploads}

    def _commit_actions(
        self,
        path: str,
        table: DeltaTable | None,
        full: pa.Schema,
        actions: list[Any],
        rows: int,
        meta: dict[str, Any],
        dt: date | None,
        mode: str,
        version: int | None = None,
    ) -> Commit:
        from deltalake.exceptions import CommitFailedError

        meta = self._fenced(path, meta)
        try:
            self._transaction(path, table, full, actions, meta, dt, mode, version)
        except OSError as e:  # how delta-rs reports a commit the store refused
            raise StoreError(f"{self.uri(path)}: the Delta commit failed ({e})") from None
        except CommitFailedError:
            raise self._lost(path, version) from None
        if table is None:
            version = 0  # the commit that created the table
        else:
            table.update_incremental()  # the new commits only, not the whole log again
            version = int(table.version())
        self._read_back(path, version)
        log.debug("commit %s v%d: %d file(s), %d row(s)", path, version, len(actions), rows)
        return Commit(path, version, len(actions), rows)

    def _fenced(self, path: str, meta: dict[str, Any]) -> dict[str, Any]:
        """The commit's info with the run's lease epoch, the lease checked just before."""
        if self.fence is None:
            return meta
        self.fence.before(path)
        return {**meta, "run_id": self.fence.run_id, "epoch": self.fence.epoch}

    def _read_back(self, path: str, version: int) -> None:
        """The version just committed read back: this run's, and the lease still its."""
        if self.fence is None:
            return
        info = self.commit_info(path, version) or {}
        self.fence.after(path, version, info.get("cdr.run_id"), info.get("cdr.epoch"))

    def _lost(self, path: str, version: int | None) -> LockedError:
        """Another writer committed first: one line naming the table and the holder."""
        from pipeline.lease import holder

        now = holder(self.store)
        who = "nobody holds the lease" if now is None else f"the lease is held by {now.describe()}"
        at = f"version {version}" if version is not None else "its next version"
        return LockedError(f"{path}: another writer committed {at} first; {who}")

    def _put_files(
        self, path: str, files: list[Path], meta: dict[str, Any], dt: date | None
    ) -> tuple[list[Any], int]:
        """Upload the files under new names (never over a live file) and describe each
        for the commit: its add action, with its statistics; and the rows they hold."""
        from deltalake.transaction import AddAction

        folder = f"{DT}={dt.isoformat()}/" if dt is not None else ""
        batch = uuid.uuid4().hex[:12]  # a new name per attempt
        partition = {DT: dt.isoformat()} if dt is not None else {}
        actions, rows = [], 0
        for i, f in enumerate(files):
            rel = f"{folder}{meta.get('run_id', 'run')}-{batch}-{i:05d}.parquet"
            n, stats = file_stats(f)
            self._put(f, path, rel)
            rows += n
            size, mtime = f.stat().st_size, int(f.stat().st_mtime * 1000)
            actions.append(AddAction(rel, size, partition, mtime, True, stats))
        return actions, rows

    def _transaction(
        self,
        path: str,
        table: DeltaTable | None,
        full: pa.Schema,
        actions: list[Any],
        meta: dict[str, Any],
        dt: date | None,
        mode: str,
        version: int | None,
    ) -> None:
        """One commit of the add actions: the table's first, or a new version that
        replaces the ``dt`` partition (or the table) or appends to it; exactly
        ``version`` when given."""
        from deltalake import CommitProperties, Schema
        from deltalake.transaction import create_table_with_add_actions

        partition_by = [DT] if dt is not None else None
        retries = None if version is None else 0  # another writer's commit: fail, not retry
        props = CommitProperties(custom_metadata=_commit_info(meta), max_commit_retries=retries)
        if table is None:
            if version not in (None, 0):
                raise StoreError(f"{self.uri(path)}: the table is gone, not at {version - 1}")
            create_table_with_add_actions(
                self.uri(path),
                Schema.from_arrow(full),
                actions,
                "append" if mode == "append" else "overwrite",
                partition_by=partition_by,
                configuration=self.properties or None,
                storage_options=self.options,
                commit_properties=props,
            )
            return
        self._set_properties(path, table, meta)
        if version is not None and version != int(table.version()) + 1:
            raise StoreError(f"{self.uri(path)}: at version {table.version()}, not {version - 1}")
        filters = [(DT, "=", dt.isoformat())] if dt is not None and mode == "overwrite" else None
        table.create_write_transaction(
            actions,
            mode,
            full,
            partition_by=partition_by,
            partition_filters=filters,
            commit_properties=props,
        )

    def _set_properties(self, path: str, table: DeltaTable, meta: dict[str, Any]) -> None:
        """Give an existing table the writer's retention if its own differs."""
        from deltalake import CommitProperties

        config = table.metadata().configuration
        if all(config.get(k) == v for k, v in self.properties.items()):
            return
        log.info("%s: table properties set to %s", path, self.properties)
        info = _commit_info({**self._fenced(path, meta), "operation": "set the retention"})
        table.alter.set_table_properties(
            self.properties, commit_properties=CommitProperties(custom_metadata=info)
        )

    def write(
        self,
        path: str,
        data: pa.Table,
        meta: dict[str, Any],
        *,
        dt: date | None = None,
        mode: str = "overwrite",
        work: Path,
        version: int | None = None,
    ) -> Commit:
        """A small table made on the driver (the runs table, the CDC description tables):
        written as one file in ``work``, then committed like Spark's files."""
        work.mkdir(parents=True, exist_ok=True)
        local = work / f"{uuid.uuid4().hex}.parquet"
        body = data.drop_columns([DT]) if dt is not None and DT in data.column_names else data
        pq.write_table(body, local)
        try:
            return self.commit(path, [local], body.schema, meta, dt=dt, mode=mode, version=version)
        finally:
            local.unlink(missing_ok=True)

    def commit_info(self, path: str, version: int) -> dict[str, Any] | None:
        """The commit info of one version, read from its log entry (delta-rs' history of a
        table loaded at an older version numbers the newer commits wrongly)."""
        key = f"{path}/_delta_log/{version:020d}.json"
        if not self.store.exists(key):
            return None
        for line in self.store.read_bytes(key).decode().splitlines():
            action = json.loads(line)
            if "commitInfo" in action:
                info: dict[str, Any] = action["commitInfo"]
                return info
        return {}

    def history(self, path: str, limit: int | None = None) -> list[dict[str, Any]]:
        t = self.table(path)
        return [] if t is None else list(t.history(limit))


def _commit_info(meta: dict[str, Any]) -> dict[str, Any]:
    """The run's id, date and verdict, as commit info values (strings)."""
    return {"cdr." + k: v if isinstance(v, str) else json.dumps(v) for k, v in meta.items()}
