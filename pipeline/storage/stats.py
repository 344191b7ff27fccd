"""docs/operations.md#conflict-trends: conflict statistics across runs.

``published/conflict_stats`` (Delta, by ``dt``): one row per run, table and thing
counted, in long form so that a new conflict type or replica is a new row, not a new
column:

- ``kind = events``: the distinct events of the night (every run of a table has it);
- ``kind = conflicts``: ``conflict_type``, ``resolver``, ``outcome`` (from the conflict log);
- ``kind = lost_writes``: the writes lost to concurrent conflicts (docs/rules.md#lost-writes);
- ``kind = quarantined``: ``reason``;
- ``kind = divergent_keys``: ``replica`` (the perspectives, docs/rules.md#convergence), and
  ``snapshot_divergent_keys`` (the replicas' full copies);
- ``kind = retried``: ``outcome`` (what became of the quarantined events offered again, retry).

Written by the resolve stage into ``resolved/conflict_stats`` and committed with the run,
replacing the date's partition; a run of a subset of the tables keeps the date's rows of
the others. The Conflicts page draws each table's last runs from it (:func:`trends`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import date
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.core import layout
from pipeline.core.columns import DT, REPLICA, RUN_ID
from pipeline.core.summary import RunSummary, TableSummary
from pipeline.storage.lake import Lake
from pipeline.storage.outputs import note_small_output
from pipeline.storage.workpath import WorkPath

PATH = layout.CONFLICT_STATS
FOLDER = "conflict_stats"  # in the run's ``resolved`` folder
_S = pa.string()
SCHEMA = pa.schema(
    [
        (RUN_ID, _S),
        ("table", _S),
        ("kind", _S),
        ("conflict_type", _S),
        ("resolver", _S),
        ("outcome", _S),
        ("reason", _S),
        (REPLICA, _S),
        ("count", pa.int64()),
    ]
)
LOST_WRITES = "lost_writes"
#: the kinds a trend draws, in the chart's order
TREND_KINDS = ("conflicts", "quarantined", "divergent_keys")


def _table_rows(
    s: TableSummary, conflicts: Mapping[tuple[str, str, str], int]
) -> Iterator[dict[str, Any]]:
    yield {"kind": "events", "count": s.distinct_events}  # every run of the table has a row
    for (conflict_type, resolver, outcome), n in sorted(conflicts.items(), key=_by_names):
        yield {
            "kind": "conflicts",
            "conflict_type": conflict_type,
            "resolver": resolver,
            "outcome": outcome,
            "count": n,
        }
    if s.lost_writes:  # docs/rules.md#lost-writes
        yield {"kind": LOST_WRITES, "count": s.lost_writes}
    for reason, n in sorted(s.quarantined.items()):
        yield {"kind": "quarantined", "reason": reason, "count": n}
    for replica, n in sorted(s.divergent_keys.items()):
        yield {"kind": "divergent_keys", REPLICA: replica, "count": n}
    for replica, n in sorted(s.snapshot_divergent_keys.items()):
        yield {"kind": "snapshot_divergent_keys", REPLICA: replica, "count": n}
    for outcome, n in sorted(s.retried.items()):
        yield {"kind": "retried", "outcome": outcome, "count": n}


def _by_names(item: tuple[tuple[str, str, str], int]) -> tuple[str, ...]:
    return tuple(name or "" for name in item[0])  # a conflict without a resolver: null


def write_stats(
    resolved: WorkPath,
    summary: RunSummary,
    conflicts: Mapping[str, Mapping[tuple[str, str, str], int]],
    others: pa.Table | None,
) -> int:
    """The run's statistics into ``resolved/conflict_stats``, from its report and each
    table's conflict log counted per conflict type, resolver and outcome (by the
    executors: ``resolve.Facts``); with ``others``, the date's published rows of the
    tables this run leaves alone. A few rows: recorded whole beside the outputs
    (``spark.note_small_output``), in no file. Returns the row count."""
    from pyspark.sql.pandas.types import from_arrow_schema

    rows: list[dict[str, Any]] = []
    for name, s in summary.tables.items():
        table_rows = _table_rows(s, conflicts.get(name, {}))
        rows += [{RUN_ID: summary.run_id, "table": name, **r} for r in table_rows]
    data = pa.Table.from_pylist(rows, SCHEMA)
    if others is not None and others.num_rows:
        data = pa.concat_tables([data, others.select(SCHEMA.names).cast(SCHEMA)])
    as_rows = [tuple(r.values()) for r in data.to_pylist()]
    note_small_output(resolved / FOLDER, from_arrow_schema(SCHEMA), as_rows)
    return data.num_rows


#: the keys of a ``runs`` row's counts that hold the run's own conflicts and those of
#: the runs it replaced in ``conflict_stats`` (E13's counters, docs/operations.md#metrics)
RUN_CONFLICTS, REPLACED = "conflicts", "replaced_conflicts"
_REPLACED_FILE = "conflict_stats_replaced.json"  # in the run's ``resolved`` folder
_KEYS = ("table", "conflict_type", "resolver", "outcome", "count")


def run_counts(resolved: WorkPath, run_id: str) -> dict[str, list[list[Any]]]:
    """What the ``runs`` row of run ``run_id`` keeps for the counters: its own conflicts
    (:data:`RUN_CONFLICTS`), as its ``resolved/conflict_stats`` records them, ``[table,
    conflict_type, resolver, outcome, count]`` rows of its own tables only (not the date's
    kept rows of the others); and the date's conflict rows it replaces
    (:data:`REPLACED`, ``[run_id, ...]``): a run of a release before these keys counts by
    them once its rows are gone."""
    from pipeline.storage.outputs import output_record  # deferred: imports pyspark

    info = output_record(resolved / FOLDER)
    rows = [dict(zip(SCHEMA.names, r, strict=True)) for r in (info.data or [])] if info else []
    own = [[r[k] for k in _KEYS] for r in rows if r[RUN_ID] == run_id and r["kind"] == "conflicts"]
    p = resolved / _REPLACED_FILE
    replaced = json.loads(p.read_text()) if p.exists() else []
    return {RUN_CONFLICTS: own, REPLACED: replaced}


def note_replaced(resolved: WorkPath, lake: Lake, dt: date, tables: Mapping[str, Any]) -> None:
    """The date's published conflict rows of ``tables`` (the run replaces them), for
    :func:`run_counts`."""
    got = lake.read(PATH, dt=dt)
    rows = [] if got is None else got.to_pylist()
    replaced = [
        [r[RUN_ID], *(r[k] for k in _KEYS)]
        for r in rows
        if r["table"] in tables and r["kind"] == "conflicts"
    ]
    (resolved / _REPLACED_FILE).write_text(json.dumps(replaced))


def kept_rows(lake: Lake, dt: date, tables: Mapping[str, Any]) -> pa.Table | None:
    """The date's published rows of the tables not in ``tables`` (a subset run)."""
    got = lake.read(PATH, dt=dt)
    if got is None:
        return None
    return got.filter(pc.invert(pc.is_in(got["table"], pa.array(list(tables), _S))))


@dataclass(frozen=True)
class Point:
    """One run of one table in its trend."""

    dt: str
    run_id: str
    conflicts: int
    quarantined: int
    divergent_keys: int


def trends(lake: Lake, last: int = 30) -> dict[str, list[Point]]:
    """Per table, its last ``last`` runs (by date, oldest first), each with its totals."""
    got = lake.read(PATH, columns=[RUN_ID, "table", "kind", "count", DT])
    if got is None or got.num_rows == 0:
        return {}
    sums = got.group_by(["table", DT, RUN_ID, "kind"]).aggregate([("count", "sum")])
    by: dict[str, dict[tuple[str, str], dict[str, int]]] = {}
    for r in sums.to_pylist():
        key = (str(r[DT]), r[RUN_ID])
        by.setdefault(r["table"], {}).setdefault(key, {})[r["kind"]] = r["count_sum"]
    out = {}
    for table, runs in sorted(by.items()):
        points = [
            Point(dt, run_id, *(kinds.get(k, 0) for k in TREND_KINDS))
            for (dt, run_id), kinds in sorted(runs.items())
        ]
        out[table] = points[-last:]
    return out
