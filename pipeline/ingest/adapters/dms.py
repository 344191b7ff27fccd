"""AWS DMS change files, CSV or Parquet (``Op`` ``I``/``U``/``D``, the commit-timestamp
column, then the table's columns), mapped to canonical records on Spark.

DMS records no old values and no position of a change in its transaction, so the id's
place is a digest of the change and its occurrence among its transaction's identical
changes by ``options.change_seq_column`` (``$AR_H_CHANGE_SEQ``), and ``pos`` that change
sequence's order (without it: the export's order of files and lines;
``pipeline.ingest.adapters.common``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipeline.core.columns import AFTER, BEFORE, KEY, OP, ORIGIN, POS, REPLICA, SEQ, TS, TXID
from pipeline.core.config import Table
from pipeline.ingest.adapters.common import (
    Adapted,
    canonical,
    digest_place,
    file_parts,
    first_problem,
    has_key,
    key_map,
    legacy_number,
    line_order,
    rfc3339,
)
from pipeline.spark.schema import event_ts_micros


def _as_text(df: DataFrame) -> DataFrame:
    """Every column of a DMS Parquet file as the canonical text of its value."""
    out = []
    for f in df.schema.fields:
        c = F.col(f"`{f.name}`")
        t = f.dataType
        if isinstance(t, (T.TimestampType, T.TimestampNTZType)):
            c = F.date_format(c, "yyyy-MM-dd'T'HH:mm:ss.SSSSSS'Z'")
        elif isinstance(t, T.BinaryType):
            c = F.base64(c)
        elif not isinstance(t, T.StringType):
            c = c.cast("string")
        out.append(c.alias(f.name))
    return df.select(*out)


def read_dms(
    spark: SparkSession, csv_files: list[str], parquet_files: list[str]
) -> DataFrame | None:
    """The staged DMS files as text columns plus ``fileno`` and ``line``: CSV files were
    staged as text with their record numbers, Parquet files as DMS wrote them."""
    parts = []
    if csv_files:
        df = file_parts(spark.read.parquet(*csv_files))
        parts.append(df.withColumnRenamed("_line", "line"))
    if parquet_files:
        df = spark.read.parquet(*parquet_files)
        df = file_parts(_as_text(df).withColumn("line", F.col("_metadata.row_index") + 1))
        parts.append(df)
    if not parts:
        return None
    out = parts[0]
    for p in parts[1:]:
        out = out.unionByName(p, allowMissingColumns=True)
    return out


def _dms_source_and_problem(
    rows: DataFrame, table: Table, row: Column, op: Column, ts: Column, ts_col: str
) -> tuple[Column, Column]:
    """The record as exported (a rejected CSV line's text, else its fields as JSON) and
    why it is no change the run can apply (null if it is one)."""
    record = [c for c in rows.columns if c not in ("fileno", "line", "_bad", "_bad_reason")]
    bad = F.col("_bad") if "_bad" in rows.columns else F.lit(None).cast("string")
    why = F.col("_bad_reason") if "_bad" in rows.columns else F.lit(None).cast("string")
    source = F.coalesce(bad, F.to_json(F.struct(*[F.col(f"`{c}`") for c in record])))
    problem = first_problem(
        [
            (bad.isNotNull(), F.concat(F.lit("not a CSV record of this export: "), why)),
            (op.isNull(), "no Op column value"),
            (~op.isin("I", "U", "D"), F.concat(F.lit("Op '"), op, F.lit("' is not I, U or D"))),
            (
                ts.isNull(),
                f"no commit timestamp in column {ts_col!r} (options.timestamp_column)",
            ),
            (~has_key(table, row), "a key column is missing"),
        ]
    )
    return source, problem


def dms(
    rows: DataFrame,
    replica: str,
    files: list[str],
    table: Table,
    options: Mapping[str, Any],
    legacy_ids: DataFrame | None = None,
) -> Adapted:
    """AWS DMS change files: ``Op`` (I, U, D), the commit-timestamp column named by
    ``options.timestamp_column`` (UTC, ``yyyy-MM-dd HH:mm:ss.SSSSSS``), optional
    ``txid_column``, ``change_seq_column`` and ``origin_column`` (DMS transformation rules
    add them from ``$AR_H_TRANSACTION_ID``, ``$AR_H_CHANGE_SEQ`` or a constant), then the
    table's columns. DMS records no old values, so an UPDATE's key is its new key, and a
    delta column cannot be reconciled (the record is quarantined as
    delta_without_old_value). ``legacy_ids``: ``common.canonical``'s."""
    ts_col = options["timestamp_column"]
    named = [options.get(k) for k in ("txid_column", "origin_column", "change_seq_column")]
    meta = {"Op", ts_col, *named, "fileno", "line", "_bad", "_bad_reason"}
    data = [c for c in rows.columns if c not in meta]
    row = F.map_from_arrays(
        F.array(*[F.lit(c) for c in data]), F.array(*[F.col(f"`{c}`") for c in data])
    )
    op = F.upper(F.col("Op")) if "Op" in rows.columns else F.lit(None).cast("string")
    ts = F.col(f"`{ts_col}`") if ts_col in rows.columns else F.lit(None).cast("string")
    file_of = F.create_map(*[x for i, f in enumerate(files) for x in (F.lit(i), F.lit(f))])
    source, problem = _dms_source_and_problem(rows, table, row, op, ts, ts_col)
    df = rows.select(
        F.lit(replica).alias(REPLICA),
        F.coalesce(file_of[F.col("fileno")], F.col("fileno").cast("string")).alias("file"),
        "line",
        "fileno",
        source.alias("source"),
        problem.alias("problem"),
        F.when(op == "I", "INSERT").when(op == "U", "UPDATE").when(op == "D", "DELETE").alias(OP),
        key_map(table, row).alias(KEY),
        F.lit(None).cast("map<string,string>").alias("new_key"),
        F.when(op.isin("I", "U"), row).alias(AFTER),
        F.lit(None).cast("map<string,string>").alias(BEFORE),
        rfc3339(ts, naive_utc=True).alias(TS),
        _named(options, "origin_column", F.lit(replica)).alias(ORIGIN),
        _named(options, "txid_column").alias(TXID),
        line_order(F.col("fileno"), F.col("line")).alias(SEQ),
        _named(options, "change_seq_column").alias("change_seq"),
    )
    placed = _placed(df, legacy_ids is not None, "change_seq_column" in options)
    return Adapted(canonical(placed, "dms", table, legacy_ids))


def _named(options: Mapping[str, Any], option: str, default: Column | None = None) -> Column:
    """The column an option names (its value, or ``default`` where it is null), or
    ``default`` (null) without the option."""
    none = F.lit(None).cast("string") if default is None else default
    col = options.get(option)
    return none if col is None else F.coalesce(F.col(f"`{col}`").cast("string"), none)


def _placed(df: DataFrame, legacy: bool, has_seq: bool) -> DataFrame:
    """The id's place and ``pos`` (module docstring), and with ``legacy`` the place the
    ids before issue 49 gave (``common.legacy_number``)."""
    c = F.col
    seq = c("change_seq") if has_seq else None  # without it: identical changes are one
    digest = digest_place(c(REPLICA), c(ORIGIN), c(TS), c(OP), c(KEY), seq)
    pos = c(SEQ)  # the export's order of files and lines
    if has_seq:  # the change sequence's order (35 digits: ranked, within the transaction)
        pos = F.dense_rank().over(
            Window.partitionBy(c(REPLICA), c(ORIGIN), c(TS)).orderBy(c("change_seq"))
        )
    out = df.select("*", digest.alias("place"), pos.alias(POS))
    if legacy:
        out = out.withColumn("legacy_n", legacy_number(c(TXID), event_ts_micros(c(TS)), c(SEQ)))
    return out.drop("change_seq")
