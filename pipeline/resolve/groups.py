"""The key groups of a fold task's stream, found with Arrow: where each group starts, and
the groups whose result is certain without the Python fold (used by ``pipeline.resolve.fold_task``).

The stream is sorted by key, then by ``is_event`` (a key's prior state row first), event
id, and the copies' order of preference (docs/rules.md#fine-points). A group is one key (the null
group: the copies whose key does not read). Two kinds of groups need no Python object per
row, since the fold's result for them is known:

- a *quiet* group, a prior state row that no event touches: it stays as it is;
- a *lone insert*: no prior state row, one event whose standing copy (the first) is an
  INSERT that writes every column, is not quarantined, not a duplicate of an event an
  earlier night resolved, not in a rejected transaction, with no column the table does not
  have, and no replica holds two copies of it. Under every policy
  (docs/rules.md#conflict-types, docs/rules.md#policies) an INSERT onto an absent key is no
  conflict: the row is written, every copy is ``applied``, one event has one order (no
  perspective differs), and a reader sees an insert of the row.

Every other group goes to ``pipeline.rules.rowfold``. ``tests/unit/test_groups.py`` holds a task's
outputs with these paths to the outputs of the Python fold alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.core.columns import (
    AFTER,
    DIGEST,
    EVENT_ID,
    EXPIRY,
    FATE,
    KEY,
    OP,
    ORIGIN,
    POS,
    RANK,
    REPLICA,
    STATE_DELETED,
    STATE_DELETED_AT,
    STATE_EVENT_ID,
    STATE_ORIGIN,
    STATE_TS,
    TS,
    TTL,
)
from pipeline.core.config import Table
from pipeline.core.policy import Fate
from pipeline.rules.events import NO_POS
from pipeline.rules.guards import READ


def _differs(a: pa.Array) -> np.ndarray:
    """Per row after the first: the value is not the previous row's (null equals null)."""
    cur, prev = a.slice(1), a.slice(0, len(a) - 1)
    ne = np.asarray(pc.fill_null(pc.not_equal(cur, prev), False))
    return ne | (np.asarray(pc.is_null(cur)) != np.asarray(pc.is_null(prev)))


@dataclass(frozen=True)
class Groups:
    """The groups of a stretch of the stream: ``starts[g]`` is group g's first row (and
    ``starts[-1]`` the number of rows); ``of_row`` each row's group."""

    starts: np.ndarray
    of_row: np.ndarray

    @property
    def sizes(self) -> np.ndarray:
        return np.diff(self.starts)

    def any(self, values: np.ndarray) -> np.ndarray:
        """Per group: whether any row has the value."""
        return np.add.reduceat(values.astype(np.int64), self.starts[:-1]) > 0

    def rows(self, per_group: np.ndarray) -> np.ndarray:
        """A value per group, per row."""
        return per_group[self.of_row]

    def select(self, keep: np.ndarray) -> Groups:
        """The groups ``keep`` marks, as they stand in the rows they keep
        (``table.filter(self.rows(keep))``)."""
        sizes = self.sizes[keep]
        starts = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
        return Groups(starts, np.repeat(np.arange(len(sizes)), sizes))


def find_groups(key: pa.StructArray) -> Groups:
    """The key groups of rows sorted by key (``key`` may be null: the null group)."""
    n = len(key)
    if n == 0:
        return Groups(np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int64))
    valid = pc.is_valid(key)
    new = np.asarray(valid)[1:] != np.asarray(valid)[:-1]
    for i in range(key.type.num_fields):
        child = pc.if_else(valid, key.field(i), pa.scalar(None, key.type.field(i).type))
        new |= _differs(child)
    starts = np.concatenate(([0], np.flatnonzero(new) + 1, [n])).astype(np.int64)
    of_row = np.repeat(np.arange(len(starts) - 1), np.diff(starts))
    return Groups(starts, of_row)


def _new_events(t: pa.Table, groups: Groups) -> np.ndarray:
    """Per row: the first of its group, or of its event in its group (a state row is not
    an event, even when it names the event that made it, which a copy may hold again)."""
    n = t.num_rows
    new = np.ones(n, dtype=bool)
    if n > 1:
        is_event = np.asarray(t.column("is_event"))
        new[1:] = _differs(t.column(EVENT_ID).combine_chunks()) | (is_event[1:] != is_event[:-1])
    new[groups.starts[:-1]] = True
    return new


def standing_rows(t: pa.Table, groups: Groups) -> np.ndarray:
    """Per row: a state row, or the copy that stands for its event (the first,
    docs/rules.md#fine-points)."""
    return (np.asarray(t.column("is_event")) != 1) | _new_events(t, groups)


def lone_inserts(t: pa.Table, groups: Groups, table: Table) -> np.ndarray:
    """Per group: it is a lone insert (see the module's docstring)."""
    col = t.column
    is_event = np.asarray(col("is_event")) == 1
    replica = col(REPLICA).combine_chunks()
    new_event = _new_events(t, groups)
    one_event = np.add.reduceat(new_event.astype(np.int64), groups.starts[:-1]) == 1
    no_state = ~groups.any(~is_event)
    first = groups.starts[:-1]

    def at_first(name: str) -> pa.Array:
        return pc.take(col(name).combine_chunks(), pa.array(first))

    ok = one_event & no_state
    ok &= np.asarray(pc.fill_null(pc.equal(at_first(OP), "INSERT"), False))
    ok &= np.asarray(pc.is_null(at_first("reason")))
    ok &= ~np.asarray(pc.fill_null(at_first("seen"), True))
    ok &= ~np.asarray(pc.fill_null(at_first("rejected"), True))
    ok &= np.asarray(pc.fill_null(pc.equal(pc.list_value_length(at_first("extra_cols")), 0), True))
    has = at_first("after_has")
    ncols = np.asarray(pc.fill_null(pc.list_value_length(has), 0)) == len(table.columns)
    ok &= ncols & _all_true(has, len(first))
    # no replica holds two copies: the replicas of a group's rows are distinct (a bit per
    # replica; past 63 replicas two share a bit, which can only send a group to Python)
    codes = np.asarray(pc.fill_null(pc.index_in(replica, pc.unique(replica)), 0))
    bits = np.left_shift(np.int64(1), codes.astype(np.int64) % 63)
    distinct = np.bitwise_or.reduceat(bits, first)
    counts = np.array([bin(int(x)).count("1") for x in distinct], dtype=np.int64)
    ok &= counts == groups.sizes
    return ok


def _all_true(lists: pa.ListArray, n: int) -> np.ndarray:
    """Per row of a list of flags: every flag is true (an empty or null list is not)."""
    if n == 0:
        return np.zeros(0, dtype=bool)
    flat = np.asarray(pc.fill_null(lists.flatten(), False))
    lengths = np.asarray(pc.fill_null(pc.list_value_length(lists), 0))
    offsets = np.concatenate(([0], np.cumsum(lengths)))
    false_count = np.add.reduceat(
        np.concatenate((~flat, [False])).astype(np.int64), offsets[:-1].clip(max=len(flat))
    )
    return (lengths > 0) & (false_count == 0)


def read_fates(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """The fates of snapshot reads (docs/adapters.md#snapshot-reads; ``rows``: the READ
    copies): each is ``read``, never applied."""
    return pa.table(
        {
            EVENT_ID: rows.column(EVENT_ID),
            REPLICA: rows.column(REPLICA),
            FATE: pa.repeat(pa.scalar(Fate.READ.value), rows.num_rows),
            "chosen": pa.repeat(pa.scalar(False), rows.num_rows),
            DIGEST: rows.column(DIGEST),
            "differs": rows.column("differs"),
        },
        schema=schema,
    )


def reads(t: pa.Table) -> np.ndarray:
    """Per row: a snapshot read (docs/adapters.md#snapshot-reads), not an event the fold
    applies."""
    return np.asarray(pc.fill_null(pc.equal(t.column(OP), READ), False)) & (
        np.asarray(t.column("is_event")) == 1
    )


def lone_insert_outputs(
    rows: pa.Table, groups: Groups, table: Table, schemas: dict[str, pa.Schema]
) -> dict[str, pa.Table]:
    """The outputs of lone-insert groups (``rows``: theirs only, ``groups`` theirs): the
    row written, every copy applied (the first stands for its event), and, with the CDC
    log, an insert of the row."""
    first = pa.array(groups.starts[:-1])
    standing = rows.take(first)
    chosen = np.zeros(rows.num_rows, dtype=bool)
    chosen[groups.starts[:-1]] = True
    out = {
        "fates": pa.table(
            {
                EVENT_ID: rows.column(EVENT_ID),
                REPLICA: rows.column(REPLICA),
                FATE: pa.repeat(pa.scalar(Fate.APPLIED.value), rows.num_rows),
                "chosen": pa.array(chosen),
                DIGEST: rows.column(DIGEST),
                "differs": rows.column("differs"),
            },
            schema=schemas["fates"],
        )
    }
    row = _written_row(standing, table, schemas["state_pre"])
    n = standing.num_rows
    state = {f.name: row.field(f.name) for f in row.type}
    state |= {
        STATE_TS: standing.column(TS),
        STATE_ORIGIN: standing.column(ORIGIN),
        STATE_EVENT_ID: standing.column(EVENT_ID),
        STATE_DELETED: pa.repeat(pa.scalar(False), n),
        STATE_DELETED_AT: pa.nulls(n, pa.int64()),
    }
    sch = schemas["state_pre"]  # a new row's column groups (column groups) are all its own: null
    out["state_pre"] = pa.Table.from_arrays(
        [state[f.name].cast(f.type) if f.name in state else pa.nulls(n, f.type) for f in sch],
        schema=sch,
    )
    if "changes" in schemas:
        sch = schemas["changes"]
        values = table.value_columns
        change = {
            EVENT_ID: standing.column(EVENT_ID),
            TS: standing.column(TS),
            RANK: standing.column(RANK),
            POS: pc.fill_null(standing.column(POS), NO_POS),
            "idx": pa.repeat(pa.scalar(0, pa.int32()), n),
            "kind": pa.repeat(pa.scalar("insert"), n),
            KEY: standing.column(KEY),
            "values": row,
            "cols": pa.array([list(values)] * n, pa.list_(pa.string())),
            TTL: pa.nulls(n, pa.int64()),
            EXPIRY: pa.nulls(n, pa.int64()),
            "pre": pa.nulls(n, sch.field("pre").type),
            "post": row,
        }
        out["changes"] = pa.Table.from_arrays(
            [change[f.name].cast(f.type) for f in sch], schema=sch
        )
    return out


def _written_row(standing: pa.Table, table: Table, state: pa.Schema) -> pa.StructArray:
    """The row an INSERT writes: its ``after``, with the key columns from its key."""
    after = standing.column(AFTER).combine_chunks()
    key = standing.column(KEY).combine_chunks()
    children, fields = [], []
    for c in table.column_names:
        f = state.field(c)
        child = key.field(c) if c in table.key else after.field(c)
        children.append(child.cast(f.type))
        fields.append(f)
    return pa.StructArray.from_arrays(children, fields=fields)
