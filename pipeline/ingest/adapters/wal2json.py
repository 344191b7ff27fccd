"""PostgreSQL's logical decoding through wal2json, format 2 (one action per line, with
``include-xids``, ``include-timestamp``, ``include-origin`` and ``include-lsn``), mapped
to canonical records on Spark.

**Whole transactions.** wal2json frames each transaction with ``B`` and ``C`` actions
(each with the transaction's xid, its commit time and origin). A change is mapped only
once its transaction is whole: its ``B``, its changes and its ``C`` in this export or in
the lines earlier exports left waiting (``carried``). Then a change's position in the
transaction is known wherever the files and nights were cut, and so are its ``pos`` (the
order of the transaction's changes of this table) and its id's place (its occurrence
among the transaction's changes with its op and key, ``pipeline.ingest.adapters.common``). A
transaction without its ``C`` waits: its lines are returned apart (``Adapted.waiting``),
published as the table's pending lines, and read again by the next night
(``pipeline.ingest.pending``). Its changes are quarantined (``malformed``) when no export this
run reads has the transaction's ``B`` (its start is lost: their places are unknown), or
when it has waited past ``give_up_before``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import date
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from pipeline.core.columns import AFTER, BEFORE, KEY, OP, ORIGIN, POS, REPLICA, SEQ, TS, TXID
from pipeline.core.config import Table
from pipeline.core.kinds import Kind, every_kind
from pipeline.ingest.adapters.common import (
    LINE_COLUMNS,
    Adapted,
    canonical,
    file_parts,
    first_problem,
    has_key,
    key_map,
    legacy_number,
    occurrence,
    rfc3339,
    table_check,
    text,
)
from pipeline.ingest.adapters.options import FRAMING
from pipeline.spark.schema import event_ts_micros

_W2J = (
    "action string, xid string, timestamp string, origin string, lsn string, "
    "schema string, table string, "
    "columns array<struct<name string, value variant>>, "
    "identity array<struct<name string, value variant>>"
)
#: the actions of a transaction: its framing, and its changes
_FRAMING = ("B", "C")
_CHANGES = ("I", "U", "D", "T")
#: the columns of a staged line (``staging.RAW_SCHEMA``) and the date of the export that
#: held it (null: this run's)
RAW_COLUMNS = (REPLICA, "file", "line", "raw", "bad")


def _pg_value(table: Table, name: Column, value: Column) -> Column:
    """The canonical text of a PostgreSQL value's text, by the column's configured type."""
    out = value
    for col in table.columns:
        canonical_text = _PG_TEXT[col.type.kind]
        if canonical_text is not None:
            out = F.when(name == col.exported, canonical_text(value)).otherwise(out)
    return out


def _pg_bytea(value: Column) -> Column:
    """A ``bytea`` as base64: wal2json's format 2 writes its hex digits (PostgreSQL's own
    text puts ``\\x`` before them, read too); a text that is not hex stays as it is (the
    binary reader makes it malformed unless it is base64)."""
    digits = F.regexp_replace(value, r"^\\x", "")
    hexed = F.when(digits.rlike("^([0-9A-Fa-f]{2})*$"), F.base64(F.unhex(digits)))
    return F.coalesce(hexed, value)


#: how every column type's PostgreSQL text becomes canonical (:func:`_pg_value`); None:
#: the text is canonical already
_PG_TEXT: Mapping[Kind, Callable[[Column], Column] | None] = every_kind(
    "wal2json._pg_value",
    {
        Kind.TIMESTAMP: lambda value: rfc3339(value, naive_utc=True),
        Kind.BINARY: _pg_bytea,
        **dict.fromkeys(
            (
                Kind.INT,
                Kind.BIGINT,
                Kind.STRING,
                Kind.BOOLEAN,
                Kind.DOUBLE,
                Kind.DECIMAL,
                Kind.DATE,
                Kind.UUID,
            ),
            None,
        ),
    },
)


def _lsn(value: Column) -> Column:
    """A PostgreSQL LSN ``X/Y`` as the 64-bit integer it stands for."""
    hi = F.conv(F.regexp_extract(value, r"^([0-9A-Fa-f]{1,8})/", 1), 16, 10).cast("bigint")
    lo = F.conv(F.regexp_extract(value, r"/([0-9A-Fa-f]{1,8})$", 1), 16, 10).cast("bigint")
    return F.when(value.rlike(r"^[0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}$"), hi * (1 << 32) + lo)


def _lines(raw: DataFrame, carried: DataFrame | None) -> DataFrame:
    """This export's staged lines and the lines earlier exports left waiting (``carried``:
    their ``exported`` date set, before this export's files)."""
    tonight = file_parts(raw).withColumn("exported", F.lit(None).cast("date"))
    if carried is None:
        return tonight
    earlier = carried.select(*RAW_COLUMNS, F.lit(-1).cast("bigint").alias("fileno"), "exported")
    return tonight.unionByName(earlier)


def _transactions(df: DataFrame, table: Table) -> DataFrame:
    """Each line's transaction (``in_tx``: a framing or change action with its xid and
    commit time), whether the lines hold its ``B`` and its ``C`` (framing as staging
    counts it: ``options.FRAMING``), and, for a change of this table, its LSN, which orders
    the transaction's changes (``pos``: with whole transactions, the copies that stand for
    one transaction's events are one replica's), and its occurrence with its op and key
    (``n``, by position: a change sent twice keeps one). One exchange and one sort: the
    lines by transaction, then by op, key and LSN, which both windows read."""
    act, p = F.col("p.action"), F.col("p")
    in_tx = act.isin(*_FRAMING, *_CHANGES) & p["xid"].isNotNull() & p["timestamp"].isNotNull()
    other, _ = table_check(table, p["schema"], p["table"], "")
    df = df.select(
        "*",
        F.col("raw").rlike(FRAMING["wal2json"].pattern.decode()).alias("framing"),
        in_tx.alias("in_tx"),
        (in_tx & act.isin(*_CHANGES) & ~F.coalesce(other, F.lit(False))).alias("change"),
        F.to_json(F.col(KEY)).alias("key_text"),
        _lsn(p["lsn"]).alias("at"),
    )
    tx = [F.col(c) for c in (REPLICA, "p.xid", "p.timestamp", "in_tx")]
    same = [*tx, F.col("change"), act, F.col("key_text")]
    df = df.repartition(*tx).sortWithinPartitions(*same, "at")
    whole = Window.partitionBy(*tx)
    framing = F.col("framing")
    return df.select(
        "*",
        F.max((framing & (act == "B")).cast("int")).over(whole).alias("has_b"),
        F.max((framing & (act == "C")).cast("int")).over(whole).alias("has_c"),
        F.when(F.col("change"), F.col("at")).alias(POS),
        F.when(F.col("change"), occurrence(same, F.col("at"))).alias("n"),
    )


def _state_of(give_up_before: date | None) -> tuple[Column, Column, Column]:
    """Whether a line is framing, waits for its transaction's commit, and why its change
    cannot be placed (null: it can)."""
    framing = F.col("framing")
    open_tx = F.col("in_tx") & (F.col("has_b") == 1) & (F.col("has_c") == 0)
    stale = F.lit(False)
    if give_up_before is not None:
        stale = F.coalesce(F.col("exported") < F.lit(give_up_before), F.lit(False))
    headless = F.col("in_tx") & (F.col("has_b") == 0)
    unplaced = F.when(
        headless,
        F.concat(
            F.lit("its transaction (xid "),
            F.col("p.xid"),
            F.lit(") began in an export this run does not hold (no action B): its place "),
            F.lit("in the transaction is unknown"),
        ),
    ).when(
        open_tx & stale,
        F.lit("its transaction's commit (action C) came in no export within gc_grace_seconds"),
    )
    return framing, open_tx & ~stale, unplaced


def _parsed(lines: DataFrame, table: Table) -> DataFrame:
    """Each line parsed (``v``, ``p``), its columns and identity as maps of canonical
    texts (``c_m``, ``i_m``) and the key its change names (``key``)."""
    v = F.try_parse_json("raw")
    p = F.try_variant_get(v, "$", _W2J)
    df = lines.select("*", v.alias("v"), p.alias("p"))
    act = F.col("p.action")

    def text_map(arr: Column) -> Column:
        return F.when(
            arr.isNotNull(),
            F.map_from_entries(
                F.transform(
                    arr,
                    lambda c: F.struct(c["name"], _pg_value(table, c["name"], text(c["value"]))),
                )
            ),
        )

    df = df.select(
        "*", text_map(F.col("p.columns")).alias("c_m"), text_map(F.col("p.identity")).alias("i_m")
    )
    key = F.when(act == "I", _new_key(table)).otherwise(
        F.coalesce(_old_key(table), _new_key(table))
    )
    return df.withColumn(KEY, F.when(act.isin("I", "U", "D"), key))


def _old_key(table: Table) -> Column:
    return F.when(has_key(table, F.col("i_m")), key_map(table, F.col("i_m")))


def _new_key(table: Table) -> Column:
    return key_map(table, F.col("c_m"))


def wal2json(
    raw: DataFrame,
    table: Table,
    options: Mapping[str, Any],
    carried: DataFrame | None = None,
    give_up_before: date | None = None,
    legacy_ids: DataFrame | None = None,
) -> Adapted:
    """wal2json format 2: the I, U, D, T actions of this table, from whole transactions
    (module docstring). ``raw``: the export's staged lines (``staging.RAW_SCHEMA``, its
    framing too); ``carried``: the lines earlier exports left waiting (their ``exported``
    date with them); ``legacy_ids``: ``common.canonical``'s."""
    df = _transactions(_parsed(_lines(raw, carried), table), table)
    framing, waiting, unplaced = _state_of(give_up_before)
    act, old_key, new_key = F.col("p.action"), _old_key(table), _new_key(table)
    origin = _w2j_origin(options.get("origins", {}))
    changed = (act == "U") & old_key.isNotNull() & (F.to_json(old_key) != F.to_json(new_key))
    ts = rfc3339(F.col("p.timestamp"), naive_utc=False)
    legacy = []
    if legacy_ids is not None:  # numbered before the lines that wait are set apart
        tonight = F.col("exported").isNull() & ~framing
        df = df.withColumn("legacy_n", _legacy_n(tonight, ts))
        legacy = ["legacy_n"]
    # mapped once for both outputs: the records, and the lines that wait
    mapped = (
        df.where(~framing | waiting)
        .select(
            waiting.alias("waits"),
            "bad",
            "exported",
            *LINE_COLUMNS,
            F.col("raw").alias("source"),
            F.coalesce(_w2j_problem(table, origin), unplaced).alias("problem"),
            F.when(act == "I", "INSERT")
            .when(act == "U", "UPDATE")
            .when(act == "D", "DELETE")
            .when(act == "T", "TRUNCATE")
            .alias(OP),
            KEY,
            F.when(changed, new_key).alias("new_key"),
            F.when(act.isin("I", "U"), F.col("c_m")).alias(AFTER),
            F.when(act.isin("U", "D"), F.col("i_m")).alias(BEFORE),
            ts.alias(TS),
            origin.alias(ORIGIN),
            F.col("p.xid").alias(TXID),
            _lsn(F.col("p.lsn")).alias(SEQ),
            F.col(POS).cast("bigint").alias(POS),
            F.concat(F.lit("#"), F.col("n").cast("string")).alias("place"),
            *legacy,
        )
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    records = mapped.where(~F.col("waits"))
    kept = mapped.where("waits").select(
        *RAW_COLUMNS[:3], F.col("source").alias("raw"), "bad", "exported"
    )
    return Adapted(canonical(records, "wal2json", table, legacy_ids), kept, mapped)


def _legacy_n(tonight: Column, ts: Column) -> Column:
    """The place the ids before issue 49 gave a change: among the night's lines of its
    transaction (``common.legacy_number``); null for the lines earlier exports held."""
    seq = _lsn(F.col("p.lsn"))
    n = legacy_number(F.struct(F.col("p.xid"), tonight), event_ts_micros(ts), seq)
    return F.when(tonight, n)


def _w2j_origin(origins: Mapping[str, str]) -> Column:
    """The replica an action came from: the exporting replica for a local change, else
    the one its replication origin maps to (the manifest's ``options.origins``)."""
    origin_map = (
        F.create_map(*[x for k, r in origins.items() for x in (F.lit(k), F.lit(r))])
        if origins
        else F.create_map().cast("map<string,string>")
    )
    local = F.col("p.origin").isNull() | (F.col("p.origin") == "0")
    return F.when(local, F.col(REPLICA)).otherwise(origin_map[F.col("p.origin")])


def _w2j_problem(table: Table, origin: Column) -> Column:
    """Why a line is no row change the run can apply (null if it is one)."""
    act = F.col("p.action")
    return first_problem(
        [
            (F.col("bad").isNotNull(), F.col("bad")),
            (F.col("v").isNull(), "not JSON"),
            (F.col("p").isNull() | act.isNull(), "not a wal2json format-2 action"),
            (act == "M", "a logical decoding message (action M), not a row change"),
            (
                ~act.isin(*_FRAMING, *_CHANGES),
                F.concat(F.lit("unknown action '"), act, F.lit("'")),
            ),
            (act.isin(*_FRAMING), "transaction framing without its xid or commit time"),
            table_check(table, F.col("p.schema"), F.col("p.table"), f"table {table.name}"),
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
