"""The state a run starts from: the previous date's published state, else the base snapshot,
else the night's snapshot reads (:func:`from_reads`), else nothing (docs/rules.md#terms,
docs/rules.md#fine-points; ``base/`` in docs/outputs.md).

Base rows carry the table's columns and optionally ``_ts`` (µs) and ``_origin``; a row
without them has ``ts = 0`` and no origin (a frozen row: no origin conflict is raised
against it). A base row that does not fit the schema stops the run, naming the file and
line: the base is the operator's input, not replicated data.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import reduce
from typing import TYPE_CHECKING

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import from_arrow_schema

from pipeline.core.columns import (
    AFTER,
    KEY,
    OP,
    REPLICA,
    SEQ,
    STATE_DELETED,
    STATE_DELETED_AT,
    STATE_EVENT_ID,
    STATE_ORIGIN,
    STATE_TS,
)
from pipeline.core.config import Table
from pipeline.core.errors import ExportError, PriorStateError
from pipeline.ingest.prior import PRIOR_PIN
from pipeline.ingest.staging import RAW_SCHEMA
from pipeline.rules.guards import READ
from pipeline.spark.schema import state_schema, typed
from pipeline.spark.session import local_frame
from pipeline.storage.lake_read import Pin, read_pinned
from pipeline.storage.workpath import WorkPath

if TYPE_CHECKING:
    from pipeline.storage.lake_read import Pin

#: the staged lines of a row export (``staging.RAW_SCHEMA``): read with it, not inferred (a
#: Spark job per read)
RAW_RECORD = from_arrow_schema(RAW_SCHEMA)
TEXT_MAP = T.MapType(T.StringType(), T.StringType())


def read_staged(spark: SparkSession, files: list[str]) -> DataFrame:
    """Lines as ``staging.stage_jsonl`` staged them (``replica, file, line, raw``)."""
    return spark.read.schema(RAW_RECORD).parquet(*files)


def empty_state(spark: SparkSession, table: Table) -> DataFrame:

    return local_frame(spark, [], state_schema(table))


def read_prior(
    spark: SparkSession, staged_table: WorkPath, table: Table, check: bool = True
) -> DataFrame:
    """The state the run starts from: the published state ingest pinned (read by the
    executors through Delta), a staged state of the earlier layout, or a base snapshot.
    ``check=False``: what this run's resolve already checked (the pinned state's row
    count, a base snapshot's rows) is not checked again (a Spark job spared)."""

    pin = Pin.load(staged_table / PRIOR_PIN)
    if pin is not None:
        return _pinned_state(spark, pin, table, check)
    prior = staged_table / "prior"
    if prior.parquet_files():  # the earlier layout's, staged
        return spark.read.schema(state_schema(table)).parquet(str(prior))
    base = staged_table / "base"
    if base.is_dir():
        return read_base(spark, base, table, check=check)
    return empty_state(spark, table)


def _pinned_state(spark: SparkSession, pin: Pin, table: Table, check: bool) -> DataFrame:
    """The pinned state partition in the state's schema (a column the config added since
    reads as null); ``check``: its row count is the one its ``runs`` row recorded."""

    df = read_pinned(spark, pin)
    schema = state_schema(table)
    cols = [
        (F.col(f"`{f.name}`") if f.name in df.columns else F.lit(None))
        .cast(f.dataType)
        .alias(f.name)
        for f in schema.fields
    ]
    state = df.select(*cols)
    if check and pin.rows >= 0:
        found = state.count()
        if found != pin.rows:
            raise PriorStateError(f"{pin.what}: Delta reads {found} rows, the runs row {pin.rows}")
    return state


def read_base(
    spark: SparkSession,
    base: WorkPath,
    table: Table,
    label: str | None = None,
    check: bool = True,
) -> DataFrame:
    """Rows of the table's columns (optional ``_ts``, ``_origin``) staged from a base
    snapshot or a replica's snapshot export (``label`` names it in errors; ``check``:
    stop at the first row that does not fit, one Spark job)."""
    label = label or f"base/table={table.name}"
    parts: list[DataFrame] = []
    jsonl = [str(p) for p in (base / "jsonl").parquet_files()]
    if jsonl:
        parts.append(_base_from_json(read_staged(spark, jsonl), table, label, check))
    pq_files = [str(p) for p in (base / "parquet").parquet_files()]
    if pq_files:
        df = spark.read.parquet(*pq_files)
        raw = df.select(
            F.lit("base").alias(REPLICA),
            F.regexp_extract(F.input_file_name(), r"([^/]+)$", 1).alias("file"),
            F.lit(None).cast("bigint").alias("line"),
            F.to_json(F.struct(*[F.col(f"`{c}`") for c in df.columns])).alias("raw"),
        )
        parts.append(_base_from_json(raw, table, label, check))
    if not parts:
        return empty_state(spark, table)
    return reduce(DataFrame.unionByName, parts)


def columns_held(spark: SparkSession, base: WorkPath) -> frozenset[str]:
    """The columns a staged base or replica snapshot's rows hold (``schema`` in
    docs/rules.md#divergence-causes): the names of its JSON lines' fields, its Parquet
    files' columns. One Spark job for JSON lines."""
    held: set[str] = set()
    jsonl = [str(p) for p in (base / "jsonl").parquet_files()]
    if jsonl:
        names = F.explode(F.map_keys(F.from_json("raw", TEXT_MAP)))  # type: ignore[arg-type]
        held |= {r[0] for r in read_staged(spark, jsonl).select(names).distinct().collect()}
    pq_files = [str(p) for p in (base / "parquet").parquet_files()]
    if pq_files:
        held |= set(spark.read.parquet(*pq_files).columns)
    return frozenset(held)


def published_held(table: Table, held: frozenset[str]) -> frozenset[str]:
    """The exported names ``held`` (:func:`columns_held`) with the table's columns by
    their published names (docs/configuration.md#column-names), any other as it is."""
    renamed = table.renamed
    return frozenset(renamed.get(n, n) for n in held)


def _base_from_json(raw: DataFrame, table: Table, label: str, check: bool) -> DataFrame:
    m = F.from_json("raw", TEXT_MAP)  # type: ignore[arg-type]  # a MapType works; 4.2's stubs omit it
    df = raw.withColumn("m", m)
    # each column by the name the exports give it (docs/configuration.md#column-names);
    # a column exported as ``_ts`` or ``_origin`` takes that member: the row has no ts
    # or origin of its own then
    cols = [typed(F.col("m")[c.exported], c.type).alias(c.name) for c in table.columns]
    ts_text, origin = _own(table, STATE_TS), _own(table, STATE_ORIGIN)
    if check:
        _refuse_misfits(df, table, label)
    rows = df.select(
        *cols,
        F.coalesce(ts_text.try_cast(T.LongType()), F.lit(0)).alias(STATE_TS),
        origin.alias(STATE_ORIGIN),
    )
    return _as_state(rows, table)


def _as_state(rows: DataFrame, table: Table) -> DataFrame:
    """Live base rows (the table's columns, ``_ts``, ``_origin``) as state rows; a cell
    table's per-cell metadata is null: a base row is cells written at ``_ts``."""
    rows = rows.select(
        "*",
        F.lit(None).cast("string").alias(STATE_EVENT_ID),
        F.lit(False).alias(STATE_DELETED),
        F.lit(None).cast("bigint").alias(STATE_DELETED_AT),
    )
    return rows.select(
        *[
            (F.col(f.name) if f.name in rows.columns else F.lit(None))
            .cast(f.dataType)
            .alias(f.name)
            for f in state_schema(table).fields
        ]
    )


def from_reads(copies: DataFrame, table: Table, replicas: Sequence[str]) -> DataFrame:
    """docs/adapters.md#snapshot-reads: the state of a table that starts empty (no
    published state, no ``base/``), from the night's snapshot reads: per key, the read of
    the first replica in config order that read it, as a base row (``_ts`` 0, no
    origin). ``copies``: the typed copies (``frames.copy_schema``)."""
    from pyspark.sql import Window

    rank = F.create_map(*[x for i, r in enumerate(replicas) for x in (F.lit(r), F.lit(i))])
    reads = copies.where((F.col(OP) == READ) & F.col("reason").isNull() & F.col(KEY).isNotNull())
    first = Window.partitionBy(KEY).orderBy(rank[F.col(REPLICA)], F.desc_nulls_last(SEQ))
    chosen = reads.withColumn("__cdr_n", F.row_number().over(first)).where("__cdr_n = 1")
    rows = chosen.select(
        *[F.col(f"{AFTER}.{c}").alias(c) for c in table.column_names],
        F.lit(0).cast("bigint").alias(STATE_TS),
        F.lit(None).cast("string").alias(STATE_ORIGIN),
    )
    return _as_state(rows, table)


def _own(table: Table, name: str) -> Column:
    """A base row's own ``_ts`` or ``_origin`` member, unless a column is exported so."""
    exported = {c.exported for c in table.columns}
    return F.lit(None).cast("string") if name in exported else F.col("m")[name]


def _refuse_misfits(df: DataFrame, table: Table, label: str) -> None:
    """Stop at the first row (``m``: its text values) that does not fit the schema."""
    bad_cond = F.col("m").isNull()
    if "bad" in df.columns:  # a line that is not UTF-8
        bad_cond = bad_cond | F.col("bad").isNotNull()
    for c in table.columns:
        v = F.col("m")[c.exported]
        bad_cond = bad_cond | (v.isNotNull() & typed(v, c.type).isNull())
        if c.name in table.not_null:
            bad_cond = bad_cond | v.isNull()
    ts_text = _own(table, STATE_TS)
    bad_cond = bad_cond | (ts_text.isNotNull() & ts_text.try_cast(T.LongType()).isNull())
    bad = df.where(bad_cond).select("file", "line", "raw").limit(1).collect()
    if bad:
        b = bad[0]
        where = f"{label}/{b.file}" + (f", line {b.line}" if b.line else "")
        raise ExportError(
            f"{where}: a row does not fit the table's schema (types, NOT NULL, key): {b.raw[:200]}"
        )
