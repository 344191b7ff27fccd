"""Canonical events on Spark: read the staged exports, parse, dedupe, type and guard them
(formats.md "The canonical event record"; semantics.md §1, §3, §12).

Every function is DataFrame-in, DataFrame-out and uses Spark built-ins only.

- :func:`read_records` reads a table's staged JSONL and Parquet exports into one shape:
  ``replica, file, line, raw`` and ``top``, the record as ``map<string,string>`` (each
  field's JSON text), so that a field of the wrong shape is reported precisely.
- :func:`dedupe` keeps one copy of every ``event_id`` (§12: the origin's own copy, else
  the first replica in config order) and the ``seq`` of every copy, for perspectives (§9).
- :func:`typed_events` types key and values by the table's schema and finds the first
  guard that quarantines the event (§3, in the order of §12).
"""

from __future__ import annotations

from functools import reduce
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipeline.config import Config, Table
from pipeline.policy import QuarantineReason
from pipeline.schema import event_ts_micros, typed

TEXT_MAP = T.MapType(T.StringType(), T.StringType())
OPS = ("INSERT", "UPDATE", "DELETE", "TRUNCATE")
_OBJECT_FIELDS = ("key", "new_key", "after", "before")


def read_records(spark: SparkSession, table_dir: Path) -> DataFrame:
    """All staged exports of one table: ``replica, file, line, raw, top``."""
    parts: list[DataFrame] = []
    jsonl = sorted(str(p) for p in table_dir.glob("replica=*/jsonl/*.parquet"))
    if jsonl:
        parts.append(spark.read.parquet(*jsonl))
    for rep_dir in sorted(table_dir.glob("replica=*")):
        files = sorted(str(p) for p in (rep_dir / "parquet").glob("*.parquet"))
        if files:
            parts.append(_parquet_as_raw(spark, files, rep_dir.name.split("=", 1)[1]))
    if not parts:
        schema = "replica string, file string, line bigint, raw string"
        return _with_top(spark.createDataFrame([], schema))
    return _with_top(reduce(DataFrame.unionByName, parts))


def _parquet_as_raw(spark: SparkSession, files: list[str], replica: str) -> DataFrame:
    """A Parquet export as raw JSON records; object fields given as JSON strings are
    parsed so that the record reads the same as its JSONL form."""
    df = spark.read.parquet(*files)
    cols = []
    for f in df.schema.fields:
        c = F.col(f"`{f.name}`")
        if f.name in _OBJECT_FIELDS and isinstance(f.dataType, T.StringType):
            c = F.try_parse_json(c)
        cols.append(c.alias(f.name))
    return df.select(
        F.lit(replica).alias("replica"),
        F.regexp_extract(F.input_file_name(), r"([^/]+)$", 1).alias("file"),
        F.lit(None).cast("bigint").alias("line"),
        F.to_json(F.struct(*cols)).alias("raw"),
    )


def _with_top(df: DataFrame) -> DataFrame:
    return df.withColumn("top", F.from_json("raw", TEXT_MAP))


def no_event_id(records: DataFrame) -> Column:
    return F.col("top").isNull() | F.coalesce(F.col("top")["event_id"], F.lit("")).eqNullSafe("")


def dedupe(records: DataFrame, replica_ids: tuple[str, ...]) -> DataFrame:
    """One row per ``event_id`` with the columns of the winning copy and ``seqs``: the map
    replica -> seq of every copy. Records without an event id must be filtered first."""
    order = F.create_map(*[x for i, r in enumerate(replica_ids) for x in (F.lit(r), F.lit(i))])
    pref = F.struct(
        (F.col("replica") != F.coalesce(F.col("top")["origin"], F.lit(""))).alias("not_origin"),
        F.coalesce(order[F.col("replica")], F.lit(len(replica_ids))).alias("config_order"),
    )
    copy = F.struct("replica", "file", "line", "raw", "top")
    seq = F.col("top")["seq"].try_cast(T.LongType())
    return (
        records.withColumn("event_id", F.col("top")["event_id"])
        .groupBy("event_id")
        .agg(
            F.min_by(copy, pref).alias("c"),
            F.map_from_entries(F.collect_list(F.struct("replica", seq.alias("seq")))).alias("seqs"),
            F.count(F.lit(1)).alias("copies"),
        )
        .select("event_id", "c.*", "seqs", "copies")
    )


# ---------------------------------------------------------------------- typing and guards


def _obj(name: str) -> Column:
    """A field that must be a JSON object, as ``map<string,string>`` (null if absent or not
    an object)."""
    return F.from_json(F.col("top")[name], TEXT_MAP)


def _lits(values: tuple[str, ...] | list[str]) -> Column:
    return F.array(*[F.lit(v) for v in values]) if values else F.array().cast("array<string>")


def _quote(c: Column) -> Column:
    return F.concat(F.lit("'"), F.coalesce(c, F.lit("null")), F.lit("'"))


def _first(checks: list[tuple[Column, Column]]) -> Column:
    """The detail of the first check that matches, else null."""
    return F.coalesce(*[F.when(cond, detail) for cond, detail in checks]) if checks else F.lit(None)


def _key_checks(table: Table, field: str, m: Column) -> list[tuple[Column, Column]]:
    want = sorted(table.key)
    checks = [
        (
            F.array_sort(F.map_keys(m)) != _lits(want),
            F.concat(
                F.lit(f"{field} has columns ["),
                F.array_join(F.array_sort(F.map_keys(m)), ", "),
                F.lit(f"]; the table's key is [{', '.join(table.key)}]"),
            ),
        )
    ]
    for c in table.key:
        checks.append((m[c].isNull(), F.lit(f"{field}.{c} is null")))
        checks.append(
            (
                typed(m[c], table.column(c).type).isNull(),
                F.concat(F.lit(f"{field}.{c}: "), _quote(m[c]),
                         F.lit(f" is not {table.column(c).type}")),
            )
        )
    return checks


def _value_checks(table: Table, field: str, m: Column) -> list[tuple[Column, Column]]:
    checks = []
    for col in table.columns:
        v = m[col.name]
        checks.append(
            (
                v.isNotNull() & typed(v, col.type).isNull(),
                F.concat(F.lit(f"{field}.{col.name}: "), _quote(v), F.lit(f" is not {col.type}")),
            )
        )
    return checks


def typed_events(
    events: DataFrame, table: Table, config: Config, now_us: int
) -> DataFrame:
    """Type a deduped table's events and find why each would be quarantined.

    Adds ``op, key, new_key, after, after_cols, before, before_cols, extra_cols, ts,
    origin, rank, txid`` and ``reason``/``detail`` (null for a good event)."""
    cols = table.column_names
    ranks = config.tie_ranks(table.tie_break)
    rank_map = F.create_map(*[x for r, i in ranks.items() for x in (F.lit(r), F.lit(i))])
    top = F.col("top")
    df = events.select(
        "*",
        F.col("top")["op"].alias("op"),
        F.col("top")["origin"].alias("origin"),
        F.col("top")["txid"].alias("txid"),
        F.col("top")["ts"].alias("ts_text"),
        event_ts_micros(F.col("top")["ts"]).alias("ts"),
        _obj("key").alias("key_m"),
        _obj("new_key").alias("new_key_m"),
        _obj("after").alias("after_m"),
        _obj("before").alias("before_m"),
    )
    key_m, nk_m, after_m, before_m = (F.col(c) for c in ("key_m", "new_key_m", "after_m", "before_m"))
    op = F.col("op")
    row_op = op.isin("INSERT", "UPDATE", "DELETE")
    target = F.coalesce(nk_m, key_m)

    malformed: list[tuple[Column, Column]] = [
        (top.isNull(), F.lit("not a JSON object")),
        (~op.isin(*OPS) | op.isNull(), F.concat(F.lit("unknown op "), _quote(op))),
        (F.col("origin").isNull(), F.lit("no origin")),
        (
            rank_map[F.col("origin")].isNull(),
            F.concat(F.lit("origin "), _quote(F.col("origin")), F.lit(" is not a configured replica")),
        ),
        (F.col("ts_text").isNull(), F.lit("no ts")),
        (
            F.col("ts").isNull(),
            F.concat(F.lit("ts "), _quote(F.col("ts_text")),
                     F.lit(" is neither µs since the epoch nor RFC 3339 with a UTC offset")),
        ),
        (top["seq"].isNull(), F.lit("no seq")),
        (top["seq"].try_cast(T.LongType()).isNull(),
         F.concat(F.lit("seq "), _quote(top["seq"]), F.lit(" is not an integer"))),
        (row_op & top["key"].isNull(), F.lit("no key")),
        (row_op & key_m.isNull(), F.lit("key is not a JSON object")),
    ]
    malformed += [(row_op & c, d) for c, d in _key_checks(table, "key", key_m)]
    malformed += [
        ((op != "UPDATE") & top["new_key"].isNotNull(),
         F.concat(F.lit("new_key on "), _quote(op), F.lit(" (only an UPDATE changes a key)"))),
        (top["new_key"].isNotNull() & nk_m.isNull(), F.lit("new_key is not a JSON object")),
    ]
    malformed += [(nk_m.isNotNull() & c, d) for c, d in _key_checks(table, "new_key", nk_m)]
    malformed += [
        ((op == "INSERT") & top["after"].isNull(), F.lit("INSERT without after")),
        (top["after"].isNotNull() & after_m.isNull(), F.lit("after is not a JSON object")),
        (top["before"].isNotNull() & before_m.isNull(), F.lit("before is not a JSON object")),
    ]
    malformed += [((op != "DELETE") & c, d) for c, d in _value_checks(table, "after", after_m)]
    malformed += _value_checks(table, "before", before_m)
    for c in table.key:
        malformed.append(
            (
                op.isin("INSERT", "UPDATE") & F.map_contains_key(after_m, c)
                & (typed(after_m[c], table.column(c).type) != typed(target[c], table.column(c).type)),
                F.concat(F.lit(f"after.{c} = "), _quote(after_m[c]),
                         F.lit(" contradicts the key "), _quote(target[c])),
            )
        )
    for c in sorted(table.not_null | table.delta):
        what = "a delta column" if c in table.delta else "a NOT NULL column"
        malformed.append(
            (
                op.isin("INSERT", "UPDATE") & F.map_contains_key(after_m, c) & after_m[c].isNull(),
                F.lit(f"after.{c} is null in {what}"),
            )
        )

    skew = config.max_clock_skew_seconds * 1_000_000
    grace = config.gc_grace_seconds * 1_000_000
    delta_cols = sorted(table.delta)
    no_old = [
        (op == "UPDATE") & F.map_contains_key(after_m, c) & before_m[c].isNull() for c in delta_cols
    ]
    guards = [
        (QuarantineReason.MALFORMED, _first(malformed)),
        (QuarantineReason.FUTURE_TIMESTAMP,
         F.when(F.col("ts") > now_us + skew,
                F.lit(f"ts is more than max_clock_skew_seconds={config.max_clock_skew_seconds} "
                      "after the run's clock"))),
        (QuarantineReason.STALE_BEYOND_GC_GRACE,
         F.when(F.col("ts") < now_us - grace,
                F.lit(f"ts is older than gc_grace_seconds={config.gc_grace_seconds} "
                      "before the run's clock"))),
        (QuarantineReason.DELTA_WITHOUT_OLD_VALUE,
         F.when(reduce(lambda a, b: a | b, no_old), F.lit("no old value (before) for a changed "
                                                           "delta column"))
         if no_old else F.lit(None)),
    ]
    reason = F.coalesce(*[F.when(d.isNotNull(), F.lit(r.value)) for r, d in guards])
    detail = F.coalesce(*[d for _r, d in guards])

    def struct_of(m: Column, names: tuple[str, ...]) -> Column:
        return F.struct(*[typed(m[n], table.column(n).type).alias(n) for n in names])

    empty = F.array().cast("array<string>")
    keys_of = lambda m: F.coalesce(F.map_keys(m), empty)  # noqa: E731
    return df.select(
        "event_id", "replica", "file", "line", "raw", "seqs", "copies", "op", "origin", "txid",
        "ts",
        rank_map[F.col("origin")].alias("rank"),
        F.when(row_op, struct_of(key_m, table.key)).alias("key"),
        F.when(nk_m.isNotNull(), struct_of(nk_m, table.key)).alias("new_key"),
        struct_of(after_m, cols).alias("after"),
        F.array_intersect(keys_of(after_m), _lits(cols)).alias("after_cols"),
        struct_of(before_m, cols).alias("before"),
        F.array_intersect(keys_of(before_m), _lits(cols)).alias("before_cols"),
        F.array_distinct(
            F.concat(F.array_except(keys_of(after_m), _lits(cols)),
                     F.array_except(keys_of(before_m), _lits(cols)))
        ).alias("extra_cols"),
        reason.alias("reason"),
        detail.alias("detail"),
    )


def malformed_without_id(records: DataFrame) -> DataFrame:
    """Records that cannot even be deduped (not JSON, no event id): quarantined one by one."""
    return records.where(no_event_id(records)).select(
        F.col("top")["event_id"].alias("event_id"),
        "replica",
        "file",
        "line",
        "raw",
        F.lit(QuarantineReason.MALFORMED.value).alias("reason"),
        F.when(F.col("top").isNull(), F.lit("not a JSON object")).otherwise(F.lit("no event_id"))
        .alias("detail"),
    )
