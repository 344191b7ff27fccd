"""The frames the resolve stage passes between its modules, each column named and typed
once: the light and the typed copy of an event (as ingest stages them), what the fold
tasks read and write (``resolve.engine``, ``resolve.fold_task``), and the run's logs as
``resolve.stage`` writes them for the publish to commit. A module that reads or writes one of these
frames takes its columns from here. Types only (and :func:`run_columns`'s literals,
:func:`with_instants`'s columns): nothing here needs a Spark session to be imported.
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipeline.core.columns import (
    AFTER,
    BEFORE,
    CAUSE,
    CONFLICT_ID,
    DIGEST,
    EVENT_ID,
    EVIDENCE,
    EXPIRY,
    FATE,
    KEY,
    OP,
    ORIGIN,
    POS,
    RANK,
    REPLICA,
    RUN_ID,
    SEQ,
    TS,
    TTL,
    TXID,
)
from pipeline.core.config import Table
from pipeline.core.layout import LEDGER, SNAPSHOT
from pipeline.spark.schema import (
    change_schema,
    key_struct_type,
    row_struct_type,
    snapshot_schema,
    state_schema,
)

_S, _L, _I, _B = T.StringType(), T.LongType(), T.IntegerType(), T.BooleanType()

# ---------------------------------------------------------------------- copies of events

#: where a copy comes from: the exporting replica, the export's file and its line (or row)
COPY_SOURCE = (REPLICA, "file", "line")


def copy_schema(table: Table) -> T.StructType:
    """A typed copy of an event: one record of one export, read and guarded once, where the
    export is fetched (``pipeline.rules.guards.Typer``; ``pipeline.ingest.copies`` writes them).
    ``pos`` is the change's place in its origin transaction (the record's, given by an
    adapter: docs/adapters.md), which orders the events of one transaction; ``pref``
    orders the copies of one event (docs/rules.md#fine-points); ``rank`` is the origin's tie rank;
    ``after_has``/``before_has`` say which of the table's columns each image holds;
    ``reason``/``detail`` the guard that quarantines it (null: none); ``raw`` the record
    as exported, kept for a quarantined copy only."""
    key, row = key_struct_type(table), row_struct_type(table)
    flags, names = T.ArrayType(_B), T.ArrayType(_S)
    fields = [
        (REPLICA, _S),
        ("file", _S),
        ("line", _L),
        (EVENT_ID, _S),
        (OP, _S),
        (ORIGIN, _S),
        (SEQ, _L),
        (POS, _L),
        ("pref", _I),
        (RANK, _I),
        (TXID, _S),
        (TS, _L),
        (KEY, key),
        ("new_key", key),
        (AFTER, row),
        ("after_has", flags),
        (BEFORE, row),
        ("before_has", flags),
        ("extra_cols", names),
        (TTL, _L),
        (EXPIRY, _L),
        ("reason", _S),
        ("detail", _S),
        ("raw", _S),
    ]
    return T.StructType([T.StructField(n, t) for n, t in fields])


# ---------------------------------------------------------------------- the Python fold

#: what the row engine's Python fold reads of each row of the stream (``group_fold``): a state
#: row's ``row`` and ``s_*``, a copy's typed fields, ``seen`` (an earlier night resolved its
#: event), ``rejected`` (its transaction was)
FOLD_INPUT = (
    KEY,
    "is_event",
    EVENT_ID,
    REPLICA,
    SEQ,
    POS,
    "pref",
    OP,
    ORIGIN,
    RANK,
    TXID,
    TS,
    "new_key",
    AFTER,
    "after_has",
    BEFORE,
    "before_has",
    "extra_cols",
    "reason",
    "detail",
    "raw",
    DIGEST,
    "seen",
    "differs",
    "rejected",
    "row",
    "s_ts",
    "s_rank",
    "s_origin",
    "s_deleted",
    "s_deleted_at",
)


def fold_input(table: Table) -> tuple[str, ...]:
    """:data:`FOLD_INPUT`, and a copy's ``file`` and ``line`` for a table with delta
    columns or a custom resolver: the fold quarantines an event whose delta would overflow
    or whose resolver fails (docs/rules.md#custom-resolvers), naming its line (the other
    tables do not carry them through the shuffle); and a state row's column groups,
    ``s_groups``, for a table with ``column_groups`` (column groups)."""
    out = (*FOLD_INPUT, "file", "line") if table.delta or table.custom else FOLD_INPUT
    return (*out, "s_groups") if table.column_groups else out


def fold_input_schema(table: Table) -> T.StructType:
    """The Spark schema of :func:`fold_input` as ``engine.build_items`` makes it: a copy's
    fields, ``is_event`` (0: a state row), and a state row's ``row`` and ``s_*``."""
    copy = {f.name: f.dataType for f in copy_schema(table).fields}
    types = {
        **copy,
        "is_event": _I,
        DIGEST: _L,
        "seen": _B,
        "differs": _B,
        "rejected": _B,
        "row": row_struct_type(table),
        "s_ts": _L,
        "s_rank": _I,
        "s_origin": _S,
        "s_deleted": _B,
        "s_deleted_at": _L,
        "s_groups": _S,
    }
    return T.StructType([T.StructField(n, types[n]) for n in fold_input(table)])


#: the conflict log's instants (docs/outputs.md#instants): each the µs column it names as a
#: ``TIMESTAMP``, for people; last in the row, as Delta adds them to a table published before
INSTANTS = (("local_time", "local_ts"), ("remote_time", "remote_ts"))
#: a conflict-log row, after ``run_id, table`` (docs/outputs.md)
CONFLICT = (
    (KEY, _S),
    ("conflict_type", _S),
    ("resolver", _S),
    ("outcome", _S),
    ("local_ts", _L),
    ("local_origin", _S),
    ("local_row", _S),
    ("remote_event_id", _S),
    ("remote_ts", _L),
    ("remote_origin", _S),
    ("remote_row", _S),
    ("reason", _S),
    (CONFLICT_ID, _S),  # docs/rules.md#manual-decisions (``pipeline.rules.decisions``)
    # the columns added since, last, in the order Delta appends them to an older table:
    # docs/rules.md#lost-writes (``pipeline.rules.lost``): the local version's writer,
    # the label, why it is unknown, the event whose write a concurrent conflict lost
    ("local_event_id", _S),
    ("concurrency", _S),
    ("concurrency_why", _S),
    ("lost_event_id", _S),
    *((name, T.TimestampType()) for name, _us in INSTANTS),
)
CONFLICT_FIELDS = tuple(n for n, _t in CONFLICT)
#: the fold's output counted for the lost writes (docs/rules.md#lost-writes): one row per
#: conflict, its label, and ``lost`` ("1") on the first conflict that lost each write
LABELS = "labels"
LABELS_SCHEMA = T.StructType([T.StructField("concurrency", _S), T.StructField("lost", _S)])
#: the fields of a conflict-log row its engine computes: all but the instants, which follow
CONFLICT_MADE = tuple(n for n in CONFLICT_FIELDS if n not in dict(INSTANTS))


def with_instants(conflicts: DataFrame) -> DataFrame:
    """The conflict log's :data:`INSTANTS`, from the µs beside them (Spark's own
    conversion: the same µs, typed as an instant)."""
    return conflicts.withColumns({t: F.timestamp_micros(F.col(us)) for t, us in INSTANTS})


def arrow_instants(conflicts: pa.Table) -> pa.Table:
    """:func:`with_instants` of conflict-log rows in Arrow (the row engine's fold tasks):
    the µs cast to a timestamp in µs, UTC, as Spark writes a ``TIMESTAMP``."""
    for t, us in INSTANTS:
        i = conflicts.schema.get_field_index(t)
        instant = conflicts[us].cast(pa.timestamp("us", tz="UTC"))
        conflicts = conflicts.set_column(i, conflicts.schema.field(i), instant)
    return conflicts


#: a conflict's place in the canonical order (the event's, then its place among the
#: event's conflicts); the conflict log is written in this order
POSITION = ("remote_ts", "pos_rank", "pos_tx", "remote_event_id", "pos_idx")
#: a divergence row after ``run_id, table, source`` (docs/rules.md#convergence); ``source`` is
#: "perspective" (docs/rules.md#convergence) or "snapshot" (a replica's full copy);
#: ``cause`` and ``evidence`` say why the row differs (docs/rules.md#divergence-causes)
DIVERGENCE_FIELDS = (REPLICA, KEY, "replica_row", "converged_row", "repair", CAUSE, EVIDENCE)
DIVERGENCE = T.StructType([T.StructField(n, _S) for n in DIVERGENCE_FIELDS])


#: a copy's fate (``applied``, ``discarded``, ``quarantined``, ``duplicate``, ``errored``,
#: ``not_reached``); ``chosen``: the copy stood for its event (an event chosen under two
#: keys had copies under both, and is resolved again under its winner's); ``digest`` and
#: ``differs``: the copy's content digest, and whether it differs from the one the ledger
#: holds of an earlier night (``pipeline.resolve.ledger``)
FATES = T.StructType(
    [
        T.StructField(EVENT_ID, _S),
        T.StructField(REPLICA, _S),
        T.StructField(FATE, _S),
        T.StructField("chosen", _B),
        T.StructField(DIGEST, _L),
        T.StructField("differs", _B),
    ]
)
#: the quarantine, after ``run_id, table``: ``event`` is the record as exported
QUARANTINE_FIELDS = (REPLICA, EVENT_ID, "reason", "detail", "event")


#: one clock-skew evidence (``pipeline.resolve.skew``): the replica behind, the one ahead, the
#: difference in µs; the fold tasks' output ``skew`` and the cell engine's column
SKEW_FIELDS = ("behind", "ahead", "lag_us")


#: the fold tasks' output of the unique values no export states (``pipeline.resolve.unique``):
#: the key, and in ``value`` a row of the table with the constraint's columns set
UNFORESEEN, VALUE = "unforeseen", "value"


def fold_outputs(table: Table, changes: bool) -> dict[str, T.StructType]:
    """What the row engine's fold tasks write (``fold_task.OUTPUTS``), each output's schema:
    the state (and its live rows, the snapshot), the fates, and the run's logs as they
    are published."""

    run = [T.StructField(n, _S) for n in RUN_COLUMNS]
    out = {
        "state_pre": state_schema(table),
        "fates": FATES,
        "conflicts": T.StructType(run + [T.StructField(n, t) for n, t in CONFLICT]),
        "quarantine": T.StructType(run + [T.StructField(n, _S) for n in QUARANTINE_FIELDS]),
        "divergence": T.StructType(
            run + [T.StructField("source", _S)] + [T.StructField(n, _S) for n in DIVERGENCE_FIELDS]
        ),
    }
    out["skew"] = T.StructType(  # clock skew: the clock-skew evidence (``pipeline.resolve.skew``)
        [T.StructField(n, t) for n, t in zip(SKEW_FIELDS, (_S, _S, _L), strict=True)]
    )
    out[LABELS] = LABELS_SCHEMA
    if changes:
        out["changes"] = change_schema(table)
    out[LEDGER] = LEDGER_SCHEMA  # the ledger's rows of the events a task folded
    out[SNAPSHOT] = snapshot_schema(table)  # unless the foreign-key step changes the state
    if table.unique:  # the values no export states (``pipeline.resolve.unique``)
        out[UNFORESEEN] = T.StructType(
            [
                T.StructField(KEY, key_struct_type(table)),
                T.StructField(VALUE, row_struct_type(table)),
            ]
        )
    return out


# ---------------------------------------------------------------------- the run's logs

#: the columns every log row starts with; its ``dt`` is the partition of the published Delta
#: table (``pipeline.storage.lake``), not a column of the files
RUN_COLUMNS = (RUN_ID, "table")


def run_columns(run_id: str, table: str) -> list[Column]:
    """:data:`RUN_COLUMNS` as the literal columns of one run and table."""
    return [F.lit(v).alias(n) for n, v in zip(RUN_COLUMNS, (run_id, table), strict=True)]


LEDGER_COLUMNS = (*RUN_COLUMNS, EVENT_ID, FATE, DIGEST)
#: how Spark reads the ledger's files (as ``resolve`` writes them; ``digest``: the content
#: digest of the copy that stood for the event, ``pipeline.resolve.ledger``)
LEDGER_SCHEMA = T.StructType([T.StructField(c, _L if c == DIGEST else _S) for c in LEDGER_COLUMNS])
