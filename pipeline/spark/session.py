"""The one Spark session of a run, built inside the job, never at import time.

``local[*]`` by default; ``CDR_SPARK_MASTER`` or ``--master`` selects another, and under
``spark-submit`` the master and resources come from spark-submit itself.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from pipeline.core.errors import StageError
from pipeline.spark import jars
from pipeline.spark import jvm as jvmstart

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType


LOG4J = Path(__file__).with_name("log4j2.properties")
log = logging.getLogger(__name__)


def under_spark_submit() -> bool:
    return "PYSPARK_GATEWAY_PORT" in os.environ


def _import_all(modules: Sequence[str]) -> None:
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as e:  # the caller's own import raises it again, in its thread
            log.debug("preload of %s failed: %s", name, e)
            return


def get_spark(
    master: str | None = None,
    app: str = "cdr",
    preload: Sequence[str] = (),
    small: bool = False,
    dump: Path | None = None,
) -> SparkSession:
    """Build (or return) the session with the settings the pipeline relies on.

    ``preload``: modules imported in a thread while the JVM starts (Great Expectations
    takes about 4 s to import, the JVM about 6 s to start; side by side they cost the
    longer of the two). PySpark is imported first, so the two threads never import the
    same modules at once. ``small``: a small run's JVM; ``dump``: the JVM writes a
    class-data archive there when it exits (:mod:`pipeline.spark.jvm`)."""
    from pyspark.sql import SparkSession

    loader = threading.Thread(target=_import_all, args=(preload,), name="cdr-preload")
    loader.start()
    try:
        return _session(SparkSession.builder.appName(app), master, small, dump)
    finally:
        loader.join()


def _session(b: Any, master: str | None, small: bool = False, dump: Path | None = None) -> Any:
    from pyspark.errors import PySparkRuntimeError

    # Python workers must run the interpreter that has this package and pyarrow.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if under_spark_submit():  # the DAG's Spark stages: spark-submit chose the master
        return _configured(_local_files(b, _submitted_master()))
    master = master or os.environ.get("CDR_SPARK_MASTER") or "local[*]"
    b = b.master(master)
    b = b.config("spark.driver.memory", os.environ.get("CDR_DRIVER_MEMORY", "4g"))
    # the locked jars (Delta Lake, s3a) on the driver's class path: local jar paths,
    # never a package resolved at run time; the class-data archive maps their classes.
    # A cluster's executors get them from the driver (spark.jars).
    paths = [str(p) for p in jars.classpath()]
    b = b.config("spark.driver.extraClassPath", os.pathsep.join(paths))
    if not master.startswith("local"):
        b = b.config("spark.jars", ",".join(paths))
    b = _local_files(b, master)
    archive = None if dump else jvmstart.usable_archive()
    java = [f"-Dlog4j2.configurationFile={LOG4J.as_uri()}"]
    try:
        options = java + jvmstart.driver_options(small, archive)
        if dump:
            options += [f"-XX:ArchiveClassesAtExit={dump}", jvmstart.BUILD_LOG]
        return _configured(b.config("spark.driver.extraJavaOptions", " ".join(options)))
    except PySparkRuntimeError:
        if archive is None:
            raise
    # a JVM that cannot map the archive (a file cut short) stops before it starts Spark
    log.warning(
        "spark: the JVM did not start with %s; starting it without (remove the "
        "file, or build it again with cdr jvm-archive)",
        archive,
    )
    options = java + jvmstart.driver_options(small, None)
    return _configured(b.config("spark.driver.extraJavaOptions", " ".join(options)))


#: Delta Lake in the session (the jars of jars.lock): its SQL extension and catalog, its
#: log replayed in few tasks (the default, 50, costs a small table seconds of empty tasks
#: at every read), and the project's log store for local files and s3a (a commit file
#: created only if absent, across processes, and only under the run's lease:
#: ``pipeline/spark/java/FencedLogStore.java``)
LOG_STORE = "cdr.delta.FencedLogStore"
DELTA_SETTINGS = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    "spark.databricks.delta.snapshotPartitions": "2",
    "spark.delta.logStore.file.impl": LOG_STORE,
    "spark.delta.logStore.s3a.impl": LOG_STORE,
    "spark.hadoop.fs.s3a.create.conditional.enabled": "true",
}
#: the run's Parquet writes into the work location: Hadoop's committer for the path's file
#: system, S3A's magic committer on s3a (the tasks upload, the job commit completes their
#: uploads; Spark's default commit renames every file into place from the driver, on S3
#: a copy signed with the driver's key), the file committer on local paths
#: (``pipeline/spark/java/PathCommitProtocol.java``)
COMMIT_SETTINGS = {
    "spark.sql.sources.commitProtocolClass": "cdr.spark.PathCommitProtocol",
    "spark.hadoop.fs.s3a.committer.name": "magic",
}
#: local files without a process per file: Hadoop's local file system sets a permission
#: by running ``chmod`` (``pipeline/spark/java/LocalFileSystem.java`` sets it in the JVM), and
#: the rename of a Delta checksum file through Hadoop's FileContext runs ``readlink``
#: (Spark's file-system-based manager renames it with one call). Measured on four small
#: scenario runs: 1,220 child processes of the driver's JVM before, and 8% less time.
#: In local mode only (a cluster's executors load a file system class before the jars
#: the driver sends them).
LOCAL_FILE_SETTINGS = {
    "spark.hadoop.fs.file.impl": "cdr.fs.LocalFileSystem",
    "spark.sql.streaming.checkpointFileManagerClass": (
        "org.apache.spark.sql.execution.streaming.checkpointing."
        "FileSystemBasedCheckpointFileManager"
    ),
}


def local_file_settings(master: str) -> dict[str, str]:
    """:data:`LOCAL_FILE_SETTINGS` for a local master (one JVM, whose class path has the
    project's file system; a cluster's executors would not), none for another."""
    return dict(LOCAL_FILE_SETTINGS) if master.startswith("local") else {}


def _local_files(b: Any, master: str) -> Any:
    for k, v in local_file_settings(master).items():
        b = b.config(k, v)
    return b


def _submitted_master() -> str:
    """The master spark-submit gave the JVM it started (a system property there)."""
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()  # the gateway to spark-submit's JVM
    return str(SparkConf().get("spark.master", ""))


def _configured(b: Any) -> SparkSession:
    partitions = os.environ.get("CDR_SHUFFLE_PARTITIONS", "8")
    settings = {
        "spark.sql.session.timeZone": "UTC",  # the run's clock and ts are UTC µs
        "spark.ui.enabled": os.environ.get("CDR_SPARK_UI", "false"),
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": partitions,
        "spark.sql.mapKeyDedupPolicy": "LAST_WIN",
        "spark.sql.ansi.enabled": "true",
        # PySpark's DataFrame debugging records the Python call site of every Column
        # function, with four Py4J round trips each: most of the driver's Python time
        "spark.python.sql.dataFrameDebugging.enabled": "false",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        # The environment Spark gives SQL's Python functions, given to the RDD ones too:
        # Spark keeps one Python daemon per environment, and each forks its own workers,
        # which import the pipeline again (a small run: 6 Python processes, 2 with it)
        "spark.executorEnv.SPARK_SIMPLIFIED_TRACEBACK": "1",
        "spark.sql.sources.partitionOverwriteMode": "static",
        "spark.sql.parquet.compression.codec": "zstd",
        # Delta readers expect timestamps as INT64 µs, not Spark's legacy INT96
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        # A batch job has no use for a long history of plans in the driver's status store.
        "spark.sql.ui.retainedExecutions": "20",
        "spark.ui.retainedJobs": "50",
        "spark.ui.retainedStages": "50",
        "spark.ui.retainedTasks": "2000",
        **DELTA_SETTINGS,
        **COMMIT_SETTINGS,
        **_where_s3_is(),
    }
    for k, v in settings.items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    # a file:// store without Hadoop's .crc sidecar beside every data file it writes (the
    # JVM's one local file system, which local mode's executors share; s3a needs it to
    # stay a LocalFileSystem, so its class is kept)
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    local = jvm.org.apache.hadoop.fs.FileSystem.getLocal(
        spark.sparkContext._jsc.hadoopConfiguration()
    )
    local.setWriteChecksum(False)
    if not _keys_may_travel(spark):
        # Spark copies the driver's AWS_* keys into its Hadoop configuration, which goes
        # with every task: taken out, each side signs with its own provider chain
        for name in ENV_COPIED_KEYS:
            spark.sparkContext._jsc.hadoopConfiguration().unset(name)
    return spark


#: below this many records read (``inputs.StagedTable.records``), a run's Spark plans
#: are interpreted, not compiled: compiling them (Janino) costs more than it saves on
#: small inputs (bench/RESULTS.md, "Interpreted plans for small runs")
CODEGEN_MIN_RECORDS = 50_000
CODEGEN_MODES = ("auto", "on", "off")
_WHOLE_STAGE = "spark.sql.codegen.wholeStage"
_FACTORY_MODE = "spark.sql.codegen.factoryMode"
_ADAPTIVE = "spark.sql.adaptive.enabled"
_PARTITIONS = "spark.sql.shuffle.partitions"


def fit_codegen(spark: SparkSession, records: int) -> bool:
    """Compile the run's plans to Java (Spark's default) or interpret them, by the run's
    size; ``CDR_CODEGEN`` (``auto``, ``on``, ``off``) overrides. Both are Spark's own
    evaluation of the same plans, with the same results. Adaptive execution goes with
    compiling: on a small run it only re-plans tiny shuffles, and submits each shuffle's
    map stage as a Spark job of its own (a 3-event run: 17 jobs with it, 9 without, in
    the same seconds). Without adaptive execution to coalesce them, a small run's
    shuffles keep as many partitions as the master has cores, not the 8 of a larger run
    (a cold 3-table run of 300 events: 28 s against 38 s), unless
    ``CDR_SHUFFLE_PARTITIONS`` sets them. Returns whether compiled."""
    mode = os.environ.get("CDR_CODEGEN", "auto")
    if mode not in CODEGEN_MODES:
        raise StageError(f"CDR_CODEGEN={mode!r}: use one of {', '.join(CODEGEN_MODES)}")
    compiled = mode == "on" or (mode == "auto" and records >= CODEGEN_MIN_RECORDS)
    spark.conf.set(_WHOLE_STAGE, str(compiled).lower())
    spark.conf.set(_FACTORY_MODE, "FALLBACK" if compiled else "NO_CODEGEN")
    spark.conf.set(_ADAPTIVE, str(compiled).lower())
    if not compiled and "CDR_SHUFFLE_PARTITIONS" not in os.environ:
        cores = spark.sparkContext.defaultParallelism
        spark.conf.set(_PARTITIONS, str(max(1, min(int(spark.conf.get(_PARTITIONS) or 8), cores))))
    log.info("spark: %d records, plans %s", records, "compiled" if compiled else "interpreted")
    return compiled


@contextmanager
def sized(spark: SparkSession, records: int) -> Iterator[bool]:
    """:func:`fit_codegen` for one stage; the session's own settings come back after it
    (interpreted mode is for the run's plans only: some of Spark's own APIs, such as
    ``spark.catalog.listTables()``, fail to decode their results without codegen)."""
    before = {k: spark.conf.get(k) for k in (_WHOLE_STAGE, _FACTORY_MODE, _ADAPTIVE, _PARTITIONS)}
    try:
        yield fit_codegen(spark, records)
    finally:
        for k, v in before.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)


def local_frame(
    spark: SparkSession, rows: Sequence[tuple[Any, ...]], schema: StructType | str
) -> DataFrame:
    """A few rows the driver holds, as a DataFrame whose plan holds them (handed over as
    Arrow): its jobs start no Python worker, where ``createDataFrame`` of a list makes
    Python tasks that serve the rows (about a second on a cold executor)."""
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    struct = StructType.fromDDL(schema) if isinstance(schema, str) else schema
    assert isinstance(struct, StructType)
    arrow = to_arrow_schema(struct, timezone="UTC")
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in struct.fields]
    data = [pa.array(list(c), f.type) for c, f in zip(columns, arrow, strict=True)]
    return spark.createDataFrame(pa.Table.from_arrays(data, schema=arrow), struct)


def _keys_may_travel(spark: SparkSession) -> bool:
    """Whether access keys may go into the session's Hadoop configuration: in local mode
    the executors are the driver's JVM (nothing travels); on a cluster only with Spark's
    authentication and RPC encryption on. Otherwise the executors use their own provider
    chain (their environment, a profile, an instance role)."""
    conf = spark.sparkContext.getConf()
    if str(spark.sparkContext.master).startswith("local"):
        return True
    return conf.get("spark.authenticate", "false") == "true" and (
        conf.get("spark.network.crypto.enabled", "false") == "true"
    )


#: where S3 is: the settings of the driver's environment every executor gets (its Python
#: tasks reach the store and the work location with boto3)
WHERE_S3_IS = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION")


def _where_s3_is() -> dict[str, str]:
    """``spark.executorEnv.*`` for the endpoint and region (never the keys: an executor
    signs with its own, ``task_settings``)."""
    return {f"spark.executorEnv.{k}": os.environ[k] for k in WHERE_S3_IS if os.environ.get(k)}


#: what an executor's credentials are: the keys of the AWS provider chain
SECRET_SETTINGS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


#: the Hadoop settings Spark fills from the driver's ``AWS_*`` environment when it starts
#: (``SparkHadoopUtil.appendS3CredentialsFromEnvironment``)
ENV_COPIED_KEYS = tuple(
    f"{scheme}.{name}"
    for scheme, names in (
        ("fs.s3", ("awsAccessKeyId", "awsSecretAccessKey")),
        ("fs.s3n", ("awsAccessKeyId", "awsSecretAccessKey")),
        ("fs.s3a", ("access.key", "secret.key", "session.token")),
    )
    for name in names
)


def task_settings(spark: SparkSession) -> dict[str, str]:
    """The driver's ``AWS_*`` settings a Python task may carry to boto3 on an executor:
    where S3 is (endpoint, region, addressing) always; the keys only where they may travel
    (:func:`_keys_may_travel`). Elsewhere the executor signs with its own provider chain."""
    travel = _keys_may_travel(spark)
    return {
        k: v
        for k, v in os.environ.items()
        if k.startswith("AWS_") and (travel or k not in SECRET_SETTINGS)
    }


def use_s3a(spark: SparkSession, bucket: str) -> None:
    """Point s3a at ``bucket`` as boto3 is configured in this process: the endpoint
    (``AWS_ENDPOINT_URL_S3``/``AWS_ENDPOINT_URL``, path-style for a server of one's own),
    the region, and the keys where they may travel (:func:`_keys_may_travel`). Settings
    per bucket, so that stores on two servers can share a session."""
    env = os.environ
    hconf = spark.sparkContext._jsc.hadoopConfiguration()
    prefix = f"fs.s3a.bucket.{bucket}."
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1"
    hconf.set(prefix + "endpoint.region", region)
    # no HEAD and LIST before each new object: data files have names of their own, and a
    # commit file is put only if absent by the log store's condition (If-None-Match)
    hconf.set(prefix + "create.performance", "true")
    if endpoint:
        hconf.set(prefix + "endpoint", endpoint)
        hconf.set(prefix + "path.style.access", "true")
        hconf.set(prefix + "connection.ssl.enabled", str(endpoint.startswith("https")).lower())
    if env.get("AWS_ACCESS_KEY_ID") and _keys_may_travel(spark):
        hconf.set(prefix + "access.key", env["AWS_ACCESS_KEY_ID"])
        hconf.set(prefix + "secret.key", env.get("AWS_SECRET_ACCESS_KEY", ""))
        if env.get("AWS_SESSION_TOKEN"):
            hconf.set(prefix + "session.token", env["AWS_SESSION_TOKEN"])
            hconf.set(
                prefix + "aws.credentials.provider",
                "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider",
            )
