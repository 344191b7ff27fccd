"""The resolve step of a night merged in place (docs/outputs.md#a-night-costs-the-night;
the three steps and the record they share: ``pipeline.ingest.inplace``): :func:`narrow`
keeps the prior rows the fold needs (the keys the night's events name, a key change's new
key included, the live rows holding a unique value a row may take tonight
(``unique.possible_values``), the tombstones whose
GC is due; in a cell table the rows whose TTL expires and the table tombstone), writes
their keys as ``touched`` and counts them into the record.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from pipeline.core import layout
from pipeline.core.columns import KEY, OP, STATE_DELETED
from pipeline.core.config import Table
from pipeline.ingest.inplace import LIVE_MARK, TOUCHED, InPlace, by_key, read_touched
from pipeline.ingest.prior import PRIOR_PIN
from pipeline.resolve.shuffle import key_struct
from pipeline.resolve.state import read_prior
from pipeline.resolve.unique import VALUE, possible_values, unique_columns, values_of
from pipeline.rules.guards import READ
from pipeline.spark.schema import snapshot_columns, state_schema
from pipeline.storage.lake_read import Pin
from pipeline.storage.outputs import read_known, read_output, write_output
from pipeline.storage.targets import STATE_PRE, final_state

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

    from pipeline.storage.workpath import WorkPath

log = logging.getLogger(__name__)


#: the marks :func:`narrow` joins with (never a column name of a table: ``__cdr_``)
_KEY, _MARK, _VALUE = "__cdr_key", "__cdr_mark", "__cdr_value"


def narrow(
    prior: DataFrame,
    events: DataFrame,
    table: Table,
    due: Column,
    out: WorkPath,
    record: InPlace,
    extra: DataFrame | None = None,
) -> DataFrame:
    """The prior rows the night's fold needs (the module's docstring), persisted, their
    keys written to ``out/touched``, their counts saved in the record there.
    ``events``: the typed copies (``frames.copy_schema``); ``due``: whether a prior row
    changes tonight though no event touches it (a tombstone purged, a TTL expired);
    ``extra``: the unforeseen values of a fold done before (``unique``). Each
    set of marks is broadcast: the night's keys and values, not the table's; the prior
    is scanned once, not shuffled."""
    from pyspark import StorageLevel
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    writes = events.where(~F.coalesce(F.col(OP) == READ, F.lit(False)))  # a read touches none
    keys = writes.select(
        F.explode(F.filter(F.array(KEY, "new_key"), lambda k: k.isNotNull())).alias(_KEY)
    ).distinct()
    df = prior.withColumn(_KEY, key_struct(table))
    df = df.join(F.broadcast(keys.withColumn(f"{_MARK}0", F.lit(True))), _KEY, "left")
    needed = F.col(f"{_MARK}0").isNotNull() | due
    possible = possible_values(events, table, extra) if table.unique else None
    for i, c in enumerate(unique_columns(table), 1):
        assert possible is not None
        mark = f"{_MARK}{i}"
        values = values_of(possible, c).withColumnRenamed(VALUE, _VALUE)
        marks = F.broadcast(values.withColumn(mark, F.lit(True)))
        df = df.join(marks, df[c] == marks[_VALUE], "left").drop(_VALUE)
        needed = needed | (~F.col(STATE_DELETED) & F.col(mark).isNotNull())
    narrowed = df.where(needed).select(*prior.columns).persist(StorageLevel.MEMORY_AND_DISK)
    seen = Observation()  # counted as the keys are written (the one job that reads them)
    counted = narrowed.observe(
        seen, F.count(F.lit(1)).alias("rows"), F.count_if(~F.col(STATE_DELETED)).alias("live")
    )
    write_output(
        counted.select(*table.key, (~F.col(STATE_DELETED)).alias(LIVE_MARK)), out / TOUCHED
    )
    got = seen.get
    record = replace(record, touched_rows=int(got["rows"]), touched_live=int(got["live"]))
    record.save(out)
    log.info(
        "resolve %s: %d prior row(s) of %d touched, merged in place",
        table.name,
        record.touched_rows,
        record.prior_rows,
    )
    return narrowed


def narrowed(
    prior: DataFrame,
    events: DataFrame,
    truncates: Sequence[object],
    table: Table,
    due: Column,
    out: WorkPath,
    record: InPlace | None,
    extra: DataFrame | None = None,
) -> DataFrame:
    """The prior rows a table's fold reads: those :func:`narrow` keeps for ``events``
    when the table is merged in place (``record``), else all of them. A TRUNCATE in the
    night (``truncates``) costs the whole table: it is then replaced, not merged."""
    if record is None:
        return prior
    if truncates:
        log.info("resolve %s: a TRUNCATE; the whole table is replaced", table.name)
        return prior
    return narrow(prior, events, table, due, out, record, extra)


def _overlay(published: DataFrame, rows: DataFrame, out: WorkPath, table: Table) -> DataFrame:
    """The table after the merge: the published rows of the keys not touched, and the
    run's ``rows`` (those of the touched keys)."""
    untouched = by_key(published, read_touched(rows.sparkSession, out), table.key, "left_anti")
    return untouched.unionByName(rows.select(*published.columns))


def whole_state(
    spark: SparkSession, staged_table: WorkPath, out: WorkPath, table: Table
) -> DataFrame | None:
    """The whole state the merge will make of the fold's rows (None: not merged in
    place): for the checks that need every row (the foreign keys)."""

    if InPlace.load(out) is None:
        return None
    prior = read_prior(spark, staged_table, table, check=False)
    return _overlay(prior, read_known(spark, out / STATE_PRE, state_schema(table)), out, table)


def _published_snapshot(
    spark: SparkSession, staged_table: WorkPath, out: WorkPath, table: Table
) -> DataFrame | None:
    """The snapshot a night merged in place starts from (None: not merged in place): the
    version of ``snapshot`` ingest planned from."""

    record, pin = InPlace.load(out), Pin.load(staged_table / PRIOR_PIN)
    if record is None or pin is None:
        return None
    path = layout.table_path(table.name, layout.SNAPSHOT)
    uri = pin.uri.removesuffix(layout.table_path(table.name, layout.STATE)) + path
    published = spark.read.format("delta").option("versionAsOf", record.versions[path]).load(uri)
    return published.select(*snapshot_columns(table))


def whole_snapshot(
    spark: SparkSession, staged_table: WorkPath, out: WorkPath, table: Table
) -> DataFrame | None:
    """The whole snapshot the merge will make of the run's snapshot rows (None: not
    merged in place), from the version of ``snapshot`` ingest planned from."""

    published = _published_snapshot(spark, staged_table, out, table)
    if published is None:
        return None
    return _overlay(published, read_output(spark, out / layout.SNAPSHOT), out, table)


def untouched_snapshot(
    spark: SparkSession, staged_table: WorkPath, out: WorkPath, table: Table
) -> DataFrame | None:
    """The published snapshot rows a night merged in place keeps as they are (None: not
    merged in place): those of the keys it did not touch."""
    published = _published_snapshot(spark, staged_table, out, table)
    if published is None:
        return None
    return by_key(published, read_touched(spark, out), table.key, "left_anti")


def touch(out: WorkPath, keys: DataFrame, table: Table) -> None:
    """Live published rows the run removes though its fold did not read them (orphans
    the foreign-key step quarantined): their keys added to ``touched`` (the merge deletes
    them), counted in the record."""
    from pyspark.sql import functions as F

    record = InPlace.load(out)
    assert record is not None
    new = keys.select(*table.key).distinct()
    new = by_key(new, read_touched(keys.sparkSession, out), table.key, "left_anti")
    n = write_output(new.select("*", F.lit(True).alias(LIVE_MARK)), out / TOUCHED, mode="append")
    more = replace(
        record, touched_rows=record.touched_rows + n, touched_live=record.touched_live + n
    )
    more.save(out)


def history_keys(spark: SparkSession, out: WorkPath, table: Table) -> DataFrame:
    """The keys whose history a night merged in place rewrites (history): those the fold read
    and those its final state holds (new keys included)."""

    final = read_known(spark, final_state(out), state_schema(table)).select(*table.key)
    return final.unionByName(read_touched(spark, out).select(*table.key)).distinct()


def touched_prior(prior: DataFrame, out: WorkPath, table: Table) -> DataFrame:
    """``prior`` cut to the keys :func:`narrow` recorded in ``out`` (the whole of it for a
    table not merged in place): what the fold read, for the checks that replay it."""
    if InPlace.load(out) is None:
        return prior
    return by_key(prior, read_touched(prior.sparkSession, out), table.key, "left_semi")
