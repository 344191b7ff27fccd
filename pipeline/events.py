"""Canonical event records on Spark: read the staged exports, parse and type every copy,
and find the guard that quarantines it (formats.md "The canonical event record";
semantics.md §3, §12). Spark built-ins only; no shuffle here.

- :func:`read_records` reads a table's staged JSONL and Parquet exports into one shape:
  ``replica, file, line, raw``.
- :func:`copy_refs` parses what the shuffle by key needs of each copy, once per run
  (:func:`parse_once` writes it to the run's work folder).
- :func:`type_copies` types the copy that stands for its event by the table's schema and
  adds ``reason`` and ``detail``, the first guard that matches in the order of §12.
  Every copy is kept: deduplication by ``event_id`` happens in the engine's one shuffle
  by key, where the copies of an event meet (§12: the origin's own copy wins, else the
  first replica in config order: the ``pref`` column).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import reduce
from pathlib import Path
from typing import TYPE_CHECKING

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import from_arrow_schema

from pipeline import adapters
from pipeline.config import Config, Table
from pipeline.exports import RAW_SCHEMA
from pipeline.frames import LIGHT_FIELDS, TYPED_COLUMNS
from pipeline.policy import Granularity, QuarantineReason, Scope
from pipeline.schema import event_ts_micros, typed
from pipeline.spark import read_output

#: the staged lines of an export (``exports.RAW_SCHEMA``): read with it, not inferred (a
#: Spark job per read)
RAW_RECORD = from_arrow_schema(RAW_SCHEMA)

if TYPE_CHECKING:
    from pipeline.exports import StagedExport

TEXT_MAP = T.MapType(T.StringType(), T.StringType())
_TEXT_FIELDS = ("op", "ts", "origin", "event_id", "txid", "seq", "ttl", "expiry")
#: Scylla's and Cassandra's largest TTL (20 years)
MAX_TTL = 630_720_000
#: the canonical record's shape: every scalar read as its JSON text, objects as text maps
RECORD = T.StructType(
    [T.StructField(n, T.StringType()) for n in _TEXT_FIELDS]
    + [T.StructField(n, TEXT_MAP) for n in ("key", "new_key", "after", "before")]
    + [T.StructField("_corrupt", T.StringType())]  # the text, when the record does not fit
    + [T.StructField("_malformed", T.StringType())]  # why an adapter could not map it
)
_PARSE = {"columnNameOfCorruptRecord": "_corrupt"}
OPS = ("INSERT", "UPDATE", "DELETE", "TRUNCATE")
_OBJECT_FIELDS = ("key", "new_key", "after", "before")


def read_records(
    spark: SparkSession, table_dir: Path, table: Table, exports: Mapping[str, StagedExport]
) -> DataFrame:
    """All staged exports of one table: ``replica, file, line, raw``, ``raw`` being the
    canonical record as JSON (the adapters map wal2json, Debezium and DMS records to it)."""
    parts: list[DataFrame] = []
    for rep, export in exports.items():
        rep_dir = table_dir / f"replica={rep}"

        def staged(kind: str, rep_dir: Path = rep_dir) -> list[str]:
            return sorted(str(p) for p in (rep_dir / kind).glob("*.parquet"))

        fmt = export.format
        if fmt == "jsonl" and staged("jsonl"):
            parts.append(read_staged(spark, staged("jsonl")))
        elif fmt == "parquet" and staged("parquet"):
            parts.append(_parquet_as_raw(spark, staged("parquet"), rep))
        elif fmt in ("wal2json", "debezium") and staged(fmt):
            adapt = adapters.wal2json if fmt == "wal2json" else adapters.debezium
            df = adapt(read_staged(spark, staged(fmt)), table, export.options)
            parts.append(_materialized(spark, df, rep_dir / "canonical"))
        elif fmt == "dms":
            rows = adapters.read_dms(spark, staged("dms/csv"), staged("dms/parquet"))
            if rows is not None:
                df = adapters.dms(rows, rep, export.files, table, export.options)
                parts.append(_materialized(spark, df, rep_dir / "canonical"))
    if not parts:
        return spark.createDataFrame([], RAW_RECORD)
    return reduce(DataFrame.unionByName, parts)


def read_staged(spark: SparkSession, files: list[str]) -> DataFrame:
    """Lines of exports as ``exports.stage_jsonl`` staged them."""
    return spark.read.schema(RAW_RECORD).parquet(*files)


def _materialized(spark: SparkSession, df: DataFrame, path: Path) -> DataFrame:
    """An adapter's canonical records, written once beside the staged export: the resolve
    reads its records several times, and the mapping (a parse and a window) runs once."""
    df.write.mode("overwrite").parquet(str(path))
    return read_output(spark, path)


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


# ---------------------------------------------------------------------- typing and guards


def _lits(values: tuple[str, ...] | list[str]) -> Column:
    return F.array(*[F.lit(v) for v in values]) if values else F.array().cast("array<string>")


def _says(*parts: str | Column) -> Column:
    """A guard's message: the text parts as they are, each Column a value in quotes
    ('null' when it has none). One ``format_string`` instead of a ``concat`` of literals:
    each Column function is a call from Python to the JVM, and the guards build hundreds."""
    text = "".join("'%s'" if isinstance(p, Column) else p.replace("%", "%%") for p in parts)
    return F.format_string(text, *[p for p in parts if isinstance(p, Column)])


def _first(checks: list[tuple[Column, Column]]) -> Column:
    """The detail of the first check that matches, else null."""
    return F.coalesce(*[F.when(cond, detail) for cond, detail in checks]) if checks else F.lit(None)


def _key_checks(table: Table, field: str, m: Column, prefix: str) -> list[tuple[Column, Column]]:
    present = reduce(lambda a, b: a & b, [F.map_contains_key(m, c) for c in table.key])
    checks = [
        (
            (F.size(m) != len(table.key)) | ~present,
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
                F.col(f"{prefix}{c}").isNull(),
                _says(f"{field}.{c}: ", m[c], f" is not {table.column(c).type}"),
            )
        )
    return checks


def _value_checks(table: Table, field: str, m: Column, prefix: str) -> list[tuple[Column, Column]]:
    return [
        (
            m[col.name].isNotNull() & F.col(f"{prefix}{col.name}").isNull(),
            _says(f"{field}.{col.name}: ", m[col.name], f" is not {col.type}"),
        )
        for col in table.columns
    ]


def copy_refs(records: DataFrame, table: Table, config: Config) -> DataFrame:
    """The first, light pass over every copy: what the shuffle by key needs (formats.md
    record fields ``event_id, op, origin, seq``, and the typed ``key``; ``new_key`` too).
    A table with unique constraints also gets their columns of ``after`` (``v_<col>``) and
    ``after_keys``, to couple keys that may share a value; a ``scope: transaction`` table
    gets ``txid`` and ``ts``, to admit transactions. A copy whose key does not parse gets a
    null ``key``: the full typing says why. ``raw`` passes through, for the full typing."""
    values = bool(table.unique)
    tx = table.scope is Scope.TRANSACTION
    fields = [T.StructField(n, T.StringType()) for n in LIGHT_FIELDS]
    fields += [T.StructField("key", TEXT_MAP), T.StructField("new_key", TEXT_MAP)]
    if values:
        fields.append(T.StructField("after", TEXT_MAP))
    if tx:
        fields += [T.StructField("txid", T.StringType()), T.StructField("ts", T.StringType())]
    p = F.from_json("raw", T.StructType(fields))
    order = F.create_map(
        *[x for i, r in enumerate(config.replica_ids) for x in (F.lit(r), F.lit(i))]
    )

    def key_of(m: Column) -> Column:
        parts = [typed(m[c], table.column(c).type) for c in table.key]
        ok = reduce(lambda a, b: a & b, [x.isNotNull() for x in parts])
        return F.when(ok, F.struct(*[x.alias(c) for x, c in zip(parts, table.key, strict=True)]))

    df = records.select("replica", "file", "line", "raw", p.alias("p"))
    eid = F.col("p.event_id")
    cols: list[Column | str] = [
        "replica",
        "file",
        "line",
        "raw",
        F.when(F.coalesce(eid, F.lit("")) != "", eid).alias("event_id"),
        F.col("p.op").alias("op"),
        F.col("p.origin").alias("origin"),
        F.col("p.seq").try_cast(T.LongType()).alias("seq"),
        F.when(F.col("replica") == F.col("p.origin"), F.lit(-1))
        .otherwise(F.coalesce(order[F.col("replica")], F.lit(len(config.replica_ids))))
        .alias("pref"),
        key_of(F.col("p.key")).alias("key"),
        key_of(F.col("p.new_key")).alias("new_key"),
    ]
    if values:
        unique_cols = sorted({c for u in table.unique for c in u})
        cols += [
            typed(F.col("p.after")[c], table.column(c).type).alias(f"v_{c}") for c in unique_cols
        ]
        cols.append(
            F.coalesce(F.map_keys("p.after"), F.array().cast("array<string>")).alias("after_keys")
        )
    if tx:
        cols += [F.col("p.txid").alias("txid"), event_ts_micros(F.col("p.ts")).alias("ts")]
    return df.select(*cols)


def parse_once(spark: SparkSession, copies: DataFrame, path: Path) -> DataFrame:
    """``copies`` (:func:`copy_refs`) written to ``path`` and read back: the engines read
    them three or four times (the TRUNCATEs and records without an id, the keys coupled by
    a key change or a unique value, the shuffle by key), and Spark would parse the JSON of
    every record again each time, in every filter that reads a field of it."""
    copies.write.mode("overwrite").parquet(str(path))
    return read_output(spark, path)


def type_copies(
    df: DataFrame, table: Table, config: Config, now_us: int, chosen: Column
) -> DataFrame:
    """The full typing and the guards (§3, in the order of §12), computed only for the rows
    where ``chosen`` (the copy that stands for its event); other rows get nulls. ``df``
    needs ``replica, raw, event_id, seq``; its other columns pass through, and ``raw`` is
    kept only for a copy that is quarantined."""
    passthrough = [c for c in df.columns if c not in TYPED_COLUMNS]
    df = _parse(df.select(*passthrough, chosen.alias("_chosen")), table)
    rank_map = F.create_map(
        *[x for r, i in config.tie_ranks(table.tie_break).items() for x in (F.lit(r), F.lit(i))]
    )
    malformed = _record_checks(rank_map) + _row_checks(table)
    guards = _guards(table, config, now_us, malformed)
    reason = F.coalesce(*[F.when(d.isNotNull(), F.lit(r.value)) for r, d in guards])
    detail = F.coalesce(*[d for _r, d in guards])
    with_reason = df.select(
        "*",
        F.when(F.col("_chosen"), reason).alias("reason"),
        F.when(F.col("_chosen"), detail).alias("detail"),
    )
    return _finish(with_reason, table, rank_map, passthrough)


# what the parse gives: ``p`` the record in its shape, ``top`` its top-level fields as text
# when a field does not fit that shape (columns are built in a session, not at import)


def _field(name: str) -> Column:
    return F.coalesce(F.col("p")[name], F.col("top")[name])


def _given(name: str) -> Column:
    return F.col("p")[name].isNotNull() | F.col("top")[name].isNotNull()


def _obj(name: str) -> Column:
    top = F.col("top")
    return F.when(top.isNull(), F.col("p")[name]).otherwise(F.from_json(top[name], TEXT_MAP))


def _parse(df: DataFrame, table: Table) -> DataFrame:
    """1. one JSON parse of each chosen copy into the record's shape. Spark fills a field
    of the wrong shape (or every field, for text that is not JSON) with null; such a record
    is parsed again, field by field, so that its quarantine says precisely what is wrong.
    Adds the record's fields, its objects as text maps (``<field>_m``) and every value
    typed by the table's schema (``k_``, ``nk_``, ``a_``, ``b_`` + column)."""
    chosen = F.col("_chosen")
    df = df.withColumn("p", F.when(chosen, F.from_json("raw", RECORD, _PARSE)))
    misfit = F.col("p")["_corrupt"].isNotNull()
    df = df.withColumn("top", F.when(chosen & misfit, F.from_json("raw", TEXT_MAP)))
    df = df.withColumn("_json", chosen & (~misfit | F.col("top").isNotNull()))

    def typed_of(m: str, names: tuple[str, ...], prefix: str) -> list[Column]:
        return [typed(F.col(m)[n], table.column(n).type).alias(f"{prefix}{n}") for n in names]

    return df.select(
        "*",
        _field("op").alias("op"),
        _field("origin").alias("origin"),
        _field("txid").alias("txid"),
        _field("ts").alias("ts_text"),
        event_ts_micros(_field("ts")).alias("ts"),
        _field("seq").alias("seq_text"),
        _field("ttl").alias("ttl_text"),
        _field("expiry").alias("expiry_text"),
        *[_obj(n).alias(f"{n}_m") for n in _OBJECT_FIELDS],
    ).select(
        "*",
        *typed_of("key_m", table.key, "k_"),
        *typed_of("new_key_m", table.key, "nk_"),
        *typed_of("after_m", table.column_names, "a_"),
        *typed_of("before_m", table.column_names, "b_"),
    )


def _record_checks(rank_map: Column) -> list[tuple[Column, Column]]:
    """2. the guards, in the order of §12: the record's own fields first."""
    op = F.col("op")
    return [
        (_field("_malformed").isNotNull(), _field("_malformed")),
        (~F.col("_json"), F.lit("not a JSON object")),
        (F.col("event_id").isNull(), F.lit("no event_id")),
        (~op.isin(*OPS) | op.isNull(), _says("unknown op ", op)),
        (F.col("origin").isNull(), F.lit("no origin")),
        (
            rank_map[F.col("origin")].isNull(),
            _says("origin ", F.col("origin"), " is not a configured replica"),
        ),
        (F.col("ts_text").isNull(), F.lit("no ts")),
        (
            F.col("ts").isNull(),
            _says(
                "ts ",
                F.col("ts_text"),
                " is neither µs since the epoch nor RFC 3339 with a UTC offset",
            ),
        ),
        (F.col("seq_text").isNull(), F.lit("no seq")),
        (
            F.col("seq").isNull(),
            _says("seq ", F.col("seq_text"), " is not an integer"),
        ),
    ]


def _row_checks(table: Table) -> list[tuple[Column, Column]]:
    """Then the key, the new key and the row images, typed by the table's schema."""
    key_m, nk_m, after_m, before_m = (F.col(f"{n}_m") for n in _OBJECT_FIELDS)
    op = F.col("op")
    row_op = op.isin("INSERT", "UPDATE", "DELETE")
    checks = [
        (row_op & ~_given("key"), F.lit("no key")),
        (row_op & key_m.isNull(), F.lit("key is not a JSON object")),
    ]
    checks += [(row_op & c, d) for c, d in _key_checks(table, "key", key_m, "k_")]
    checks += [
        (
            (op != "UPDATE") & _given("new_key"),
            _says("new_key on ", op, " (only an UPDATE changes a key)"),
        ),
        (_given("new_key") & nk_m.isNull(), F.lit("new_key is not a JSON object")),
    ]
    checks += [(nk_m.isNotNull() & c, d) for c, d in _key_checks(table, "new_key", nk_m, "nk_")]
    cell = table.granularity is Granularity.CELL
    if cell:  # §12 "Cell tables": every column is a cell; an INSERT may write the key only
        checks += _cell_checks(table, _given, after_m, before_m)
    checks += [
        ((op == "INSERT") & ~_given("after") & F.lit(not cell), F.lit("INSERT without after")),
        (_given("after") & after_m.isNull(), F.lit("after is not a JSON object")),
        (_given("before") & before_m.isNull(), F.lit("before is not a JSON object")),
    ]
    checks += [((op != "DELETE") & c, d) for c, d in _value_checks(table, "after", after_m, "a_")]
    checks += _value_checks(table, "before", before_m, "b_")
    return checks + _value_rules(table)


def _value_rules(table: Table) -> list[tuple[Column, Column]]:
    """Then the values against the key and the column rules (NOT NULL, delta)."""
    key_m, nk_m, after_m = F.col("key_m"), F.col("new_key_m"), F.col("after_m")
    writes = F.col("op").isin("INSERT", "UPDATE")
    checks = []
    for c in table.key:
        target = F.coalesce(F.col(f"nk_{c}"), F.col(f"k_{c}"))
        checks.append(
            (
                writes & F.map_contains_key(after_m, c) & (F.col(f"a_{c}") != target),
                _says(
                    f"after.{c} = ",
                    after_m[c],
                    " contradicts the key ",
                    F.coalesce(nk_m[c], key_m[c]),
                ),
            )
        )
    for c in sorted(table.not_null | table.delta):
        what = "a delta column" if c in table.delta else "a NOT NULL column"
        checks.append(
            (
                writes & F.map_contains_key(after_m, c) & after_m[c].isNull(),
                F.lit(f"after.{c} is null in {what}"),
            )
        )
    return checks


def _guards(
    table: Table, config: Config, now_us: int, malformed: list[tuple[Column, Column]]
) -> list[tuple[QuarantineReason, Column]]:
    """Each quarantine reason with its detail (null when it does not apply), in the order
    of §12: the first that applies is the copy's reason."""
    skew = config.max_clock_skew_seconds * 1_000_000
    grace = config.gc_grace_seconds * 1_000_000
    after_m, before_m = F.col("after_m"), F.col("before_m")
    no_old = [
        (F.col("op") == "UPDATE") & F.map_contains_key(after_m, c) & before_m[c].isNull()
        for c in sorted(table.delta)
    ]
    return [
        (QuarantineReason.MALFORMED, _first(malformed)),
        (
            QuarantineReason.FUTURE_TIMESTAMP,
            F.when(
                F.col("ts") > now_us + skew,
                F.lit(
                    f"ts is more than max_clock_skew_seconds={config.max_clock_skew_seconds} "
                    "after the run's clock"
                ),
            ),
        ),
        (
            QuarantineReason.STALE_BEYOND_GC_GRACE,
            F.when(
                F.col("ts") < now_us - grace,
                F.lit(
                    f"ts is older than gc_grace_seconds={config.gc_grace_seconds} "
                    "before the run's clock"
                ),
            ),
        ),
        (
            QuarantineReason.DELTA_WITHOUT_OLD_VALUE,
            F.when(
                reduce(lambda a, b: a | b, no_old),
                F.lit("no old value (before) for a changed delta column"),
            )
            if no_old
            else F.lit(None).cast("string"),
        ),
    ]


def _int_text(c: Column) -> Column:
    return F.when(c.rlike(r"^\d{1,12}$"), c.try_cast(T.LongType()))


def _cell_checks(
    table: Table, given: Callable[[str], Column], after_m: Column, before_m: Column
) -> list[tuple[Column, Column]]:
    """Malformed for a cell table (§12): a ``new_key``, a column the table does not
    have, a ``ttl`` that is not 0..20 years in whole seconds, an ``expiry`` without a
    ttl or not in whole seconds."""
    cols = _lits(table.column_names)
    empty = F.array().cast("array<string>")
    unknown = F.array_distinct(
        F.concat(
            F.array_except(F.coalesce(F.map_keys(after_m), empty), cols),
            F.array_except(F.coalesce(F.map_keys(before_m), empty), cols),
        )
    )
    ttl, expiry = F.col("ttl_text"), F.col("expiry_text")
    return [
        (given("new_key"), F.lit("new_key on a cell-granularity table (a key never changes)")),
        (
            F.size(unknown) > 0,
            F.concat(
                F.lit("unknown column(s) ["),
                F.array_join(F.array_sort(unknown), ", "),
                F.lit("] (a cell-granularity table has no source_column_extra)"),
            ),
        ),
        (
            ttl.isNotNull() & ~F.coalesce(_int_text(ttl) <= MAX_TTL, F.lit(False)),
            _says("ttl ", ttl, f" is not whole seconds 0..{MAX_TTL}"),
        ),
        (
            expiry.isNotNull() & _int_text(expiry).isNull(),
            _says("expiry ", expiry, " is not whole seconds"),
        ),
        (
            expiry.isNotNull() & F.coalesce(_int_text(ttl), F.lit(0)).__eq__(0),
            F.lit("expiry without a ttl"),
        ),
    ]


def _finish(df: DataFrame, table: Table, rank_map: Column, passthrough: list[str]) -> DataFrame:
    """3. the copy's columns: typed structs, present and extra column names."""
    cols = table.column_names
    chosen = F.col("_chosen")
    nk_m, after_m, before_m = (F.col(f"{n}_m") for n in ("new_key", "after", "before"))

    def struct_of(prefix: str, names: tuple[str, ...]) -> Column:
        return F.when(chosen, F.struct(*[F.col(f"{prefix}{n}").alias(n) for n in names]))

    empty = F.array().cast("array<string>")

    def keys_of(m: Column) -> Column:
        return F.coalesce(F.map_keys(m), empty)

    def has(m: Column) -> Column:
        """Which of the table's columns the object carries, in schema order."""
        return F.array(*[F.coalesce(F.map_contains_key(m, c), F.lit(False)) for c in cols])

    def n_known(m: Column) -> Column:
        return reduce(
            lambda a, b: a + b, [F.when(F.map_contains_key(m, c), 1).otherwise(0) for c in cols]
        )

    unknown = F.coalesce(F.size(after_m), F.lit(0)) + F.coalesce(
        F.size(before_m), F.lit(0)
    ) != n_known(after_m) + n_known(before_m)
    extra = F.array_distinct(
        F.concat(
            F.array_except(keys_of(after_m), _lits(cols)),
            F.array_except(keys_of(before_m), _lits(cols)),
        )
    )
    out = [c for c in passthrough if c != "raw"]
    return df.select(
        *out,
        "op",
        "origin",
        rank_map[F.col("origin")].alias("rank"),
        "txid",
        "ts",
        F.when(nk_m.isNotNull(), struct_of("nk_", table.key)).alias("new_key"),
        struct_of("a_", cols).alias("after"),
        F.when(chosen, has(after_m)).alias("after_has"),
        struct_of("b_", cols).alias("before"),
        F.when(chosen, has(before_m)).alias("before_has"),
        F.when(chosen, F.when(unknown, extra).otherwise(empty)).alias("extra_cols"),
        # §6: a ttl of 0 is no ttl; expiry (s) defaults to floor(ts / 1e6) + ttl
        F.when(_int_text(F.col("ttl_text")) > 0, _int_text(F.col("ttl_text"))).alias("ttl"),
        F.when(
            _int_text(F.col("ttl_text")) > 0,
            F.coalesce(
                _int_text(F.col("expiry_text")),
                F.floor(F.col("ts") / 1_000_000) + _int_text(F.col("ttl_text")),
            ),
        ).alias("expiry"),
        "reason",
        "detail",
        F.when(F.col("reason").isNotNull(), F.col("raw")).alias("raw"),
    )
