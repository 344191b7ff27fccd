"""The stage of a cell table: the one shuffle by key and its windows, then the resolved
outputs (the package docstring has the design)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import reduce

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.window import WindowSpec

from pipeline.core.columns import (
    CELLS,
    CONFLICT_ID,
    DIGEST,
    EVENT_ID,
    FATE,
    KEY,
    MARKER,
    OP,
    ORIGIN,
    RANK,
    REPLICA,
    STATE_EVENT_ID,
    STATE_ORIGIN,
    STATE_TS,
    TOMB,
    TS,
)
from pipeline.core.config import Config, Table
from pipeline.core.policy import Concurrency, Fate
from pipeline.resolve.cells.changes import event_change, truncate_changes, truncate_slots
from pipeline.resolve.cells.conflicts import conflict_columns
from pipeline.resolve.cells.state import (
    final_state,
    purge_cells,
    table_tombstone,
    table_tombstone_row,
)
from pipeline.resolve.cells.writes import event_writes, prior_writes, value_columns
from pipeline.resolve.shuffle import (
    key_struct,
    rank_map,
    settle_disputes,
    split_special,
    standing_order,
    with_special_copies,
)
from pipeline.resolve.skew import tally, with_evidence
from pipeline.rules.events import Event
from pipeline.rules.guards import READ
from pipeline.spark.frames import CONFLICT_MADE, DIVERGENCE
from pipeline.spark.schema import change_schema
from pipeline.storage.workpath import WorkPath

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Resolved:
    """The results of one cell table, as DataFrames over its written resolution."""

    state: DataFrame
    conflicts: DataFrame
    divergence: DataFrame
    fates: DataFrame  # per copy: event_id, replica, fate (applied | discarded | errored | ...)
    quarantine: DataFrame  # the quarantined events: their chosen copy
    truncates: list[Event]
    changes: DataFrame | None = None  # schema.change_schema, when the CDC log is on
    clock_skew: dict = field(default_factory=dict)  # clock skew: ``skew.tally``


def _resolve_keys(
    main: DataFrame,
    state_rows: DataFrame,
    config: Config,
    table: Table,
    truncs: Sequence[Event],
    tt_prior: dict | None,
    tt: dict | None,
    now_us: int,
    capture: bool,
) -> DataFrame:
    """The one shuffle by key and its windows (package docstring). One row per event
    and per state row, with the structs ``state`` (at a key's last row), ``conflict`` and
    ``quarantine`` where they apply, the arrays ``fates`` (one per copy) and ``skews``
    (clock skew), and ``chosen_id``; with ``capture``, ``change`` (an applied event's) and
    ``tchanges`` (the run's TRUNCATEs', at a key's last row) for the CDC log."""
    flags, logged = conflict_columns(table, truncs, tt_prior)
    df = _chosen_copies(main, state_rows, table)
    df = _slot_maxima(df, config, table, flags, now_us)
    return _outputs(df, table, logged, truncs, tt_prior, tt, now_us, capture)


def _canonical() -> WindowSpec:
    """A key's rows in the canonical order, its prior state row first."""
    return Window.partitionBy(KEY).orderBy("is_event", TS, RANK, EVENT_ID)


def _chosen_copies(main: DataFrame, state_rows: DataFrame, table: Table) -> DataFrame:
    """1. the copy that stands for each event (docs/rules.md#fine-points), the one
    row of its event from here
    on: with the replicas of all its copies (``copies``, for their fates) and their
    clock-skew evidence (``skews``, clock skew), read from each copy before the others are let
    go. The later windows sort a third of the rows they would sort with every copy."""
    events = main.select(F.lit(1).alias("is_event"), *main.columns)
    items = events.unionByName(state_rows, allowMissingColumns=True).repartition(KEY)
    items = with_evidence(items, table)
    w_ev = Window.partitionBy(KEY, "is_event", EVENT_ID).orderBy(*standing_order())
    every = w_ev.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    df = items.select(
        "*",
        F.row_number().over(w_ev).alias("rn"),
        F.collect_list(REPLICA).over(every).alias("copies"),
        F.collect_list("skew").over(every).alias("skews"),
    )
    df = df.where(F.col("rn") == 1).drop("rn", "skew")
    return df.withColumn("good", (F.col("is_event") == 1) & F.col("reason").isNull())


def _slot_maxima(
    df: DataFrame,
    config: Config,
    table: Table,
    flags: Sequence[Column],
    now_us: int,
) -> DataFrame:
    """2. every slot's writes, and their maxima before each row in the canonical order;
    the conflict ``flags`` and the fate of every event (its copies')."""
    is_state = F.col("is_event") == 0
    names = [c for c, _ in value_columns(table)] + [MARKER, TOMB]
    ranks = rank_map(config, table)
    writes = [
        F.when(is_state, s).otherwise(e).alias(f"w_{n}")
        for s, e, n in zip(
            prior_writes(table, ranks), event_writes(table, now_us), names, strict=True
        )
    ]
    df = df.select("*", *writes)
    w = _canonical()
    before = w.rowsBetween(Window.unboundedPreceding, -1)
    df = df.select(
        "*",
        *[F.max(f"w_{n}").over(before).alias(f"p_{n}") for n in names],
        F.lead(F.lit(1)).over(w).isNull().alias("last"),
    )
    df = df.select(
        "*",
        *[F.greatest(f"p_{n}", f"w_{n}").alias(f"f_{n}") for n in names],
        *flags,
    )
    return df.withColumn(
        FATE,
        F.when(F.col("reason").isNotNull(), F.lit("quarantined"))
        .when(F.col("won"), F.lit("applied"))
        .otherwise(F.lit("discarded")),
    )


#: docs/rules.md#lost-writes: a cell table's conflicts are not judged (its state keeps no
#: event id of a cell's writer, nor the fold the exports' positions)
def unjudged() -> dict[str, Column]:
    return {
        "local_event_id": F.lit(None).cast("string"),
        "concurrency": F.lit(Concurrency.UNKNOWN.value),
        "concurrency_why": F.lit("a cell table's conflicts are not judged"),
        "lost_event_id": F.lit(None).cast("string"),
    }


def _outputs(
    df: DataFrame,
    table: Table,
    logged: Mapping[str, Column],
    truncs: Sequence[Event],
    tt_prior: dict | None,
    tt: dict | None,
    now_us: int,
    capture: bool,
) -> DataFrame:
    """3. the structs of the outputs, where they apply (``_resolve_keys``); the conflict
    log's fields (``logged``) are computed on the conflicting rows only."""
    state_cols, exists = final_state(table, now_us, tt)
    remote = {
        "remote_event_id": F.col(EVENT_ID),
        "remote_ts": F.col(TS),
        "remote_origin": F.col(ORIGIN),
    }
    fields = {**logged, **remote, **unjudged(), CONFLICT_ID: F.lit(None).cast("string")}
    conflict = F.struct(
        *[fields[n].alias(n) for n in CONFLICT_MADE],
        F.col(RANK).alias("pos_rank"),
        # a cell's conflicts: by ts and value (docs/rules.md#cell-rules)
        F.lit(None).cast("long").alias("pos_tx"),
        F.lit(0).alias("pos_idx"),
    )
    is_event = F.col("is_event") == 1
    quarantined = F.struct(REPLICA, EVENT_ID, "reason", "detail", "raw")
    fates = F.transform(  # each with the standing copy's digest: the ledger's (``resolve.ledger``)
        "copies",
        lambda r: F.struct(F.col(EVENT_ID), r.alias(REPLICA), F.col(FATE), F.col(DIGEST)),
    )
    changes = []
    if capture:
        applied = F.col("good") & F.col("won")
        changes.append(F.when(applied, event_change(table, truncs, tt_prior)).alias("change"))
        if truncs:
            df = df.select("*", *truncate_slots(table, truncs))
            changes.append(
                F.when(F.col("last"), truncate_changes(table, truncs, tt_prior)).alias("tchanges")
            )
    return df.select(
        F.when(F.col("last") & exists, F.struct(*state_cols)).alias("state"),
        F.when(F.col("good") & F.col("conflict"), conflict).alias("conflict"),
        F.when(is_event, fates).alias("fates"),
        F.when(is_event & F.col("reason").isNotNull(), quarantined).alias("quarantine"),
        F.when(is_event, F.col(EVENT_ID)).alias("chosen_id"),
        "skews",
        *changes,
    )


def resolve_cells(
    spark: SparkSession,
    config: Config,
    table: Table,
    refs: DataFrame,
    prior: DataFrame,
    now_us: int,
    scratch: WorkPath,
    any_special: bool = True,
    narrow: Callable[[DataFrame, DataFrame, Sequence[Event]], DataFrame] | None = None,
) -> Resolved:
    """Resolve one cell-granularity table. ``refs``: the typed copies of the exports
    (``frames.copy_schema``; ``any_special`` False: none is special); ``prior``: the state
    the run starts from (not yet purged); ``scratch``: a work folder for the resolution;
    ``narrow``: for a table merged in place, the prior rows the events (its second
    argument) need of it, given the night's TRUNCATEs (``inplace.narrowed``)."""
    main, specials = split_special(refs, any_special)
    main, reads = _reads_aside(main)
    truncs = specials.truncates
    prior = prior if narrow is None else narrow(prior, main, truncs)
    prior = purge_cells(prior, table, now_us, config.gc_grace_seconds)
    state_rows, tt_prior, tt = _state_rows(prior, table, truncs, now_us)
    capture = config.captures(table)
    keys = (state_rows, config, table, truncs, tt_prior, tt, now_us, capture)
    out = _settled(main, table, lambda m: _with_reads(_resolve_keys(m, *keys), reads), scratch)

    state = out.where(F.col("state").isNotNull()).select("state.*")
    if tt is not None:
        state = state.unionByName(table_tombstone_row(spark, table, tt))
    conflicts = (
        out.where(F.col("conflict").isNotNull())
        .select("conflict.*")
        .select(*CONFLICT_MADE, "pos_rank", "pos_tx", "pos_idx")
    )
    fates, quarantine = with_special_copies(
        spark,
        out.select(F.explode("fates").alias("f")).select("f.*"),
        out.where(F.col("quarantine").isNotNull()).select("quarantine.*"),
        specials,
    )
    # docs/rules.md#convergence: a cell table converges in every replica's order
    # (tests/spark/test_cells.py)
    divergence = spark.createDataFrame([], DIVERGENCE)
    changes = _changes(out, table, bool(truncs)) if capture else None
    return Resolved(
        state,
        conflicts,
        divergence,
        fates,
        quarantine,
        list(truncs),
        changes,
        tally(out.select(F.explode("skews").alias("skew"))),
    )


def _reads_aside(main: DataFrame) -> tuple[DataFrame, DataFrame]:
    """docs/adapters.md#snapshot-reads: the copies to resolve, and the fates of the
    snapshot reads among them (``read``: never a write)."""
    read = (F.col(OP) == READ) & F.col("reason").isNull()
    reads = main.where(read).select(EVENT_ID, REPLICA, F.lit(Fate.READ.value).alias(FATE))
    return main.where(~F.coalesce(read, F.lit(False))), reads


def _with_reads(out: DataFrame, reads: DataFrame) -> DataFrame:
    """The resolution with a row per snapshot read that holds only its fate, so that the
    read's fate is written with the resolution and every output is read from its files
    (``_written``): the staged copies are not scanned again for them."""
    fate = out.schema["fates"].dataType.elementType  # type: ignore[attr-defined]
    own = set(reads.columns)
    entry = F.struct(
        *[(F.col(f.name) if f.name in own else F.lit(None).cast(f.dataType)).alias(f.name)
          for f in fate.fields]
    )  # fmt: skip
    return out.unionByName(reads.select(F.array(entry).alias("fates")), allowMissingColumns=True)


def _state_rows(
    prior: DataFrame, table: Table, truncs: Sequence[Event], now_us: int
) -> tuple[DataFrame, dict | None, dict | None]:
    """The prior state's rows of the table's keys, in the shape of the shuffle's items;
    the table tombstone before the run (the state's row with no key), and after it (with
    the run's TRUNCATEs)."""
    has_key = reduce(lambda a, b: a & b, [F.col(c).isNotNull() for c in table.key])
    tt_rows = prior.where(~has_key & F.col(TOMB).isNotNull()).select(TOMB).collect()
    tt_prior = table_tombstone(tt_rows, [], now_us)
    tt = table_tombstone(tt_rows, truncs, now_us)
    return _item_rows(prior.where(has_key), table), tt_prior, tt


def _item_rows(prior: DataFrame, table: Table) -> DataFrame:
    """The prior state's rows of the table's keys, in the shape of the shuffle's items."""
    return prior.select(
        key_struct(table).alias(KEY),
        F.lit(0).alias("is_event"),
        F.struct(*table.column_names).alias("row"),
        STATE_TS,
        STATE_ORIGIN,
        STATE_EVENT_ID,
        CELLS,
        MARKER,
        TOMB,
    )


def _settled(
    main: DataFrame, table: Table, resolve: Callable[[DataFrame], DataFrame], scratch: WorkPath
) -> DataFrame:
    """``resolve(main)``, written once; if some event's copies sit under different keys,
    they are moved to their winner's key and resolved again (rare; see ``engine``)."""
    out = _written(resolve(main), scratch)
    disputed = [
        r.chosen_id
        for r in out.where(F.col("chosen_id").isNotNull())
        .groupBy("chosen_id")
        .count()
        .where(F.col("count") > 1)
        .select("chosen_id")
        .collect()
    ]
    if disputed:
        log.warning(
            "table %s: %d event(s) have copies under different keys; the winning copy's "
            "key is used",
            table.name,
            len(disputed),
        )
        out = _written(resolve(settle_disputes(main, disputed)), scratch)
    return out


def _written(df: DataFrame, path: WorkPath) -> DataFrame:
    """``df`` written to ``path`` as Parquet and read back. The outputs are read from
    these files: their jobs neither compute the resolution again nor analyse, optimise
    and ship its plan (large even for a table of a few columns: the slots' structs, the
    conflict log's renderings), which cost a small run more than the files do. Unlike a
    cache, the files survive the loss of an executor."""
    df.write.mode("overwrite").parquet(str(path))
    return df.sparkSession.read.schema(df.schema).parquet(str(path))


def _changes(out: DataFrame, table: Table, truncated: bool) -> DataFrame:
    """What every applied event changed, and the TRUNCATEs' partition deletes (the CDC
    log's input), in ``change_schema``."""
    schema = change_schema(table)
    changes = out.where(F.col("change").isNotNull()).select(F.col("change").cast(schema).alias("c"))
    if truncated:
        truncs = out.select(F.explode("tchanges").alias("c"))
        changes = changes.unionByName(truncs.select(F.col("c").cast(schema).alias("c")))
    return changes.select("c.*")
