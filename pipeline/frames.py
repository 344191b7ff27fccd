"""The frames the resolve wing passes between its modules, each column named and typed
once: the light and the typed copy of an event (``events``), what the Python fold reads
and writes (``engine``, ``foldrun``), and the run's logs as the resolve stage writes them
(``resolve``, then ``lake`` publishes them). A module that reads or writes one of these
frames takes its columns from here. Types only: nothing here needs a Spark session.
"""

from __future__ import annotations

from pyspark.sql import types as T

from pipeline.config import Table
from pipeline.schema import row_struct_type

_S, _L, _I, _B = T.StringType(), T.LongType(), T.IntegerType(), T.BooleanType()

# ---------------------------------------------------------------------- copies of events

#: the fields of every copy that the shuffle by key needs, read as text (``copy_refs``)
LIGHT_FIELDS = ("event_id", "op", "origin", "seq")

#: what the full typing adds to the copy that stands for its event (``type_copies``)
TYPED_COLUMNS = (
    "op",
    "origin",
    "rank",
    "txid",
    "ts",
    "new_key",
    "after",
    "after_has",
    "before",
    "before_has",
    "extra_cols",
    "ttl",
    "expiry",
    "reason",
    "detail",
)

#: what the shuffle by key carries of each copy, after ``key`` and ``is_event`` (both engines)
SHUFFLED_COPY = ("event_id", "replica", "file", "line", "raw", "seq", "pref")

# ---------------------------------------------------------------------- the Python fold

#: what the Python fold reads of each row (everything else stays in the JVM)
FOLD_INPUT = (
    "key",
    "is_event",
    "ts",
    "rank",
    "event_id",
    "op",
    "origin",
    "new_key",
    "after",
    "after_has",
    "before",
    "before_has",
    "extra_cols",
    "txid",
    "rejected",
    "replica",
    "seq",
    "pref",
    "rn",
    "row",
    "s_ts",
    "s_rank",
    "s_origin",
    "s_deleted",
    "s_deleted_at",
)

#: a conflict-log row, after ``run_id, table`` (formats.md)
CONFLICT = (
    ("key", _S),
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
)
CONFLICT_FIELDS = tuple(n for n, _t in CONFLICT)
#: a conflict's place in the canonical order (the event's, then its place among the
#: event's conflicts); the conflict log is written in this order
POSITION = ("remote_ts", "pos_rank", "remote_event_id", "pos_idx")
#: a divergence row after ``run_id, table, source`` (semantics.md §9); ``source`` is
#: "perspective" (§9) or "snapshot" (a replica's full copy)
DIVERGENCE_FIELDS = ("replica", "key", "replica_row", "converged_row", "repair")
DIVERGENCE = T.StructType([T.StructField(n, _S) for n in DIVERGENCE_FIELDS])


def fold_output(table: Table) -> T.StructType:
    """The rows the Python fold returns (``foldrun``): a ``kind`` (state, conflict,
    outcome, divergence, change) and the fields of each kind, null elsewhere."""
    row = row_struct_type(table)
    fields = [
        ("kind", _S),
        ("row", row),
        ("_ts", _L),
        ("_origin", _S),
        ("_event_id", _S),
        ("_deleted", _B),
        ("_deleted_at", _L),
        *CONFLICT,
        ("pos_rank", _I),
        ("pos_idx", _I),
        ("event_id", _S),
        ("fate", _S),
        ("replica", _S),
        ("replica_row", _S),
        ("converged_row", _S),
        ("repair", _S),
        # a change: remote_event_id, remote_ts, pos_rank, pos_idx (its place among the
        # event's changes), ``row`` (the key and the values written), and these
        ("change", _S),
        ("cols", T.ArrayType(_S)),
        ("pre", row),
        ("post", row),
    ]
    return T.StructType([T.StructField(n, t) for n, t in fields])


# ---------------------------------------------------------------------- the run's logs

#: the columns every log row starts with; its ``dt`` is the partition of the published Delta
#: table (``pipeline.lake``), not a column of the files
RUN_COLUMNS = ("run_id", "table")
LEDGER_COLUMNS = (*RUN_COLUMNS, "event_id", "fate")
#: how Spark reads the ledger's files (text columns, as ``resolve`` writes them)
LEDGER_SCHEMA = T.StructType([T.StructField(c, _S) for c in LEDGER_COLUMNS])
