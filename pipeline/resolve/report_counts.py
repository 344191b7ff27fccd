"""What the run report counts of a table's outputs, counted by the executors: the driver
gets a few rows of counts, never the outputs.

- the row engine's fold tasks count what they write (:data:`COUNTED_BY`) and, since every
  copy of an event meets in one task, tally its events and write their ledger rows
  (:func:`tally`); each tells the driver the digests of its events' ids
  (:func:`task_events`), and only when two tasks told the same one (:func:`may_split`)
  does one Spark job look for the rare events whose copies two tasks saw
  (:func:`split_events`: the disputes, folded again, and the rest counted again by
  :func:`write_ledger`);
- the cell engine's events are counted as its ledger is written (:func:`write_ledger`: that
  job shuffles the fates by event anyway), and its outputs by one Spark job
  (:func:`count_outputs`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import reduce
from hashlib import blake2b
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from pipeline.core import layout
from pipeline.core.columns import CAUSE, DIGEST, EVENT_ID, FATE, REPLICA
from pipeline.core.policy import Fate
from pipeline.resolve.skew import EVENTS, MAX_SECONDS
from pipeline.spark.frames import LABELS, LEDGER_COLUMNS, RUN_COLUMNS, SKEW_FIELDS
from pipeline.storage.outputs import read_known, write_output
from pipeline.storage.workpath import WorkPath

log = logging.getLogger(__name__)

#: the columns of the fates the counts and the ledger read, as the engines write them
FATE_COLUMNS = (
    "event_id string, replica string, fate string, chosen boolean, digest bigint, differs boolean"
)
DUPLICATE = Fate.DUPLICATE.value
#: the fates after which an event is never resolved again (the ledger's)
FINAL_FATES = tuple(f.value for f in Fate if f.final)
#: what the run report counts each output's rows by (up to three text columns), and the
#: name of those counts in :class:`Facts`
COUNTED_BY: Mapping[str, tuple[str, tuple[str, ...]]] = {
    "fates": ("replicas", (REPLICA, FATE)),
    "conflicts": ("conflicts", ("conflict_type", "resolver", "outcome")),
    "quarantine": ("quarantined", ("reason",)),
    "divergence": ("divergent", (REPLICA, CAUSE)),
    LABELS: ("labels", ("concurrency", "lost")),  # docs/rules.md#lost-writes
}
#: the counts of the events (not of an output's rows): distinct events per fate, the
#: events a replica exported twice, and the copies of an earlier night's event whose
#: content differs from the one that stood for it then (``pipeline.resolve.ledger``)
EVENT_COUNTS = ("events", "repeated", "changed")
#: the clock-skew evidence (clock skew) the row engine's tasks write, counted by them per pair of
#: replicas (the one behind, the one ahead) and largest difference in µs (:func:`skew_counts`)
SKEW = "skew"
#: one count: its kind (``COUNTED_BY``'s names, ``EVENT_COUNTS``), up to three values it is
#: counted by, and the rows
Count = tuple[str, Any, Any, Any, int]


@dataclass(frozen=True)
class Facts:
    """What the run report counts of a table's outputs."""

    #: distinct events per fate: an event counts once per fate its copies got, a record
    #: without an event id once; an event counts as a duplicate only when all its records
    #: are (an earlier night resolved it)
    events: Mapping[str, int]
    #: records per replica and fate
    replicas: Mapping[str, Mapping[str, int]]
    #: (event, replica) pairs with more than one record: a replica exported it twice
    repeated: int
    #: the conflict log's rows per (conflict type, resolver, outcome)
    conflicts: Mapping[tuple[str, str, str], int]
    quarantined: Mapping[str, int]
    divergent: Mapping[str, int]  # by replica
    #: events whose copies sit under different keys: each key's task chose a copy of its
    #: own (the fates' ``chosen``; the row engine folds them again, ``engine``)
    disputed: tuple[str, ...] = ()
    #: clock skew, the row engine's: ``{behind: {ahead: {events, max_seconds}}}``
    clock_skew: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    #: copies of events an earlier night resolved, whose content differs from the copy
    #: that stood for the event then (``pipeline.resolve.ledger``)
    changed: int = 0
    #: the divergent keys per replica by cause (docs/rules.md#divergence-causes)
    divergent_causes: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    #: docs/rules.md#lost-writes: the conflict-log rows per label, and the writes lost
    #: (each losing event once)
    concurrency: Mapping[str, int] = field(default_factory=dict)
    lost_writes: int = 0

    @classmethod
    def of(cls, counts: Iterable[Count], disputed: Iterable[str] = ()) -> Facts:
        """The facts from counts (rows of the same kind and values are added)."""
        found: dict[str, dict[tuple[Any, ...], int]] = {}
        for kind, a, b, c, n in counts:
            into = found.setdefault(kind, {})
            into[(a, b, c)] = into.get((a, b, c), 0) + int(n)
        replicas: dict[str, dict[str, int]] = {}
        for (replica, fate, _), n in found.get("replicas", {}).items():
            replicas.setdefault(replica, {})[fate] = n
        flat = {
            k: {a: n for (a, _, _), n in found.get(k, {}).items()}
            for k in ("events", "quarantined")
        }
        divergent: dict[str, int] = {}
        causes: dict[str, dict[str, int]] = {}
        for (replica, cause, _), n in found.get("divergent", {}).items():
            divergent[replica] = divergent.get(replica, 0) + n
            causes.setdefault(replica, {})[cause] = n
        return cls(
            events=flat["events"],
            replicas=replicas,
            repeated=sum(found.get("repeated", {}).values()),
            changed=sum(found.get("changed", {}).values()),
            conflicts=dict(found.get("conflicts", {})),
            quarantined=flat["quarantined"],
            divergent=divergent,
            divergent_causes=causes,
            disputed=tuple(sorted(disputed)),
            clock_skew=_clock_skew(found.get(SKEW, {})),
            concurrency=_summed(found.get("labels", {})),
            lost_writes=sum(n for (_, lost, _), n in found.get("labels", {}).items() if lost),
        )

    @classmethod
    def counted(cls, spark: SparkSession, out: WorkPath) -> Facts:
        """Everything counted again from the outputs in ``out`` (after a rare rewrite of
        them): two Spark jobs."""
        events = events_of(read_known(spark, out / "fates", FATE_COLUMNS))
        observed = events.agg(*_event_metrics()).first()
        assert observed is not None
        counts = [*count_outputs(spark, out), *_event_counts(observed.asDict())]
        return cls.of(counts, _disputed(events) if observed["disputed"] else ())


def _summed(counts: Mapping[tuple[Any, ...], int]) -> dict[str, int]:
    """Counts by their first value."""
    out: dict[str, int] = {}
    for (a, _, _), n in counts.items():
        out[a] = out.get(a, 0) + n
    return out


def skew_counts(evidence: pa.Table) -> list[dict[str, Any]]:
    """A task's clock-skew evidence (``frames.SKEW_FIELDS``) as its counts: per pair of
    replicas, the events (``rows``) and the largest difference (``c``, µs as text)."""
    behind, ahead, lag = SKEW_FIELDS
    pairs = evidence.group_by([behind, ahead]).aggregate([([], "count_all"), (lag, "max")])
    return [
        {"a": p[behind], "b": p[ahead], "c": str(p[f"{lag}_max"]), "rows": p["count_all"]}
        for p in pairs.to_pylist()
    ]


def _clock_skew(
    counted: Mapping[tuple[Any, ...], int],
) -> dict[str, dict[str, dict[str, Any]]]:
    """The tasks' :func:`skew_counts` of every pair added up (its largest difference)."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for (behind, ahead, lag), n in sorted(counted.items()):
        pair = out.setdefault(behind, {}).setdefault(ahead, {EVENTS: 0, MAX_SECONDS: 0.0})
        pair[EVENTS] += n
        pair[MAX_SECONDS] = max(pair[MAX_SECONDS], int(lag) / 1_000_000)
    return out


def events_of(fates: DataFrame) -> DataFrame:
    """One row per event of the fates (``FATE_COLUMNS``): its copies (replica and fate),
    the fates it counts under (``fates``), whether a replica exported it twice
    (``again``) and whether more than one key chose it (``disputed``); a record without
    an event id is a row of its own."""
    with_id = fates.where(F.col(EVENT_ID).isNotNull())
    per_event = with_id.groupBy(EVENT_ID).agg(
        F.collect_list(F.struct(REPLICA, FATE)).alias("copies"),
        F.count_if(F.col("chosen")).alias("chosen"),
        # the standing copy's (as ``tally``); a cell engine's copies all carry it, unchosen
        F.coalesce(
            F.min(F.when(F.col("chosen"), F.col(DIGEST))),
            F.min(F.when(F.col("chosen").isNull(), F.col(DIGEST))),
        ).alias(DIGEST),
        F.count_if(F.coalesce("differs", F.lit(False))).alias("changed"),
    )
    mine = F.array_remove(F.array_distinct(F.col("copies.fate")), DUPLICATE)
    events = per_event.select(
        EVENT_ID,
        "copies",
        F.when(F.size(mine) > 0, mine).otherwise(F.array(F.lit(DUPLICATE))).alias("fates"),
        (F.size("copies") > F.size(F.array_distinct(F.col("copies.replica")))).alias("again"),
        (F.col("chosen") > 1).alias("disputed"),
        DIGEST,
        "changed",
    )
    alone = fates.where(F.col(EVENT_ID).isNull()).select(
        EVENT_ID,
        F.array(F.struct(REPLICA, FATE)).alias("copies"),
        F.array(FATE).alias("fates"),
        F.lit(False).alias("again"),
        F.lit(False).alias("disputed"),
        F.lit(None).cast("bigint").alias(DIGEST),
        F.lit(0).cast("bigint").alias("changed"),
    )
    return events.unionByName(alone)


def _event_metrics() -> list[Column]:
    """The events' counts, as aggregates over :func:`events_of`."""
    return [
        *[F.sum(F.array_contains("fates", f.value).cast("long")).alias(f.value) for f in Fate],
        F.count_if("again").alias("repeated"),
        F.count_if("disputed").alias("disputed"),
        F.sum("changed").alias("changed"),
    ]


def tally(fates: pa.Table) -> tuple[pa.Table, list[Count]]:
    """What :func:`events_of` and :func:`_event_metrics` find of ``fates`` (``FATES``)
    when every copy of their events is in it (a fold task's, or the driver's special
    copies): the ledger's (event, fate) pairs, sorted by event, and the events' counts
    (disputes aside: :func:`split_events`)."""
    has_id = pc.is_valid(fates[EVENT_ID])
    with_id = fates.filter(has_id)
    pairs = with_id.select([EVENT_ID, FATE]).group_by([EVENT_ID, FATE]).aggregate([])
    mine = pc.not_equal(pairs[FATE], DUPLICATE)
    per_event = pairs.append_column("mine", mine).group_by(EVENT_ID).aggregate([("mine", "any")])
    only_duplicates = per_event.num_rows - (
        pc.sum(per_event["mine_any"].cast(pa.int64())).as_py() or 0
    )
    counted: dict[str, int] = dict.fromkeys((f.value for f in Fate), 0)
    alone = fates.filter(pc.invert(has_id))  # a record without an event id counts alone
    for values in (pairs.filter(mine)[FATE], alone[FATE]):
        for v in pc.value_counts(values).to_pylist():
            counted[v["values"]] += v["counts"]
    counted[DUPLICATE] += only_duplicates
    copies = with_id.group_by([EVENT_ID, REPLICA]).aggregate([(FATE, "count")])
    twice = copies.filter(pc.greater(copies["fate_count"], 1))
    repeated = len(pc.unique(twice[EVENT_ID]))
    final = pairs.filter(pc.is_in(pairs[FATE], pa.array(FINAL_FATES)))
    final = final.join(_standing_digests(with_id), EVENT_ID, join_type="left outer")
    final = final.sort_by([(EVENT_ID, "ascending"), (FATE, "ascending")])
    changed = pc.sum(pc.fill_null(with_id["differs"], False).cast(pa.int64())).as_py() or 0
    counts = [*_event_counts({**counted, "repeated": repeated, "changed": changed})]
    return final, counts


def _standing_digests(fates: pa.Table) -> pa.Table:
    """``event_id, digest``: the digest of the copy that stood for each event (none when
    no copy was chosen: a copy the driver settled)."""
    chosen = fates.filter(pc.fill_null(fates["chosen"], False))
    first = chosen.group_by(EVENT_ID).aggregate([(DIGEST, "min")])
    return pa.table({EVENT_ID: first[EVENT_ID], DIGEST: first["digest_min"]})


def event_digests(ids: Iterable[str | None]) -> np.ndarray:
    """Distinct event ids as the first 8 bytes of their BLAKE2b digests, sorted (the same
    in every process: Python's own ``hash`` of a text is not)."""
    digests = [blake2b(i.encode(), digest_size=8).digest() for i in set(ids) if i is not None]
    return np.sort(np.frombuffer(b"".join(digests), dtype=np.uint64))


def task_events(fates: pa.Table) -> bytes:
    """What a fold task tells the driver of its events (``FATES``), for
    :func:`may_split`: the digests of their ids (:func:`event_digests`), and once more
    the digest of each event it chose more than once (under two of its keys: a dispute)."""
    with_id = fates.filter(pc.is_valid(fates[EVENT_ID]))
    chosen = with_id.filter(with_id["chosen"]).group_by(EVENT_ID).aggregate([([], "count_all")])
    twice = chosen.filter(pc.greater(chosen["count_all"], 1))[EVENT_ID].to_pylist()
    mine = event_digests(pc.unique(with_id[EVENT_ID]).to_pylist())
    return np.concatenate([mine, event_digests(twice)]).tobytes()


def may_split(told: Iterable[bytes]) -> bool:
    """Whether an event of the fold's tasks (each told by :func:`task_events`) may have
    fates in two tasks' files or be disputed: a digest told twice. No digest twice: no
    event is (the common case: :func:`split_events` needs no job); two ids that share a
    digest only cost that job."""
    every = np.sort(np.concatenate([np.frombuffer(t, dtype=np.uint64) for t in told] or [_NONE]))
    return bool(np.any(every[1:] == every[:-1]))  # (np.unique: 70 times slower here)


_NONE = np.zeros(0, dtype=np.uint64)


def split_events(spark: SparkSession, out: WorkPath) -> tuple[list[str], bool]:
    """The events of the fates in ``out`` that the fold's tasks could not tally alone (one
    Spark job; its result, a few rows or none, is all the driver reads): the disputed
    ones (chosen under more than one key: folded again under their winner's), and
    whether some event has copies in the files of more than one task (its counts and
    ledger rows are then made again by :func:`write_ledger`)."""
    folder = out / "fates"
    if not folder.parquet_files():
        return [], False
    fates = spark.read.schema(FATE_COLUMNS).parquet(str(folder))
    file = F.substring_index(F.col("_metadata.file_path"), "/", -1)
    found = (
        fates.where(F.col(EVENT_ID).isNotNull())
        .groupBy(EVENT_ID)
        .agg(
            (F.min(file) != F.max(file)).alias("split"),
            (F.count_if("chosen") > 1).alias("disputed"),
        )
        .where(F.col("split") | F.col("disputed"))
        .collect()
    )
    return sorted(r[EVENT_ID] for r in found if r["disputed"]), any(r["split"] for r in found)


def _event_counts(observed: Mapping[str, Any]) -> list[Count]:
    found: list[Count] = [("events", f.value, None, None, observed[f.value] or 0) for f in Fate]
    found.append(("repeated", None, None, None, observed["repeated"] or 0))
    return [*found, ("changed", None, None, None, observed.get("changed") or 0)]


def _disputed(events: DataFrame) -> list[str]:
    """The ids of the disputed events (a job of its own: only when there are some)."""
    return [r[EVENT_ID] for r in events.where("disputed").select(EVENT_ID).collect()]


@dataclass(frozen=True)
class Tally:
    """The events' counts observed as the ledger was written (:func:`write_ledger`)."""

    counts: tuple[Count, ...]
    disputed: tuple[str, ...]


def write_ledger(spark: SparkSession, out: WorkPath, run_id: str, table: str) -> Tally:
    """The ledger of a table's run, written by the executors into ``out``: the ids of the
    events that reached a final fate, one file sorted by id (published with the run,
    read by the next nights' runs); the events' counts observed as it is written."""
    events = events_of(read_known(spark, out / "fates", FATE_COLUMNS))
    seen = Observation()
    final = F.filter("fates", lambda f: f.isin(*FINAL_FATES))
    values = (run_id, table)
    run: list[Column] = [F.lit(v).alias(n) for n, v in zip(RUN_COLUMNS, values, strict=True)]
    ledger = (
        events.observe(seen, *_event_metrics())
        .where(F.col(EVENT_ID).isNotNull())
        .select(*run, EVENT_ID, F.explode(final).alias(FATE), DIGEST)
        .select(*LEDGER_COLUMNS)
    )
    t = time.monotonic()
    # one file, sorted; the events grouped in parallel first
    write_output(ledger.repartition(1).sortWithinPartitions(EVENT_ID), out / layout.LEDGER)
    log.debug("ledger %s: %.2fs", out.name, time.monotonic() - t)
    observed = seen.get
    disputed = _disputed(events) if observed["disputed"] else []
    return Tally(tuple(_event_counts(observed)), tuple(disputed))


def count_outputs(spark: SparkSession, out: WorkPath) -> list[Count]:
    """The outputs' counts (:data:`COUNTED_BY`), counted by the executors in one Spark
    job: its result, a few rows, is all the driver reads."""
    parts = []
    for output, (kind, by) in COUNTED_BY.items():
        rows = read_known(spark, out / output, ", ".join(f"{c} string" for c in by))
        keys = [F.col(c) for c in by] + [F.lit(None).cast("string")] * (3 - len(by))
        named = rows.select(*[k.alias(n) for k, n in zip(keys, "abc", strict=True)])
        parts.append(named.groupBy("a", "b", "c").count().withColumn("kind", F.lit(kind)))
    t = time.monotonic()
    counted = reduce(DataFrame.unionByName, parts).collect()
    log.debug("count %s: %.2fs", out.name, time.monotonic() - t)
    return [(r["kind"], r["a"], r["b"], r["c"], r["count"]) for r in counted]
