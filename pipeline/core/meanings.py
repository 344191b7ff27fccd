"""The policy in words: what each conflict type, resolver, quarantine reason and
divergence cause means, and the tables of docs/rules.md rendered from the policy
(``pipeline.core.policy``).

``tests/unit/test_policy.py`` compares each rendered table with the page: edit the table
here or in ``pipeline.core.policy``, then paste ``meanings.<render>()`` between the
page's markers."""

from __future__ import annotations

from collections.abc import Iterable

from pipeline.core.policy import (
    DELETE_WINS_OPS,
    DELETE_WINS_TABLE,
    PRESETS,
    REASONS,
    Cause,
    ConflictType,
    Granularity,
    Preset,
    QuarantineReason,
    Resolver,
    Why,
    allowed_resolvers,
)

_R = Resolver
_C = ConflictType


def resolver_table() -> str:
    """The README's table of docs/rules.md#resolvers, rendered from :data:`ALLOWED` and
    :data:`PRESETS` (``tests/unit/test_policy.py`` compares it with the README)."""
    row_presets = [p for p in Preset if PRESETS[p].granularity is Granularity.ROW]
    lines = [
        "| conflict type | " + " | ".join(f"`{p}` default" for p in row_presets) + " | allowed |",
        "|---|" + "---|" * len(row_presets) + "---|",
    ]
    for t in ConflictType:
        defaults = " | ".join(f"`{PRESETS[p].resolvers[t]}`" for p in row_presets)
        allowed = ", ".join(f"`{r}`" for r in allowed_resolvers(t))
        lines.append(f"| `{t}` | {defaults} | {allowed} |")
    return "\n".join(lines) + "\n"


def delete_wins_table() -> str:
    """The README's copy of docs/rules.md#policies's delete-wins table, rendered from
    :data:`DELETE_WINS_TABLE` (``tests/unit/test_policy.py`` compares it with the README)."""
    lines = [
        "| L | " + " | ".join(f"E = {op}" for op in DELETE_WINS_OPS) + " |",
        "|---|" + "---|" * len(DELETE_WINS_OPS),
    ]
    for s, rulings in DELETE_WINS_TABLE.items():
        lines.append(f"| {s.value} | " + " | ".join(r.value for r in rulings) + " |")
    return "\n".join(lines) + "\n"


#: What each conflict type means, for the rules page (``docs/rules.md#conflict-types``;
#: ``tests/unit/test_policy.py`` checks that every type has a row and that the page shows it).
CONFLICT_MEANING: dict[ConflictType, str] = {
    _C.SOURCE_COLUMN_EXTRA: "the event carries a column the table does not have",
    _C.INSERT_EXISTS: "an INSERT meets a live row with its key",
    _C.UPDATE_DIFFER: (
        "an UPDATE meets a row another origin changed last (with `detection: before_image`:"
        " a row that differs from the event's `before`)"
    ),
    _C.UPDATE_MISSING: "an UPDATE finds no row with its key",
    _C.UPDATE_DELETED: "an UPDATE finds its row deleted (a tombstone not yet purged)",
    _C.DELETE_DIFFER: "a DELETE meets a row another origin changed last",
    _C.DELETE_MISSING: "a DELETE finds no row with its key",
    _C.PKEY_EXISTS: "an UPDATE that changes the key (`new_key`) meets a live row at the new key",
    _C.TARGET_COLUMN_EXTRA: "an INSERT lacks a column the table has",
    _C.MULTIPLE_UNIQUE_CONFLICTS: "the event's row would collide with other rows on a `unique`",
}

#: What each resolver does with the remote event E against the local version L
#: (``docs/rules.md#resolvers``).
RESOLVER_MEANING: dict[Resolver, str] = {
    _R.LATEST_TIMESTAMP_WINS: (
        "the later version stays: E if its `(ts, tie rank)` is after L's, else L"
    ),
    _R.EARLIEST_TIMESTAMP_WINS: "the earlier version stays",
    _R.APPLY: "E is applied whatever L is",
    _R.APPLY_OR_SKIP: (
        "E is applied as an INSERT when it holds the whole row (`converted_to_insert`),"
        " else skipped"
    ),
    _R.APPLY_OR_ERROR: "as `apply_or_skip`, but a partial row stops the table",
    _R.SKIP: "E is discarded, L stays",
    _R.ERROR: (
        "the table stops at E: its conflict log is written up to E and nothing is published"
    ),
    _R.IGNORE: "the extra column is dropped and the rest of E applied",
    _R.USE_DEFAULT: "the missing column takes its value from the table's `defaults`",
    _R.PRIORITY_WINS: (
        "the version whose origin comes first in `priority` stays, whatever the timestamps"
    ),
    _R.DELETE_WINS: "the delete-wins table decides (`policy: delete_wins`)",
    _R.SCYLLA: "each cell is decided by the cell rules (`policy: scylla`)",
    _R.PYTHON: (
        '`{python: "module:function"}`: the user\'s function answers `local`, `remote` or a'
        " row (logged as `python:<module:function>`)"
    ),
    _R.MANUAL: (
        "an operator's decision of this conflict (`cdr decide`), in place of the configured"
        " resolver; never configured"
    ),
}

#: Why an event is quarantined (``docs/rules.md#what-is-quarantined``): the guards'
#: reasons in the order they check, then the fold's, the foreign keys' and ``retry``'s.
QUARANTINE_MEANING: dict[QuarantineReason, str] = {
    QuarantineReason.MALFORMED: (
        "the record cannot be read as an event of the table (its detail names the file, the"
        " line and what is wrong)"
    ),
    QuarantineReason.FUTURE_TIMESTAMP: (
        "its `ts` is more than `max_clock_skew_seconds` after the run's clock"
    ),
    QuarantineReason.STALE_BEYOND_GC_GRACE: (
        "its `ts` is older than `gc_grace_seconds`: it could bring back a purged deletion"
    ),
    QuarantineReason.DELTA_WITHOUT_OLD_VALUE: (
        "it changes a `delta` column without the column's old value in `before`"
    ),
    QuarantineReason.FK_VIOLATION: (
        "its row's parent is not live after resolution (`on_fk_violation: quarantine`)"
    ),
    QuarantineReason.DELTA_OVERFLOW: "its delta would take a column past its type's range",
    QuarantineReason.RESOLVER_ERROR: (
        "the table's custom resolver raised on its conflict, or answered something other than"
        " `local`, `remote` or a row that fits the table (the detail has the message)"
    ),
    QuarantineReason.UPDATE_MISSING: (
        "with `retry`, an UPDATE skipped for want of its row, offered again to later runs"
    ),
}


#: What each cause means, and what the divergence row's ``evidence`` holds for it.
CAUSE_MEANING: dict[Cause, str] = {
    Cause.SCHEMA: (
        "the replica's snapshot lacks a column on which its row differs"
        " (`missing_columns`), or the key met a conflict of columns one replica's table"
        " has and another's lacks (`conflict_types`: source_column_extra,"
        " target_column_extra)"
    ),
    Cause.MISSING_EVENTS: (
        "the replica's export lacks events of the key that other replicas' exports hold"
        " (`missing_events`: their count and ids); in a perspective, one of them comes"
        " before an event the replica holds; a later night whose export of the replica"
        " brings them counts them `arrived_late`"
    ),
    Cause.APPLY_ORDER: (
        "the replica applied the same events in another order (`replica_order`,"
        " `canonical_order`: the event ids)"
    ),
    Cause.UNIQUE_COLLISION: (
        "a unique constraint made one side keep another row (`unique`: the columns,"
        " `other_key`: the row that holds the value)"
    ),
    Cause.RESURRECTION: (
        "the replica holds a row whose key is a tombstone in the converged state (`tombstone_ts`)"
    ),
    Cause.POLICY: (
        "the key met a conflict that the project's own rules decided, as no replica"
        " database does by itself: delete-wins, priority, a custom resolver, a merge,"
        " delta or order-by column, column groups (`rules`)"
    ),
    Cause.DECISION: "an operator's decision (`cdr decide`) resolved a conflict of the key",
    Cause.UNDETERMINED: (
        "none of the above is supported by the data; `evidence` has what was checked, and"
        " no cause is guessed"
    ),
}


def _meaning_table(head: str, rows: Iterable[tuple[str, str]]) -> str:
    lines = [f"| {head} | meaning |", "|---|---|"]
    lines += [f"| `{k}` | {v} |" for k, v in rows]
    return "\n".join(lines) + "\n"


def conflict_types_table() -> str:
    """The rules page's table of conflict types, from :data:`CONFLICT_MEANING`."""
    return _meaning_table("conflict type", CONFLICT_MEANING.items())


def resolvers_meaning_table() -> str:
    """The rules page's table of what each resolver does, from :data:`RESOLVER_MEANING`."""
    return _meaning_table("resolver", RESOLVER_MEANING.items())


def quarantine_table() -> str:
    """The rules page's table of quarantine reasons, from :data:`QUARANTINE_MEANING`."""
    return _meaning_table("reason", QUARANTINE_MEANING.items())


def causes_table() -> str:
    """The rules page's table of divergence causes, from :data:`CAUSE_MEANING`."""
    return _meaning_table("cause", CAUSE_MEANING.items())


def reasons_table() -> str:
    """The rules page's list of the conflict log's reasons, from :data:`REASONS`."""
    lines = ["| reason | sentence |", "|---|---|"]
    lines += [f"| `{w}` | {REASONS[w]} |" for w in Why]
    return "\n".join(lines) + "\n"
