"""The CDC stage: the history of every converged table as a ScyllaDB-style CDC log, with
its generations and streams-description tables (docs/cdc.md).

Input: the changes the resolve stage recorded (``resolved/<table>/changes``: what each
applied event did to the row a reader sees, ``schema.change_schema``) and the rows a
foreign-key quarantine removed. Output, under ``resolved/cdc/``: the log of each table and
the four description tables, which the publish stage writes with the run's tables.

- **Order**: ``cdc$time`` is a version-1 timeuuid whose time is the event's ``ts`` and
  whose other 55 bits are ``tie_rank + 1`` (9 bits), the event's position among the events
  of its origin at that microsecond ordered by event id (23 bits), and 23 bits of the event
  id's hash. Timeuuids compare by time, then by those bytes (each kept below 0x80, so
  Cassandra's signed and Scylla's unsigned byte comparisons agree), so the log in
  ``(cdc$time, cdc$batch_seq_no)`` order is the canonical order of
  docs/rules.md#the-canonical-order, and a rerun gives the same values.
- **Streams**: each row goes to the stream of its key's token in the generation
  operating at its ``ts`` (``pipeline.changes.streams``), so late events land in old generations.
- **Rows of an event**: optional pre-image (``cdc$operation`` 0), the change (1 update,
  2 insert, 3 row delete, 4 partition delete), optional post-image (9); numbered by
  ``cdc$batch_seq_no`` per stream, ``cdc$end_of_batch`` on the event's last row in it.
- **Removals**: a row moved out by ``on_fk_violation: quarantine`` is a row delete after
  every event of the run (at ``now + max_clock_skew``, the latest ``ts`` a run applies).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipeline.changes.streams import Generation, Generations, StreamId, Topology, next_generations
from pipeline.changes.tokens import serialize_key, tokens
from pipeline.core.columns import EVENT_ID, EXPIRY, KEY, OP, POS, RANK, SEQ, TS, TTL
from pipeline.core.config import CdcConfig, Config, Table
from pipeline.core.policy import CDC_POST_IMAGE, CDC_PRE_IMAGE, ChangeKind
from pipeline.core.summary import CdcSection, CdcTable, RunSummary
from pipeline.spark.schema import change_schema, row_struct_type
from pipeline.storage.context import RunContext
from pipeline.storage.outputs import read_output, write_output
from pipeline.storage.workpath import WorkPath, read_folder, write_table

log = logging.getLogger(__name__)

#: 100-ns intervals between the UUID epoch (1582-10-15) and the Unix epoch
UUID_EPOCH_OFFSET = 0x01B21DD213814000
ORDINAL_BITS = 23
HASH_BITS = 23
RANK_BITS = 9
#: the tie rank of the pipeline's own removals: after every replica's events
PIPELINE_RANK = 2**RANK_BITS - 2


# ---------------------------------------------------------------------- the tables

_TIME = pa.timestamp("us", tz="UTC")
_PAIR = pa.struct([("hi", pa.int64()), ("lo", pa.int64())])
SCHEMAS = {
    "cdc_generation_descriptions": pa.schema(
        [
            ("time", _TIME),
            (
                "description",
                pa.list_(
                    pa.struct(
                        [
                            ("token_range_end", pa.int64()),
                            ("streams", pa.list_(_PAIR)),
                            ("sharding_ignore_msb", pa.int8()),
                        ]
                    )
                ),
            ),
            ("expired", _TIME),
        ]
    ),
    "cdc_streams_descriptions": pa.schema(
        [
            ("time", _TIME),
            (
                "streams",
                pa.list_(pa.struct([("hi", pa.int64()), ("lo", pa.int64()), ("id", pa.string())])),
            ),
            ("expired", _TIME),
        ]
    ),
    "cdc_streams_descriptions_v2": pa.schema(
        [("time", _TIME), ("range_end", pa.int64()), ("streams", pa.list_(pa.binary(16)))]
    ),
    "cdc_generation_timestamps": pa.schema([("time", _TIME), ("expired", _TIME)]),
}


def _pair(s: StreamId) -> dict[str, int]:
    return {"hi": s.hi, "lo": s.lo}


def description_tables(gens: list[Generation]) -> dict[str, pa.Table]:
    """The four tables of docs/cdc.md, one row per generation (``_v2``: per generation and
    range). Stream lists are in range and shard order."""
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in SCHEMAS}
    for g in gens:
        common = {"time": g.time, "expired": g.expired}
        rows["cdc_generation_descriptions"].append(
            common
            | {
                "description": [
                    {
                        "token_range_end": end,
                        "streams": [_pair(s) for s in streams],
                        "sharding_ignore_msb": g.ignore_msb,
                    }
                    for end, streams in zip(g.ends, g.streams, strict=True)
                ]
            }
        )
        rows["cdc_streams_descriptions"].append(
            common | {"streams": [_pair(s) | {"id": s.hex()} for s in g.all_streams()]}
        )
        rows["cdc_streams_descriptions_v2"] += [
            {"time": g.time, "range_end": end, "streams": [s.to_bytes() for s in streams]}
            for end, streams in zip(g.ends, g.streams, strict=True)
        ]
        rows["cdc_generation_timestamps"].append(dict(common))
    out = {}
    for name, schema in SCHEMAS.items():
        out[name] = pa.Table.from_pylist(rows[name], schema=schema)
    return out


def write_description_tables(gens: list[Generation], dest: WorkPath) -> None:
    for name, t in description_tables(gens).items():
        write_table(t, dest / name / "part-00000.parquet")


def _micros(v: Any) -> int | None:
    if v is None:
        return None
    return int(pa.scalar(v, _TIME).cast(pa.int64()).as_py())


def read_generations(folder: WorkPath) -> list[Generation]:
    """The generations of a staged ``cdc_generation_descriptions`` (stream ids as stored:
    a later change of how ids are made never renames an existing stream)."""
    rows = read_folder(folder)
    return generations([] if rows is None else rows.to_pylist())


def generations(rows: list[dict[str, Any]]) -> list[Generation]:
    """The rows of ``cdc_generation_descriptions`` as generations, oldest first."""
    gens = []
    for r in rows:
        desc = r["description"]
        gens.append(
            Generation(
                _micros(r["time"]) or 0,
                tuple(d["token_range_end"] for d in desc),
                tuple(tuple(StreamId(s["hi"], s["lo"]) for s in d["streams"]) for d in desc),
                desc[0]["sharding_ignore_msb"] if desc else 0,
                _micros(r["expired"]),
            )
        )
    return sorted(gens, key=lambda g: g.time)


# ---------------------------------------------------------------------- columns


def stream_id_column(table: Table, gens: Generations) -> Column:
    """``cdc$stream_id`` (16 bytes) of each row from its ``key`` and ``ts``: the token
    (``pipeline.changes.tokens``) and the stream lookup run vectorized on Arrow batches."""
    types = [table.column(c).type for c in table.key]

    @F.arrow_udf(T.BinaryType())  # type: ignore[call-overload]
    def stream_id(ts: pa.Array, key: pa.Array) -> pa.Array:
        toks = tokens(serialize_key([key.field(i) for i in range(len(types))], types))
        ids = gens.stream_ids(toks, ts.to_numpy(zero_copy_only=False))
        raw = np.ascontiguousarray(ids.astype(">i8")).view(np.uint8)
        fixed = pa.FixedSizeBinaryArray.from_buffers(
            pa.binary(16), len(ids), [None, pa.py_buffer(raw.tobytes())]
        )
        return fixed.cast(pa.binary())

    return stream_id(F.col(TS), F.col(KEY))


def _hex(value: Column, digits: int) -> Column:
    return F.lower(F.lpad(F.hex(value), digits, "0"))


def timeuuid(ts: Column, rank: Column, ordinal: Column, event_id: Column) -> Column:
    """The version-1 timeuuid text of ``cdc$time`` (module docstring)."""
    ticks = ts * 10 + F.lit(UUID_EPOCH_OFFSET)
    order = (
        (rank + 1).cast("long") * F.lit(2 ** (ORDINAL_BITS + HASH_BITS))
        + ordinal.cast("long") * F.lit(2**HASH_BITS)
        + F.xxhash64(event_id).bitwiseAND(F.lit(2**HASH_BITS - 1))
    )

    def bits(value: Column, shift: int, mask: int) -> Column:
        return F.shiftright(value, shift).bitwiseAND(F.lit(mask))

    # clock_seq: the variant bits 10, 6 bits, then a byte; node: six bytes; every byte
    # holds 7 bits of ``order`` so that it stays below 0x80
    clock_seq = bits(order, 49, 0x3F).bitwiseOR(F.lit(0x80)) * 256 + bits(order, 42, 0x7F)
    node = F.lit(0).cast("long")
    for shift in (35, 28, 21, 14, 7, 0):
        node = node * 256 + bits(order, shift, 0x7F)
    return F.concat_ws(
        "-",
        _hex(bits(ticks, 0, 0xFFFFFFFF), 8),
        _hex(bits(ticks, 32, 0xFFFF), 4),
        _hex(bits(ticks, 48, 0x0FFF).bitwiseOR(F.lit(0x1000)), 4),
        _hex(clock_seq, 4),
        _hex(node, 12),
    )


# ---------------------------------------------------------------------- the log


def removals(
    spark: SparkSession, path: WorkPath, table: Table, at_us: int, put_back: bool = False
) -> DataFrame | None:
    """Rows the foreign-key quarantine moved out of the table, as row deletes; with
    ``put_back``, the rows a retry put back (docs/operations.md#a-quarantine-that-heals), as
    inserts."""
    if not path.parquet_files():
        return None
    rows = read_output(spark, path)
    key = F.struct(*[F.col(c) for c in table.key])
    row = F.struct(*[F.col(c) for c in table.column_names])
    none = F.lit(None).cast(row_struct_type(table))
    kind = ChangeKind.INSERT if put_back else ChangeKind.ROW_DELETE
    values = [c for c in table.column_names if c not in table.key] if put_back else []
    out = rows.select(
        F.concat(F.lit("fk_violation:"), F.to_json(key)).alias(EVENT_ID),
        F.lit(at_us).cast("long").alias(TS),
        F.lit(PIPELINE_RANK).alias(RANK),
        F.lit(None).cast("long").alias(POS),
        F.lit(0).alias("idx"),
        F.lit(kind.value).alias("kind"),
        key.alias(KEY),
        (row if put_back else none).alias("values"),
        F.array(*[F.lit(c) for c in values]).cast("array<string>").alias("cols"),
        F.lit(None).cast("long").alias(TTL),
        F.lit(None).cast("long").alias(EXPIRY),
        (none if put_back else row).alias("pre"),
        (row if put_back else none).alias("post"),
    )
    return out.select(*[F.col(f.name).cast(f.dataType) for f in change_schema(table).fields])


def run_changes(spark: SparkSession, src: WorkPath, table: Table, removed_at: int) -> DataFrame:
    """The changes the resolve stage recorded for one table, the foreign-key quarantine's
    removals as row deletes and the rows a retry put back as inserts
    (``schema.change_schema``)."""
    changes = spark.read.schema(change_schema(table)).parquet(str(src / "changes"))
    for folder, put_back in (("fk_removed", False), ("fk_restored", True)):
        more = removals(spark, src / folder, table, removed_at, put_back)
        changes = changes if more is None else changes.unionByName(more)
    return changes


def _entries(table: Table, cdc: CdcConfig) -> list[Column]:
    """The log entries of one change: its pre-image (``sub`` 0), the change itself (1) and
    its post-image (2), as the config asks; an image is there when the row was."""
    codes = F.create_map(*[x for k in ChangeKind for x in (F.lit(k.value), F.lit(k.code))])
    row_t = row_struct_type(table)
    no_cols = F.lit(None).cast("array<string>")

    def entry(op: Column, sub: int, row: Column, cols: Column, ttl: Column) -> Column:
        return F.struct(
            op.alias(OP),
            F.lit(sub).alias("sub"),
            row.cast(row_t).alias("row"),
            cols.alias("cols"),
            ttl.cast("long").alias(TTL),
        )

    entries = [entry(codes[F.col("kind")], 1, F.col("values"), F.col("cols"), F.col(TTL))]
    if cdc.preimage:
        pre = entry(F.lit(CDC_PRE_IMAGE), 0, F.col("pre"), no_cols, F.lit(None))
        entries.insert(0, F.when(F.col("pre").isNotNull(), pre))
    if cdc.postimage:
        post = entry(F.lit(CDC_POST_IMAGE), 2, F.col("post"), no_cols, F.lit(None))
        entries.append(F.when(F.col("post").isNotNull(), post))
    return entries


def build_log(changes: DataFrame, table: Table, gens: Generations, cdc: CdcConfig) -> DataFrame:
    """The log rows of ``changes`` (``schema.change_schema``), in canonical order."""
    by_instant = Window.partitionBy(TS, RANK).orderBy(POS, EVENT_ID)
    df = changes.select(
        "*",
        (F.dense_rank().over(by_instant) - 1).alias("ordinal"),
        stream_id_column(table, gens).alias("stream"),
    )
    too_many = F.raise_error(F.lit("cdc: too many events of one origin at one microsecond"))
    df = df.withColumn(
        "ordinal", F.when(F.col("ordinal") < 2**ORDINAL_BITS, F.col("ordinal")).otherwise(too_many)
    )
    entries = _entries(table, cdc)
    rows = df.select(
        EVENT_ID,
        TS,
        RANK,
        POS,
        "ordinal",
        "idx",
        KEY,
        "stream",
        F.explode(F.filter(F.array(*entries), lambda e: e.isNotNull())).alias("e"),
    )
    in_batch = Window.partitionBy(TS, RANK, EVENT_ID, "stream").orderBy(
        "idx", F.to_json(KEY), "e.sub"
    )
    rows = rows.select(
        "*",
        (F.row_number().over(in_batch) - 1).alias(SEQ),
        F.lead(F.lit(1)).over(in_batch).isNull().alias("last"),
    )
    deleted = [
        F.when(F.array_contains("e.cols", c) & F.col(f"e.row.{c}").isNull(), F.lit(True)).alias(
            f"cdc$deleted_{c}"
        )
        for c in table.value_columns
    ]
    return rows.orderBy(TS, RANK, POS, EVENT_ID, "stream", SEQ).select(
        F.col("stream").alias("cdc$stream_id"),
        timeuuid(F.col(TS), F.col(RANK), F.col("ordinal"), F.col(EVENT_ID)).alias("cdc$time"),
        F.col(SEQ).alias("cdc$batch_seq_no"),
        F.col("e.op").cast("byte").alias("cdc$operation"),
        F.col("e.ttl").alias("cdc$ttl"),
        F.col("last").alias("cdc$end_of_batch"),
        *[
            (F.col(f"key.{c}") if c in table.key else F.col(f"e.row.{c}")).alias(c)
            for c in table.column_names
        ],
        *deleted,
    )


def cdc_stage(
    spark: SparkSession, config: Config, ctx: RunContext, summary: RunSummary
) -> CdcSection:
    """Decide the generations, then write every table's log and the description tables
    to ``resolved/cdc/``. Returns the run report's ``cdc`` section."""
    out = ctx.resolved / "cdc"
    current = read_generations(ctx.staged / "cdc" / "cdc_generation_descriptions")
    topology = Topology.of(config.cdc)
    gens, held = next_generations(current, topology, ctx.interval_start_us)
    if held:
        log.warning("%s", held)
    write_description_tables(gens, out)
    lookup = Generations(gens)
    removed_at = ctx.now_us + config.max_clock_skew_seconds * 1_000_000
    tables: dict[str, CdcTable] = {}
    for name, table in config.tables.items():
        if summary.stopped(name):
            continue  # an error resolver stopped the table: nothing is published
        changes = run_changes(spark, ctx.resolved / name, table, removed_at)
        dest = out / name / "log"
        rows = write_output(build_log(changes, table, lookup, config.cdc), dest)
        tables[name] = CdcTable(log_rows=rows)
        log.info("cdc %s: %d log rows", name, rows)
    operating = gens[-1]
    section = CdcSection(
        generation=operating.time,
        new_generation=len(gens) > len(current),
        generations=len(gens),
        streams=len(operating.all_streams()),
        warning=held,
        tables=tables,
    )
    (out / "cdc.json").write_text(json.dumps(section.to_dict(), indent=2))
    return section
