"""The pending lines: a wal2json transaction whose ``C`` (its commit) is in no export yet
waits, whole, for the night whose export has it (docs/adapters.md "Whole transactions").

- the resolve stage maps a transaction only when its ``B``, its changes and its ``C`` are
  all there (``pipeline.ingest.adapters.wal2json``); the lines of a transaction still open at
  the end of the night's export are written to the table's ``pending`` output
  (:func:`write`), with the date of the export that held each (``exported``), and
  published with the run as ``published/<table>/pending`` (one partition per run date,
  replaced by a rerun of that date, like the ledger);
- ingest pins the partition of the date the run starts from (:func:`pin`), so that the
  next night reads them (:func:`carried`) beside its own export: a rerun of a date reads
  the same lines its first run read;
- the run report counts, per replica, the lines read back (``pending_in``) and the lines
  left waiting (``pending``): the accounting is ``records + pending_in = fates +
  pending``. A transaction that waited past ``gc_grace_seconds`` is given up: its changes
  are quarantined, never held for ever.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import date, timedelta
from typing import TYPE_CHECKING

from pipeline.core import layout
from pipeline.core.columns import REPLICA
from pipeline.ingest.adapters.options import FRAMING
from pipeline.ingest.prior import pin_dates
from pipeline.spark.frames import RUN_COLUMNS
from pipeline.spark.session import local_frame
from pipeline.storage.lake_read import Pin, read_pinned
from pipeline.storage.outputs import write_output

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

    from pipeline.storage.lake import Lake
    from pipeline.storage.store import Store
    from pipeline.storage.workpath import WorkPath

PIN = "pending.pin.json"
#: the published table's columns after ``run_id, table`` (its ``dt``: the run's date)
COLUMNS = (REPLICA, "file", "line", "raw", "bad", "exported")
SCHEMA_DDL = (
    "run_id string, table string, replica string, file string, line bigint, raw string, "
    "bad string, exported date"
)
#: the lines an adapter left waiting, as the resolve stage keeps them beside its copies
#: (``exported`` null: the run's own export's)
WAITING_DDL = "replica string, file string, line bigint, raw string, bad string, exported date"
#: the per-replica counts of the run report (``summary.TableSummary.replicas``)
READ_BACK, LEFT = "pending_in", "pending"


def pin(store: Store, lake: Lake, table: str, prior_dt: date, dest: WorkPath) -> bool:
    """Pin the pending lines the run of ``prior_dt`` left (the run this one starts
    from) into ``dest``; False when it left none."""

    found = pin_dates(store, lake, layout.table_path(table, layout.PENDING), prior_dt, prior_dt)
    if found is None:
        return False
    found.save(dest / PIN)
    return True


def carried(spark: SparkSession, staged_table: WorkPath) -> DataFrame | None:
    """The lines earlier exports left waiting, as ingest pinned them (:data:`COLUMNS`)."""

    found = Pin.load(staged_table / PIN)
    if found is None:
        return None
    return read_pinned(spark, found).select(*COLUMNS)


def give_up_before(dt: date, gc_grace_seconds: int) -> date:
    """The lines exported before this date wait no longer (the ledger's window)."""
    return dt - timedelta(days=max(1, gc_grace_seconds // 86400))


def write(
    spark: SparkSession,
    waiting: list[DataFrame],
    out: WorkPath,
    run_id: str,
    table: str,
    dt: date,
    replicas: tuple[str, ...],
) -> dict[str, int]:
    """The lines that wait after this run (``waiting``: :data:`COLUMNS`, ``exported`` null
    for this run's own) into ``out``; returns, per replica, how many records (framing
    aside) wait. A line of this run's export gets its date, and its file is named with
    it (``dt=<D>/<file>``: the quarantine of a later night says which export held it)."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    frame = local_frame(spark, [], SCHEMA_DDL).select(*COLUMNS)
    for w in waiting:
        frame = frame.unionByName(w.select(*COLUMNS))
    mine = F.col("exported").isNull()
    run = [F.lit(v).alias(n) for n, v in zip(RUN_COLUMNS, (run_id, table), strict=True)]
    rows = frame.select(
        *run,
        REPLICA,
        F.when(mine, F.concat(F.lit(f"dt={dt.isoformat()}/"), F.col("file")))
        .otherwise(F.col("file"))
        .alias("file"),
        "line",
        "raw",
        "bad",
        F.coalesce(F.col("exported"), F.lit(dt)).alias("exported"),
    )
    seen = Observation()
    counts = _per_replica(replicas)
    write_output(rows.observe(seen, *counts).coalesce(1), out / layout.PENDING)
    return {r: int(n or 0) for r, n in seen.get.items()}


def to_account(counts: Mapping[str, int]) -> int:
    """The records a run accounts for of one replica (its report's counts): its export's,
    and the ones read back, but those left waiting."""
    return int(counts.get("records", 0)) + counts.get(READ_BACK, 0) - counts.get(LEFT, 0)


def read_back(carried_lines: DataFrame | None, replicas: tuple[str, ...]) -> dict[str, int]:
    """Per replica, the records (framing aside) read back from earlier exports."""
    if carried_lines is None:
        return {}
    row = carried_lines.agg(*_per_replica(replicas)).first()
    return {} if row is None else {r: int(row[r] or 0) for r in replicas}


def _per_replica(replicas: tuple[str, ...]) -> list[Column]:
    """Aggregates of pending lines: per replica, its records (its framing aside)."""
    from pyspark.sql import functions as F

    record = ~F.col("raw").rlike(FRAMING["wal2json"].pattern.decode())
    mine = [record & (F.col(REPLICA) == r) for r in replicas]
    return [F.sum(F.when(m, 1).otherwise(0)).alias(r) for m, r in zip(mine, replicas, strict=True)]
