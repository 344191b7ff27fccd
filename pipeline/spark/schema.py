"""Spark types of the config's column types, and the typed reading of JSON scalars.

Values arrive as the text of a JSON scalar (``from_json`` into ``map<string,string>`` keeps
presence and text). :func:`typed` turns that text into the column's type with Spark
built-ins; a non-null text that does not parse gives null, which the guards report as
``malformed`` (docs/rules.md#conflict-types).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipeline.core.columns import (
    CELLS,
    DEAD,
    DELETED_AT,
    EVENT_ID,
    EXPIRY,
    GROUPS,
    KEY,
    MARKER,
    ORIGIN,
    POS,
    RANK,
    STATE_DELETED,
    STATE_DELETED_AT,
    STATE_EVENT_ID,
    STATE_ORIGIN,
    STATE_TS,
    TOMB,
    TS,
    TTL,
)
from pipeline.core.config import Table
from pipeline.core.kinds import ColumnType, Kind, every_kind
from pipeline.core.policy import Granularity

_UUID_RE = r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\z"
TS_WITH_OFFSET_RE = r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})\z"


def spark_type(ct: ColumnType) -> T.DataType:
    """The Spark type of a column type (docs/configuration.md#column-types)."""
    return _SPARK_TYPES[ct.kind](ct)


#: every column type's Spark type (its name is ``KINDS[kind].spark``)
_SPARK_TYPES: Mapping[Kind, Callable[[ColumnType], T.DataType]] = every_kind(
    "schema.spark_type",
    {
        Kind.INT: lambda ct: T.IntegerType(),
        Kind.BIGINT: lambda ct: T.LongType(),
        Kind.DOUBLE: lambda ct: T.DoubleType(),
        Kind.DECIMAL: lambda ct: T.DecimalType(ct.precision, ct.scale),
        Kind.BOOLEAN: lambda ct: T.BooleanType(),
        Kind.DATE: lambda ct: T.DateType(),
        Kind.TIMESTAMP: lambda ct: T.TimestampType(),
        Kind.BINARY: lambda ct: T.BinaryType(),
        Kind.STRING: lambda ct: T.StringType(),
        Kind.UUID: lambda ct: T.StringType(),
    },
)


def typed(text: Column, ct: ColumnType) -> Column:
    """The JSON scalar's text as the column type; null when it does not parse."""
    return _TYPED[ct.kind](text, ct)


def _cast(text: Column, ct: ColumnType) -> Column:
    return text.try_cast(spark_type(ct))


def _timestamp(text: Column, ct: ColumnType) -> Column:
    """µs since the epoch, or RFC 3339 with its UTC offset."""
    return F.when(text.rlike(r"^-?\d+$"), F.timestamp_micros(text.try_cast(T.LongType()))).when(
        text.rlike(TS_WITH_OFFSET_RE), text.try_cast(T.TimestampType())
    )


#: how every column type reads a JSON scalar's text (:func:`typed`)
_TYPED: Mapping[Kind, Callable[[Column, ColumnType], Column]] = every_kind(
    "schema.typed",
    {
        Kind.STRING: lambda text, ct: text,
        Kind.UUID: lambda text, ct: F.when(text.rlike(_UUID_RE), F.lower(text)),
        Kind.BOOLEAN: lambda text, ct: F.when(text == "true", F.lit(True)).when(
            text == "false", F.lit(False)
        ),
        Kind.DATE: lambda text, ct: F.when(
            text.rlike(r"^\d{4}-\d{2}-\d{2}$"), text.try_cast(T.DateType())
        ),
        Kind.TIMESTAMP: _timestamp,
        Kind.BINARY: lambda text, ct: F.try_to_binary(text, F.lit("base64")),
        Kind.INT: _cast,
        Kind.BIGINT: _cast,
        Kind.DOUBLE: _cast,
        Kind.DECIMAL: _cast,
    },
)


def event_ts_micros(text: Column) -> Column:
    """docs/rules.md#conflict-types/docs/rules.md#fine-points: ``ts`` is µs since
    the epoch or RFC 3339 *with* a UTC offset."""
    return F.when(text.rlike(r"^-?\d+$"), text.try_cast(T.LongType())).when(
        text.rlike(TS_WITH_OFFSET_RE), F.unix_micros(text.try_cast(T.TimestampType()))
    )


def row_struct_type(table: Table) -> T.StructType:
    return T.StructType([T.StructField(c.name, spark_type(c.type)) for c in table.columns])


def key_struct_type(table: Table) -> T.StructType:
    return T.StructType([T.StructField(c, spark_type(table.column(c).type)) for c in table.key])


#: docs/rules.md#column-groups: a row's stamp per column group, as JSON ``{group: [ts, rank,
#: event_id, origin]}`` (``events.Version.groups``)
META_FIELDS = [
    T.StructField(STATE_TS, T.LongType()),
    T.StructField(STATE_ORIGIN, T.StringType()),
    T.StructField(STATE_EVENT_ID, T.StringType()),
    T.StructField(STATE_DELETED, T.BooleanType()),
    T.StructField(STATE_DELETED_AT, T.LongType()),
]


def cell_meta_fields(table: Table) -> list[T.StructField]:
    """What a cell table keeps per key besides the readable row (docs/rules.md#cell-rules,
    docs/rules.md#tombstones-and-gc_grace_seconds): every cell as
    written (``_cells.<column>``: the value even once expired, its ts, ttl, expiry, or
    its deletion), the row marker and the row tombstone. The table tombstone of a
    TRUNCATE is a state row whose key columns are null."""
    L, S, B = T.LongType(), T.StringType(), T.BooleanType()
    cell = [
        (TS, L),
        (TTL, L),
        (EXPIRY, L),
        (DEAD, B),
        (DELETED_AT, L),
        (ORIGIN, S),
        (EVENT_ID, S),
    ]
    cells = T.StructType(
        [
            T.StructField(
                c.name,
                T.StructType(
                    [T.StructField("value", spark_type(c.type))]
                    + [T.StructField(n, t) for n, t in cell]
                ),
            )
            for c in table.columns
            if c.name not in table.key
        ]
    )
    marker = T.StructType([T.StructField(n, t) for n, t in cell if n not in (DEAD, DELETED_AT)])
    tomb = T.StructType(
        [T.StructField(n, t) for n, t in ((TS, L), (DELETED_AT, L), (ORIGIN, S), (EVENT_ID, S))]
    )
    return [
        T.StructField(CELLS, cells),
        T.StructField(MARKER, marker),
        T.StructField(TOMB, tomb),
    ]


def state_schema(table: Table) -> T.StructType:
    """The state kept between runs: the table's columns (for a cell table, what a reader
    sees), then the metadata (docs/rules.md#terms,
    docs/rules.md#tombstones-and-gc_grace_seconds)."""
    extra = cell_meta_fields(table) if table.granularity is Granularity.CELL else []
    if table.column_groups:  # docs/rules.md#column-groups: null while every group is the row's
        extra.append(T.StructField(GROUPS, T.StringType()))
    return T.StructType(list(row_struct_type(table).fields) + META_FIELDS + extra)


def change_schema(table: Table) -> T.StructType:
    """What the resolve stage hands the CDC stage: one row per change an event made to a
    row a reader sees (``rowfold.visible_changes``; docs/cdc.md#entries). ``pos`` orders the
    events of one transaction (``frames.copy_schema``), ``idx`` the changes of one event;
    ``values`` holds the key and the values of ``cols`` (the value columns written or
    cleared), ``ttl`` and ``expiry`` (s) those of a cell table's TTL writes; ``pre`` and
    ``post`` the live row before and after."""
    row = row_struct_type(table)
    L, S, Int = T.LongType(), T.StringType(), T.IntegerType()
    fields = [
        (EVENT_ID, S),
        (TS, L),
        (RANK, Int),
        (POS, L),
        ("idx", Int),
        ("kind", S),
        (KEY, key_struct_type(table)),
        ("values", row),
        ("cols", T.ArrayType(S)),
        (TTL, L),
        (EXPIRY, L),
        ("pre", row),
        ("post", row),
    ]
    return T.StructType([T.StructField(n, t) for n, t in fields])


def snapshot_columns(table: Table) -> list[str]:
    return [*table.column_names, STATE_TS, STATE_ORIGIN]


def snapshot_schema(table: Table) -> T.StructType:
    """The snapshot's columns (:func:`snapshot_columns`) as the state has them."""
    fields = {f.name: f for f in state_schema(table).fields}
    return T.StructType([fields[c] for c in snapshot_columns(table)])
