"""Replica snapshots: when a replica also exports a full copy of a table
(``exports/replica=R/table=T/snapshot/dt=D/``, docs/rules.md#convergence), compare it with
the converged snapshot and report every key that differs the way a perspective's divergence
is reported (docs/rules.md#convergence): both versions, as a reader sees them, and the
repair.

A perspective says what a replica *should* hold if it applied the run's events in its
order; its snapshot says what it *does* hold. Both go to ``divergence/dt=D/``, told
apart by ``source`` (``perspective`` or ``snapshot``).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import date
from functools import reduce
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema

from pipeline.core.columns import CAUSE, KEY, REPLICA, STATE_DELETED, STATE_ORIGIN, STATE_TS
from pipeline.core.config import Table
from pipeline.core.jsonvalues import dumps
from pipeline.core.policy import Resolver
from pipeline.resolve.foldrun import repair_record
from pipeline.rules.rowfold import Version
from pipeline.spark.frames import DECISION_CAUSE, DIVERGENCE, DIVERGENCE_FIELDS


def snapshot_divergence(
    converged: DataFrame,
    replica_rows: DataFrame,
    table: Table,
    replica: str,
    dt: date,
    now_us: int,
) -> DataFrame:
    """The keys where ``replica_rows`` (the replica's exported live rows) and ``converged``
    (the published snapshot: the table's columns, ``_ts``, ``_origin``) differ."""
    cols = table.column_names
    conv = converged.select(
        *[F.col(c) for c in table.key],
        F.struct(*cols, STATE_TS, STATE_ORIGIN).alias("conv"),
    )
    mine = replica_rows.where(~F.col(STATE_DELETED)).select(
        *[F.col(c) for c in table.key], F.struct(*cols).alias("mine")
    )
    joined = conv.join(mine, list(table.key), "full_outer")
    differs = reduce(
        lambda a, b: a | b,
        [~F.col(f"conv.{c}").eqNullSafe(F.col(f"mine.{c}")) for c in cols],
        F.col("conv").isNull() | F.col("mine").isNull(),
    )
    rows = joined.where(differs).select("conv", "mine")
    key_cols = table.key
    arrow_schema = to_arrow_schema(DIVERGENCE)

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            out: list[dict[str, Any]] = []
            for r in batch.to_pylist():
                c, m = r["conv"], r["mine"]
                side = c if c is not None else m
                k = tuple(side[x] for x in key_cols)
                cv = None
                if c is not None:
                    values = {x: c[x] for x in cols}
                    cv = Version(values, c[STATE_TS], c[STATE_ORIGIN], None, 0)
                out.append(
                    {
                        REPLICA: replica,
                        KEY: dumps(dict(zip(key_cols, k, strict=True))),
                        "replica_row": dumps(m) if m is not None else None,
                        "converged_row": dumps(cv.values) if cv is not None else None,
                        "repair": dumps(repair_record(table, replica, k, m, cv, dt, now_us)),
                    }
                )
            yield pa.RecordBatch.from_pylist(out, schema=arrow_schema)

    return rows.mapInArrow(run, DIVERGENCE)


def decided_cause(diff: DataFrame, conflicts: DataFrame) -> DataFrame:
    """docs/rules.md#manual-decisions: the divergent keys a manual decision resolved (their
    conflict-log rows' resolver is ``manual``) have cause ``decision``."""
    decided = (
        conflicts.where(F.col("resolver") == Resolver.MANUAL.value)
        .select(F.col(KEY).alias("_decided"))
        .distinct()
    )
    joined = diff.join(F.broadcast(decided), diff[KEY] == decided["_decided"], "left")
    cause = F.when(F.col("_decided").isNotNull(), F.lit(DECISION_CAUSE)).otherwise(F.col(CAUSE))
    return joined.withColumn(CAUSE, cause).select(*DIVERGENCE_FIELDS)
