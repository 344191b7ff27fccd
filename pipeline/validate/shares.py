"""A loud quarantine (docs/operations.md#a-loud-quarantine): the share of each export's
records, and of each of its files', that the guards quarantined (``malformed``,
``future_timestamp``, ``stale_beyond_gc_grace``, ``delta_without_old_value``: what a
record is, not what a rule decided of it), with the first reason and detail: the
accounting suite's ``quarantine_share`` checks warn above ``quarantine_share.warn`` and
fail at ``quarantine_share.fail``. A whole export that does not read (a converter's
setting, a format's option) is then a night that says so, not a silent one.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from pipeline.core.columns import REPLICA
from pipeline.core.config import QuarantineShare
from pipeline.core.policy import QuarantineReason
from pipeline.ingest.inputs import load_inputs
from pipeline.spark.session import local_frame

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

    from pipeline.storage.context import RunContext

#: the guards' reasons: what a record is (the others say what a rule decided of it)
GUARDS = (
    QuarantineReason.MALFORMED.value,
    QuarantineReason.FUTURE_TIMESTAMP.value,
    QuarantineReason.STALE_BEYOND_GC_GRACE.value,
    QuarantineReason.DELTA_WITHOUT_OLD_VALUE.value,
)
#: where a quarantined record's detail names its file and line: the guards'
#: ``<file> line <n>: `` (``ingest.copies.located``) or an adapter's
#: ``<format> record at <file>:<n>: `` (``adapters.common``)
WHERE = (r"^(\S+) line (\d+): ", r"^\S+ record at (\S+):(\d+): ")
#: the shares' columns: an export (``file`` null) or one of its files
SCHEMA = (
    "replica string, file string, records long, quarantined long, share double, "
    "reason string, detail string"
)


def _records(ctx: RunContext, table: str) -> list[tuple[str, str | None, int]]:
    """(replica, file or None for the whole export, records) of the table's exports, from
    ingest's staging: each export's records, and each file's rows by its manifest."""
    from pipeline.ingest.fetch import PLAN  # deferred: loads pyspark

    out: list[tuple[str, str | None, int]] = [
        (r, None, e.records) for r, e in load_inputs(ctx)[table].exports.items()
    ]
    plan = json.loads((ctx.staged / PLAN).read_text())
    out += [
        (t["replica"], t["entry"], int(t["rows"]))
        for t in plan
        if t["table"] == table and t["kind"] == "export"
    ]
    return out


def shares(spark: SparkSession, ctx: RunContext, table: str, quarantine: DataFrame) -> DataFrame:
    """Per export and per file of ``table``: its records, those the guards quarantined,
    their share, and the first quarantined record's reason and detail (``SCHEMA``)."""
    from pyspark.sql import functions as F

    records = local_frame(spark, _records(ctx, table), "replica string, file string, records long")
    if "detail" not in quarantine.columns:  # an empty output
        return records.select(
            "*",
            F.lit(0).cast("long").alias("quarantined"),
            F.lit(0.0).alias("share"),
            F.lit(None).cast("string").alias("reason"),
            F.lit(None).cast("string").alias("detail"),
        )

    def located(group: int) -> Column:
        found = [F.nullif(F.regexp_extract("detail", w, group), F.lit("")) for w in WHERE]
        return F.coalesce(*found)

    q = quarantine.where(F.col("reason").isin(*GUARDS)).select(
        REPLICA,
        located(1).alias("file"),
        located(2).try_cast("long").alias("line"),
        "reason",
        "detail",
    )
    first = F.min_by(F.struct("reason", "detail"), "line")
    per_file = q.groupBy(REPLICA, "file").agg(F.count("*").alias("q"), first.alias("f"))
    per_export = q.groupBy(REPLICA).agg(F.count("*").alias("q"), first.alias("f"))
    found = per_file.unionByName(per_export.withColumn("file", F.lit(None).cast("string")))
    on = [records[REPLICA] == found[REPLICA], records["file"].eqNullSafe(found["file"])]
    joined = records.join(found, on, "left").select(
        records[REPLICA], records["file"], "records", F.coalesce("q", F.lit(0)).alias("n"), "f"
    )
    return joined.select(
        REPLICA,
        "file",
        "records",
        F.col("n").cast("long").alias("quarantined"),
        (F.col("n") / F.greatest("records", F.lit(1))).alias("share"),
        F.col("f.reason").alias("reason"),
        F.col("f.detail").alias("detail"),
    )


def placeholders(config: Any) -> dict[str, Any]:
    """The accounting template's ``${quarantine_*}`` values (no config: the defaults)."""

    q = config.quarantine_share if config is not None else QuarantineShare()
    return {
        "quarantine_warn": q.warn,
        "quarantine_fail": q.fail,
        "quarantine_min_records": q.min_records,
        "quarantine_warn_pct": f"{q.warn:.0%}",
        "quarantine_fail_pct": f"{q.fail:.0%}",
    }
