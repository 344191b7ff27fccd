"""Reading the published Delta tables: a table at a version, through a Delta reader.

Never through its file list and Parquet (that would return the rows a deletion vector
removed): Spark's reader for the data a run reads (:meth:`LakeReader.frame`, and the
executors' read of a :class:`Pin`), delta-rs' query engine for the small control tables
a process without a JVM reads (:meth:`LakeReader.read`: the ``runs`` table, the conflict
statistics). The log itself (versions, history, commit info, add actions) is read with
delta-rs or as the JSON of its entries. :class:`pipeline.storage.lake.Lake`, the writer,
is a reader too.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from datetime import date
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from pipeline.core.columns import DT
from pipeline.core.errors import StoreError
from pipeline.spark.session import get_spark, local_frame, use_s3a
from pipeline.storage.store import Store, s3a_uri
from pipeline.storage.workpath import WorkPath

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import DataFrame, SparkSession


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


def add_actions(table: Any, dt: date | None = None) -> list[dict[str, Any]]:
    """The add actions (``path``, ``num_records``, ``partition.dt``, ...) of a loaded table
    version: the files a reader of that version reads (of partition ``dt``)."""
    actions: list[dict[str, Any]] = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    if dt is not None:
        return [a for a in actions if a.get(f"partition.{DT}") == dt]
    return actions


@dataclass(frozen=True)
class Pin:
    """A published table at one version (and some of its partitions), as a run reads it:
    ingest pins it (``pipeline.ingest.prior``) in the run's staged folder, the executors read
    it (:func:`read_pinned`). ``rows``: the rows the reader must find (-1: unchecked);
    ``what``: how an error names it."""

    uri: str  # for Spark: file: or s3a://
    version: int
    dates: tuple[str, ...] | None = None  # the partitions read; None: the whole table
    rows: int = -1
    what: str = ""

    def save(self, path: WorkPath) -> None:
        path.write_text(json.dumps(asdict(self), indent=1))

    @staticmethod
    def load(path: WorkPath) -> Pin | None:
        if not path.is_file():
            return None
        d = json.loads(path.read_text())
        dates = tuple(d["dates"]) if d.get("dates") is not None else None
        return Pin(d["uri"], int(d["version"]), dates, int(d.get("rows", -1)), d.get("what", ""))


def read_pinned(spark: SparkSession, pin: Pin) -> DataFrame:
    """The pinned version (of its partitions), read by the executors through Delta."""
    from pyspark.sql import functions as F

    if pin.uri.startswith("s3a://"):
        use_s3a(spark, pin.uri.removeprefix("s3a://").split("/")[0])
    df = spark.read.format("delta").option("versionAsOf", pin.version).load(pin.uri)
    if pin.dates is not None:
        df = df.where(F.col(DT).isin([date.fromisoformat(d) for d in pin.dates]))
    return df


def meta_of(info: dict[str, Any]) -> dict[str, Any]:
    """What a commit says of the run that made it: its ``userMetadata`` (JSON), or the
    ``cdr.*`` commit info keys of a table an older release wrote with delta-rs."""
    raw = info.get("userMetadata")
    if raw:
        try:
            meta = json.loads(raw)
        except ValueError:
            return {}
        return meta if isinstance(meta, dict) else {}
    return {k[4:]: _legacy(v) for k, v in info.items() if k.startswith("cdr.")}


def _legacy(v: Any) -> Any:
    if isinstance(v, str) and v[:1] in "[{":
        try:
            return json.loads(v)
        except ValueError:
            return v
    return v


class LakeReader:
    """The Delta tables under one store's ``published/`` folder, read: with delta-rs on
    the driver, or with Spark (a session given, a function that makes one, or one made
    on first use: a process that only reads through delta-rs starts no JVM)."""

    def __init__(
        self, store: Store, spark: SparkSession | Callable[[], SparkSession] | None = None
    ):
        self.store = store
        self.options = storage_options(store.uri)
        self._spark = spark

    # ------------------------------------------------------------------ where

    def uri(self, path: str) -> str:
        """The table's URI for delta-rs (a local path on ``file://``)."""
        local = self.store.local_path(path)
        return str(local) if local is not None else f"{self.store.uri}/{path}"

    def spark_uri(self, path: str) -> str:
        """The table's URI for Spark: ``file:`` or ``s3a://``."""
        local = self.store.local_path(path)
        if local is not None:  # not Path.as_uri(): Hadoop takes "%3D" for the name's own
            return f"file://{local}"
        return s3a_uri(f"{self.store.uri}/{path}")

    def session(self) -> SparkSession:
        """The writer's Spark session (made on first use), pointed at the store."""
        from pyspark.sql import SparkSession

        if not isinstance(self._spark, SparkSession):
            self._spark = self._spark() if self._spark is not None else get_spark(small=True)
        if self.store.uri.startswith("s3://"):
            use_s3a(self._spark, self.store.uri.removeprefix("s3://").split("/")[0])
        return self._spark

    # ------------------------------------------------------------------ reading

    def table(self, path: str, version: int | None = None) -> Any:
        """The table's log at ``version`` (default: its latest) through delta-rs (its
        version, schema, history, files; not its rows), or None if it does not exist."""
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

    def read(
        self,
        path: str,
        version: int | None = None,
        dt: date | None = None,
        columns: Any = None,
        where: str | None = None,
    ) -> pa.Table | None:
        """A small table (or one partition of it, or the rows ``where`` keeps: SQL) read
        whole on the driver, through delta-rs' query engine (which applies deletion
        vectors)."""
        from deltalake import QueryBuilder

        t = self.table(path, version)
        if t is None:
            return None
        cols = ", ".join(f'"{c}"' for c in columns) if columns else "*"
        conds = [f"\"{DT}\" = DATE '{dt.isoformat()}'"] if dt is not None else []
        conds += [where] if where else []
        sql = f"SELECT {cols} FROM t" + (f" WHERE {' AND '.join(conds)}" if conds else "")
        batches = QueryBuilder().register("t", t).execute(sql)
        got = pa.table(batches.read_all())
        schema = pa.schema(t.schema().to_arrow())
        names = list(columns) if columns else schema.names
        return got.select(names).cast(pa.schema([schema.field(n) for n in names]))

    def frame(self, path: str, version: int | None = None, dt: date | None = None) -> DataFrame:
        """The table (of partition ``dt``) at ``version``, for Spark: the executors read
        it, deletion vectors applied."""
        reader = self.session().read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", version)
        df = reader.load(self.spark_uri(path))
        if dt is not None:
            from pyspark.sql import functions as F

            df = df.where(F.col(DT) == F.lit(dt))
        return df

    def commit_info(self, path: str, version: int) -> dict[str, Any] | None:
        """The commit info of one version, read from its log entry."""
        key = f"{path}/_delta_log/{version:020d}.json"
        if not self.store.exists(key):
            return None
        for line in self.store.read_bytes(key).decode().splitlines():
            action = json.loads(line)
            if "commitInfo" in action:
                info: dict[str, Any] = action["commitInfo"]
                return info
        return {}

    def changes_data(self, path: str, version: int) -> bool:
        """Whether the commit of ``version`` may change what a reader finds: any file it
        adds or removes says ``dataChange`` (Delta's ``OPTIMIZE`` rewrites files and says
        false), or it changes the table's metadata or protocol. True when its log entry
        is no longer there (past the log's retention)."""
        key = f"{path}/_delta_log/{version:020d}.json"
        if not self.store.exists(key):
            return True
        for line in self.store.read_bytes(key).decode().splitlines():
            action = json.loads(line)
            if "metaData" in action or "protocol" in action:
                return True
            for kind in ("add", "remove", "cdc"):
                if kind in action and action[kind].get("dataChange", True):
                    return True
        return False

    def commit_meta(self, path: str, version: int) -> dict[str, Any]:
        """What the commit of ``version`` says of its run (:func:`meta_of`)."""
        return meta_of(self.commit_info(path, version) or {})

    def history(self, path: str, limit: int | None = None) -> list[dict[str, Any]]:
        t = self.table(path)
        return [] if t is None else list(t.history(limit))

    def rows(self, path: str, version: int) -> int:
        """The rows a reader finds in the table at ``version``, deletion vectors applied:
        Spark's count of a whole Delta table, which Delta answers from its log (each
        file's records less its deletion vector's cardinality) without reading a file."""
        return self.frame(path, version).count()

    def added_rows(self, path: str, version: int) -> DataFrame:
        """The rows of the files ``version`` added to the table (those its version before
        does not name), read by the executors as they were written: a MERGE with
        deletion vectors writes each row it updates or inserts to a new file, and only
        those (a file it changes keeps its path and gains a vector)."""
        after = self.table(path, version)
        names = {a["path"] for a in add_actions(after)}
        if version > 0:
            names -= {a["path"] for a in add_actions(self.table(path, version - 1))}
        schema = self.frame(path, version).schema
        if not names:
            return local_frame(self.session(), [], schema)
        uri = self.spark_uri(path)
        return self.session().read.schema(schema).parquet(*[f"{uri}/{n}" for n in sorted(names)])

    def written_rows(self, path: str, version: int, dt: date | None = None) -> int | None:
        """The rows of the version's files (of partition ``dt``) as their writer counted
        them (the log's ``numRecords``; None if a file's statistics do not say), from the
        log alone. delta-rs' add actions do not show deletion vectors, so this is what a
        reader finds only for files no DELETE or MERGE touched since they were written:
        those of the partition (or the table) a commit just replaced."""
        t = self.table(path, version)
        if t is None:
            return None
        total = 0
        for a in add_actions(t, dt):
            n = a.get("num_records")
            if n is None:
                return None
            total += int(n)
        return total
