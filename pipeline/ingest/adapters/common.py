"""What the adapters share: reading values, the canonical record they all produce, and
the event id rule (docs/adapters.md "Event ids").

**The id.** ``<origin>@<commit µs>/<op>/<old key><place>``: what every copy of a change
keeps (its origin, its origin's commit time, the op and the key it changed), then its
*place*, which tells it apart from the other changes of its transaction and is as stable
as the format allows:

- ``#<n>``: the change is the n-th change with this op of this key in its transaction,
  counted by its position in the transaction, which the adapter assembled whole
  (wal2json: :mod:`pipeline.ingest.adapters.wal2json`). Counting per key keeps the id when a
  replica's apply skipped another change of the transaction (PostgreSQL skips an UPDATE
  of a missing row), which would shift a position counted over the whole transaction;
- ``#p<k>``: the change's position in its transaction, as the export carries it (Debezium
  with ``provide.transaction.metadata``: ``data_collection_order``);
- ``~<digest>#<n>``: where no position is known, a digest of the change (its new key,
  after and before images) and its occurrence among the identical changes of its
  transaction in this export, counted by the export's own order of them (Debezium's LSN,
  DMS's change sequence); without such an order, identical changes of one transaction on
  one key are one event (a replica's second copy: a duplicate in the report).

The order of one transaction's changes is ``pos`` (the canonical record's, and the
canonical order's after ``ts`` and the origin's rank: ``events.Event.position``), never
the id's text.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from pipeline.core.columns import (
    AFTER,
    BEFORE,
    EVENT_ID,
    KEY,
    OP,
    ORIGIN,
    POS,
    REPLICA,
    SEQ,
    TS,
    TXID,
)
from pipeline.core.config import Table
from pipeline.spark.schema import event_ts_micros


@dataclass(frozen=True)
class Adapted:
    """An adapter's export mapped: its canonical records (``replica, file, line, raw``)
    and the lines that wait for a later export (wal2json's transactions without their
    commit yet: :data:`pipeline.ingest.pending.SCHEMA`'s columns but the run's), or None."""

    records: DataFrame
    waiting: DataFrame | None = None
    #: what both were read from, kept while they are written (:meth:`release` after)
    kept: DataFrame | None = None

    def release(self) -> None:
        if self.kept is not None:
            self.kept.unpersist()


def text(v: Column) -> Column:
    """A VARIANT scalar as text (a JSON string unquoted, a number with its digits); an
    object or array as its JSON."""
    return F.when(
        ~F.is_variant_null(v), F.coalesce(F.try_variant_get(v, "$", "string"), F.to_json(v))
    )


def rfc3339(ts: Column, naive_utc: bool) -> Column:
    """PostgreSQL's and DMS's timestamp text as RFC 3339: ``+00`` becomes ``+00:00``, and
    with ``naive_utc`` a timestamp without offset is read as UTC."""
    with_offset = F.regexp_replace(ts, r"([+-]\d{2})$", "$1:00")
    if not naive_utc:
        return with_offset
    return F.when(ts.rlike(r"([+-]\d{2}(:?\d{2})?|[Zz])$"), with_offset).otherwise(
        F.concat(ts, F.lit("Z"))
    )


def key_map(table: Table, m: Column) -> Column:
    """The key columns of a text map, in key order, by the names the exports give them
    (docs/configuration.md#column-names); null when the map is null."""
    names = [table.exported(c) for c in table.key]
    return F.when(
        m.isNotNull(),
        F.map_from_arrays(F.array(*[F.lit(c) for c in names]), F.array(*[m[c] for c in names])),
    )


def has_key(table: Table, m: Column) -> Column:
    names = [table.exported(c) for c in table.key]
    parts = [F.coalesce(F.map_contains_key(m, c), F.lit(False)) for c in names]
    out = parts[0]
    for p in parts[1:]:
        out = out & p
    return out


def file_parts(df: DataFrame) -> DataFrame:
    """``fileno`` (the file's place in the manifest) from the staged file's name."""
    name = F.regexp_extract(F.input_file_name(), r"part-(\d+)\.parquet$", 1)
    return df.withColumn("fileno", name.cast("bigint"))


def line_order(fileno: Column, line: Column) -> Column:
    """An export's record order when the source gives no log position: file, then line."""
    return fileno * (1 << 32) + line


#: where each canonical record came from (``file_parts``), first in every adapter's output
LINE_COLUMNS = (REPLICA, "file", "line", "fileno")


def first_problem(checks: list[tuple[Column, str | Column]]) -> Column:
    return F.coalesce(
        *[F.when(cond, F.lit(msg) if isinstance(msg, str) else msg) for cond, msg in checks]
    )


def table_check(table: Table, schema: Column, name: Column, what: str) -> tuple[Column, Column]:
    qualified = F.concat_ws(".", schema, name)
    return (
        name.isNotNull() & (name != table.name) & (qualified != table.name),
        F.concat(F.lit("a change of table "), qualified, F.lit(f" in an export of {what}")),
    )


def op_letter(op: Column) -> Column:
    return F.substring(op, 1, 1)


def occurrence(partition: list[Column], order: Column) -> Column:
    """The place of a change among those of ``partition`` (a transaction, and what else
    the place counts by) in ``order``: 1, 2, ...; copies with the same ``order`` (one
    change sent twice) share it."""
    return F.dense_rank().over(Window.partitionBy(*partition).orderBy(order))


def digest_place(
    replica: Column, origin: Column, ts: Column, op: Column, key: Column, order: Column | None
) -> Column:
    """``~<digest>#<n>`` (module docstring) for a frame with ``new_key``, ``after`` and
    ``before`` (text maps); ``order``: the export's order of the changes (none: identical
    changes are one)."""
    content = F.to_json(F.struct(F.col("new_key"), F.col(AFTER), F.col(BEFORE)))
    digest = F.lpad(F.lower(F.hex(F.xxhash64(content))), 16, "0")  # Spark's seed: stable
    same = [replica, origin, ts, op, F.to_json(key), digest]
    n = F.lit(1) if order is None else occurrence(same, order)
    return F.concat(F.lit("~"), digest, F.lit("#"), n.cast("string"))


def _event_id(origin: Column, ts_us: Column, op: Column, key: Column, place: Column) -> Column:
    return F.concat(
        origin,
        F.lit("@"),
        ts_us.cast("string"),
        F.lit("/"),
        op_letter(op),
        F.lit("/"),
        F.coalesce(F.to_json(key), F.lit("")),
        place,
    )


def legacy_number(txid: Column, ts_us: Column, seq: Column) -> Column:
    """The ``n`` of the ids the adapters made before issue 49: a change's place among the
    changes of its transaction in the night's export (``txid``, the commit µs), by
    ``seq``, then file and line."""
    w = Window.partitionBy(F.col(REPLICA), txid, ts_us).orderBy(seq, "fileno", "line")
    return F.row_number().over(w)


def _legacy_id(origin: Column, ts_us: Column, op: Column, key: Column, n: Column) -> Column:
    """The id the adapters made before issue 49 (``<origin>@<commit µs>#<n>/<op>/<key>``,
    ``n`` zero-padded: :func:`legacy_number`)."""
    return F.concat(
        origin,
        F.lit("@"),
        ts_us.cast("string"),
        F.lit("#"),
        F.lpad(n.cast("string"), 10, "0"),
        F.lit("/"),
        op_letter(op),
        F.lit("/"),
        F.coalesce(F.to_json(key), F.lit("")),
    )


def canonical(
    df: DataFrame, fmt: str, table: Table, legacy_ids: DataFrame | None = None
) -> DataFrame:
    """``replica, file, line, raw`` from the adapter's columns ``op, key, new_key, after,
    before, ts, origin, txid, seq, pos, place, problem, source`` (maps of text, text
    scalars; ``place``: the id's last part, module docstring).

    ``legacy_ids`` (``event_id``): the ids of the ledger's window that runs before issue
    49 wrote, while the window holds some (docs/adapters.md "Upgrading"); a change whose
    id by that rule (``legacy_n``: :func:`legacy_number`) is among them takes it, so that
    an earlier night's event is not resolved again under its new id."""
    ts_us = event_ts_micros(F.col(TS))
    problem = F.coalesce(
        F.col("problem"),
        F.when(F.col(TS).isNull(), F.lit("no commit timestamp")),
        F.when(
            ts_us.isNull(),
            F.concat(F.lit("commit timestamp '"), F.col(TS), F.lit("' cannot be read")),
        ),
    )
    df = df.withColumn("problem", problem).withColumn("ts_us", ts_us)
    origin, key, op = F.col(ORIGIN), F.col(KEY), F.col(OP)
    event_id = _event_id(origin, F.col("ts_us"), op, key, F.col("place"))
    if legacy_ids is not None:
        old = _legacy_id(origin, F.col("ts_us"), op, key, F.col("legacy_n"))
        known = legacy_ids.select(F.col(EVENT_ID).alias("_legacy"), F.lit(True).alias("_known"))
        df = df.withColumn("_legacy", old).join(known, "_legacy", "left")
        event_id = F.when(F.col("_known"), F.col("_legacy")).otherwise(event_id)
    good = F.to_json(
        F.struct(
            F.col(OP),
            F.col(KEY),
            F.col("new_key"),
            F.col(AFTER),
            F.col(BEFORE),
            F.col("ts_us").alias(TS),
            F.col(ORIGIN),
            event_id.alias(EVENT_ID),
            F.col(TXID),
            F.col(SEQ),
            F.col(POS),
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
        REPLICA,
        "file",
        "line",
        F.when(F.col("problem").isNull(), good).otherwise(bad).alias("raw"),
    )
