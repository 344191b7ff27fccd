"""Clock-skew evidence (extensions.md E7): an UPDATE or DELETE whose ``before`` matches a
version another origin wrote with a *later* ts saw that version, yet is stamped earlier:
its origin's clock was behind by at least the difference.

Which version an event saw is read from its origin's own export, whose ``seq`` is the
order that replica applied the changes in: the change of the same key just before the
event there. It is the evidence when it came from another origin, is stamped later than
the event, and its ``after`` holds every column the event's ``before`` and it share with
the same values (at least one). One Spark job per table over the typed copies; per
ordered pair (the replica behind, the one ahead) the number of such events and the
largest difference.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import reduce
from typing import Any

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from pipeline.config import Table
from pipeline.summary import TableSummary

#: the fields of one pair's evidence in the run report
EVENTS, MAX_SECONDS = "events", "max_seconds"


def _matches(table: Table, seen: str) -> Column:
    """The event's ``before`` and the ``after`` of the change ``seen`` agree on every
    column both hold, and they hold one at least."""
    both, same = [], []
    for i, c in enumerate(table.column_names):
        shared = F.col("before_has")[i] & F.col(f"{seen}.after_has")[i]
        both.append(shared)
        same.append(~shared | F.col(f"before.{c}").eqNullSafe(F.col(f"{seen}.after.{c}")))
    return reduce(lambda a, b: a | b, both) & reduce(lambda a, b: a & b, same)


def skew_evidence(copies: DataFrame, table: Table) -> dict[str, dict[str, dict[str, Any]]]:
    """``{behind: {ahead: {events, max_seconds}}}`` of one table's copies
    (``frames.copy_schema``; malformed copies, with a ``reason``, left out)."""
    own = Window.partitionBy("replica", "key").orderBy("seq")
    seen = F.struct("origin", "ts", "op", "after", "after_has")
    df = copies.where(F.col("reason").isNull()).select(
        "replica", "origin", "op", "ts", "before", "before_has", F.lag(seen).over(own).alias("s")
    )
    evidence = df.where(
        (F.col("origin") == F.col("replica"))
        & F.col("op").isin("UPDATE", "DELETE")
        & F.col("before_has").isNotNull()
        & F.col("s.op").isin("INSERT", "UPDATE")
        & (F.col("s.origin") != F.col("origin"))
        & (F.col("s.ts") > F.col("ts"))
        & _matches(table, "s")
    )
    rows = (
        evidence.groupBy(F.col("origin").alias("behind"), F.col("s.origin").alias("ahead"))
        .agg(F.count("*").alias("n"), F.max(F.col("s.ts") - F.col("ts")).alias("lag"))
        .collect()
    )
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for r in sorted(rows, key=lambda r: (r["behind"], r["ahead"])):
        out.setdefault(r["behind"], {})[r["ahead"]] = {
            EVENTS: int(r["n"]),
            MAX_SECONDS: r["lag"] / 1_000_000,
        }
    return out


def skew_warnings(tables: Mapping[str, TableSummary], max_seconds: int) -> list[str]:
    """A warning per table and pair whose largest difference is above ``max_seconds``
    (``max_clock_skew_seconds``)."""
    out = []
    for t, summary in tables.items():
        for behind, ahead in summary.clock_skew.items():
            for other, ev in ahead.items():
                if ev[MAX_SECONDS] > max_seconds:
                    out.append(
                        f"table {t}: the clock of replica {behind} runs behind {other}'s by "
                        f"{ev[MAX_SECONDS]:.1f} s at least ({ev[EVENTS]} event(s) saw a "
                        f"version of {other} stamped later than themselves; "
                        f"max_clock_skew_seconds: {max_seconds})"
                    )
    return out
