"""The resolve stage's reading of the typed copies (written at fetch time by
``pipeline.ingest.copies``): every copy of a table's exports with its schema
(:func:`read_copies`), an adapter's export mapped and typed the first time it is read
(then written beside the others), and the copies that need the driver (:func:`special_free`
says when none does). Nothing parses a record twice.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from pipeline.core.columns import DIGEST, EVENT_ID, REPLICA, RUN_ID, SEQ
from pipeline.core.jsonvalues import dumps
from pipeline.ingest import pending
from pipeline.ingest.adapters.debezium import debezium
from pipeline.ingest.adapters.dms import dms, read_dms
from pipeline.ingest.adapters.wal2json import wal2json
from pipeline.ingest.copies import COPIES, WAITING, copy_record, type_adapted
from pipeline.ingest.staging import RAW_SCHEMA
from pipeline.resolve import retry
from pipeline.resolve.ledger import content_digest
from pipeline.resolve.shuffle import standing_order
from pipeline.resolve.state import read_staged
from pipeline.rules.guards import (
    TypingSpec,
)
from pipeline.spark.frames import copy_schema
from pipeline.spark.session import local_frame
from pipeline.storage.workpath import WorkPath

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from pipeline.core.config import Config, Table
    from pipeline.ingest.adapters.common import Adapted
    from pipeline.ingest.inputs import StagedExport


@dataclass(frozen=True)
class Adapting:
    """What mapping an adapter's export needs of the run besides the export: its date and
    id, the table's output folder (the lines that wait go there: ``pipeline.ingest.pending``),
    the ledger's ids of before issue 49 while its window holds some
    (``adapters.common.canonical``), and the replicas in config order."""

    dt: date
    run_id: str
    out: WorkPath
    gc_grace_seconds: int
    replicas: tuple[str, ...]
    legacy_ids: DataFrame | None = None


def _adapted(
    spark: SparkSession,
    rep_dir: WorkPath,
    export: StagedExport,
    spec: TypingSpec,
    carried: DataFrame | None,
    run: Adapting,
) -> Adapted | None:
    """An adapter's export mapped to canonical records (Spark), or None when it is empty
    and nothing of it waits."""

    def staged(kind: str) -> list[str]:
        return [str(p) for p in (rep_dir / kind).parquet_files()]

    table, fmt, legacy = spec.table, export.format, run.legacy_ids
    if fmt == "wal2json":
        if not staged(fmt) and carried is None:
            return None
        lines = read_staged(spark, staged(fmt)) if staged(fmt) else _no_lines(spark)
        give_up = pending.give_up_before(run.dt, run.gc_grace_seconds)
        return wal2json(lines, table, export.options, carried, give_up, legacy)
    if fmt == "debezium":
        if not staged(fmt):
            return None
        return debezium(read_staged(spark, staged(fmt)), table, export.options, legacy)
    rows = read_dms(spark, staged("dms/csv"), staged("dms/parquet"))
    if rows is None:
        return None
    return dms(rows, export.replica, export.files, table, export.options, legacy)


def _no_lines(spark: SparkSession) -> DataFrame:

    ddl = ", ".join(f"{f.name} string" if f.name != "line" else "line bigint" for f in RAW_SCHEMA)
    return local_frame(spark, [], ddl)


def read_copies(
    spark: SparkSession,
    config: Config,
    table: Table,
    table_dir: WorkPath,
    exports: Mapping[str, StagedExport],
    now_us: int,
    run: Adapting | None = None,
) -> tuple[DataFrame, dict[str, dict[str, int]]]:
    """Every typed copy of the table's exports, and per replica what ``pipeline.ingest.pending``
    counts (lines read back, lines left waiting; none when no export of the table waits
    for anything). An adapter's export is mapped and typed the first time (one Spark job,
    written beside the others); with ``run`` (the resolve stage's), a wal2json export's
    open transactions are written to the table's pending output."""
    from pyspark.sql import functions as F

    schema = copy_schema(table)
    spec = TypingSpec.of(config, table, now_us)
    carried = pending.carried(spark, table_dir) if run is not None else None
    files: list[str] = []
    waiting: list[DataFrame] = []
    for rep, export in exports.items():
        rep_dir = table_dir / f"replica={rep}"
        if export.format not in ("jsonl", "parquet") and not (rep_dir / COPIES).is_dir():
            theirs = None if carried is None else carried.where(F.col(REPLICA) == rep)
            adapted = _adapted(spark, rep_dir, export, spec, theirs, run or _alone(table_dir))
            if adapted is not None:
                typed = adapted.records.select(REPLICA, "file", "line", "raw").mapInArrow(
                    type_adapted(spec), schema
                )
                typed.write.mode("overwrite").parquet(str(rep_dir / COPIES))
                if adapted.waiting is not None:  # beside the copies: a retry reads both
                    adapted.waiting.write.mode("overwrite").parquet(str(rep_dir / WAITING))
                adapted.release()
        if (rep_dir / WAITING).is_dir():
            waiting.append(spark.read.schema(pending.WAITING_DDL).parquet(str(rep_dir / WAITING)))
        files += [str(p) for p in (rep_dir / COPIES).parquet_files()]
    counts = _pending(spark, run, exports, carried, waiting, table.name)
    files += retry.copies_of(table_dir)  # retry: quarantined events offered again

    typed = spark.read.schema(schema).parquet(*files) if files else local_frame(spark, [], schema)
    return typed.withColumn(DIGEST, content_digest(table)), counts


def _alone(table_dir: WorkPath) -> Adapting:
    """A mapping outside a run (a test's, a benchmark's): nothing waits across nights."""
    return Adapting(date.max, "", table_dir / "_adapting", 0, ())


def _pending(
    spark: SparkSession,
    run: Adapting | None,
    exports: Mapping[str, StagedExport],
    carried: DataFrame | None,
    waiting: list[DataFrame],
    table: str,
) -> dict[str, dict[str, int]]:
    """The table's pending output (``pipeline.ingest.pending``): the lines its wal2json exports
    left waiting, and those of earlier exports of a replica whose export tonight is not
    wal2json (kept waiting as they were); the per-replica counts."""
    from pyspark.sql import functions as F

    uses = any(e.format == "wal2json" for e in exports.values())
    if run is None or not (uses or carried is not None):
        return {}
    mapped = {r for r, e in exports.items() if e.format == "wal2json"}
    if carried is not None and set(run.replicas) - mapped:
        waiting.append(carried.where(~F.col(REPLICA).isin(*mapped)) if mapped else carried)
    back = pending.read_back(carried, run.replicas)
    left = pending.write(spark, waiting, run.out, run.run_id, table, run.dt, run.replicas)
    return {
        r: {pending.READ_BACK: back.get(r, 0), pending.LEFT: left.get(r, 0)}
        for r in run.replicas
        if back.get(r) or left.get(r) or r in mapped
    }


_S, _L = pa.string(), pa.int64()
_WHERE = (REPLICA, EVENT_ID, "file", "line", SEQ)


DIFFERING_SCHEMA = pa.schema(
    [(n, _S) for n in (RUN_ID, "table", *_WHERE[:3])]
    + [("line", _L), (SEQ, _L), ("standing", pa.bool_()), ("record", _S)]
    + [("digest", _L), ("ledger_digest", _L)]
)


def differing_copies(copies: DataFrame, fates: DataFrame, table: Table) -> list[dict[str, Any]]:
    """The copies of every event that one replica's export holds more than once in
    different versions (issue 16), the standing one first. Read only when some replica
    holds an event twice (its fates say so: ``resolve.Facts``): the copies of those events
    alone."""
    from pyspark.sql import functions as F

    repeated = (
        fates.where(F.col(EVENT_ID).isNotNull())
        .groupBy(EVENT_ID, REPLICA)
        .count()
        .where(F.col("count") > 1)
        .select(EVENT_ID, REPLICA)
    )
    picked = copies.join(repeated, [EVENT_ID, REPLICA], "left_semi")
    rows = picked.orderBy(EVENT_ID, *standing_order()).toArrow().to_pylist()
    out: list[dict[str, Any]] = []
    for _, group in itertools.groupby(rows, key=lambda r: (r[EVENT_ID], r[REPLICA])):
        copies_of = list(group)
        records = [
            r["raw"] if r["reason"] is not None else dumps(copy_record(r, table.column_names))
            for r in copies_of
        ]
        if len(set(records)) > 1:
            out += [
                {**{f: r[f] for f in _WHERE}, "standing": i == 0, "record": rec}
                | {"digest": r["digest"], "ledger_digest": None}
                for i, (r, rec) in enumerate(zip(copies_of, records, strict=True))
            ]
    return out


def special_free(exports: Mapping[str, Any], table_dir: WorkPath) -> bool:
    """Whether the fetch's typing counted no copy ``special_count`` counts in any of the
    table's exports (an adapter's export, typed later, is not counted) and no quarantined
    event is offered again: then ``shuffle.split_special`` has nothing to bring."""
    if any(e.specials != 0 for e in exports.values()):
        return False
    return not retry.copies_of(table_dir)
