"""What both engines do with a run's typed copies around their one shuffle by key
(docs/rules.md#the-canonical-order, docs/rules.md#fine-points): the special copies settled
on the driver (TRUNCATEs, records without an event id, repairs) with the keys a key change
couples, the events whose copies sit under different keys moved to their winner's key, and
the tie ranks and key structs of the shuffle. ``resolve.engine`` (rows) and ``resolve.cells``
(cells) import this module, never each other."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from pipeline.core.columns import EVENT_ID, KEY, OP, ORIGIN, RANK, REPLICA, SEQ, TS
from pipeline.core.config import Config, Table
from pipeline.core.policy import REPAIR_ORIGIN, Fate
from pipeline.rules.events import Event


def rank_map(config: Config, table: Table) -> Column:
    ranks = config.tie_ranks(table.tie_break)
    return F.create_map(*[x for r, i in ranks.items() for x in (F.lit(r), F.lit(i))])


def key_struct(table: Table, row: str | None = None) -> Column:
    return F.struct(*[F.col(f"{row}.{c}" if row else c).alias(c) for c in table.key])


def standing_order() -> list[Column]:
    """docs/rules.md#fine-points: the order of an event's copies, the first stands:
    the origin's
    own copy, else the first replica in config order; of one replica's copies (which
    should not differ), the highest ``seq`` of its export, then the last file and line."""
    return [
        F.col("pref"),
        F.col(REPLICA),
        F.desc_nulls_last(SEQ),
        F.desc_nulls_last("file"),
        F.desc_nulls_last("line"),
    ]


def settle_disputes(copies: DataFrame, ids: list[str]) -> DataFrame:
    """docs/rules.md#fine-points across keys: the winning copy (the origin's own,
    else the first
    replica in config order) gives its key and record to every copy of the event, so that
    they meet in one key group, where the winner stands for the event and the others still
    count for their replica's order and accounting. Rare: the winners are broadcast."""
    w = Window.partitionBy(EVENT_ID).orderBy(*standing_order())
    moved = [c for c in copies.columns if c not in (EVENT_ID, REPLICA, "file", "line", SEQ, "pref")]
    winners = (
        copies.where(F.col(EVENT_ID).isin(ids))
        .withColumn("_rn", F.row_number().over(w))
        .where("_rn = 1")
        .select(
            EVENT_ID, F.lit(True).alias("_disputed"), *[F.col(c).alias(f"_w_{c}") for c in moved]
        )
    )
    joined = copies.join(F.broadcast(winners), EVENT_ID, "left")
    return joined.select(
        *[
            F.when(F.col("_disputed"), F.col(f"_w_{c}")).otherwise(F.col(c)).alias(c)
            if c in moved
            else F.col(c)
            for c in copies.columns
        ]
    )


@dataclass(frozen=True)
class Specials:
    """The run's TRUNCATEs and its records without an event id, settled on the driver:
    the good TRUNCATE events, the fate of every copy ``(event_id, replica, fate)`` and the
    quarantined ones ``(replica, event_id, reason, detail, raw)``; and both ends of every
    key change (``moved``: the keys a key change couples)."""

    truncates: list[Event]
    fates: list[tuple]
    quarantined: list[tuple]
    moved: list[Any]


def split_special(copies: DataFrame, possible: bool = True) -> tuple[DataFrame, Specials]:
    """The copies both engines resolve by key, and the special ones (TRUNCATEs, records
    without an event id) settled on the driver, with the keys of the key changes: one job
    that brings the few copies of those kinds (most nights have none). ``possible`` False:
    the fetch's typing counted none (``read.special_free``, the same rule in pyarrow),
    and no job runs."""
    if not possible:
        return copies, Specials([], [], [], [])
    repair = F.coalesce(_repair(), F.lit(False))
    special = (F.col(EVENT_ID).isNull() | (F.col(OP) == "TRUNCATE")).cast("boolean")
    special = F.coalesce(special, F.lit(False)) | repair
    main = copies.where(~special)
    fields = [EVENT_ID, REPLICA, SEQ, "pref", TS, ORIGIN, RANK, "reason", "detail"]
    seen = F.col("seen") if "seen" in copies.columns else F.lit(False)
    rows = (
        copies.where(special | F.col("new_key").isNotNull())
        .select(
            special.alias("special"),
            repair.alias("repair"),
            *fields,
            F.when(~repair, F.col("raw")).alias("raw"),  # a repair's record is not kept
            seen.alias("seen"),
            KEY,
            "new_key",
        )
        .collect()
    )
    moved = {k for r in rows if not r.special and r.key is not None for k in (r.key, r.new_key)}
    return main, special_copies([r for r in rows if r.special], list(moved))


def _repair() -> Column:
    """docs/operations.md#repair: a change ``cdr repair`` made (a well-formed copy whose
    origin is :data:`REPAIR_ORIGIN`), counted and never resolved."""
    return (F.col(ORIGIN) == REPAIR_ORIGIN) & F.col("reason").isNull()


def special_copies(rows: list[Any], moved: list[Any]) -> Specials:
    """The special copies (``split_special``), settled on the driver: a repair is
    ``repaired``; a TRUNCATE that an earlier night resolved (``seen``) is a duplicate, and
    so is a replica's second copy of one."""
    events: list[Event] = []
    fates: list[tuple] = []
    quarantined: list[tuple] = []
    by_event: dict[str, list] = {}
    for r in rows:
        if r.repair:
            fates.append((r.event_id, r.replica, Fate.REPAIRED.value))
        elif r.event_id is None:  # cannot be deduplicated: quarantined one by one
            fates.append((None, r.replica, Fate.QUARANTINED.value))
            quarantined.append((r.replica, None, r.reason, r.detail, r.raw))
        else:
            by_event.setdefault(r.event_id, []).append(r)
    for eid, copies in sorted(by_event.items()):
        copies.sort(key=lambda r: (r.pref, r.replica))
        c = copies[0]
        fate = Fate.DUPLICATE if c.seen else Fate.QUARANTINED if c.reason else Fate.APPLIED
        replicas = [r.replica for r in copies]
        fates += [
            (eid, rep, (Fate.DUPLICATE if rep in replicas[:i] else fate).value)
            for i, rep in enumerate(replicas)
        ]
        if c.seen:
            continue
        if c.reason:
            quarantined.append((c.replica, eid, c.reason, c.detail, c.raw))
        else:
            events.append(
                Event(
                    eid,
                    "TRUNCATE",
                    None,
                    c.ts,
                    c.origin,
                    c.rank,
                    seqs={r.replica: r.seq for r in copies},
                )
            )
    return Specials(events, fates, quarantined, moved)


def with_special_copies(
    spark: SparkSession,
    fates: DataFrame,
    quarantine: DataFrame,
    specials: Specials,
) -> tuple[DataFrame, DataFrame]:
    """The fates and the quarantine of the main copies, with those of the special ones
    (``split_special``: TRUNCATEs and records without an event id), for both engines."""
    if specials.fates:
        fates = fates.unionByName(
            spark.createDataFrame(specials.fates, "event_id string, replica string, fate string"),
            allowMissingColumns=True,
        )
    if specials.quarantined:
        quarantine = quarantine.unionByName(
            spark.createDataFrame(
                specials.quarantined,
                "replica string, event_id string, reason string, detail string, raw string",
            )
        )
    return fates, quarantine
