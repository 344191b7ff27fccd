"""A night that costs the night (docs/outputs.md#a-night-costs-the-night): a run
whose prior is the newest published date reads only the prior rows its events touch,
folds only them, and MERGEs the resulting rows into ``state``, ``snapshot`` and (history)
``history`` in place (deletion vectors: no data file that holds none of them is
rewritten).

Three steps, one per stage:

- **ingest** (:func:`plan`) decides whether the table can be merged in place: a table
  whose prior is the newest published date, with its tables (the history too, once the
  prior run published one) still at the versions that date's ``runs`` row names (or
  at later ones whose commits change no data: Delta's ``OPTIMIZE``) and the state's
  columns unchanged. Anything else (a rerun of the newest date, a backfill, a
  table whose latest versions another run moved) takes the whole-table path, which is
  exact for every case: it starts from the pinned version and replaces the table in one
  commit.
- **resolve** (:func:`narrow`) keeps the prior rows the fold needs: the keys the night's
  events name (a key change's new key included), the live rows holding a unique value
  an event writes, and the tombstones whose GC is due (purged: deleted from ``state``);
  in a cell table, the rows whose TTL expires since the prior run's clock
  (``cells.state.due``) and the table tombstone.
  Their keys are written as ``touched``; their counts go into the record
  (:class:`InPlace`), which carries the table's row counts: the prior's, minus the
  touched rows, plus the fold's output.
- **publish** (``pipeline.publish.commit``) merges each output by key (:func:`merge_source`):
  the fold's rows replace or add theirs, a touched key the output no longer holds is
  deleted (the history's versions are merged by key, date and number, none deleted).
  Before, the table must still be at the version ingest found; after, the committed
  version's row count (Delta's, deletion vectors applied) must be the carried count and
  the rows of the files it added the output's (count and checksum), else the version
  before is restored.

A TRUNCATE in the night, or a replica's full-copy export, costs the table by nature: the
resolve then writes no record, and the table takes the whole-table path.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, replace
from datetime import date
from typing import TYPE_CHECKING, Any

from pipeline.core import layout
from pipeline.core.columns import DT, KEY
from pipeline.core.config import Config
from pipeline.core.policy import Granularity
from pipeline.storage.lake import DROP
from pipeline.storage.outputs import read_output
from pipeline.storage.runs_table import latest_date

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pyspark.sql import DataFrame, SparkSession

    from pipeline.storage.lake import Lake
    from pipeline.storage.lake_read import Pin
    from pipeline.storage.runs_table import RunRow
    from pipeline.storage.workpath import WorkPath

log = logging.getLogger(__name__)

#: the record of a table merged in place, in its ``resolved`` folder
RECORD = "in_place.json"
#: the in-place record's key in the staged table's ``prior``
STAGED_KEY = "in_place"


@dataclass(frozen=True)
class InPlace:
    """One table merged in place: the versions it starts from and the counts it carries."""

    key: tuple[str, ...]
    versions: dict[str, int]  # each table merged -> P's version, or a later one of its rows
    prior_rows: int  # P's state rows (its runs row's ``state_rows``)
    prior_live: int  # P's snapshot rows
    touched_rows: int = 0  # prior rows the fold read
    touched_live: int = 0  # of them live
    state_rows: int = -1  # the table's rows after the merge (-1: not yet counted)
    rows: int = -1  # the snapshot's
    prior_history: int = -1  # history: P's history rows (-1: no history merged)
    history_rows: int = -1  # the history's after the merge
    prior_now_us: int = -1  # P's run's clock: a cell table's TTLs expire since then

    def carried(self, state_out: int, snapshot_out: int) -> InPlace:
        """With the rows after the merge: the prior's, minus the touched rows (each is in
        the output, or deleted), plus the output's."""
        return replace(
            self,
            state_rows=self.prior_rows - self.touched_rows + state_out,
            rows=self.prior_live - self.touched_live + snapshot_out,
        )

    def rows_of(self, path: str) -> int:
        """The rows table ``path`` holds after the merge."""
        if path.endswith(f"/{layout.HISTORY}"):
            return self.history_rows
        return self.rows if path.endswith(f"/{layout.SNAPSHOT}") else self.state_rows

    def merge_key(self, path: str) -> tuple[str, ...]:
        """The columns a row of ``path`` is merged by: the table's key, and in the history
        the version's date and number (a version is never deleted: no ``touched``)."""
        return (*self.key, DT, "_version") if path.endswith(f"/{layout.HISTORY}") else self.key

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(d: dict[str, Any]) -> InPlace:
        return InPlace(**{**d, KEY: tuple(d[KEY]), "versions": dict(d["versions"])})

    def save(self, out: WorkPath) -> None:
        (out / RECORD).write_text(json.dumps(self.to_json(), indent=1, sort_keys=True))

    @staticmethod
    def load(out: WorkPath) -> InPlace | None:
        p = out / RECORD
        return InPlace.from_json(json.loads(p.read_text())) if p.is_file() else None


@dataclass(frozen=True)
class Plan:
    """What ingest decided for one table: the record to start from, or why not."""

    record: InPlace | None
    why_not: str = ""


def plan(
    config: Config,
    lake: Lake,
    runs: list[RunRow],
    run: RunRow,
    pin: Pin,
    name: str,
    dt: date,
    now_us: int,
) -> Plan:
    """Whether the run of ``dt`` merges table ``name`` in place, starting from ``run``'s
    state (``pin``). The latest versions of ``state`` and ``snapshot`` are those ``run``'s
    row names, or the run takes the whole-table path (a warning names the table and both
    versions: another run moved it, or restored it after a refused commit)."""
    from pipeline.spark.schema import state_schema  # deferred: loads pyspark

    table = config.tables[name]
    if latest_date(runs, name) != run.dt or run.dt >= dt:
        return Plan(None, "the run is not for a date after the newest published one")
    state, snapshot = (
        layout.table_path(name, layout.STATE),
        layout.table_path(name, layout.SNAPSHOT),
    )
    if pin.dates is not None or state not in run.versions or snapshot not in run.versions:
        return Plan(None, "the prior state is in the layout before the state was one table")
    paths = [state, snapshot]
    if table.history is not None:  # history: merged too, once the prior run published it
        history = layout.table_path(name, layout.HISTORY)
        if history not in run.versions:
            return Plan(None, "the history starts: the prior run did not publish one")
        paths.append(history)
    versions, moved = _start_versions(lake, run, paths, name)
    if moved:
        for m in moved:
            log.warning("ingest %s: %s: this run replaces the whole table", name, m)
        return Plan(None, "; ".join(moved))
    t = lake.table(state, versions[state])
    if [f.name for f in t.schema().fields] != state_schema(table).names:
        return Plan(None, "the config changed the state's columns")
    tables = run.tables().get(name, {})
    record = InPlace(
        tuple(table.key),
        versions,
        int(tables.get("state_rows", pin.rows)),
        int(tables.get("rows", -1)),
        prior_history=int(tables.get("history", {}).get("rows", -1)),
        prior_now_us=int(run.counts.get("now_us", -1)),
    )
    if (
        record.prior_rows < 0
        or record.prior_live < 0
        or (table.history is not None and record.prior_history < 0)
    ):
        return Plan(None, "the prior run's row counts are not recorded")
    if table.granularity is Granularity.CELL and record.prior_now_us < 0:
        return Plan(None, "the prior run's clock is not recorded (its TTLs expire since then)")
    if table.granularity is Granularity.CELL and now_us < record.prior_now_us:
        return Plan(None, "the run's clock is before the prior run's: a TTL may live again")
    return Plan(record)


def _start_versions(
    lake: Lake, run: RunRow, paths: list[str], name: str
) -> tuple[dict[str, int], list[str]]:
    """The version of each table the merge starts from (its latest: ``run``'s, or a later
    one whose commits change no data, Delta's ``OPTIMIZE``), and why each table that
    moved otherwise cannot be merged into."""
    versions, moved = {}, []
    for p in paths:
        v, now = run.versions[p], lake.version(p)
        versions[p] = v if now is None else now
        if now is None or now < v or any(lake.changes_data(p, n) for n in range(v + 1, now + 1)):
            moved.append(
                f"{p} is at version {now}, not version {v} that run {run.run_id} of {run.dt} names"
            )
        elif now != v:  # Delta's OPTIMIZE: the rows of version v in other files
            log.info("ingest %s: %s versions %d to %d change no data", name, p, v + 1, now)
    return versions, moved


def staged_record(prior: dict[str, Any] | None) -> InPlace | None:
    """The record ingest staged with the table's ``prior``, if it merges in place."""
    d = (prior or {}).get(STAGED_KEY)
    return InPlace.from_json(d) if d else None


def checksum(rows: DataFrame, columns: list[str]) -> tuple[int, int]:
    """The rows' count and the sum of their hashes (``xxhash64`` of ``columns``): equal
    for two sets of rows that hold the same rows, in any order and any files."""
    from pyspark.sql import functions as F

    hashed = F.xxhash64(*[F.col(f"`{c}`") for c in columns]).cast("decimal(38,0)")
    got = rows.agg(F.count(F.lit(1)), F.sum(hashed)).first()
    assert got is not None
    return int(got[0]), int(got[1] or 0)


#: the keys of the prior rows the fold read (its ``resolved`` folder)
TOUCHED = "touched"


#: beside each touched key: whether its prior row was live (in the snapshot)
LIVE_MARK = "__cdr_live"


def merge_source(rows: DataFrame, touched: DataFrame | None, key: tuple[str, ...]) -> DataFrame:
    """What a MERGE by ``key`` makes of a table from the fold's ``rows`` of the touched
    keys: each row replaces its key's or is added; a ``touched`` key (the prior rows the
    fold read) with no row is deleted (``lake.DROP``; None: none is)."""
    from pyspark.sql import functions as F

    if touched is None:
        return rows.withColumn(DROP, F.lit(False))
    gone = by_key(touched.select(*key), rows, key, "left_anti")
    drops = gone.select(
        *[
            F.col(f.name) if f.name in key else F.lit(None).cast(f.dataType).alias(f.name)
            for f in rows.schema.fields
        ],
        F.lit(True).alias(DROP),
    )
    return rows.withColumn(DROP, F.lit(False)).unionByName(drops)


def read_touched(spark: SparkSession, out: WorkPath) -> DataFrame:
    """The keys :func:`narrow` (and :func:`touch`) wrote, with the schema recorded beside."""

    return read_output(spark, out / TOUCHED)


def touched_in(spark: SparkSession, out: WorkPath, path: str) -> DataFrame:
    """The touched keys whose prior row table ``path`` holds: the snapshot only the live
    ones. (A MERGE must not be given a row to delete that the table has not, when its key
    is null: Delta 4 then fails with "did not match any merge clause"; the one such key is
    a cell table's table tombstone, in ``state`` only.)"""
    from pyspark.sql import functions as F

    touched = read_touched(spark, out)
    return touched.where(F.col(LIVE_MARK)) if path.endswith(f"/{layout.SNAPSHOT}") else touched


def by_key(left: DataFrame, right: DataFrame, key: Sequence[str], how: str) -> DataFrame:
    """``left``'s rows whose key ``right`` holds (``how``: ``left_semi``) or not
    (``left_anti``), a null equal to a null as in the merge: a cell table's table
    tombstone is its one row with no key."""
    from pyspark.sql import functions as F

    mine, theirs = left.alias("__cdr_l"), right.select(*key).alias("__cdr_r")
    on = [F.col(f"__cdr_l.`{c}`").eqNullSafe(F.col(f"__cdr_r.`{c}`")) for c in key]
    return mine.join(theirs, on, how)
