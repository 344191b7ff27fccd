"""Adapters for real exports (formats.md "Adapters for real exports"): PostgreSQL's
wal2json, Debezium envelopes and AWS DMS change files, each mapped on Spark, with
built-ins only, to the canonical event record that the rest of the pipeline reads.

Every adapter returns the records of a staged export: ``replica, file, line, raw`` with
``raw`` the canonical record as JSON text, which ``pipeline.copies`` types like any JSONL
export's line. A record the adapter cannot
map becomes ``{"_malformed": <reason>, "_source": <the record as exported>}``: the
first guard quarantines it as ``malformed`` with that reason, and the quarantine keeps
the record as it was exported.

Values are read through Spark's VARIANT type, which keeps a JSON number's digits (a
``numeric(38,10)`` does not go through a double), and turned into the canonical text of
the column's configured type: PostgreSQL's ``timestamptz`` text gets an RFC 3339 offset, a
``timestamp`` without zone is read as UTC, ``bytea`` hex becomes base64, and Debezium's
logical types (``Decimal`` bytes, ``Date`` days, ``Timestamp``/``MicroTimestamp``/
``NanoTimestamp``) are decoded with the schema of a schema-wrapped envelope.

**Event ids.** An adapter's event id must be the same in every export holding the change
(the origin's, and those of the replicas that applied it) and differ between changes.
Log positions and transaction ids are local to the server that wrote the log, so they
cannot be used. What a replicated change keeps is its origin, its origin's commit
timestamp (PostgreSQL's logical decoding reports the origin's commit time for a change
applied under a replication origin) and its place in its transaction. The id is
``<origin>@<commit µs>#<n>/<op>/<key>``: ``n`` is the change's position among its
transaction's changes of this table (ten digits, so that the canonical order, which
breaks ties of ``(ts, origin)`` by event id, keeps the transaction's order), and the op
and old key make two transactions that commit in the same microsecond distinct (they
cannot both change one row then).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipeline.config import Kind, Table
from pipeline.errors import ExportError
from pipeline.schema import event_ts_micros

#: lines that are not records: wal2json's transaction framing, Kafka's tombstones. They
#: are counted (the manifest's ``rows``) but staged as nothing (formats.md "Adapters")
FRAMING: dict[str, re.Pattern[bytes]] = {
    "wal2json": re.compile(rb'^\s*\{\s*"action"\s*:\s*"[BC]"'),
    "debezium": re.compile(rb"^\s*null\s*$"),
}

#: what the Debezium PostgreSQL connector writes for a TOASTed value a change did not
#: decode (its ``unavailable.value.placeholder``; the manifest's option overrides it)
UNAVAILABLE = "__debezium_unavailable_value"

#: the manifest's ``options`` each format accepts, and their JSON types
OPTIONS: dict[str, dict[str, type | tuple[type, ...]]] = {
    "jsonl": {},
    "parquet": {},
    "wal2json": {"origins": dict},
    "debezium": {"unavailable_value_placeholder": str},
    "dms": {
        "timestamp_column": str,
        "header": bool,
        "columns": list,
        "delimiter": str,
        "null_value": str,
        "txid_column": str,
        "origin_column": str,
    },
}


def check_options(fmt: str, options: Any, where: str) -> dict[str, Any]:
    """The manifest's ``options`` for ``fmt``, checked; every problem names the field."""
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise ExportError(f"{where}: options must be an object")
    allowed = OPTIONS[fmt]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        known = ", ".join(sorted(allowed)) or "none"
        raise ExportError(f"{where}: options {unknown} are not options of {fmt} (known: {known})")
    for k, v in options.items():
        if not isinstance(v, allowed[k]) or isinstance(v, bool) != (allowed[k] is bool):
            raise ExportError(f"{where}: options.{k} must be a {allowed[k].__name__}")  # type: ignore[union-attr]
    if fmt == "wal2json":
        for k, v in options.get("origins", {}).items():
            if not re.fullmatch(r"\d+", k) or not isinstance(v, str):
                raise ExportError(
                    f"{where}: options.origins maps replication origin ids (digits) to "
                    f"replica ids, got {k!r}: {v!r}"
                )
    if fmt == "dms":
        if "timestamp_column" not in options:
            raise ExportError(
                f"{where}: a dms export needs options.timestamp_column, the commit-timestamp "
                "column that DMS adds (its TimestampColumnName setting)"
            )
        cols = options.get("columns")
        if cols is not None and not all(isinstance(c, str) and c for c in cols):
            raise ExportError(f"{where}: options.columns must be a list of column names")
        if options.get("header") is False and cols is None:
            raise ExportError(
                f"{where}: a dms CSV without a header needs options.columns, its columns in order"
            )
        if len(options.get("delimiter", ",")) != 1:
            raise ExportError(f"{where}: options.delimiter must be one character")
    return options


# ---------------------------------------------------------------------------- helpers


def _text(v: Column) -> Column:
    """A VARIANT scalar as text (a JSON string unquoted, a number with its digits); an
    object or array as its JSON."""
    return F.when(
        ~F.is_variant_null(v), F.coalesce(F.try_variant_get(v, "$", "string"), F.to_json(v))
    )


def _rfc3339(ts: Column, naive_utc: bool) -> Column:
    """PostgreSQL's and DMS's timestamp text as RFC 3339: ``+00`` becomes ``+00:00``, and
    with ``naive_utc`` a timestamp without offset is read as UTC."""
    with_offset = F.regexp_replace(ts, r"([+-]\d{2})$", "$1:00")
    if not naive_utc:
        return with_offset
    return F.when(ts.rlike(r"([+-]\d{2}(:?\d{2})?|[Zz])$"), with_offset).otherwise(
        F.concat(ts, F.lit("Z"))
    )


def _pg_value(table: Table, name: Column, text: Column) -> Column:
    """The canonical text of a PostgreSQL value's text, by the column's configured type."""
    out = text
    for col in table.columns:
        if col.type.kind is Kind.TIMESTAMP:
            out = F.when(name == col.name, _rfc3339(text, naive_utc=True)).otherwise(out)
        elif col.type.kind is Kind.BINARY:
            hexed = F.when(text.startswith("\\x"), F.base64(F.unhex(F.substring(text, 3, 1 << 30))))
            out = F.when(name == col.name, F.coalesce(hexed, text)).otherwise(out)
    return out


def _key_map(table: Table, m: Column) -> Column:
    """The key columns of a text map, in key order; null when the map is null."""
    return F.when(
        m.isNotNull(),
        F.map_from_arrays(
            F.array(*[F.lit(c) for c in table.key]), F.array(*[m[c] for c in table.key])
        ),
    )


def _has_key(table: Table, m: Column) -> Column:
    parts = [F.coalesce(F.map_contains_key(m, c), F.lit(False)) for c in table.key]
    out = parts[0]
    for p in parts[1:]:
        out = out & p
    return out


def _lsn(text: Column) -> Column:
    """A PostgreSQL LSN ``X/Y`` as the 64-bit integer it stands for."""
    hi = F.conv(F.regexp_extract(text, r"^([0-9A-Fa-f]{1,8})/", 1), 16, 10).cast("bigint")
    lo = F.conv(F.regexp_extract(text, r"/([0-9A-Fa-f]{1,8})$", 1), 16, 10).cast("bigint")
    return F.when(text.rlike(r"^[0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}$"), hi * (1 << 32) + lo)


def _file_parts(df: DataFrame) -> DataFrame:
    """``fileno`` (the file's place in the manifest) from the staged file's name."""
    name = F.regexp_extract(F.input_file_name(), r"part-(\d+)\.parquet$", 1)
    return df.withColumn("fileno", name.cast("bigint"))


def _line_order(fileno: Column, line: Column) -> Column:
    """An export's record order when the source gives no log position: file, then line."""
    return fileno * (1 << 32) + line


#: where each canonical record came from (``_file_parts``), first in every adapter's output
_LINE_COLUMNS = ("replica", "file", "line", "fileno")


def _first_problem(checks: list[tuple[Column, str | Column]]) -> Column:
    return F.coalesce(
        *[F.when(cond, F.lit(msg) if isinstance(msg, str) else msg) for cond, msg in checks]
    )


def canonical(df: DataFrame, fmt: str, table: Table) -> DataFrame:
    """``replica, file, line, raw`` from the adapter's columns ``op, key, new_key, after,
    before, ts, origin, txid, seq, problem, source`` (maps of text, text scalars).

    The event id is computed here, the same way for every adapter (module docstring)."""
    ts_us = event_ts_micros(F.col("ts"))
    op_letter = F.substring(F.col("op"), 1, 1)
    problem = F.coalesce(
        F.col("problem"),
        F.when(F.col("ts").isNull(), F.lit("no commit timestamp")),
        F.when(
            ts_us.isNull(),
            F.concat(F.lit("commit timestamp '"), F.col("ts"), F.lit("' cannot be read")),
        ),
    )
    df = df.withColumn("problem", problem).withColumn("ts_us", ts_us)
    # the change's place among its transaction's changes of this table
    tx = Window.partitionBy("replica", "txid", "ts_us").orderBy("seq", "fileno", "line")
    n = F.row_number().over(tx)
    event_id = F.concat(
        F.col("origin"),
        F.lit("@"),
        F.col("ts_us").cast("string"),
        F.lit("#"),
        F.lpad(n.cast("string"), 10, "0"),  # zero-padded: the text sorts as the number
        F.lit("/"),
        op_letter,
        F.lit("/"),
        F.coalesce(F.to_json(F.col("key")), F.lit("")),
    )
    good = F.to_json(
        F.struct(
            F.col("op"),
            F.col("key"),
            F.col("new_key"),
            F.col("after"),
            F.col("before"),
            F.col("ts_us").alias("ts"),
            F.col("origin"),
            event_id.alias("event_id"),
            F.col("txid"),
            F.col("seq"),
        )
    )
    where = F.concat(
        F.lit(f"{fmt} record at "), F.col("file"), F.lit(":"), F.col("line").cast("string")
    )
    bad = F.to_json(
        F.struct(
            F.concat(where, F.lit(": "), F.col("problem")).alias("_malformed"),
            F.col("source").alias("_source"),
        )
    )
    return df.select(
        "replica",
        "file",
        "line",
        F.when(F.col("problem").isNull(), good).otherwise(bad).alias("raw"),
    )


def _table_check(table: Table, schema: Column, name: Column, what: str) -> tuple[Column, Column]:
    qualified = F.concat_ws(".", schema, name)
    return (
        name.isNotNull() & (name != table.name) & (qualified != table.name),
        F.concat(F.lit("a change of table "), qualified, F.lit(f" in an export of {what}")),
    )


# ----------------------------------------------------------------------------- wal2json

_W2J = (
    "action string, xid string, timestamp string, origin string, lsn string, "
    "schema string, table string, "
    "columns array<struct<name string, value variant>>, "
    "identity array<struct<name string, value variant>>"
)


def wal2json(raw: DataFrame, table: Table, options: Mapping[str, Any]) -> DataFrame:
    """wal2json format 2 (one action per line; ``include-xids``, ``include-timestamp``,
    ``include-origin``, ``include-lsn``): I, U, D, T actions of this table."""
    v = F.try_parse_json("raw")
    p = F.try_variant_get(v, "$", _W2J)
    df = _file_parts(raw).select("*", v.alias("v"), p.alias("p"))
    act = F.col("p.action")

    def text_map(arr: Column) -> Column:
        return F.when(
            arr.isNotNull(),
            F.map_from_entries(
                F.transform(
                    arr,
                    lambda c: F.struct(c["name"], _pg_value(table, c["name"], _text(c["value"]))),
                )
            ),
        )

    df = df.select(
        "*", text_map(F.col("p.columns")).alias("c_m"), text_map(F.col("p.identity")).alias("i_m")
    )
    cols, ident = F.col("c_m"), F.col("i_m")
    origin = _w2j_origin(options.get("origins", {}))
    old_key = F.when(_has_key(table, ident), _key_map(table, ident))
    new_key = _key_map(table, cols)
    key = F.when(act == "I", new_key).otherwise(F.coalesce(old_key, new_key))
    changed = (act == "U") & old_key.isNotNull() & (F.to_json(old_key) != F.to_json(new_key))
    problem = _w2j_problem(table, origin)
    is_row = act.isin("I", "U", "D")
    return canonical(
        df.select(
            *_LINE_COLUMNS,
            F.col("raw").alias("source"),
            problem.alias("problem"),
            F.when(act == "I", "INSERT")
            .when(act == "U", "UPDATE")
            .when(act == "D", "DELETE")
            .when(act == "T", "TRUNCATE")
            .alias("op"),
            F.when(is_row, key).alias("key"),
            F.when(changed, new_key).alias("new_key"),
            F.when(act.isin("I", "U"), cols).alias("after"),
            F.when(act.isin("U", "D"), ident).alias("before"),
            _rfc3339(F.col("p.timestamp"), naive_utc=False).alias("ts"),
            origin.alias("origin"),
            F.col("p.xid").alias("txid"),
            _lsn(F.col("p.lsn")).alias("seq"),
        ),
        "wal2json",
        table,
    )


def _w2j_origin(origins: Mapping[str, str]) -> Column:
    """The replica an action came from: the exporting replica for a local change, else
    the one its replication origin maps to (the manifest's ``options.origins``)."""
    origin_map = (
        F.create_map(*[x for k, r in origins.items() for x in (F.lit(k), F.lit(r))])
        if origins
        else F.create_map().cast("map<string,string>")
    )
    local = F.col("p.origin").isNull() | (F.col("p.origin") == "0")
    return F.when(local, F.col("replica")).otherwise(origin_map[F.col("p.origin")])


def _w2j_problem(table: Table, origin: Column) -> Column:
    """Why a line is no row change the run can apply (null if it is one)."""
    act = F.col("p.action")
    return _first_problem(
        [
            (F.col("bad").isNotNull(), F.col("bad")),
            (F.col("v").isNull(), "not JSON"),
            (F.col("p").isNull() | act.isNull(), "not a wal2json format-2 action"),
            (act == "M", "a logical decoding message (action M), not a row change"),
            (act.isin("B", "C"), "transaction framing (action B or C), not a row change"),
            (
                ~act.isin("I", "U", "D", "T"),
                F.concat(F.lit("unknown action '"), act, F.lit("'")),
            ),
            _table_check(table, F.col("p.schema"), F.col("p.table"), f"table {table.name}"),
            (
                origin.isNull(),
                F.concat(
                    F.lit("replication origin "),
                    F.col("p.origin"),
                    F.lit(" is not mapped to a replica (the manifest's options.origins)"),
                ),
            ),
            (F.col("p.xid").isNull(), "no xid (export with include-xids)"),
            (F.col("p.lsn").isNull(), "no lsn (export with include-lsn)"),
            (
                _lsn(F.col("p.lsn")).isNull(),
                F.concat(F.lit("lsn '"), F.col("p.lsn"), F.lit("' is not X/Y")),
            ),
            (act.isin("I", "U") & F.col("c_m").isNull(), "no columns"),
            ((act == "D") & F.col("i_m").isNull(), "no identity (old key)"),
        ]
    )


# ----------------------------------------------------------------------------- debezium

_FIELD = "struct<field string, name string, parameters map<string,string>>"
_DBZ_SCHEMA = f"array<struct<field string, fields array<{_FIELD}>>>"
_SOURCE = (
    "struct<ts_ms bigint, ts_us bigint, ts_ns bigint, lsn bigint, txId string, "
    "schema string, table string, db string>"
)
_DBZ = (
    f"struct<op string, source {_SOURCE}, before map<string, variant>, "
    "after map<string, variant>, origin string, "
    "transaction struct<id string, data_collection_order bigint>>"
)


def _decimal_unscaled(b64: Column) -> Column:
    """Kafka Connect's ``Decimal`` is the unscaled value as big-endian two's complement
    bytes (base64 in JSON): that value, exactly, when it has up to 8 bytes (18 digits);
    null for a longer one (the record is then malformed: see ``debezium``)."""
    raw = F.try_to_binary(b64, F.lit("base64"))
    hexed = F.hex(raw)
    unsigned = F.conv(hexed, 16, 10).cast("decimal(38,0)")
    negative = F.conv(F.substr(hexed, F.lit(1), F.lit(2)), 16, 10).cast("int") >= 128
    # 2^(8n), exactly: a double cast to a decimal goes through its shortest text
    # (2^64 became 18446744073709552000), which shifted long negative values
    offsets = F.array(*[F.lit(str(2 ** (8 * n))).cast("decimal(38,0)") for n in range(1, 9)])
    offset = F.element_at(offsets, F.greatest(F.length(raw), F.lit(1)))
    return F.when(F.length(raw) <= 8, F.when(negative, unsigned - offset).otherwise(unsigned))


def _decimal_text(unscaled: Column, scale: Column) -> Column:
    """An unscaled value and its scale as decimal text, by string operations (exact)."""
    digits = F.abs(unscaled).cast("string")
    s = F.coalesce(scale.cast("int"), F.lit(0))
    padded = F.lpad(digits, F.greatest(F.length(digits), s + 1), "0")
    cut = F.length(padded) - s
    text = F.when(
        s > 0,
        F.concat(F.substr(padded, F.lit(1), cut), F.lit("."), F.substr(padded, cut + 1)),
    ).otherwise(padded)
    return F.concat(F.when(unscaled < 0, "-").otherwise(""), text)


_DECIMAL = "org.apache.kafka.connect.data.Decimal"
_DAYS = ("io.debezium.time.Date", "org.apache.kafka.connect.data.Date")
_MILLIS = ("io.debezium.time.Timestamp", "org.apache.kafka.connect.data.Timestamp")


def _dbz_value(
    table: Table, col: str, v: Column, logical: Column, scale: Column, unscaled: Column
) -> Column:
    """A Debezium value as canonical text, decoded by its logical type when the envelope
    has a schema (``unscaled``: the value decoded as a ``Decimal``, computed before)."""
    text = _text(v)
    kind = table.column(col).type.kind
    if kind is Kind.DECIMAL:
        return F.when(logical == _DECIMAL, _decimal_text(unscaled, scale)).otherwise(text)
    if kind is Kind.DATE:
        days = text.try_cast("int")
        return F.when(
            logical.isin(*_DAYS), F.date_add(F.lit("1970-01-01").cast("date"), days).cast("string")
        ).otherwise(text)
    if kind is Kind.TIMESTAMP:
        n = text.try_cast("bigint")
        return (
            F.when(logical.isin(*_MILLIS), (n * 1000).cast("string"))
            .when(logical == "io.debezium.time.MicroTimestamp", n.cast("string"))
            .when(logical == "io.debezium.time.NanoTimestamp", F.floor(n / 1000).cast("string"))
            .otherwise(_rfc3339(text, naive_utc=False))
        )
    return text


def debezium(raw: DataFrame, table: Table, options: Mapping[str, Any]) -> DataFrame:
    """Debezium change events as an S3 sink writes them: one envelope per line, plain or
    wrapped as ``{"schema": …, "payload": …}`` (Kafka Connect's JsonConverter)."""
    decimals = [c.name for c in table.columns if c.type.kind is Kind.DECIMAL]
    unavailable = options.get("unavailable_value_placeholder", UNAVAILABLE)
    df = _dbz_envelopes(raw, decimals)
    df = df.select(
        "*",
        _dbz_text_map(table, "after", decimals, unavailable).alias("a_m"),
        _dbz_text_map(table, "before", decimals, unavailable).alias("b_m"),
    )
    op = F.col("p.op")
    after, before = F.col("a_m"), F.col("b_m")
    old_key = F.when(_has_key(table, before), _key_map(table, before))
    new_key = F.when(_has_key(table, after), _key_map(table, after))
    src = F.col("p.source")
    # ns to µs in decimal arithmetic: a long divided by a long is a double in Spark, whose
    # 53 bits cannot hold a nanosecond time (…001999 ns would round up to …002 µs)
    ns_to_us = F.floor(src["ts_ns"].cast("decimal(20,0)") / 1000).cast("bigint")
    ts_us = F.coalesce(src["ts_us"], ns_to_us, src["ts_ms"] * 1000)
    seq = F.coalesce(src["lsn"], _line_order(F.col("fileno"), F.col("line")))
    return canonical(
        df.select(
            *_LINE_COLUMNS,
            F.col("raw").alias("source"),
            _dbz_problem(table, decimals, ts_us, old_key).alias("problem"),
            F.when(op.isin("c", "r"), "INSERT")
            .when(op == "u", "UPDATE")
            .when(op == "d", "DELETE")
            .when(op == "t", "TRUNCATE")
            .alias("op"),
            F.when(op.isin("c", "r"), new_key)
            .when(op.isin("u", "d"), F.coalesce(old_key, new_key))
            .alias("key"),
            F.when(
                (op == "u") & old_key.isNotNull() & (F.to_json(old_key) != F.to_json(new_key)),
                new_key,
            ).alias("new_key"),
            F.when(op.isin("c", "r", "u"), after).alias("after"),
            F.when(op.isin("u", "d"), before).alias("before"),
            ts_us.cast("string").alias("ts"),
            F.coalesce(F.col("p.origin"), F.col("replica")).alias("origin"),
            F.coalesce(src["txId"], F.col("p.transaction.id")).alias("txid"),
            seq.alias("seq"),
        ),
        "debezium",
        table,
    )


def _dbz_envelopes(raw: DataFrame, decimals: list[str]) -> DataFrame:
    """Each line parsed: ``v`` (the JSON), ``p`` (the envelope's payload), ``sf`` (the
    schema's fields, when wrapped), ``lt`` (each column's logical type and scale: before
    and after share the row's schema) and ``dec_<part>_<column>`` (the unscaled value of
    each decimal column given as Debezium's base64 bytes)."""
    v = F.try_parse_json("raw")
    wrapped = (
        F.try_variant_get(v, "$.payload", "variant").isNotNull()
        & F.try_variant_get(v, "$.schema", "variant").isNotNull()
    )
    payload = F.when(wrapped, F.try_variant_get(v, "$.payload", "variant")).otherwise(v)
    df = _file_parts(raw).select(
        "*",
        v.alias("v"),
        F.try_variant_get(payload, "$", _DBZ).alias("p"),
        F.when(wrapped, F.try_variant_get(v, "$.schema.fields", _DBZ_SCHEMA)).alias("sf"),
    )
    rows = F.filter(F.col("sf"), lambda f: f["field"].isin("after", "before"))[0]["fields"]
    logical = F.map_from_entries(
        F.transform(
            rows,
            lambda f: F.struct(
                f["field"],
                F.struct(f["name"].alias("name"), f["parameters"]["scale"].alias("scale")),
            ),
        )
    )
    df = df.withColumn("lt", F.when(F.col("sf").isNotNull(), logical))
    return df.select(
        "*",
        *[
            F.when(
                F.col("lt")[c]["name"] == _DECIMAL, _decimal_unscaled(_text(F.col(f"p.{part}")[c]))
            ).alias(f"dec_{part}_{c}")
            for c in decimals
            for part in ("after", "before")
        ],
    )


def _unavailable(kind: Kind, value: Column, placeholder: str) -> Column:
    """Whether a value is the connector's placeholder for a TOASTed value the change did
    not decode (text, or a ``bytea``'s bytes as base64 or hex)."""
    if kind is Kind.STRING:
        return value == placeholder
    if kind is Kind.BINARY:
        raw = placeholder.encode()
        return value.isin(base64.b64encode(raw).decode(), raw.hex())
    return F.lit(False)


def _dbz_text_map(table: Table, part: str, decimals: list[str], unavailable: str) -> Column:
    """The envelope's ``before`` or ``after`` as a map of canonical texts: the table's
    columns by their logical types, any other field as its JSON text. A column whose value
    is the placeholder of an unchanged TOASTed value is left out: the change did not
    write it."""
    m = F.col(f"p.{part}")
    entries = [
        F.when(
            F.map_contains_key(m, col.name)
            & ~F.coalesce(
                _unavailable(col.type.kind, _text(m[col.name]), unavailable), F.lit(False)
            ),
            F.struct(
                F.lit(col.name).alias("k"),
                _dbz_value(
                    table,
                    col.name,
                    m[col.name],
                    F.col("lt")[col.name]["name"],
                    F.col("lt")[col.name]["scale"],
                    F.col(f"dec_{part}_{col.name}") if col.name in decimals else F.lit(None),
                ).alias("v"),
            ),
        )
        for col in table.columns
    ]
    known = F.filter(F.array(*entries), lambda e: e.isNotNull())
    extra = F.transform(
        F.filter(F.map_keys(m), lambda k: ~k.isin(*table.column_names)),
        lambda k: F.struct(k.alias("k"), _text(m[k]).alias("v")),
    )
    return F.when(m.isNotNull(), F.map_from_entries(F.concat(known, extra)))


def _dbz_problem(table: Table, decimals: list[str], ts_us: Column, old_key: Column) -> Column:
    """Why a line is no change event the run can apply (null if it is one)."""
    op = F.col("p.op")
    src = F.col("p.source")
    # a Decimal too long to decode reads as null: the record is malformed, not changed
    oversized = [
        (F.col("lt")[c]["name"] == _DECIMAL)
        & _text(F.col(f"p.{part}")[c]).isNotNull()
        & F.col(f"dec_{part}_{c}").isNull()
        for c in decimals
        for part in ("after", "before")
    ]
    return _first_problem(
        [
            (F.col("bad").isNotNull(), F.col("bad")),
            (F.col("v").isNull(), "not JSON"),
            (F.col("p").isNull() | op.isNull(), "not a Debezium change event envelope"),
            (op == "m", "a Debezium message event (op m), not a row change"),
            (
                ~op.isin("c", "r", "u", "d", "t"),
                F.concat(F.lit("unknown op '"), op, F.lit("'")),
            ),
            _table_check(table, src["schema"], src["table"], f"table {table.name}"),
            (ts_us.isNull(), "no source.ts_ms, ts_us or ts_ns (the commit time)"),
            (op.isin("c", "r", "u") & F.col("p.after").isNull(), "no after"),
            ((op == "d") & old_key.isNull(), "no before key"),
            *[
                (
                    o,
                    "a Decimal that is not the base64 of at most 8 bytes (for longer values, "
                    "use decimal.handling.mode=string)",
                )
                for o in oversized
            ],
        ]
    )


# ---------------------------------------------------------------------------------- dms


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
        df = _file_parts(spark.read.parquet(*csv_files))
        parts.append(df.withColumnRenamed("_line", "line"))
    if parquet_files:
        df = spark.read.parquet(*parquet_files)
        df = _file_parts(_as_text(df).withColumn("line", F.col("_metadata.row_index") + 1))
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
    problem = _first_problem(
        [
            (bad.isNotNull(), F.concat(F.lit("not a CSV record of this export: "), why)),
            (op.isNull(), "no Op column value"),
            (~op.isin("I", "U", "D"), F.concat(F.lit("Op '"), op, F.lit("' is not I, U or D"))),
            (
                ts.isNull(),
                f"no commit timestamp in column {ts_col!r} (options.timestamp_column)",
            ),
            (~_has_key(table, row), "a key column is missing"),
        ]
    )
    return source, problem


def dms(
    rows: DataFrame, replica: str, files: list[str], table: Table, options: Mapping[str, Any]
) -> DataFrame:
    """AWS DMS change files: ``Op`` (I, U, D), the commit-timestamp column named by
    ``options.timestamp_column`` (UTC, ``yyyy-MM-dd HH:mm:ss.SSSSSS``), optional
    ``txid_column`` and ``origin_column`` (DMS transformation rules can add them from
    ``$AR_H_TRANSACTION_ID`` or a constant), then the table's columns. DMS records no
    old values, so an UPDATE's key is its new key, and a delta column cannot be
    reconciled (the record is quarantined as delta_without_old_value)."""
    ts_col = options["timestamp_column"]
    meta = {
        "Op",
        ts_col,
        options.get("txid_column"),
        options.get("origin_column"),
        "fileno",
        "line",
        "_bad",
        "_bad_reason",
    }
    data = [c for c in rows.columns if c not in meta]
    row = F.map_from_arrays(
        F.array(*[F.lit(c) for c in data]), F.array(*[F.col(f"`{c}`") for c in data])
    )
    op = F.upper(F.col("Op")) if "Op" in rows.columns else F.lit(None).cast("string")
    ts = F.col(f"`{ts_col}`") if ts_col in rows.columns else F.lit(None).cast("string")
    file_of = F.create_map(*[x for i, f in enumerate(files) for x in (F.lit(i), F.lit(f))])
    origin_col = options.get("origin_column")
    txid_col = options.get("txid_column")
    source, problem = _dms_source_and_problem(rows, table, row, op, ts, ts_col)
    df = rows.select(
        F.lit(replica).alias("replica"),
        F.coalesce(file_of[F.col("fileno")], F.col("fileno").cast("string")).alias("file"),
        "line",
        "fileno",
        source.alias("source"),
        problem.alias("problem"),
        F.when(op == "I", "INSERT").when(op == "U", "UPDATE").when(op == "D", "DELETE").alias("op"),
        _key_map(table, row).alias("key"),
        F.lit(None).cast("map<string,string>").alias("new_key"),
        F.when(op.isin("I", "U"), row).alias("after"),
        F.lit(None).cast("map<string,string>").alias("before"),
        _rfc3339(ts, naive_utc=True).alias("ts"),
        (
            F.coalesce(F.col(f"`{origin_col}`"), F.lit(replica)) if origin_col else F.lit(replica)
        ).alias("origin"),
        (F.col(f"`{txid_col}`") if txid_col else F.lit(None).cast("string")).alias("txid"),
        _line_order(F.col("fileno"), F.col("line")).alias("seq"),
    )
    return canonical(df, "dms", table)
