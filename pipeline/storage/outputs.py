"""The outputs a stage writes into the run's work folder (a folder of Parquet files per
output), each with its record: its schema and row count, noted when it is written, so
that the next stage knows both without reading a footer or counting on Spark, and reads
an empty output as an empty frame of its schema.
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Any, NamedTuple

from pipeline.spark.session import local_frame
from pipeline.storage import workpath
from pipeline.storage.workpath import write_table

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from pipeline.storage.workpath import WorkPath

log = logging.getLogger(__name__)


#: where Spark keeps a DataFrame's schema in the Parquet files it writes
SPARK_SCHEMA_KEY = b"org.apache.spark.sql.parquet.row.metadata"


#: a control file beside the files of an output folder of the run (Spark skips names
#: that start with ``_``): the Spark schema they were written with and how many rows they
#: hold (null: not counted), written by the driver that started their write, so that no
#: reader opens a file of the folder on the driver
OUTPUT_INFO = "_output.json"


def note_output(folder: WorkPath, schema: StructType, rows: int | None) -> None:
    """Record the schema and the rows of the output written in ``folder``."""
    text = json.dumps({"schema": schema.jsonValue(), "rows": rows}, separators=(",", ":"))
    (folder / OUTPUT_INFO).write_text(text)


def note_small_output(folder: WorkPath, schema: StructType, rows: list[tuple[Any, ...]]) -> None:
    """A few rows the driver made (a report's: text and integers only), recorded whole
    with their schema in ``folder``'s record and in no Parquet file: its readers and the
    publish hand them to Spark (:attr:`OutputInfo.data`), and no file of the run's
    outputs is written or read on the driver."""
    said = {"schema": schema.jsonValue(), "rows": len(rows), "data": rows}
    (folder / OUTPUT_INFO).write_text(json.dumps(said, separators=(",", ":")))


class OutputInfo(NamedTuple):
    """What the record of an output folder says (:data:`OUTPUT_INFO`)."""

    schema: StructType
    rows: int | None  # None: not counted
    data: list[tuple[Any, ...]] | None = None  # the rows themselves (:func:`note_small_output`)

    def small_frame(self, spark: SparkSession) -> DataFrame | None:
        """The recorded rows as a DataFrame, if the record holds them."""
        if self.data is None:
            return None
        return local_frame(spark, [tuple(r) for r in self.data], self.schema)


def output_record(folder: WorkPath) -> OutputInfo | None:
    """What :func:`note_output` (or :func:`note_small_output`) recorded of ``folder``, if
    it did."""
    from pyspark.sql.types import StructType

    p = folder / OUTPUT_INFO
    if not p.is_file():
        return None
    said = json.loads(p.read_text())
    return OutputInfo(StructType.fromJson(said["schema"]), said["rows"], said.get("data"))


def output_info(folder: WorkPath) -> tuple[StructType, int | None] | None:
    """The schema and the rows :func:`output_record` reads."""
    record = output_record(folder)
    return None if record is None else (record.schema, record.rows)


def recount_output(folder: WorkPath, rows: int) -> None:
    """The rows recorded of ``folder`` once the driver rewrote its files (a rare cut of a
    small output), its schema kept."""
    info = output_info(folder)
    if info is not None:
        note_output(folder, info[0], rows)


def replace_output(folder: WorkPath, data: pa.Table | None) -> None:
    """The driver's rare cut of a small output (it only removes rows: an error's cut of
    the conflict log, a retry's rewrite of the fates and the quarantine): its files
    replaced by one holding ``data`` (None: no rows, its record alone), its rows
    recorded again."""

    for f in folder.parquet_files():
        f.unlink()
    if data is not None:
        write_table(data, folder / "part-00000.parquet", compression="zstd")
    recount_output(folder, 0 if data is None else data.num_rows)


def write_output(df: DataFrame, folder: WorkPath, mode: str = "overwrite") -> int:
    """``df`` written as Parquet into ``folder`` by the executors, its schema and rows
    recorded beside (:func:`note_output`); returns its rows, counted as they were written
    (no file of it is read again to count them)."""

    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    t = time.monotonic()
    before = output_info(folder) if mode == "append" else None
    written = Observation()
    df.observe(written, F.count(F.lit(1)).alias("rows")).write.mode(mode).parquet(str(folder))
    rows = int(written.get["rows"])
    earlier = before[1] if before is not None else 0
    note_output(folder, df.schema, None if earlier is None else earlier + rows)
    log.debug("write %s: %.2fs", folder.name, time.monotonic() - t)
    return rows


def read_output(spark: SparkSession, folder: WorkPath) -> DataFrame:
    """A Parquet folder this run wrote in the work location, with the schema recorded
    beside its files (:func:`output_info`), else the one Spark stored in its first file's
    footer (read on the driver): Spark's own schema inference would be a Spark job per
    read. A folder with neither (not written by Spark) is inferred as usual. (Columns
    whose schema is known: ``read_known``.)"""
    from pyspark.sql.types import StructType

    info = output_record(folder)
    if info is not None:
        small = info.small_frame(spark)
        return small if small is not None else spark.read.schema(info[0]).parquet(str(folder))
    first = min(folder.parquet_files(), default=None)
    stored = (
        None if first is None else (workpath.metadata(first).metadata or {}).get(SPARK_SCHEMA_KEY)
    )
    if stored is None:
        return spark.read.parquet(str(folder))
    schema = StructType.fromJson(json.loads(stored))
    return spark.read.schema(schema).parquet(str(folder))


def read_known(spark: SparkSession, folder: WorkPath, schema: str | StructType) -> DataFrame:
    """Columns of a run's output folder, by name with their known types (a DDL string or a
    ``StructType``; the driver lists the folder and reads no file of it); no rows if it
    holds no file."""
    if not folder.parquet_files():
        return local_frame(spark, [], schema)
    return spark.read.schema(schema).parquet(str(folder))
