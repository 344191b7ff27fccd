"""The one Spark session of a run, built inside the job, never at import time.

``local[*]`` by default; ``CDR_SPARK_MASTER`` or ``--master`` selects another, and under
``spark-submit`` the master and resources come from spark-submit itself.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

LOG4J = Path(__file__).with_name("log4j2.properties")


def under_spark_submit() -> bool:
    return "PYSPARK_GATEWAY_PORT" in os.environ


def get_spark(master: str | None = None, app: str = "cdr") -> SparkSession:
    """Build (or return) the session with the settings the pipeline relies on."""
    from pyspark.sql import SparkSession

    # Python workers must run the interpreter that has this package and pyarrow.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    b = SparkSession.builder.appName(app)
    if not under_spark_submit():
        b = b.master(master or os.environ.get("CDR_SPARK_MASTER") or "local[*]")
        b = b.config("spark.driver.memory", os.environ.get("CDR_DRIVER_MEMORY", "4g"))
        b = b.config(
            "spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={LOG4J.as_uri()}"
        )
    partitions = os.environ.get("CDR_SHUFFLE_PARTITIONS", "8")
    settings = {
        "spark.sql.session.timeZone": "UTC",  # the run's clock and ts are UTC µs
        "spark.ui.enabled": os.environ.get("CDR_SPARK_UI", "false"),
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": partitions,
        "spark.sql.mapKeyDedupPolicy": "LAST_WIN",
        "spark.sql.ansi.enabled": "true",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.sources.partitionOverwriteMode": "static",
        "spark.sql.parquet.compression.codec": "zstd",
        # Delta readers expect timestamps as INT64 µs, not Spark's legacy INT96
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        # A batch job has no use for a long history of plans in the driver's status store.
        "spark.sql.ui.retainedExecutions": "20",
        "spark.ui.retainedJobs": "50",
        "spark.ui.retainedStages": "50",
        "spark.ui.retainedTasks": "2000",
    }
    for k, v in settings.items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
