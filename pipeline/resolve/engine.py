"""Row-granularity resolution on Spark (docs/rules.md#the-canonical-order,
docs/rules.md#tombstones-and-gc_grace_seconds, docs/rules.md#fine-points): the jobs of
the row engine, and the parts of the run both engines share (the special copies, the
disputes).

One Spark job per table (:func:`fold`): one shuffle by key brings each key's prior state row
and every copy of its events together, sorted, and a Python task per partition folds them
with ``pipeline.rules.rowfold`` (through ``mapInArrow``: notes/performance.md) and writes
the outputs itself (``pipeline.resolve.fold_task``). The copies of an event meet under their
key, where the first in the order of docs/rules.md#fine-points stands for it (the origin's
own copy, else the first replica in config order): no shuffle by ``event_id``. A key no
event touches keeps its row without a Python object per row. What the fold cannot see from
one key is settled before it, on Spark or on the driver:

- the run's TRUNCATEs and its records without an event id (:func:`split_special`);
- the events an earlier night resolved (their ids in the ledger: ``seen``);
- the transactions ``scope: transaction`` rejects (:func:`admit_transactions`);
- the keys *coupled* by a key change or by a shared unique value (:func:`coupled_keys`):
  folded together as one group, since their rules read each other's rows;
- and after it, the events whose copies sat under different keys (rare: moved to their
  winner's key, and folded again).

``tests/spark/test_engine.py`` holds the published results to the pure fold on generated data.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import date
from functools import reduce
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from pipeline.core.columns import (
    DIGEST,
    EVENT_ID,
    FATE,
    KEY,
    ORIGIN,
    REPLICA,
    RUN_ID,
    STATE_DELETED,
    STATE_DELETED_AT,
    STATE_EVENT_ID,
    STATE_ORIGIN,
    STATE_TS,
    TS,
    TXID,
)
from pipeline.core.config import Config, Table
from pipeline.core.errors import StageError
from pipeline.core.layout import LEDGER
from pipeline.core.policy import QuarantineReason, Scope
from pipeline.ingest.inplace import InPlace
from pipeline.resolve.fold_task import (
    TASK_COLUMNS,
    TASK_EVENTS,
    fold_function,
    ledger_rows,
    write_parquet,
)
from pipeline.resolve.group_fold import FoldJob
from pipeline.resolve.inplace import narrowed
from pipeline.resolve.ledger import with_seen as ledger_marks
from pipeline.resolve.report_counts import (
    COUNTED_BY,
    EVENT_COUNTS,
    SKEW,
    Count,
    Facts,
    event_digests,
    may_split,
    split_events,
    tally,
    write_ledger,
)
from pipeline.resolve.shuffle import (
    Specials,
    key_struct,
    rank_map,
    settle_disputes,
    split_special,
    standing_order,
)
from pipeline.resolve.unique import (
    possible_values,
    refold_needed,
    unique_columns,
    value_column,
)
from pipeline.rules.decisions import Decisions
from pipeline.rules.events import FoldSpec
from pipeline.rules.lost import Witness
from pipeline.spark.frames import UNFORESEEN, fold_input, fold_outputs
from pipeline.spark.schema import GROUPS
from pipeline.storage.outputs import note_output, read_output
from pipeline.storage.workpath import WorkPath

log = logging.getLogger(__name__)


def gc_horizon(now_us: int, gc_grace_seconds: int) -> int:
    """docs/rules.md#tombstones-and-gc_grace_seconds: a tombstone deleted before this
    instant (µs) is purged."""
    return now_us - gc_grace_seconds * 1_000_000


def purge(prior: DataFrame, now_us: int, gc_grace_seconds: int) -> DataFrame:
    """docs/rules.md#tombstones-and-gc_grace_seconds: a tombstone is purged when
    ``deleted_at < now - gc_grace_seconds``."""
    horizon = gc_horizon(now_us, gc_grace_seconds)
    return prior.where(~(F.col(STATE_DELETED) & (F.col(STATE_DELETED_AT) < horizon)))


def admit_transactions(
    events: DataFrame, prior: DataFrame, config: Config, table: Table
) -> DataFrame:
    """docs/rules.md#policies/docs/rules.md#fine-points ``scope: transaction``: a
    transaction ``(origin, txid)`` is admitted only
    when its time (its latest event ts) beats, tie-break included, every key it touches
    in the state the run started from. ``events`` are the typed copies
    (``frames.copy_schema``). Adds ``rejected``."""
    if table.scope is not Scope.TRANSACTION:
        return events.withColumn("rejected", F.lit(False))
    ranks = rank_map(config, table)
    tx = events.where(F.col(TXID).isNotNull() & F.col(TS).isNotNull()).select(
        ORIGIN, TXID, TS, KEY, "new_key"
    )
    times = tx.groupBy(ORIGIN, TXID).agg(F.max(TS).alias("tx_ts"))
    touched = tx.select(
        ORIGIN,
        TXID,
        F.explode(F.filter(F.array(KEY, "new_key"), lambda k: k.isNotNull())).alias(KEY),
    )
    local = prior.select(
        key_struct(table).alias(KEY),
        F.col(STATE_TS).alias("l_ts"),
        F.coalesce(ranks[F.col(STATE_ORIGIN)], F.lit(-1)).alias("l_rank"),
    )
    beaten = (
        touched.join(local, KEY)
        .join(times, [ORIGIN, TXID])
        .where(F.struct("tx_ts", ranks[F.col(ORIGIN)]) <= F.struct("l_ts", "l_rank"))
        .select(ORIGIN, TXID)
        .distinct()
        .withColumn("rejected", F.lit(True))
    )
    return events.join(F.broadcast(beaten), [ORIGIN, TXID], "left").withColumn(
        "rejected", F.coalesce("rejected", F.lit(False))
    )


def coupled_keys(
    events: DataFrame,
    prior: DataFrame,
    table: Table,
    moved_keys: list[Any],
    extra: DataFrame | None = None,
) -> DataFrame | None:
    """Keys whose fold must see other keys' rows: both ends of every key change
    (``moved_keys``, found on the driver by :func:`split_special`), and every key that may
    share a unique value with another key at some point of the run (a safe
    over-approximation: each key's possible values come from its prior row and
    ``unique.possible_values`` of its events and of the ``extra`` values; keys touched by
    key changes pool their values, since rows move between them). ``events`` are the
    typed copies (``frames.copy_schema``). None when no key is coupled; only a table with
    unique constraints pays a Spark job for it."""
    spark = events.sparkSession
    key_type = events.schema[KEY].dataType
    moved = spark.createDataFrame(
        [(k,) for k in moved_keys], T.StructType([T.StructField(KEY, key_type)])
    )
    if not table.unique:
        return moved if moved_keys else None
    moved_flag = moved.withColumn("moved", F.lit(True))
    unique_cols = unique_columns(table)
    live = prior.where(~F.col(STATE_DELETED)).select(
        key_struct(table).alias(KEY), *[F.col(c).alias(value_column(c)) for c in unique_cols]
    )
    writes = possible_values(events, table, extra)
    values = live.unionByName(writes).join(F.broadcast(moved_flag), KEY, "left")
    unit = F.when(F.col("moved"), F.lit(None)).otherwise(F.col(KEY))
    values = values.withColumn(
        "unit", F.struct(F.col("moved").isNotNull().alias("m"), unit.alias("k"))
    )
    shared_units = []
    for cols in table.unique:
        sets = values.groupBy("unit").agg(
            *[F.collect_set(value_column(c)).alias(f"s_{c}") for c in cols]
        )
        tuples = sets
        for c in cols:
            tuples = tuples.withColumn(f"t_{c}", F.explode(f"s_{c}"))
        shared = (
            tuples.groupBy(*[f"t_{c}" for c in cols])
            .agg(F.collect_set("unit").alias("units"))
            .where(F.size("units") > 1)
            .select(F.explode("units").alias("unit"))
        )
        shared_units.append(shared)
    units = reduce(DataFrame.union, shared_units).distinct()
    by_unit = values.select("unit", KEY).distinct().join(units, "unit").select(KEY)
    return on_the_driver(by_unit.union(moved).distinct())


def build_items(copies: DataFrame, prior: DataFrame, config: Config, table: Table) -> DataFrame:
    """Event copies and prior state rows in one frame, by ``key``: ``is_event``,
    ``event_id`` and the fields of each kind (a state row's are ``row`` and ``s_*``)."""
    ev = copies.select(F.lit(1).alias("is_event"), *copies.columns)
    if "seen" not in copies.columns:
        ev = ev.withColumn("seen", F.lit(False)).withColumn("differs", F.lit(False))
    st = prior.select(
        key_struct(table).alias(KEY),
        F.lit(0).alias("is_event"),
        F.col(STATE_EVENT_ID).alias(EVENT_ID),
        F.col(STATE_TS).alias("s_ts"),
        F.coalesce(rank_map(config, table)[F.col(STATE_ORIGIN)], F.lit(-1)).alias("s_rank"),
        F.struct(*table.column_names).alias("row"),
        F.col(STATE_ORIGIN).alias("s_origin"),
        F.col(STATE_DELETED).alias("s_deleted"),
        F.col(STATE_DELETED_AT).alias("s_deleted_at"),
        *([F.col(GROUPS).alias("s_groups")] if table.column_groups else []),
    )
    return ev.unionByName(st, allowMissingColumns=True)


@dataclass(frozen=True)
class RowRun:
    """Where and when one table's row engine runs: the run's clock, date and id, the
    table's output folder, the ledger partitions of the nights before, and whether any
    copy may be special (``read.special_free``)."""

    now_us: int
    dt: date
    run_id: str
    out: WorkPath
    ledger: DataFrame | None  # the window's events (``ledger.read_ledger``)
    any_special: bool = True  # False: no copy for ``shuffle.split_special`` to bring
    in_place: InPlace | None = None  # merged in place: the fold reads the touched rows
    #: docs/rules.md#manual-decisions: the date's decisions, applied by the converged fold
    decisions: Decisions = field(default_factory=Decisions)
    #: docs/rules.md#lost-writes: who exported tonight, in which order (the fold's labels)
    witness: Witness = field(default_factory=Witness)


def resolve_rows(
    spark: SparkSession,
    config: Config,
    table: Table,
    copies: DataFrame,
    prior: DataFrame,
    run: RowRun,
) -> Facts:
    """Resolve one row-granularity table into ``run.out`` (``fold_task.OUTPUTS``): ``copies``
    are the typed copies of its exports (``frames.copy_schema``), ``prior`` the state the
    run starts from (its tombstones purged here, :func:`purge`; merged in place, only the
    rows its events touch are read: ``inplace.narrow``). Returns what the run report
    counts of them, counted by the fold's tasks (which write the ledger's rows of their
    events too), and the disputes one more job finds (``report_counts.split_events``: folded
    again), run only when what the tasks told of their events says an event may be split
    (``report_counts.may_split``)."""
    copies = with_seen(copies, run.ledger)
    main, specials = split_special(copies, run.any_special)
    folds = _Folds(spark, config, table, run, specials)
    extra: DataFrame | None = None  # the unforeseen unique values of the folds before
    for _ in range(MAX_FOLDS):
        start = _start_from(prior, main, specials, config, table, run, extra)
        admitted = admit_transactions(main, start, config, table)
        coupled = coupled_keys(admitted, start, table, specials.moved, extra)
        facts = folds.once(admitted, start, coupled)
        if facts.disputed:  # rare: move every copy of those events to their winner's key
            log.warning(
                "table %s: %d event(s) have copies under different keys; the winning "
                "copy's key is used",
                table.name,
                len(facts.disputed),
            )
            folds.clear()
            admitted = settle_disputes(admitted, list(facts.disputed))
            facts = folds.once(admitted, start, coupled)
        if not folds.written.get(UNFORESEEN):
            return facts
        found = _unforeseen(spark, run.out, extra)
        if not refold_needed(found, prior, admitted, table, coupled):
            return facts
        log.info(
            "table %s: a row took a unique value no export states, which another row "
            "holds: folded again with the keys that share it",
            table.name,
        )
        extra = found
        folds.clear()
    raise StageError(
        f"table {table.name}: the unique values the fold's rows take kept meeting other "
        f"rows after {MAX_FOLDS} folds; report it, with the run's work folder"
    )


class _Folds:
    """The folds of one table's run: each writes every output (:func:`fold`, the special
    copies', the ledger made again when an event is split) into the table's folder."""

    def __init__(
        self, spark: SparkSession, config: Config, table: Table, run: RowRun, specials: Specials
    ):
        self.spark, self.config, self.table, self.run = spark, config, table, run
        self.specials = specials
        self.schemas = fold_outputs(table, config.captures(table))
        self.job = FoldJob(
            FoldSpec(table, run.now_us, run.decisions),
            config.replica_ids,
            tuple(specials.truncates),
            run.dt,
            run.run_id,
            run.out,
            config.captures(table),
            QuarantineReason.UPDATE_MISSING in config.retry,
            self.schemas,
            run.witness,
        )
        self.written: dict[str, int | None] = {}  # each output's rows, of the last fold

    def once(self, main: DataFrame, prior: DataFrame, coupled: DataFrame | None) -> Facts:
        run, job, table = self.run, self.job, self.table
        counts, rows, told = fold(self.spark, main, prior, self.config, table, job, coupled)
        self.written = rows
        counts += _write_specials(self.specials, job, rows)
        for kind, schema in self.schemas.items():  # what the tasks wrote, for its readers
            note_output(run.out / kind, schema, rows.get(kind, 0))  # (none wrote: empty)
        told.append(event_digests(e for e, _, _ in self.specials.fates).tobytes())
        split_at = split_events(self.spark, run.out) if may_split(told) else ([], False)
        disputed, split = split_at
        if split and not disputed:  # rare: the events' counts and ledger made again
            again = write_ledger(self.spark, run.out, run.run_id, table.name)
            counts = [c for c in counts if c[0] not in EVENT_COUNTS] + list(again.counts)
        return Facts.of(counts, disputed)

    def clear(self) -> None:
        """Remove every output, before the next fold writes them again."""
        for kind in self.schemas:
            (self.run.out / kind).rmtree()


#: how many times a table is folded at most (``unique.refold_needed``): a fold that finds
#: a unique value no export states, held by a row it did not read, is done again
MAX_FOLDS = 4


def _unforeseen(spark: SparkSession, out: WorkPath, before: DataFrame | None) -> DataFrame:
    """The unforeseen unique values the fold's tasks reported (``unique``), with those of
    the folds before, brought to the driver (their folder is replaced by the next fold)."""
    found = read_output(spark, out / UNFORESEEN)
    now = spark.createDataFrame(found.collect(), found.schema)
    return now if before is None else before.unionByName(now).distinct()


def _start_from(
    prior: DataFrame,
    main: DataFrame,
    specials: Specials,
    config: Config,
    table: Table,
    run: RowRun,
    extra: DataFrame | None,
) -> DataFrame:
    """The prior rows the fold reads (``inplace.narrowed``), purged."""
    horizon = gc_horizon(run.now_us, config.gc_grace_seconds)
    due = F.col(STATE_DELETED) & (F.col(STATE_DELETED_AT) < horizon)  # purged: see purge
    prior = narrowed(prior, main, specials.truncates, table, due, run.out, run.in_place, extra)
    return purge(prior, run.now_us, config.gc_grace_seconds)


def with_seen(copies: DataFrame, ledger: DataFrame | None) -> DataFrame:
    """``seen``: an earlier night resolved the copy's event (its id is in ``ledger``, the
    window ingest pinned: ``ledger.read_ledger``), and ``differs`` (``pipeline.resolve.ledger``);
    such a copy is a duplicate."""
    return ledger_marks(copies, ledger)


def fold(
    spark: SparkSession,
    main: DataFrame,
    prior: DataFrame,
    config: Config,
    table: Table,
    job: FoldJob,
    coupled: DataFrame | None,
) -> tuple[list[Count], dict[str, int | None], list[bytes]]:
    """The one Spark job of the row engine: every key's prior row and copies meet in its
    partition, sorted, and each task folds its keys and writes their outputs
    (``fold_task``); the keys coupled by a key change or a unique value are folded as one
    group in a task of their own (``coupled``: :func:`coupled_keys`). Returns what the
    tasks counted of their outputs (``report_counts.COUNTED_BY``,
    ``report_counts.EVENT_COUNTS``), the rows of each output, and what each task told of its
    events (``report_counts.task_events``)."""
    items = build_items(main, prior, config, table)
    order = [F.col("is_event"), F.col(EVENT_ID), *standing_order()]
    if coupled is not None:
        items = items.join(F.broadcast(coupled.withColumn("coupled", F.lit(True))), KEY, "left")
        is_coupled = F.coalesce(F.col("coupled"), F.lit(False))
        single = (
            items.where(is_coupled)
            .repartition(1)
            .sortWithinPartitions(*order)
            .select(*fold_input(table))
            .mapInArrow(fold_function(job, single_group=True), TASK_COLUMNS)
        )
        items = items.where(~is_coupled)
    n = int(spark.conf.get("spark.sql.shuffle.partitions") or "8")
    keyed = (
        items.repartition(n, KEY)
        .sortWithinPartitions(F.col(KEY), *order)
        .select(*fold_input(table))
        .mapInArrow(fold_function(job, single_group=False), TASK_COLUMNS)
    )
    tasks = keyed if coupled is None else keyed.unionByName(single)
    named = {o: kind for o, (kind, _) in COUNTED_BY.items()}
    named |= {k: k for k in (*EVENT_COUNTS, SKEW)}
    results = tasks.collect()
    told: list[bytes] = [r["events"] for r in results if r["output"] == TASK_EVENTS]
    rows: dict[str, int | None] = {}
    for r in results:
        if r["output"] not in (*EVENT_COUNTS, TASK_EVENTS):
            rows[r["output"]] = (rows.get(r["output"]) or 0) + r["rows"]
    counts = [
        (named[r["output"]], r["a"], r["b"], r["c"], r["rows"])
        for r in results
        if r["output"] in named
    ]
    return counts, rows, told


def _write_specials(
    specials: Specials, job: FoldJob, written: dict[str, int | None]
) -> list[Count]:
    """The special copies' fates, quarantine and ledger rows (settled on the driver),
    beside the tasks' (their rows added to ``written``); returns what the run report
    counts of them."""
    out, run = job.out, {RUN_ID: job.run_id, "table": job.table.name}

    def write(kind: str, rows: list[dict[str, Any]] | pa.Table) -> None:
        schema = job.schemas[kind]
        arrow = to_arrow_schema(schema)
        data = rows.cast(arrow) if isinstance(rows, pa.Table) else pa.Table.from_pylist(rows, arrow)
        write_parquet(data, out / kind / "part-special.parquet", schema)
        written[kind] = (written.get(kind) or 0) + data.num_rows

    counts: list[Count] = [("replicas", r, f, None, 1) for _, r, f in specials.fates]
    counts += [("quarantined", q[2], None, None, 1) for q in specials.quarantined]
    if specials.fates:
        rows = [
            {EVENT_ID: e, REPLICA: r, FATE: f, "chosen": False, DIGEST: None}
            for e, r, f in specials.fates
        ]
        write("fates", rows)
        pairs, events = tally(pa.Table.from_pylist(rows, to_arrow_schema(job.schemas["fates"])))
        counts += events
        if pairs.num_rows:
            write(LEDGER, ledger_rows(pairs, job.run_id, job.table.name))
    if specials.quarantined:
        names = (REPLICA, EVENT_ID, "reason", "detail", "event")
        write(
            "quarantine",
            [{**run, **dict(zip(names, q, strict=True))} for q in specials.quarantined],
        )
    return counts


def on_the_driver(keys: DataFrame | None) -> DataFrame | None:
    """The coupled keys, computed once and brought to the driver (a broadcast join brings
    them there anyway); None when no key is coupled, as on most nights."""
    if keys is None:
        return None
    found = keys.collect()
    if not found:
        return None
    # rows, not Arrow: a local relation, which a broadcast join needs no Spark job to read
    return keys.sparkSession.createDataFrame(found, keys.schema)
