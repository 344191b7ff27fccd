"""Clock-skew evidence (docs/operations.md#clock-skew-evidence): an UPDATE or DELETE whose
``before`` matches a
version another origin wrote with a *later* ts saw that version, yet is stamped earlier:
its origin's clock was behind by at least the difference.

Which version an event saw is read from its origin's own export, whose ``seq`` is the
order that replica applied the changes in: the change of the same key just before the
event there. It is the evidence when it came from another origin, is stamped later than
the event, and its ``after`` holds every column the event's ``before`` and it share with
the same values (at least one). Per ordered pair (the replica behind, the one ahead),
the number of such events and the largest difference.

The row engine finds the evidence in its fold tasks, which hold every copy of a key
(:func:`seen_later`); the cell engine in its shuffle by key, with one more window
(:func:`with_evidence`). Neither pays a shuffle of its own. ``tests/spark/test_extensions.py``
checks on generated nights that both give the same evidence. The fold reads a copy's
fields from the copy that stands for its event (the copies of one event agree, save the
rare ones the ``differing_copies`` log names); the cell engine reads each copy's own, and
leaves out the copies an earlier night resolved, which it sets aside before its shuffle.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from functools import reduce
from typing import Any

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from pipeline.core.columns import AFTER, BEFORE, KEY, OP, ORIGIN, REPLICA, SEQ, TS
from pipeline.core.config import Table
from pipeline.core.summary import TableSummary
from pipeline.spark.frames import SKEW_FIELDS

#: the fields of one pair's evidence in the run report
EVENTS, MAX_SECONDS = "events", "max_seconds"
#: one evidence event: (the replica behind, the replica ahead, the difference in µs)
Evidence = tuple[str, str, int]
_SAW = ("INSERT", "UPDATE")  # what an event may have seen
_SAWS = ("UPDATE", "DELETE")  # what may have seen it


def _matches(table: Table, seen: str) -> Column:
    """The event's ``before`` and the ``after`` of the change ``seen`` agree on every
    column both hold, and they hold one at least."""
    both, same = [], []
    for i, c in enumerate(table.column_names):
        shared = F.col("before_has")[i] & F.col(f"{seen}.after_has")[i]
        both.append(shared)
        same.append(~shared | F.col(f"before.{c}").eqNullSafe(F.col(f"{seen}.after.{c}")))
    return reduce(lambda a, b: a | b, both) & reduce(lambda a, b: a & b, same)


def with_evidence(df: DataFrame, table: Table) -> DataFrame:
    """``df`` (rows of ``frames.copy_schema``'s fields, partitioned by ``key`` or not) with
    one more column, ``skew``: a struct of :data:`SKEW_FIELDS` on each copy that is the
    evidence, else null. Malformed copies (with a ``reason``) neither are nor give
    evidence. The window is by key first, so that a frame already partitioned by key (the
    cell engine's shuffle) is not shuffled again."""
    valid = F.col("reason").isNull()
    own = Window.partitionBy(KEY, REPLICA, valid).orderBy(SEQ)
    seen = F.struct(ORIGIN, TS, OP, AFTER, "after_has")
    df = df.withColumn("_s", F.lag(seen).over(own))
    evidence = (
        valid
        & (F.col(ORIGIN) == F.col(REPLICA))
        & F.col(OP).isin(*_SAWS)
        & F.col("before_has").isNotNull()
        & F.col("_s.op").isin(*_SAW)
        & (F.col("_s.origin") != F.col(ORIGIN))
        & (F.col("_s.ts") > F.col(TS))
        & _matches(table, "_s")
    )
    fields = (F.col(ORIGIN), F.col("_s.origin"), F.col("_s.ts") - F.col(TS))
    skew = F.struct(*[c.alias(n) for c, n in zip(fields, SKEW_FIELDS, strict=True)])
    return df.withColumn("skew", F.when(evidence, skew)).drop("_s")


def tally(df: DataFrame) -> dict[str, dict[str, dict[str, Any]]]:
    """``{behind: {ahead: {events, max_seconds}}}`` of the ``skew`` column of
    :func:`with_evidence`: one small job."""
    behind, ahead, lag = SKEW_FIELDS
    rows = (
        df.where(F.col("skew").isNotNull())
        .select("skew.*")
        .groupBy(behind, ahead)
        .agg(F.count("*").alias("n"), F.max(lag).alias("lag"))
        .collect()
    )
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for r in sorted(rows, key=lambda r: (r[behind], r[ahead])):
        out.setdefault(r[behind], {})[r[ahead]] = {
            EVENTS: int(r["n"]),
            MAX_SECONDS: r["lag"] / 1_000_000,
        }
    return out


def _agree(cur: Mapping[str, Any], prev: Mapping[str, Any], columns: Sequence[str]) -> bool:
    """:func:`_matches` for one pair: ``cur``'s ``before`` and ``prev``'s ``after`` agree
    on every column both hold, and they hold one at least."""
    b_has, a_has = cur["before_has"], prev["after_has"] or ()
    shared = [c for c, b, a in zip(columns, b_has, a_has, strict=False) if b and a]
    before, after = cur[BEFORE], prev[AFTER]
    return bool(shared) and all(before[c] == after[c] for c in shared)


def seen_later(
    copies: Iterable[tuple[str, int, Mapping[str, Any]]], columns: Sequence[str]
) -> Iterator[Evidence]:
    """The evidence among the copies of a few keys (a fold task's group), the rule of
    :func:`with_evidence` in Python. ``copies``: (replica, seq, the fields of the copy that
    stands for its event: ``key``, ``op``, ``origin``, ``ts``, images and flags,
    ``reason``)."""
    own: dict[tuple[str, Any], list[tuple[int, Mapping[str, Any]]]] = {}
    for replica, seq, e in copies:
        if e["reason"] is None:
            own.setdefault((replica, tuple(e[KEY].values())), []).append((seq, e))
    for (replica, _key), rows in own.items():
        if len(rows) < 2:
            continue
        rows.sort(key=lambda r: r[0])
        for (_s, prev), (_t, cur) in itertools.pairwise(rows):
            if (
                cur[ORIGIN] == replica
                and cur[OP] in _SAWS
                and cur["before_has"] is not None
                and prev[OP] in _SAW
                and prev[ORIGIN] != replica
                and prev[TS] > cur[TS]
                and _agree(cur, prev, columns)
            ):
                yield replica, prev[ORIGIN], prev[TS] - cur[TS]


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
