"""Each event once (docs/outputs.md#each-event-once): the ledger of the events earlier
nights resolved, and what a run does with a copy of one of them.

- every event that reached a final fate has a row in the table's ledger
  (``published/<table>/ledger``, by ``dt``): its id, its fate and the digest of the copy
  that stood for it (:func:`content_digest`: what it wrote, the key and images it gave,
  its ``ts``, origin and TTL; not its before image, in which each replica's copy names its
  own old row);
- a run of D reads the window ``[D - gc_grace_seconds, D)`` (:func:`read_ledger`): a copy
  whose id is there is not resolved again (``seen``: a duplicate); when its digest is not
  the one the ledger holds (``differs``), it is kept in the ``differing_copies`` log with
  both digests, and counted (``changed_copies`` in the run report);
- ledger rows written before the digests (issue 49) hold none: nothing is compared with
  them, and while the window holds some, the adapters' ids of that time are matched too
  (:func:`legacy_ids`, docs/adapters.md "Upgrading").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from pipeline.core.columns import (
    AFTER,
    DIGEST,
    EVENT_ID,
    EXPIRY,
    FATE,
    KEY,
    OP,
    ORIGIN,
    REPLICA,
    SEQ,
    TS,
    TTL,
)
from pipeline.core.config import Table
from pipeline.core.jsonvalues import dumps
from pipeline.ingest.copies import copy_record
from pipeline.ingest.prior import LEDGER_PIN
from pipeline.storage.lake_read import Pin, read_pinned

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from pipeline.storage.workpath import WorkPath

#: the copies' columns this module adds: a copy's content digest, whether an earlier
#: night resolved its event, and whether it differs from the copy that stood for it then
SEEN, DIFFERS = "seen", "differs"
#: the ledger's digests of an event, as :func:`read_ledger` groups them
KNOWN = "known"


def content_digest(table: Table) -> Column:
    """A typed copy's (``frames.copy_schema``) content as a 64-bit digest: its op, key,
    new key, the columns its after image gives (by name: a column added to the table
    later changes no digest) with their values, ``ts``, origin, TTL and expiry."""
    given = F.array_compact(
        F.array(
            *[F.when(F.col("after_has")[i], F.lit(c)) for i, c in enumerate(table.column_names)]
        )
    )
    return F.xxhash64(
        F.col(OP),
        F.to_json(F.col(KEY)),
        F.to_json(F.col("new_key")),
        F.to_json(F.col(AFTER)),
        given,
        F.col(TS),
        F.col(ORIGIN),
        F.col(TTL),
        F.col(EXPIRY),
    )


def read_ledger(spark: SparkSession, staged_table: WorkPath) -> DataFrame | None:
    """The events of the ledger partitions ingest pinned (the window's nights), read by
    the executors through Delta: ``event_id`` and the digests its rows hold (``known``,
    empty for rows written before the digests); None when there are none."""

    pin = Pin.load(staged_table / LEDGER_PIN)
    if pin is None:
        return None
    rows = read_pinned(spark, pin)
    digest = F.col(DIGEST) if DIGEST in rows.columns else F.lit(None).cast("bigint")
    return rows.groupBy(EVENT_ID).agg(F.collect_set(digest).alias(KNOWN))


def legacy_ids(ledger: DataFrame | None) -> DataFrame | None:
    """The window's event ids that runs before issue 49 wrote (their rows hold no
    digest): an adapter's copy is matched on its id of that time too."""
    if ledger is None:
        return None
    return ledger.where(F.size(KNOWN) == 0).select(EVENT_ID)


def _marks(known: Column) -> tuple[Column, Column]:
    seen = known.isNotNull()
    differs = seen & (F.size(known) > 0) & ~F.array_contains(known, F.col(DIGEST))
    return seen, differs


def with_seen(copies: DataFrame, ledger: DataFrame | None) -> DataFrame:
    """``seen`` and ``differs`` (module docstring) on every copy (``copies``: with their
    :data:`DIGEST`)."""
    if ledger is None:
        return copies.withColumn(SEEN, F.lit(False)).withColumn(DIFFERS, F.lit(False))
    # no broadcast hint: ten nights of a busy table's ids are too many for one
    flagged = copies.join(ledger, EVENT_ID, "left")
    seen, differs = _marks(F.col(KNOWN))
    return flagged.withColumn(SEEN, seen).withColumn(DIFFERS, differs).drop(KNOWN)


def set_aside(
    copies: DataFrame, ledger: DataFrame | None, duplicate: str
) -> tuple[DataFrame, DataFrame | None]:
    """The copies of events an earlier night resolved, apart (their fates: ``duplicate``,
    with their digest and ``differs``), and the others (the cell engine's way)."""
    if ledger is None:
        return copies, None
    again = copies.join(ledger, EVENT_ID)
    rest = copies.join(ledger, EVENT_ID, "left_anti")
    _, differs = _marks(F.col(KNOWN))
    return rest, again.select(
        EVENT_ID,
        REPLICA,
        F.lit(duplicate).alias(FATE),
        F.lit(False).alias("chosen"),
        F.col(DIGEST),
        differs.alias(DIFFERS),
    )


def changed_copies(copies: DataFrame, ledger: DataFrame, table: Table) -> list[dict[str, Any]]:
    """The copies of events an earlier night resolved whose content differs from the
    copy that stood for it then, as rows of the ``differing_copies`` log
    (``copies.DIFFERING_SCHEMA``: the copy, its digest and the ledger's). One Spark job;
    run only when the fates counted some."""

    found = copies.join(ledger, EVENT_ID).where(_marks(F.col(KNOWN))[1])
    out = []
    for r in found.select(*copies.columns, F.array_min(KNOWN).alias("_ledger")).collect():
        d = r.asDict(recursive=True)
        record = d["raw"] if d["reason"] is not None else dumps(copy_record(d, table.column_names))
        where = {k: d[k] for k in (REPLICA, EVENT_ID, "file", "line", SEQ)}
        digests = {DIGEST: d[DIGEST], "ledger_digest": d["_ledger"]}
        out.append({**where, "standing": False, "record": record, **digests})
    return out
