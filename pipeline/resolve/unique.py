"""The values a row may take in a unique column tonight (docs/rules.md#fine-points,
multiple_unique_conflicts): what decides which keys the fold must see together
(``engine.coupled_keys``) and which untouched rows a night merged in place must read
(``inplace.narrow``). One function serves both, so that the two paths fold the same keys
together (docs/outputs.md#a-night-costs-the-night).

A row's value comes from one of:

- an INSERT's or UPDATE's ``after`` (at its new key, for a key change);
- an event's ``before`` (``update_missing: apply_or_*`` builds the row from it);
- the table's ``defaults`` (``target_column_extra: use_default`` fills a column the event
  lacks);
- a value no export states: a custom resolver's row, an operator's decision, a delta
  column's sum. The fold tasks report each such value a row held (*unforeseen*, with its
  key: ``group_fold``); when one meets a row of another key the fold did not read with it
  (:func:`refold_needed`), the table is folded again with those values added here as
  ``extra``.
"""

from __future__ import annotations

from functools import reduce
from typing import TYPE_CHECKING

from pipeline.core.columns import AFTER, BEFORE, KEY, OP, STATE_DELETED
from pipeline.core.config import Table
from pipeline.resolve.shuffle import key_struct
from pipeline.spark.frames import VALUE
from pipeline.spark.schema import spark_type

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame


def unique_columns(table: Table) -> list[str]:
    """Every column of a unique constraint, once, sorted."""
    return sorted({c for u in table.unique for c in u})


def value_column(c: str) -> str:
    """The column of :func:`possible_values` with the values of unique column ``c``."""
    return f"v_{c}"


def possible_values(events: DataFrame, table: Table, extra: DataFrame | None = None) -> DataFrame:
    """One row per (key, source) with each unique column's value from that source (null:
    none): the module's sources, for the typed copies ``events`` (``frames.copy_schema``)
    and the ``extra`` values (rows of the fold tasks' ``UNFORESEEN`` output). Columns: ``key`` and
    :func:`value_column` of each unique column."""
    from pyspark.sql import functions as F

    names, cols = table.column_names, unique_columns(table)
    events = events.where(F.col(KEY).isNotNull())
    writes = events.where(F.col(OP).isin("INSERT", "UPDATE"))

    def image(image: str, has: str) -> list[Column]:
        return [
            F.when(F.col(has)[names.index(c)], F.col(f"{image}.{c}")).alias(value_column(c))
            for c in cols
        ]

    sources = [
        writes.select(F.coalesce("new_key", KEY).alias(KEY), *image(AFTER, "after_has")),
        events.where(F.col("before_has").isNotNull()).select(KEY, *image(BEFORE, "before_has")),
    ]
    defaults = {c: table.defaults[c] for c in cols if table.defaults.get(c) is not None}
    if defaults:
        sources.append(
            writes.select(
                F.coalesce("new_key", KEY).alias(KEY),
                *[
                    F.lit(defaults[c]).cast(spark_type(table.column(c).type))
                    if c in defaults
                    else F.lit(None).cast(spark_type(table.column(c).type))
                    for c in cols
                ],
            ).toDF(KEY, *[value_column(c) for c in cols])
        )
    if extra is not None:
        sources.append(
            extra.select(KEY, *[F.col(f"{VALUE}.{c}").alias(value_column(c)) for c in cols])
        )
    return reduce(lambda a, b: a.unionByName(b), sources)


def values_of(possible: DataFrame, c: str) -> DataFrame:
    """The distinct non-null values of unique column ``c`` among ``possible``
    (:func:`possible_values`), as one column ``value``."""
    from pyspark.sql import functions as F

    v = F.col(value_column(c))
    return possible.where(v.isNotNull()).select(v.alias(VALUE)).distinct()


def refold_needed(
    unforeseen: DataFrame,
    prior: DataFrame,
    events: DataFrame,
    table: Table,
    coupled: DataFrame | None,
) -> bool:
    """Whether an unforeseen value (``unforeseen``: what the fold tasks reported) is held
    by another key than the one that took it, among the live rows of the whole ``prior``,
    the night's :func:`possible_values` and the other unforeseen values, when the two keys
    were not folded together (``coupled``: the keys folded as one group). Compared column
    by column: a constraint of several columns may call for a fold that finds no
    collision, never miss one."""
    from pyspark.sql import functions as F

    possible = possible_values(events, table, unforeseen)
    live = prior.where(~F.col(STATE_DELETED))
    together = set() if coupled is None else {tuple(r[KEY]) for r in coupled.select(KEY).collect()}
    for c in unique_columns(table):
        taken = values_of(unforeseen.select(KEY, F.col(f"{VALUE}.{c}").alias(value_column(c))), c)
        if not taken.take(1):
            continue
        holders = live.select(key_struct(table).alias(KEY), F.col(c).alias(VALUE)).unionByName(
            possible.select(KEY, F.col(value_column(c)).alias(VALUE))
        )
        held = holders.join(F.broadcast(taken), VALUE, "left_semi").distinct()
        shared = held.groupBy(VALUE).agg(F.collect_set(KEY).alias("keys"))
        for r in shared.where(F.size("keys") > 1).collect():
            keys = {tuple(k) for k in r["keys"]}
            if not keys <= together:
                return True
    return False
