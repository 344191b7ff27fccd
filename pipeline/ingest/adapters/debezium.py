"""Debezium change events as an S3 sink writes them (one envelope per line, plain or
wrapped as ``{"schema": …, "payload": …}`` by Kafka Connect's JsonConverter), mapped to
canonical records on Spark.

Values are read through Spark's VARIANT type, which keeps a JSON number's digits, and
Debezium's logical types (``Decimal`` bytes, ``Date`` days, ``Timestamp``/
``MicroTimestamp``/``NanoTimestamp``) are decoded with the schema of a schema-wrapped
envelope. The id's place (``pipeline.ingest.adapters.common``): the change's position in its
transaction when the connector sets ``provide.transaction.metadata``
(``transaction.data_collection_order``), else a digest of the change and its occurrence by
``source.lsn``; ``pos`` is the one or the other.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from pipeline.core.columns import AFTER, BEFORE, KEY, OP, ORIGIN, POS, REPLICA, SEQ, TS, TXID
from pipeline.core.config import Column as TableColumn
from pipeline.core.config import Table
from pipeline.core.kinds import Kind, every_kind
from pipeline.ingest.adapters.common import (
    LINE_COLUMNS,
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
    table_check,
    text,
)
from pipeline.ingest.adapters.options import UNAVAILABLE
from pipeline.rules.guards import READ
from pipeline.spark.schema import event_ts_micros

_FIELD = "struct<field string, name string, parameters map<string,string>>"
_DBZ_SCHEMA = f"array<struct<field string, fields array<{_FIELD}>>>"
_SOURCE = (
    "struct<ts_ms bigint, ts_us bigint, ts_ns bigint, lsn bigint, txId string, "
    "schema string, table string, db string, origin string>"
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
    return _DBZ_DECODE[table.column(col).type.kind](text(v), logical, scale, unscaled)


def _dbz_as_text(as_text: Column, logical: Column, scale: Column, unscaled: Column) -> Column:
    return as_text


def _dbz_decimal(as_text: Column, logical: Column, scale: Column, unscaled: Column) -> Column:
    return F.when(logical == _DECIMAL, _decimal_text(unscaled, scale)).otherwise(as_text)


def _dbz_date(as_text: Column, logical: Column, scale: Column, unscaled: Column) -> Column:
    days = as_text.try_cast("int")
    return F.when(
        logical.isin(*_DAYS), F.date_add(F.lit("1970-01-01").cast("date"), days).cast("string")
    ).otherwise(as_text)


def _dbz_timestamp(as_text: Column, logical: Column, scale: Column, unscaled: Column) -> Column:
    n = as_text.try_cast("bigint")
    return (
        F.when(logical.isin(*_MILLIS), (n * 1000).cast("string"))
        .when(logical == "io.debezium.time.MicroTimestamp", n.cast("string"))
        .when(logical == "io.debezium.time.NanoTimestamp", F.floor(n / 1000).cast("string"))
        .otherwise(rfc3339(as_text, naive_utc=False))
    )


#: how every column type's value is decoded from its Debezium logical type (:func:`_dbz_value`)
_DBZ_DECODE: Mapping[Kind, Callable[[Column, Column, Column, Column], Column]] = every_kind(
    "debezium._dbz_value",
    {
        Kind.DECIMAL: _dbz_decimal,
        Kind.DATE: _dbz_date,
        Kind.TIMESTAMP: _dbz_timestamp,
        **dict.fromkeys(
            (Kind.INT, Kind.BIGINT, Kind.STRING, Kind.BOOLEAN, Kind.DOUBLE, Kind.BINARY, Kind.UUID),
            _dbz_as_text,
        ),
    },
)


def debezium(
    raw: DataFrame,
    table: Table,
    options: Mapping[str, Any],
    legacy_ids: DataFrame | None = None,
) -> Adapted:
    """Debezium change events as an S3 sink writes them: one envelope per line, plain or
    wrapped as ``{"schema": …, "payload": …}`` (Kafka Connect's JsonConverter).
    ``legacy_ids``: ``common.canonical``'s."""
    decimals = [c for c in table.columns if c.type.kind is Kind.DECIMAL]
    unavailable = options.get("unavailable_value_placeholder", UNAVAILABLE)
    df = _dbz_envelopes(raw, decimals)
    df = df.select(
        "*",
        _dbz_text_map(table, AFTER, decimals, unavailable).alias("a_m"),
        _dbz_text_map(table, BEFORE, decimals, unavailable).alias("b_m"),
    )
    op = F.col("p.op")
    after, before = F.col("a_m"), F.col("b_m")
    old_key = F.when(has_key(table, before), key_map(table, before))
    new_key = F.when(has_key(table, after), key_map(table, after))
    src = F.col("p.source")
    # ns to µs in decimal arithmetic: a long divided by a long is a double in Spark, whose
    # 53 bits cannot hold a nanosecond time (…001999 ns would round up to …002 µs)
    ns_to_us = F.floor(src["ts_ns"].cast("decimal(20,0)") / 1000).cast("bigint")
    ts_us = F.coalesce(src["ts_us"], ns_to_us, src["ts_ms"] * 1000)
    order = F.col("p.transaction.data_collection_order")
    origin = _dbz_origin(options.get("origins", {}))
    problem = _dbz_problem(table, decimals, ts_us, old_key, origin)
    if options.get("transaction_metadata"):  # a snapshot's read is in no transaction
        missing = "no transaction.data_collection_order (options.transaction_metadata)"
        problem = F.coalesce(problem, F.when(order.isNull() & (op != "r"), F.lit(missing)))
    mapped = _mapped(df, op, problem, origin, ts_us, order, old_key, new_key)
    return Adapted(
        canonical(_placed(mapped, legacy_ids is not None), "debezium", table, legacy_ids)
    )


def _mapped(
    df: DataFrame,
    op: Column,
    problem: Column,
    origin: Column,
    ts_us: Column,
    order: Column,
    old_key: Column,
    new_key: Column,
) -> DataFrame:
    """The envelopes as canonical records' fields (``common.canonical`` finishes them)."""
    after, before = F.col("a_m"), F.col("b_m")
    src = F.col("p.source")
    return df.select(
        *LINE_COLUMNS,
        F.col("raw").alias("source"),
        problem.alias("problem"),
        F.when(op == "c", "INSERT")
        .when(op == "r", READ)  # docs/adapters.md#snapshot-reads: a read, not a write
        .when(op == "u", "UPDATE")
        .when(op == "d", "DELETE")
        .when(op == "t", "TRUNCATE")
        .alias(OP),
        F.when(op.isin("c", "r"), new_key)
        .when(op.isin("u", "d"), F.coalesce(old_key, new_key))
        .alias(KEY),
        F.when(
            (op == "u") & old_key.isNotNull() & (F.to_json(old_key) != F.to_json(new_key)),
            new_key,
        ).alias("new_key"),
        F.when(op.isin("c", "r", "u"), after).alias(AFTER),
        F.when(op.isin("u", "d"), before).alias(BEFORE),
        ts_us.cast("string").alias(TS),
        F.coalesce(F.col("p.origin"), origin).alias(ORIGIN),
        F.coalesce(src["txId"], F.col("p.transaction.id")).alias(TXID),
        F.coalesce(src["lsn"], line_order(F.col("fileno"), F.col("line"))).alias(SEQ),
        order.alias("order"),
        src["lsn"].alias("lsn"),
    )


def _placed(df: DataFrame, legacy: bool) -> DataFrame:
    """The id's place and ``pos`` (module docstring), and with ``legacy`` the place the
    ids before issue 49 gave (``common.legacy_number``)."""
    c = F.col
    digest = digest_place(c(REPLICA), c(ORIGIN), c(TS), c(OP), c(KEY), c("lsn"))
    place = F.when(c("order").isNotNull(), F.concat(F.lit("#p"), c("order").cast("string")))
    out = df.select(
        "*",
        place.otherwise(digest).alias("place"),
        F.coalesce(c("order"), c(SEQ)).alias(POS),
    )
    if legacy:
        out = out.withColumn("legacy_n", legacy_number(c(TXID), event_ts_micros(c(TS)), c(SEQ)))
    return out.drop("order", "lsn")


def _dbz_envelopes(raw: DataFrame, decimals: list[TableColumn]) -> DataFrame:
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
    df = file_parts(raw).select(
        "*",
        v.alias("v"),
        F.try_variant_get(payload, "$", _DBZ).alias("p"),
        F.when(wrapped, F.try_variant_get(v, "$.schema.fields", _DBZ_SCHEMA)).alias("sf"),
    )
    rows = F.filter(F.col("sf"), lambda f: f["field"].isin(AFTER, BEFORE))[0]["fields"]
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
                F.col("lt")[c.exported]["name"] == _DECIMAL,
                _decimal_unscaled(text(F.col(f"p.{part}")[c.exported])),
            ).alias(f"dec_{part}_{c.name}")
            for c in decimals
            for part in (AFTER, BEFORE)
        ],
    )


def _unavailable(kind: Kind, value: Column, placeholder: str) -> Column:
    """Whether a value is the connector's placeholder for a TOASTed value the change did
    not decode (text, or a ``bytea``'s bytes as base64 or hex)."""
    return _UNAVAILABLE[kind](value, placeholder)


def _unavailable_binary(value: Column, placeholder: str) -> Column:
    raw = placeholder.encode()
    return value.isin(base64.b64encode(raw).decode(), raw.hex())


#: which column types the connector's TOAST placeholder can stand in (:func:`_unavailable`)
_UNAVAILABLE: Mapping[Kind, Callable[[Column, str], Column]] = every_kind(
    "debezium._unavailable",
    {
        Kind.STRING: lambda value, placeholder: value == placeholder,
        Kind.BINARY: _unavailable_binary,
        **dict.fromkeys(
            (
                Kind.INT,
                Kind.BIGINT,
                Kind.BOOLEAN,
                Kind.DOUBLE,
                Kind.DECIMAL,
                Kind.DATE,
                Kind.TIMESTAMP,
                Kind.UUID,
            ),
            lambda value, placeholder: F.lit(False),
        ),
    },
)


def _dbz_text_map(table: Table, part: str, decimals: list[TableColumn], unavailable: str) -> Column:
    """The envelope's ``before`` or ``after`` as a map of canonical texts: the table's
    columns by their logical types, any other field as its JSON text. A column whose value
    is the placeholder of an unchanged TOASTed value is left out: the change did not
    write it."""
    m = F.col(f"p.{part}")
    entries = [
        F.when(
            F.map_contains_key(m, col.exported)
            & ~F.coalesce(
                _unavailable(col.type.kind, text(m[col.exported]), unavailable), F.lit(False)
            ),
            F.struct(
                F.lit(col.exported).alias("k"),
                _dbz_value(
                    table,
                    col.name,
                    m[col.exported],
                    F.col("lt")[col.exported]["name"],
                    F.col("lt")[col.exported]["scale"],
                    F.col(f"dec_{part}_{col.name}") if col in decimals else F.lit(None),
                ).alias("v"),
            ),
        )
        for col in table.columns
    ]
    known = F.filter(F.array(*entries), lambda e: e.isNotNull())
    extra = F.transform(
        F.filter(F.map_keys(m), lambda k: ~k.isin(*[c.exported for c in table.columns])),
        lambda k: F.struct(k.alias("k"), text(m[k]).alias("v")),
    )
    return F.when(m.isNotNull(), F.map_from_entries(F.concat(known, extra)))


def _dbz_origin(origins: Mapping[str, str]) -> Column:
    """The replica a change came from: the exporting replica's own change (no
    ``source.origin``), else the one its replication origin maps to (the manifest's
    ``options.origins``: a change another replica made, that this one applied through a
    subscription; docs/adapters.md); null when unmapped."""
    origin_map = (
        F.create_map(*[x for k, r in origins.items() for x in (F.lit(k), F.lit(r))])
        if origins
        else F.create_map().cast("map<string,string>")
    )
    named = F.col("p.source.origin")
    return F.when(named.isNull() | (named == ""), F.col(REPLICA)).otherwise(origin_map[named])


def _bytes_decimals(decimals: list[TableColumn]) -> Column:
    """The first decimal column of the change given as Debezium's bytes (base64) without
    the schema that says how to read them: its image, name and text (null: none)."""
    found = [
        F.when(
            F.col("sf").isNull()
            & text(F.col(f"p.{part}")[c.exported]).rlike(r"^[A-Za-z0-9+/]+=*$")
            & text(F.col(f"p.{part}")[c.exported]).try_cast("decimal(38,18)").isNull(),
            F.concat(
                F.lit(f"{part}.{c.name}: '"), text(F.col(f"p.{part}")[c.exported]), F.lit("'")
            ),
        )
        for c in decimals
        for part in (AFTER, BEFORE)
    ]
    return F.coalesce(*found) if found else F.lit(None).cast("string")


#: why a decimal given as bytes without a schema cannot be read (docs/adapters.md#debezium)
DECIMAL_BYTES = (
    " is a decimal as Debezium's bytes (decimal.handling.mode=precise), which only the "
    "schema says how to read: set decimal.handling.mode=string on the connector, or "
    "value.converter.schemas.enable=true"
)


def _dbz_problem(
    table: Table, decimals: list[TableColumn], ts_us: Column, old_key: Column, origin: Column
) -> Column:
    """Why a line is no change event the run can apply (null if it is one)."""
    op = F.col("p.op")
    src = F.col("p.source")
    as_bytes = _bytes_decimals(decimals)
    # a Decimal too long to decode reads as null: the record is malformed, not changed
    oversized = [
        (F.col("lt")[c.exported]["name"] == _DECIMAL)
        & text(F.col(f"p.{part}")[c.exported]).isNotNull()
        & F.col(f"dec_{part}_{c.name}").isNull()
        for c in decimals
        for part in (AFTER, BEFORE)
    ]
    return first_problem(
        [
            (F.col("bad").isNotNull(), F.col("bad")),
            (F.col("v").isNull(), "not JSON"),
            (F.col("p").isNull() | op.isNull(), "not a Debezium change event envelope"),
            (op == "m", "a Debezium message event (op m), not a row change"),
            (
                ~op.isin("c", "r", "u", "d", "t"),
                F.concat(F.lit("unknown op '"), op, F.lit("'")),
            ),
            table_check(table, src["schema"], src["table"], f"table {table.name}"),
            (
                origin.isNull(),
                F.concat(
                    F.lit("source.origin '"),
                    src["origin"],
                    F.lit("' is not mapped to a replica (the manifest's options.origins)"),
                ),
            ),
            (ts_us.isNull(), "no source.ts_ms, ts_us or ts_ns (the commit time)"),
            (as_bytes.isNotNull(), F.concat(as_bytes, F.lit(DECIMAL_BYTES))),
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
