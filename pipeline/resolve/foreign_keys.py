"""docs/rules.md#foreign-keys, after every table is resolved: the orphans (live rows whose
parent is not live), round after round while ``on_fk_violation: quarantine`` takes them
out of their table's state (a removed parent can orphan its children), and the orphan
rows a retry offered put back (docs/operations.md#a-quarantine-that-heals). Writes every
table's ``orphans`` (and their quarantine), its final ``state`` and its ``snapshot``.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import reduce
from typing import Any

from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.window import Window

from pipeline.core import layout
from pipeline.core.columns import (
    EVENT_ID,
    KEY,
    ORIGIN,
    REPLICA,
    STATE_DELETED,
    STATE_EVENT_ID,
    STATE_ORIGIN,
    STATE_TS,
)
from pipeline.core.config import Config, Table
from pipeline.core.policy import FkPolicy, QuarantineReason
from pipeline.core.summary import RunSummary
from pipeline.ingest.inplace import InPlace
from pipeline.ingest.retry import FK
from pipeline.resolve.inplace import touch, whole_state
from pipeline.resolve.retry import add_outcomes, fk_outcomes, offers_of
from pipeline.spark.frames import run_columns
from pipeline.spark.schema import snapshot_columns, state_schema
from pipeline.storage.context import RunContext
from pipeline.storage.outputs import output_info, read_known
from pipeline.storage.outputs import write_output as _write
from pipeline.storage.targets import STATE_PRE, final_state
from pipeline.storage.workpath import WorkPath


def _key_json(cols: list[str]) -> Column:
    return F.to_json(F.struct(*[F.col(c) for c in cols]))


def check_foreign_keys(
    spark: SparkSession, config: Config, ctx: RunContext, summary: RunSummary
) -> RunSummary:
    """docs/rules.md#foreign-keys: orphans after resolution; with ``quarantine`` they leave
    state and snapshot,
    repeatedly, until none is left. Writes ``orphans``, the final ``state`` and the
    ``snapshot`` of every table; returns the summary with their counts."""
    states = {
        t: read_known(spark, ctx.resolved / t / STATE_PRE, state_schema(table))
        for t, table in config.tables.items()
    }
    for t in _in_foreign_keys(config):  # merged in place: the fold's rows over the table's
        whole = whole_state(spark, ctx.staged / t, ctx.resolved / t, config.tables[t])
        states[t] = states[t] if whole is None else whole
    found: dict[str, list[DataFrame]] = {t: [] for t in config.tables}
    removed: dict[str, list[DataFrame]] = {t: [] for t in config.tables}
    restored: dict[str, DataFrame] = {}
    # docs/rules.md#fine-points: not checked after an error
    if not any(s.stopped for s in summary.tables.values()):
        states, restored, summary = _put_back(spark, config, ctx, states, summary)
        states, found, removed = _find_orphans(config, states)
    for t in config.tables:
        counts = _write_fk_outputs(
            spark, config, ctx, t, states[t], found[t], removed[t], restored.get(t)
        )
        if counts.get("orphans") and config.on_fk_violation is FkPolicy.QUARANTINE:
            fk = {QuarantineReason.FK_VIOLATION.value: counts["orphans"]}
            counts["quarantined"] = {**summary.tables[t].quarantined, **fk}
        summary = summary.with_table(t, **counts)
    return summary


def _in_foreign_keys(config: Config) -> set[str]:
    """The tables a foreign key joins, as child or parent."""
    return {
        n for t in config.tables.values() for fk in t.foreign_keys for n in (t.name, fk.references)
    }


def _put_back(
    spark: SparkSession,
    config: Config,
    ctx: RunContext,
    states: dict[str, DataFrame],
    summary: RunSummary,
) -> tuple[dict[str, DataFrame], dict[str, DataFrame], RunSummary]:
    """docs/operations.md#a-quarantine-that-heals: the orphan rows offered again
    (``retry.fk_violation``) go back
    into their table's state when every parent they reference is live after resolution
    and their key was not written since. Returns the states, the rows put back per table
    and the summary with their outcomes."""
    states, restored = dict(states), {}
    for t, table in config.tables.items():
        offers = [o for o in offers_of(ctx.staged / t) if o["reason"] == FK]
        if not offers:
            continue
        rows = _offered_rows(spark, table, offers)
        # a key orphaned on two nights: its latest row may come back, the other cannot
        latest = Window.partitionBy(*table.key).orderBy(F.desc(STATE_TS), F.desc(STATE_EVENT_ID))
        rows = rows.withColumn("_n", F.row_number().over(latest)).persist()
        keys = states[t].select(*table.key)
        taken = rows.where(F.col("_n") > 1).unionByName(
            rows.join(keys, list(table.key), "left_semi")
        )
        written = {r[0] for r in taken.select(STATE_EVENT_ID).collect()}
        free = rows.where(F.col("_n") == 1).drop("_n").join(keys, list(table.key), "left_anti")
        for fk in table.foreign_keys:
            parent = config.tables[fk.references]
            live = states[parent.name].where(~F.col(STATE_DELETED))
            pairs = list(zip(fk.columns, parent.key, strict=True))
            parents = live.select(*[F.col(pk).alias(c) for c, pk in pairs]).distinct()
            has = parents.withColumn("_parent", F.lit(True))
            null = reduce(lambda a, b: a | b, [F.col(c).isNull() for c in fk.columns])
            free = (
                free.join(has, list(fk.columns), "left")
                .where(null | F.col("_parent"))
                .drop("_parent")
            )
        free = free.persist()
        back = {r[0] for r in free.select(STATE_EVENT_ID).collect()}
        if back:
            restored[t] = free
            states[t] = states[t].unionByName(free)
        settled = fk_outcomes(offers, back, written)
        add_outcomes(ctx.resolved / t, ctx.run_id, t, settled)
        summary = summary.with_table(t, retried=_merged(summary.tables[t].retried, settled.retried))
    return states, restored, summary


def _offered_rows(spark: SparkSession, table: Table, offers: list[dict[str, Any]]) -> DataFrame:
    """The orphan rows as their quarantine kept them (the table's columns, ``_ts`` and
    ``_origin``, as JSON), as live state rows."""
    schema = state_schema(table)
    kept = T.StructType([schema[c] for c in (*table.column_names, STATE_TS, STATE_ORIGIN)])
    given = spark.createDataFrame(
        [(o[EVENT_ID], o["event"]) for o in offers], "event_id string, row string"
    )
    parsed = given.select(EVENT_ID, F.from_json("row", kept).alias("r"))
    cols = []
    for f in schema.fields:
        if f.name in kept.names:
            cols.append(F.col(f"r.{f.name}").alias(f.name))
        elif f.name == STATE_EVENT_ID:
            cols.append(F.col(EVENT_ID).alias(f.name))
        elif f.name == STATE_DELETED:
            cols.append(F.lit(False).alias(f.name))
        else:
            cols.append(F.lit(None).cast(f.dataType).alias(f.name))
    return parsed.select(*cols)


def _merged(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
    return {k: a.get(k, 0) + b.get(k, 0) for k in sorted({*a, *b})}


def _find_orphans(
    config: Config, states: dict[str, DataFrame]
) -> tuple[dict[str, DataFrame], dict[str, list[DataFrame]], dict[str, list[DataFrame]]]:
    """Every foreign key's orphans, round after round while a quarantine removes rows (a
    removed parent can orphan its children). Returns the states after the quarantine, the
    orphans found and the rows removed, per table."""
    states = dict(states)
    quarantine = config.on_fk_violation is FkPolicy.QUARANTINE
    found: dict[str, list[DataFrame]] = {t: [] for t in config.tables}
    removed: dict[str, list[DataFrame]] = {t: [] for t in config.tables}
    for _round in range(100):
        new_orphans = False
        for child_name, child in config.tables.items():
            for fk in child.foreign_keys:
                parent = config.tables[fk.references]
                live_child = states[child_name].where(~F.col(STATE_DELETED))
                for c in fk.columns:
                    live_child = live_child.where(F.col(c).isNotNull())
                pairs = list(zip(fk.columns, parent.key, strict=True))
                parents = (
                    states[parent.name]
                    .where(~F.col(STATE_DELETED))
                    .select(*[F.col(pk).alias(c) for c, pk in pairs])
                    .distinct()
                )
                orphans = live_child.join(parents, list(fk.columns), "left_anti").persist()
                if orphans.isEmpty():
                    continue
                ref = F.to_json(
                    F.struct(
                        F.lit(parent.name).alias("references"),
                        *[F.col(c).alias(pk) for c, pk in pairs],
                    )
                )
                found[child_name].append(
                    orphans.select(
                        _key_json(list(child.key)).alias(KEY),
                        ref.alias("reference"),
                        F.col(STATE_EVENT_ID).alias(EVENT_ID),
                        F.to_json(F.struct(*child.column_names, STATE_TS, STATE_ORIGIN)).alias(
                            "row"
                        ),
                        F.col(STATE_ORIGIN).alias(ORIGIN),
                    )
                )
                if quarantine:
                    removed[child_name].append(orphans.select(*child.column_names))
                    states[child_name] = states[child_name].join(
                        orphans.select(*child.key), list(child.key), "left_anti"
                    )
                    new_orphans = True
        if not new_orphans:
            break
    return states, found, removed


def _write_fk_outputs(
    spark: SparkSession,
    config: Config,
    ctx: RunContext,
    t: str,
    state: DataFrame,
    found: list[DataFrame],
    removed: list[DataFrame],
    restored: DataFrame | None,
) -> dict[str, Any]:
    """One table's orphans (and their quarantine), the rows the quarantine removed and
    those a retry put back (for the CDC log and the history), its final state and its
    snapshot. Returns their counts."""
    table = config.tables[t]
    out = ctx.resolved / t
    counts: dict[str, Any] = {}
    if found:
        unique_orphans = reduce(DataFrame.unionByName, found).dropDuplicates([KEY]).persist()
        counts["orphans"] = _write(
            unique_orphans.select(*run_columns(ctx.run_id, t), KEY, "reference", EVENT_ID),
            out / "orphans",
        )
        if config.on_fk_violation is FkPolicy.QUARANTINE:
            _write(
                unique_orphans.select(
                    *run_columns(ctx.run_id, t),
                    F.col(ORIGIN).alias(REPLICA),
                    EVENT_ID,
                    F.lit(QuarantineReason.FK_VIOLATION.value).alias("reason"),
                    F.concat(F.lit("no live parent for "), F.col("reference")).alias("detail"),
                    F.col("row").alias("event"),
                ),
                out / "quarantine",
                mode="append",
            )
    if removed and config.captures(table):  # the CDC log and the history: row deletes
        gone = reduce(DataFrame.unionByName, removed).dropDuplicates(list(table.key))
        _write(gone, out / "fk_removed")
    if restored is not None and config.captures(table):
        _write(restored.select(*table.column_names), out / "fk_restored")
    if removed or restored is not None:
        if InPlace.load(out) is not None:  # merged in place: the touched rows, changed
            state = _changed_rows(spark, table, out, removed, restored)
        _write(state, out / layout.STATE)
        (out / STATE_PRE).rmtree()
    elif (folded := _folded_snapshot(out)) is not None:  # the fold's state is final, and
        return {**counts, **folded}  # its tasks wrote the snapshot beside it
    # else the fold's state is the final one, where it is (on S3 a move is a copy)
    final = read_known(spark, final_state(out), state_schema(table))
    seen = Observation()
    final = final.observe(seen, F.count(F.lit(1)).alias("state_rows"))
    live = final.where(~F.col(STATE_DELETED))
    counts["rows"] = _write(live.select(*snapshot_columns(table)), out / layout.SNAPSHOT)
    counts["state_rows"] = int(seen.get["state_rows"])  # the next run checks it
    record = InPlace.load(out)
    if record is not None:  # the tables' rows after the merge
        record = record.carried(counts["state_rows"], counts["rows"])
        record.save(out)
        counts |= {"rows": record.rows, "state_rows": record.state_rows}
    return counts


def _changed_rows(
    spark: SparkSession,
    table: Table,
    out: WorkPath,
    removed: list[DataFrame],
    restored: DataFrame | None,
) -> DataFrame:
    """A table merged in place, after the foreign-key step: the fold's rows but those it
    removed, and the rows it put back; the keys of the removed rows the fold did not
    write (published rows no event touched) join ``touched``: the merge deletes them."""
    rows = read_known(spark, out / STATE_PRE, state_schema(table))
    if removed:
        key = list(table.key)
        gone = reduce(DataFrame.unionByName, removed).select(*key).distinct()
        touch(out, gone.join(rows.select(*key), key, "left_anti"), table)  # published rows
        rows = rows.join(gone, key, "left_anti")
    if restored is not None:
        rows = rows.unionByName(restored.select(*rows.columns))
    return rows


def _folded_snapshot(out: WorkPath) -> dict[str, Any] | None:
    """The snapshot's and the state's rows when the row engine's fold tasks wrote the
    snapshot beside the state (its live rows), which is then final; else None."""
    snapshot, state = output_info(out / layout.SNAPSHOT), output_info(out / STATE_PRE)
    if snapshot is None or state is None:
        return None
    record = InPlace.load(out)
    if record is None or snapshot[1] is None or state[1] is None:
        return {"rows": snapshot[1], "state_rows": state[1]}
    record = record.carried(state[1], snapshot[1])  # the tables' rows after the merge
    record.save(out)
    return {"rows": record.rows, "state_rows": record.state_rows}
