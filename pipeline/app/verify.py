"""``cdr verify --date D``: the whole-table checks of a published date, recomputed
over the whole tables at the versions D's ``runs`` row names.

A night merged in place (``pipeline.ingest.inplace``) checks what it touched: the carried row
counts against Delta's, the snapshot and the CDC replay on the touched keys. This is
the audit that covers the rest, for any date within the retention (time travel): the
rows the ``runs`` row counts, no key twice, the snapshot exactly the state's live rows,
no unique value twice, every reference to a live parent (when the policy removes
orphans). Each check reads whole tables: run it off the nightly path.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import date
from functools import reduce
from typing import TYPE_CHECKING, Any

from pipeline.core import layout
from pipeline.core.columns import DT, STATE_DELETED
from pipeline.core.config import Config, Table
from pipeline.core.errors import StageError
from pipeline.core.policy import FkPolicy, Granularity
from pipeline.core.progress import current as progress
from pipeline.ingest.prior import state_path
from pipeline.spark.progress import watching
from pipeline.storage.runs_table import published_by_date, read_runs

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from pipeline.storage.lake import Lake

#: every check, what it asserts
CHECKS = {
    "state_rows": "the state holds the rows its runs row counts",
    "snapshot_rows": "the snapshot holds the rows its runs row counts",
    "state_keys": "no key twice in the state",
    "snapshot_keys": "no key twice in the snapshot",
    "snapshot_is_live_state": "the snapshot is the state's live rows, column by column",
    "unique": "no value of a unique constraint twice among the live rows",
    "foreign_keys": "every live row's reference has a live parent",
}


@dataclass(frozen=True)
class Finding:
    """One check of one table: what was found, and what must be (None: reported only)."""

    table: str
    check: str
    observed: int
    expected: int | None

    @property
    def ok(self) -> bool:
        return self.expected is None or self.observed == self.expected

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok, "description": CHECKS[self.check]}


def _duplicates(df: DataFrame, cols: list[str]) -> int:
    """Rows beyond the first of each value of ``cols`` (rows with a null in them aside)."""
    from pyspark.sql import functions as F

    keyed = df.where(reduce(lambda a, b: a & b, [F.col(c).isNotNull() for c in cols]))
    extra = keyed.groupBy(*cols).count().where("count > 1").agg(F.sum(F.col("count") - 1))
    got = extra.first()
    return int(got[0] or 0) if got else 0


def check_table(
    config: Config,
    table: Table,
    state: DataFrame,
    snapshot: DataFrame | None,
    counts: dict[str, Any],
    states: dict[str, DataFrame],
) -> list[Finding]:
    """The checks of one table: ``state`` and ``snapshot`` (None for a backfill, which
    publishes none) as the run left them, ``counts`` its runs row's, ``states`` every
    table's state (the parents of its foreign keys)."""
    from pyspark.sql import functions as F

    from pipeline.spark.schema import snapshot_columns  # deferred: loads pyspark

    t = table.name
    key = list(table.key)
    found = [
        Finding(t, "state_rows", state.count(), int(counts.get("state_rows", -1))),
        Finding(t, "state_keys", _duplicates(state, key), 0),
    ]
    live = state.where(~F.coalesce(F.col(STATE_DELETED), F.lit(False)))
    if snapshot is not None:
        found += [
            Finding(t, "snapshot_rows", snapshot.count(), int(counts.get("rows", -1))),
            Finding(t, "snapshot_keys", _duplicates(snapshot, key), 0),
        ]
        if table.granularity is Granularity.ROW:  # a cell table's view also expires cells
            shown = snapshot_columns(table)
            mine = live.select(*shown)
            differ = mine.exceptAll(snapshot.select(*shown)).count()
            differ += snapshot.select(*shown).exceptAll(mine).count()
            found.append(Finding(t, "snapshot_is_live_state", differ, 0))
    if table.granularity is Granularity.ROW:
        for unique in table.unique:
            found.append(Finding(t, "unique", _duplicates(live, list(unique)), 0))
    removes = config.on_fk_violation is not FkPolicy.WARN
    for fk in table.foreign_keys:
        if fk.references not in states:  # a parent the run did not publish
            continue
        parent = config.tables[fk.references]
        pairs = list(zip(fk.columns, parent.key, strict=True))
        parents = (
            states[parent.name]
            .where(~F.coalesce(F.col(STATE_DELETED), F.lit(False)))
            .select(*[F.col(pk).alias(c) for c, pk in pairs])
        )
        child = live.where(reduce(lambda a, b: a & b, [F.col(c).isNotNull() for c in fk.columns]))
        orphans = child.join(parents, list(fk.columns), "left_anti").count()
        found.append(Finding(t, "foreign_keys", orphans, 0 if removes else None))
    return found


def _published(lake: Lake, run: Any, path: str) -> DataFrame:
    """Table ``path`` at the version ``run`` names (its date's partition, in the layout
    before the state was one table)."""
    from pyspark.sql import functions as F

    df = lake.frame(path, run.versions[path])
    if DT in df.columns:
        df = df.where(F.col(DT) == F.lit(run.dt)).drop(DT)
    return df


def verify(config: Config, lake: Lake, dt: date) -> list[Finding]:
    """Every check of every table D's published run names."""

    run = published_by_date(read_runs(lake)).get(dt)
    if run is None:
        raise StageError(f"no published run of {dt}: nothing to verify")
    states, snapshots = {}, {}
    for t in config.tables:
        path = state_path(run, t)
        if path is None or t not in run.tables():
            continue
        states[t] = _published(lake, run, path)
        snap = layout.table_path(t, layout.SNAPSHOT)
        snapshots[t] = _published(lake, run, snap) if snap in run.versions else None
    found: list[Finding] = []
    spark = next(iter(states.values())).sparkSession if states else None
    with progress().stage("verify"), watching(spark):
        for i, (t, state) in enumerate(states.items(), 1):
            progress().step(t, i, len(states), "tables")
            found += check_table(
                config, config.tables[t], state, snapshots[t], run.tables()[t], states
            )
    return found
