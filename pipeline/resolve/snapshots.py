"""Replica snapshots: when a replica also exports a full copy of a table
(``exports/replica=R/table=T/snapshot/dt=D/``, docs/rules.md#convergence), compare it with
the converged snapshot and report every key that differs the way a perspective's divergence
is reported (docs/rules.md#convergence): both versions, as a reader sees them, the repair,
and the causes (docs/rules.md#divergence-causes).

A perspective says what a replica *should* hold if it applied the run's events in its
order; its snapshot says what it *does* hold. Both go to ``divergence/dt=D/``, told
apart by ``source`` (``perspective`` or ``snapshot``). The resolve stage compares every
snapshot of the date once the foreign keys left their final state (:func:`compare_snapshots`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import date
from functools import reduce
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from pipeline.core.columns import (
    CAUSE,
    EVENT_ID,
    EVIDENCE,
    KEY,
    ORIGIN,
    REPLICA,
    STATE_DELETED,
    STATE_ORIGIN,
    STATE_TS,
)
from pipeline.core.config import Config, Table
from pipeline.core.jsonvalues import dumps
from pipeline.core.policy import REPAIR_ORIGIN, Cause, FkPolicy
from pipeline.core.summary import RunSummary
from pipeline.ingest.inputs import StagedTable
from pipeline.resolve.group_fold import repair_record
from pipeline.resolve.read import read_copies
from pipeline.resolve.state import columns_held, published_held, read_base
from pipeline.rules.causes import REPLICA_LACKS, Finding, run_findings, snapshot_findings, verdict
from pipeline.rules.events import Version
from pipeline.spark.frames import DIVERGENCE, DIVERGENCE_FIELDS, run_columns
from pipeline.spark.schema import state_schema
from pipeline.storage.context import RunContext
from pipeline.storage.outputs import read_known, read_output
from pipeline.storage.outputs import write_output as _write
from pipeline.storage.targets import final_state
from pipeline.storage.workpath import WorkPath

Batches = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]


@dataclass(frozen=True)
class RunEvidence:
    """What the run knows that explains a snapshot's divergent rows
    (docs/rules.md#divergence-causes): the final state (its tombstones), the night's typed
    copies (which replica holds which event of a key), the conflict log, the perspectives'
    divergence, and the columns the replica's snapshot holds."""

    state: DataFrame  # key columns, ``_deleted``, ``_ts``
    copies: DataFrame  # ``copy_schema``: replica, event_id, key, new_key, reason
    conflicts: DataFrame  # the run's conflict log (``key``, ``resolver``, ``conflict_type``)
    perspectives: DataFrame  # the run's divergence so far (``source``, ``replica``, ...)
    columns: frozenset[str]  # the columns the replica's snapshot rows hold
    #: the key columns of the orphans ``on_fk_violation: quarantine`` took out of the
    #: converged state (None: the rule is not ``quarantine``)
    orphans: DataFrame | None = None


def snapshot_divergence(
    converged: DataFrame,
    replica_rows: DataFrame,
    table: Table,
    replica: str,
    dt: date,
    now_us: int,
    run: RunEvidence,
) -> DataFrame:
    """The keys where ``replica_rows`` (the replica's exported live rows) and ``converged``
    (the published snapshot: the table's columns, ``_ts``, ``_origin``) differ, with their
    causes. Only the differing keys meet the run's evidence: two passes over them, one
    that renders each row with what it shows by itself (its key as the logs write it),
    one that adds what the rest of the run says of that key."""
    cols = table.column_names
    key = list(table.key)
    conv = converged.select(*key, F.struct(*cols, STATE_TS, STATE_ORIGIN).alias("conv"))
    mine = replica_rows.where(~F.col(STATE_DELETED)).select(*key, F.struct(*cols).alias("mine"))
    differs = reduce(
        lambda a, b: a | b,
        [~F.col(f"conv.{c}").eqNullSafe(F.col(f"mine.{c}")) for c in cols],
        F.col("conv").isNull() | F.col("mine").isNull(),
    )
    rows = conv.join(mine, key, "full_outer").where(differs)
    rows = _with_row_evidence(rows, run, table, replica)
    missing_cols = tuple(c for c in cols if c not in run.columns)
    found = rows.mapInArrow(_rows_of(table, replica, dt, now_us, missing_cols), DIVERGENCE)
    return _with_run_evidence(found, run, table, replica, missing_cols)


def _with_row_evidence(rows: DataFrame, run: RunEvidence, table: Table, replica: str) -> DataFrame:
    """``rows`` with the key's tombstone (``tomb``: its ``_ts``) and the ids of the night's
    events of the key (by key and new key, quarantined ones and repairs aside) that the
    replica's export lacks (``missing``), joined by key."""
    key = list(table.key)
    tombs = run.state.where(F.col(STATE_DELETED)).select(*key, F.col(STATE_TS).alias("tomb"))
    held = run.copies.where(F.col("reason").isNull() & (F.col(ORIGIN) != REPAIR_ORIGIN))
    by_key = held.select(F.col(KEY).alias("k"), EVENT_ID, REPLICA).unionByName(
        held.where(F.col("new_key").isNotNull()).select(
            F.col("new_key").alias("k"), EVENT_ID, REPLICA
        )
    )
    theirs = F.when(F.col(REPLICA) == replica, F.col(EVENT_ID))
    lacks = (
        by_key.where(F.col("k").isNotNull())
        .groupBy("k")
        .agg(F.array_except(F.collect_set(EVENT_ID), F.collect_set(theirs)).alias("missing"))
        .select(*[F.col(f"k.{c}").alias(c) for c in key], "missing")
    )
    joined = rows.join(tombs, key, "left").join(lacks, key, "left")
    orphan = F.lit(False)
    if run.orphans is not None:
        joined = joined.join(run.orphans.withColumn("_orphan", F.lit(True)), key, "left")
        orphan = F.coalesce(F.col("_orphan"), F.lit(False))
    return joined.select("conv", "mine", "tomb", "missing", orphan.alias("orphan"))


def _rows_of(
    table: Table, replica: str, dt: date, now_us: int, missing_cols: tuple[str, ...]
) -> Batches:
    """The task that renders each differing key as a divergence row; its ``evidence``
    holds, until :func:`_with_run_evidence` decides, the findings the row shows by itself
    (a JSON list of ``[cause, evidence]``)."""
    cols, key_cols = table.column_names, table.key
    arrow_schema = to_arrow_schema(DIVERGENCE)

    def converged(c: dict[str, Any] | None, key: dict[str, Any], tomb: int | None):
        if c is not None:
            return Version({x: c[x] for x in cols}, c[STATE_TS], c[STATE_ORIGIN], None, 0)
        if tomb is not None:  # a repair that deletes takes the tombstone's ts
            return Version(key, tomb, None, None, 0, deleted=True)
        return None

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            out: list[dict[str, Any]] = []
            for r in batch.to_pylist():
                c, m = r["conv"], r["mine"]
                k = tuple((c if c is not None else m)[x] for x in key_cols)
                key = dict(zip(key_cols, k, strict=True))
                cv = converged(c, key, r["tomb"])
                values = cv.values if cv is not None and not cv.deleted else None
                found = snapshot_findings(
                    m, values, missing_cols, r["missing"] or (), r["tomb"], r["orphan"]
                )
                out.append(
                    {
                        REPLICA: replica,
                        KEY: dumps(key),
                        "replica_row": dumps(m) if m is not None else None,
                        "converged_row": dumps(values) if values is not None else None,
                        "repair": dumps(repair_record(table, replica, k, m, cv, dt, now_us)),
                        CAUSE: None,
                        EVIDENCE: dumps([[f.cause.value, f.evidence] for f in found]),
                    }
                )
            yield pa.RecordBatch.from_pylist(out, schema=arrow_schema)

    return run


def _with_run_evidence(
    found: DataFrame, run: RunEvidence, table: Table, replica: str, lacks: tuple[str, ...]
) -> DataFrame:
    """The snapshot's rows with their causes: their own, the perspective's of the same
    replica and key, and the key's conflicts; ``undetermined`` when none. Each says the
    table's columns the replica's snapshot lacks (``lacks``), if any."""
    seen = run.perspectives.where(
        (F.col("source") == "perspective") & (F.col(REPLICA) == replica)
    ).select(F.col(KEY).alias("_k"), F.col(EVIDENCE).alias("_p"))
    met = run.conflicts.groupBy(F.col(KEY).alias("_k")).agg(
        F.collect_set("resolver").alias("_resolvers"),
        F.collect_set("conflict_type").alias("_types"),
    )
    rows = (
        found.join(seen, found[KEY] == seen["_k"], "left")
        .drop("_k")
        .join(met, found[KEY] == met["_k"], "left")
        .drop("_k")
    )
    arrow_schema = to_arrow_schema(DIVERGENCE)
    meta = {STATE_TS, STATE_ORIGIN, STATE_DELETED}
    extra = sorted(run.columns - set(table.column_names) - meta)

    context = {REPLICA_LACKS: list(lacks)} if lacks else {}

    def combine(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            out = []
            for r in batch.to_pylist():
                own = [Finding(Cause(c), e) for c, e in json.loads(r[EVIDENCE])]
                resolvers = r["_resolvers"] or ()
                theirs = run_findings(table, r["_p"], resolvers, r["_types"] or ())
                checked = {
                    "perspective_differs": r["_p"] is not None,
                    "conflict_resolvers": sorted(resolvers),
                    "extra_columns": extra,
                }
                cause, evidence = verdict([*own, *theirs], checked, context)
                row = {n: r[n] for n in DIVERGENCE_FIELDS}
                out.append({**row, CAUSE: cause, EVIDENCE: evidence})
            yield pa.RecordBatch.from_pylist(out, schema=arrow_schema)

    return rows.mapInArrow(combine, DIVERGENCE)


def compare_snapshots(
    spark: SparkSession,
    config: Config,
    ctx: RunContext,
    inputs: dict[str, StagedTable],
    summary: RunSummary,
) -> RunSummary:
    """docs/rules.md#convergence against what the replicas hold: each replica snapshot
    export of the date is
    compared with the converged snapshot; differences are appended to the divergence.
    Returns the summary with the divergent keys per replica."""
    for t, table in config.tables.items():
        counts: dict[str, int] = {}
        # docs/rules.md#fine-points: not compared after an error
        if inputs[t].snapshots and not summary.stopped(t):
            out = ctx.resolved / t
            converged = read_output(spark, out / "snapshot")
            evidence = _run_evidence(spark, config, ctx, table, inputs[t])
            for replica in inputs[t].snapshots:
                label = f"exports/replica={replica}/table={t}/snapshot/dt={ctx.dt}"
                where = ctx.staged / t / f"snapshot={replica}"
                mine = read_base(spark, where, table, label)
                run = replace(evidence, columns=published_held(table, columns_held(spark, where)))
                diff = snapshot_divergence(converged, mine, table, replica, ctx.dt, ctx.now_us, run)
                counts[replica] = _write(  # published with the rest of the divergence
                    diff.select(
                        *run_columns(ctx.run_id, t),
                        F.lit("snapshot").alias("source"),
                        *DIVERGENCE_FIELDS,
                    ),
                    out / "divergence",
                    mode="append",
                )
        causes = _snapshot_causes(spark, ctx.resolved / t) if any(counts.values()) else {}
        summary = summary.with_table(
            t, snapshot_divergent_keys=counts, snapshot_divergent_causes=causes
        )
    return summary


def _snapshot_causes(spark: SparkSession, out: WorkPath) -> dict[str, dict[str, int]]:
    """The snapshot comparisons' divergent keys per replica by cause, read back (the
    divergent rows only)."""
    rows = read_output(spark, out / "divergence").where(F.col("source") == "snapshot")
    causes: dict[str, dict[str, int]] = {}
    for r in rows.groupBy(REPLICA, CAUSE).count().collect():
        causes.setdefault(r[REPLICA], {})[r[CAUSE]] = r["count"]
    return causes


def _run_evidence(
    spark: SparkSession, config: Config, ctx: RunContext, table: Table, staged: StagedTable
) -> RunEvidence:
    """What the run knows that explains a snapshot's divergent rows (read lazily: only
    the differing keys are joined with it)."""
    out = ctx.resolved / table.name
    copies, _ = read_copies(
        spark, config, table, ctx.staged / table.name, staged.exports, ctx.now_us
    )
    return RunEvidence(
        state=read_known(spark, final_state(out), state_schema(table)),
        copies=copies,
        conflicts=read_output(spark, out / "conflicts"),
        perspectives=read_output(spark, out / "divergence"),
        columns=frozenset(),
        orphans=_quarantined_orphans(spark, config, table, out),
    )


def _quarantined_orphans(
    spark: SparkSession, config: Config, table: Table, out: WorkPath
) -> DataFrame | None:
    """The key columns of the orphans ``on_fk_violation: quarantine`` took out of the
    table's converged state (None: another rule, or a table without foreign keys)."""
    if config.on_fk_violation is not FkPolicy.QUARANTINE or not table.foreign_keys:
        return None
    schema = T.StructType([state_schema(table)[c] for c in table.key])
    orphans = read_known(spark, out / "orphans", f"{KEY} string")
    return orphans.select(F.from_json(KEY, schema).alias("_k")).select("_k.*").distinct()
