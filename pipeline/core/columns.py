"""Every internal column name, in one place: the fields of an event as the fold reads it,
the metadata the state keeps beside a row, and the fields of a cell
(docs/how-a-run-works.md, docs/rules.md#terms). The published tables' own columns are
named with their schemas (``pipeline.spark.frames``, ``pipeline.spark.schema``); they
use these names where they carry the same thing.

A name is a constant so that a reader can find every use of it, and so that a typo is a
``NameError`` at import, not a column Spark cannot resolve in the middle of a night.
"""

from __future__ import annotations

from typing import Final

# an event (``pipeline.spark.frames.copy_schema``, docs/adapters.md)
EVENT_ID: Final = "event_id"
REPLICA: Final = "replica"
ORIGIN: Final = "origin"
OP: Final = "op"
TS: Final = "ts"
TXID: Final = "txid"
SEQ: Final = "seq"
POS: Final = "pos"
KEY: Final = "key"
BEFORE: Final = "before"
AFTER: Final = "after"
#: the transaction rank of the event (docs/rules.md#conflict-types)
RANK: Final = "rank"

# the run (``pipeline.spark.frames.RUN_COLUMNS``), the partition of the logs
RUN_ID: Final = "run_id"
DT: Final = "dt"

# the ledger (docs/outputs.md#each-event-once): what became of an event, and its content digest
FATE: Final = "fate"
DIGEST: Final = "digest"

# the conflict log and the divergence (docs/rules.md#manual-decisions): a conflict's name,
# and what made a key diverge
CONFLICT_ID: Final = "conflict_id"
CAUSE: Final = "cause"
EVIDENCE: Final = "evidence"  # docs/rules.md#divergence-causes: what a cause was decided from

# the state's metadata beside each row (``pipeline.spark.schema.META_FIELDS``)
STATE_TS: Final = "_ts"
STATE_ORIGIN: Final = "_origin"
STATE_EVENT_ID: Final = "_event_id"
STATE_DELETED: Final = "_deleted"
STATE_DELETED_AT: Final = "_deleted_at"

# a cell table's state (``pipeline.spark.schema.cell_meta_fields``, docs/rules.md#cell-rules):
# every cell as written, the row marker, the row tombstone; and the fields of each
CELLS: Final = "_cells"
MARKER: Final = "_marker"
TOMB: Final = "_tomb"
TTL: Final = "ttl"
EXPIRY: Final = "expiry"
DEAD: Final = "dead"
DELETED_AT: Final = "deleted_at"

# what a published table holds beside a table's own columns: the history's versions
# (docs/outputs.md#history), a row's column groups (docs/rules.md#column-groups)
HISTORY_RUN_ID: Final = "_run_id"
VALID_FROM: Final = "_valid_from"
VALID_TO: Final = "_valid_to"
LATE: Final = "_late"
VERSION: Final = "_version"
GROUPS: Final = "_groups"

#: docs/configuration.md#column-names: the names a table's column cannot take (compared
#: without case, as Spark and Delta compare them): what the state, the snapshot and the
#: history hold beside a table's own columns, and the prefixes of the marks the pipeline
#: joins with and of the CDC log's columns. ``tests/unit/test_config.py`` holds it to the
#: schemas.
RESERVED: Final = frozenset(
    {
        STATE_TS,
        STATE_ORIGIN,
        STATE_EVENT_ID,
        STATE_DELETED,
        STATE_DELETED_AT,
        CELLS,
        MARKER,
        TOMB,
        DT,
        HISTORY_RUN_ID,
        VALID_FROM,
        VALID_TO,
        LATE,
        VERSION,
        GROUPS,
    }
)
RESERVED_PREFIXES: Final = ("__cdr", "cdc$")
