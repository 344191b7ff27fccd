"""What the run report counts of a table's outputs, counted by the executors in one Spark
job (the resolve stage's; the row engine's disputes too): the driver gets a few rows of
counts, never the outputs."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from functools import reduce
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from pipeline.policy import Fate
from pipeline.workpath import WorkPath

log = logging.getLogger(__name__)

#: the columns of the fates the counts and the ledger read, as the engines write them
FATE_COLUMNS = "event_id string, replica string, fate string, chosen boolean"
#: the columns of the conflict log the counts read
CONFLICT_COUNTED = "conflict_type string, resolver string, outcome string"
DUPLICATE = Fate.DUPLICATE.value


def read_known(spark: SparkSession, folder: WorkPath, schema: str | StructType) -> DataFrame:
    """Columns of a run's output folder, by name with their known types (a DDL string or a
    ``StructType``; the driver lists the folder and reads no file of it); no rows if it
    holds no file."""
    if not folder.parquet_files():
        return spark.createDataFrame([], schema)
    return spark.read.schema(schema).parquet(str(folder))


@dataclass(frozen=True)
class Facts:
    """What the run report counts of a table's outputs (:meth:`of`)."""

    #: distinct events per fate: an event counts once per fate its copies got, a record
    #: without an event id once; an event counts as a duplicate only when all its records
    #: are (an earlier night resolved it)
    events: Mapping[str, int]
    #: records per replica and fate
    replicas: Mapping[str, Mapping[str, int]]
    #: (event, replica) pairs with more than one record: a replica exported it twice
    repeated: int
    #: the conflict log's rows per (conflict type, resolver, outcome)
    conflicts: Mapping[tuple[str, str, str], int]
    quarantined: Mapping[str, int]
    divergent: Mapping[str, int]
    #: events whose copies sit under different keys: each key's task chose a copy of its
    #: own (the fates' ``chosen``; the row engine folds them again, ``engine``)
    disputed: tuple[str, ...] = ()

    @classmethod
    def of(cls, spark: SparkSession, out: WorkPath) -> Facts:
        """Counted by the executors in one Spark job: its result, a few rows, is all the
        driver reads."""
        logs = [
            _grouped(
                read_known(spark, out / "conflicts", CONFLICT_COUNTED),
                "conflicts",
                "conflict_type",
                "resolver",
                "outcome",
            ),
            _grouped(
                read_known(spark, out / "quarantine", "reason string"), "quarantined", "reason"
            ),
            _grouped(
                read_known(spark, out / "divergence", "replica string"), "divergent", "replica"
            ),
        ]
        parts = _fate_counts(read_known(spark, out / "fates", FATE_COLUMNS)) + logs
        found: dict[str, list[tuple[Any, ...]]] = {}
        t = time.monotonic()
        counted = reduce(DataFrame.unionByName, parts).collect()
        log.debug("count %s: %.2fs", out.name, time.monotonic() - t)
        for r in counted:
            found.setdefault(r["kind"], []).append((r["a"], r["b"], r["c"], int(r["count"])))
        replicas: dict[str, dict[str, int]] = {}
        for replica, fate, _, n in found.get("replicas", []):
            replicas.setdefault(replica, {})[fate] = n
        flat = {
            k: {a: n for a, _, _, n in found.get(k, [])}
            for k in ("events", "quarantined", "divergent")
        }
        return cls(
            events=flat["events"],
            replicas=replicas,
            repeated=sum(n for *_, n in found.get("repeated", [])),
            conflicts={(a, b, c): n for a, b, c, n in found.get("conflicts", [])},
            quarantined=flat["quarantined"],
            divergent=flat["divergent"],
            disputed=tuple(sorted(a for a, *_ in found.get("disputed", []))),
        )


def _fate_counts(fates: DataFrame) -> list[DataFrame]:
    """The counts of the fates, from one shuffle of them by event: each event's copies
    (replica and fate) and how many keys chose it (a branch of its own for each count
    cost twice as much: 6.9 s against 2.6 s for 1M records, in a warm JVM)."""
    with_id = fates.where(F.col("event_id").isNotNull())
    without_id = fates.where(F.col("event_id").isNull())  # each record counts on its own
    per_event = with_id.groupBy("event_id").agg(
        F.collect_list(F.struct("replica", "fate")).alias("copies"),
        F.count_if(F.col("chosen")).alias("chosen"),
    )
    mine = F.array_remove(F.array_distinct(F.col("copies.fate")), DUPLICATE)
    events = per_event.select(
        "event_id",
        "copies",
        F.when(F.size(mine) > 0, mine).otherwise(F.array(F.lit(DUPLICATE))).alias("fates"),
        (F.size("copies") > F.size(F.array_distinct(F.col("copies.replica")))).alias("again"),
        (F.col("chosen") > 1).alias("disputed"),
    )
    by_event = events.select(F.explode("fates").alias("fate"))
    by_copy = events.select(F.explode("copies").alias("c")).select("c.*")
    nothing = F.lit(None).cast("string")
    return [
        _grouped(by_event.unionByName(without_id.select("fate")), "events", "fate"),
        _grouped(
            by_copy.unionByName(without_id.select("replica", "fate")), "replicas", "replica", "fate"
        ),
        _grouped(events.where("again").select(nothing.alias("none")), "repeated", "none"),
        _grouped(events.where("disputed"), "disputed", "event_id"),
    ]


def _grouped(df: DataFrame, kind: str, *by: str) -> DataFrame:
    """Rows of ``df`` counted by up to three columns, as (a, b, c, count, kind)."""
    keys = [F.col(c) for c in by] + [F.lit(None).cast("string")] * (3 - len(by))
    named = df.select(*[k.alias(n) for k, n in zip(keys, "abc", strict=True)])
    return named.groupBy("a", "b", "c").count().withColumn("kind", F.lit(kind))
