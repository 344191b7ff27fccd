"""Policy as data: the closed sets of conflict types, resolvers and outcomes, and one table
per preset (docs/rules.md#conflict-types, docs/rules.md#fine-points).

Config validation, dispatch in the fold and the tables of docs/rules.md (rendered by
``pipeline.core.meanings``, with what each name means) all derive from the tables below;
how each resolver decides is the fold's resolver table (``pipeline.rules.resolvers``),
which reads the delete-wins table from here. ``tests/unit/test_policy.py`` proves every
type has a rule and every resolver an implementation.
"""

from __future__ import annotations

import math
import string
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pipeline.core.instants import instant_micros


class ConflictType(StrEnum):
    """docs/rules.md#conflict-types, in the order several conflicts of one event are logged
    (docs/rules.md#fine-points)."""

    SOURCE_COLUMN_EXTRA = "source_column_extra"
    INSERT_EXISTS = "insert_exists"
    UPDATE_DIFFER = "update_differ"
    UPDATE_MISSING = "update_missing"
    UPDATE_DELETED = "update_deleted"
    DELETE_DIFFER = "delete_differ"
    DELETE_MISSING = "delete_missing"
    PKEY_EXISTS = "pkey_exists"
    TARGET_COLUMN_EXTRA = "target_column_extra"
    MULTIPLE_UNIQUE_CONFLICTS = "multiple_unique_conflicts"


class Resolver(StrEnum):
    """docs/rules.md#resolvers, plus the two rule-based resolvers a preset records."""

    LATEST_TIMESTAMP_WINS = "latest_timestamp_wins"
    EARLIEST_TIMESTAMP_WINS = "earliest_timestamp_wins"
    APPLY = "apply"
    APPLY_OR_SKIP = "apply_or_skip"
    APPLY_OR_ERROR = "apply_or_error"
    SKIP = "skip"
    ERROR = "error"
    IGNORE = "ignore"
    USE_DEFAULT = "use_default"
    PRIORITY_WINS = "priority_wins"  # docs/rules.md#priority: the origin first in `priority` wins
    # the Informix rule of docs/rules.md#policies, recorded by `delete_wins` tables
    DELETE_WINS = "delete_wins"
    SCYLLA = "scylla"  # the cell rules of docs/rules.md#cell-rules, recorded by `scylla` tables
    #: docs/rules.md#custom-resolvers: a function of the user's (``{python: "module:function"}``)
    PYTHON = "python"
    #: docs/rules.md#manual-decisions: an operator's decision (``cdr decide``), never configured
    MANUAL = "manual"


class Outcome(StrEnum):
    """What happened to the remote event (docs/rules.md#fine-points)."""

    APPLIED = "applied"
    SKIPPED = "skipped"
    CONVERTED_TO_INSERT = "converted_to_insert"
    CONVERTED_TO_UPDATE = "converted_to_update"
    ERRORED = "errored"
    DISCARDED = "discarded"

    @property
    def remote_applied(self) -> bool:
        return self in (Outcome.APPLIED, Outcome.CONVERTED_TO_INSERT, Outcome.CONVERTED_TO_UPDATE)


class Concurrency(StrEnum):
    """docs/rules.md#lost-writes: whether a conflict's two writes were made one after the
    other (``sequential``: an origin change, nothing lost) or each without having seen the
    other (``concurrent``: the loser's write is lost), as the exports tell."""

    SEQUENTIAL = "sequential"
    CONCURRENT = "concurrent"
    UNKNOWN = "unknown"  # a needed export is absent, lacks the event, or has no apply order
    NA = "n/a"  # no local write: update_missing, delete_missing, column_extra


class Fate(StrEnum):
    """What became of one exported copy of an event (docs/outputs.md: nothing an export
    held is lost; the run report's accounting). An event's copies share its fate, but a
    replica's second copy of one event, and a copy of an event an earlier night resolved,
    are duplicates."""

    APPLIED = "applied"
    DISCARDED = "discarded"
    QUARANTINED = "quarantined"
    DUPLICATE = "duplicate"
    ERRORED = "errored"  # the run stopped on it (docs/rules.md#fine-points)
    NOT_REACHED = "not_reached"  # after the event the run stopped on
    #: a change ``cdr repair`` made (its origin is :data:`REPAIR_ORIGIN`): counted, never
    #: resolved (docs/operations.md#repair)
    REPAIRED = "repaired"
    #: a snapshot's read of a row (docs/adapters.md#snapshot-reads): never a write;
    #: counted (on a table's first night the reads seed its state)
    READ = "read"

    @property
    def final(self) -> bool:
        """Never resolved again: the ledger's fates (a quarantined event is resolved
        again if it comes again)."""
        return self in (Fate.APPLIED, Fate.DISCARDED)


#: the replication origin of the sessions ``cdr repair`` applies its statements in, and the
#: ``origin`` of the changes they made, as an export names it (docs/operations.md#repair);
#: no replica may take the name
REPAIR_ORIGIN = "cdr_repair"


class ChangeKind(StrEnum):
    """What an event did to a row as a reader sees it: the delta row of its CDC log entry
    (docs/cdc.md#entries). ``code`` is Scylla's ``cdc$operation``."""

    UPDATE = "update"
    INSERT = "insert"
    ROW_DELETE = "row_delete"
    PARTITION_DELETE = "partition_delete"

    @property
    def code(self) -> int:
        return _CDC_OPERATION[self]


_CDC_OPERATION = {
    ChangeKind.UPDATE: 1,
    ChangeKind.INSERT: 2,
    ChangeKind.ROW_DELETE: 3,
    ChangeKind.PARTITION_DELETE: 4,
}
CDC_PRE_IMAGE = 0  # Scylla's cdc$operation of the rows around a change
CDC_POST_IMAGE = 9


class QuarantineReason(StrEnum):
    """docs/rules.md#conflict-types guards, in the order they are checked
    (docs/rules.md#fine-points), plus FK quarantine and the fold's delta
    overflow."""

    MALFORMED = "malformed"
    FUTURE_TIMESTAMP = "future_timestamp"
    STALE_BEYOND_GC_GRACE = "stale_beyond_gc_grace"
    DELTA_WITHOUT_OLD_VALUE = "delta_without_old_value"
    FK_VIOLATION = "fk_violation"
    # the fold's: a delta past its column's range (docs/rules.md#delta-columns)
    DELTA_OVERFLOW = "delta_overflow"
    #: the fold's: a custom resolver raised or answered what it may not
    #: (docs/rules.md#custom-resolvers)
    RESOLVER_ERROR = "resolver_error"
    #: docs/operations.md#a-quarantine-that-heals, with a retry configured: an UPDATE
    #: skipped for want of its row
    UPDATE_MISSING = "update_missing"


#: docs/operations.md#a-quarantine-that-heals: the reasons ``retry`` may offer again to the
#: next runs
RETRYABLE = (
    QuarantineReason.FK_VIOLATION,
    QuarantineReason.FUTURE_TIMESTAMP,
    QuarantineReason.UPDATE_MISSING,
)


class Standing(StrEnum):
    """Where the local version L stands against the remote event E: the rows of
    docs/rules.md#policies's delete-wins table. At equal ts the tie-break orders them (the
    canonical order, docs/rules.md#the-canonical-order)."""

    ABSENT = "absent"
    OLDER = "live or tombstone, L.ts < E.ts (or equal ts, E wins the tie-break)"
    NEWER = "live or tombstone, L.ts > E.ts"
    TIE_WON = "equal ts, L wins the tie-break"


class DeleteWinsRuling(StrEnum):
    """What docs/rules.md#policies's delete-wins table does with the remote event: a cell
    of :data:`DELETE_WINS_TABLE` (a resolver's ruling on a conflict is
    ``pipeline.rules.resolution.Ruling``)."""

    APPLY = "apply"
    DISCARD = "discard"
    IF_LIVE = "apply if L is live, discard if L is a tombstone"


_DW = DeleteWinsRuling
#: the columns of :data:`DELETE_WINS_TABLE`: the remote event's operation
DELETE_WINS_OPS = ("INSERT", "UPDATE", "DELETE")
# fmt: off
#: docs/rules.md#policies: Informix Enterprise Replication's delete-wins rule (row scope),
#: against a live row or a tombstone L. So a delete is never undone by an update, and an
#: update never creates a row. (A key change meets the row at its new key as an INSERT.)
DELETE_WINS_TABLE: dict[Standing, tuple[DeleteWinsRuling, DeleteWinsRuling, DeleteWinsRuling]] = {
    #                  E = INSERT    E = UPDATE    E = DELETE
    Standing.ABSENT:  (_DW.APPLY,   _DW.DISCARD, _DW.APPLY),
    Standing.OLDER:   (_DW.APPLY,   _DW.IF_LIVE, _DW.APPLY),
    Standing.NEWER:   (_DW.DISCARD, _DW.DISCARD, _DW.APPLY),
    Standing.TIE_WON: (_DW.DISCARD, _DW.DISCARD, _DW.DISCARD),
}
# fmt: on


def delete_wins(standing: Standing, op: str, live: bool) -> tuple[bool, str]:
    """docs/rules.md#policies's table: whether E applies against L (``live``: L is a live
    row), and why."""
    ruling = DELETE_WINS_TABLE[standing][DELETE_WINS_OPS.index(op)]
    applies = ruling is _DW.APPLY or (ruling is _DW.IF_LIVE and live)
    return applies, reason(Why.DELETE_WINS, standing=standing.value, op=op, ruling=ruling.value)


class Why(StrEnum):
    """Why the fold decided a conflict as it did: the conflict log's ``reason``
    (docs/rules.md#reasons). One member per sentence, rendered by :func:`reason` alone from
    :data:`REASONS`, as PostgreSQL's ``errdetail_apply_conflict`` renders the detail of
    every apply conflict in one function."""

    REMOTE_LATER = "remote_later"
    LOCAL_LATER = "local_later"
    REMOTE_EARLIER = "remote_earlier"
    LOCAL_EARLIER = "local_earlier"
    SAME_ORIGIN = "same_origin"
    REMOTE_RANKS_ABOVE = "remote_ranks_above"
    LOCAL_RANKS_ABOVE = "local_ranks_above"
    APPLY = "apply"
    SKIP = "skip"
    ERROR = "error"
    DELETE_WINS = "delete_wins"
    COMPARED_BY = "compared_by"
    AGAINST_LOCAL = "against_local"
    IN_GROUP = "in_group"
    EXTRA_DROPPED = "extra_dropped"
    EXTRA_REFUSED = "extra_refused"
    REJECTED = "rejected"
    MISSING_REFUSED = "missing_refused"
    MISSING_KEEP_LOCAL = "missing_keep_local"
    MISSING_NOT_NULL = "missing_not_null"
    MISSING_DEFAULTS = "missing_defaults"
    DELETE_BEATS_UPDATE = "delete_beats_update"
    UPDATE_BEATS_DELETE = "update_beats_delete"
    UPDATE_WINS_NO_ROW = "update_wins_no_row"
    NO_FULL_ROW = "no_full_row"
    FULL_ROW = "full_row"
    REFUSED = "refused"
    NO_LIVE_ROW = "no_live_row"
    UNIQUE_COLLISION = "unique_collision"
    MERGED = "merged"
    CUSTOM = "custom"
    ASYMMETRIC = "asymmetric"
    MANUAL = "manual"


#: docs/rules.md#custom-resolvers: how a conflict-log reason says that the custom resolver
#: answers another row with the sides swapped (the run report counts these)
ASYMMETRIC_NOTE = " (asymmetric: with the sides swapped it answers "

#: docs/rules.md#reasons: the sentence of each :class:`Why`, with the facts it names in
#: braces; ``{why}`` is the sentence of the decision it wraps
REASONS: dict[Why, str] = {
    Why.REMOTE_LATER: "remote (ts, tie_rank) is later",
    Why.LOCAL_LATER: "local (ts, tie_rank) is later",
    Why.REMOTE_EARLIER: "remote (ts, tie_rank) is earlier",
    Why.LOCAL_EARLIER: "local (ts, tie_rank) is earlier",
    Why.SAME_ORIGIN: "same origin {origin}: {why}",
    Why.REMOTE_RANKS_ABOVE: "remote origin {remote} ranks above local origin {local} in priority",
    Why.LOCAL_RANKS_ABOVE: "local origin {local} ranks above remote origin {remote} in priority",
    Why.APPLY: "apply: remote always applied",
    Why.SKIP: "skip: local row kept",
    Why.ERROR: "error: the run stops on this conflict",
    Why.DELETE_WINS: "delete_wins: L {standing}, E = {op}: {ruling}",
    Why.COMPARED_BY: "{why} (L and E compared by ({order_by}, ts))",
    Why.AGAINST_LOCAL: "{why}; local origin {origin}, ts {ts}",
    Why.IN_GROUP: "group {group}: {why}",
    Why.EXTRA_DROPPED: "extra columns dropped: {columns}",
    Why.EXTRA_REFUSED: "extra columns: {columns}",
    Why.REJECTED: "transaction rejected",
    Why.MISSING_REFUSED: "missing columns: {columns}",
    Why.MISSING_KEEP_LOCAL: "missing columns keep local values: {columns}",
    Why.MISSING_NOT_NULL: "missing NOT NULL column(s) without default: {columns}",
    Why.MISSING_DEFAULTS: "missing columns take defaults: {columns}",
    Why.DELETE_BEATS_UPDATE: "the delete wins: {why}",
    Why.UPDATE_BEATS_DELETE: "the update wins: {why}",
    Why.UPDATE_WINS_NO_ROW: "the update wins ({why}) but the full row cannot be built",
    Why.NO_FULL_ROW: "the full row cannot be built from the event",
    Why.FULL_ROW: "the event carries the full row",
    Why.REFUSED: "{resolver}",
    Why.NO_LIVE_ROW: "no live row to delete",
    Why.UNIQUE_COLLISION: "collides on a unique constraint with key(s) {keys}",
    Why.MERGED: "{why}; merge took the {side} value of {columns}",
    Why.CUSTOM: "{function} answered {answer}",
    Why.ASYMMETRIC: "{why}" + ASYMMETRIC_NOTE + "{swapped}, another row)",
    Why.MANUAL: "decision {decision} took {take}: {note}",
}


def _named(text: str) -> frozenset[str]:
    return frozenset(f for _, f, _, _ in string.Formatter().parse(text) if f)


_FACTS = {why: _named(text) for why, text in REASONS.items()}


def reason(sentence: Why, /, **facts: object) -> str:
    """The conflict log's ``reason``: the ``sentence`` of :data:`REASONS` with its facts; a list
    of names or keys is joined with commas, a time (``ts``, µs) is the instant with its µs
    beside it (``instants.instant_micros``). A fact the sentence does not name, or one it
    names and is not given, is an error."""
    named = _FACTS[sentence]
    if named != facts.keys():
        raise ValueError(f"reason {sentence}: given {sorted(facts)}, it names {sorted(named)}")
    joined = {k: _fact(k, v) for k, v in facts.items()}
    return REASONS[sentence].format(**joined)


def _fact(name: str, v: object) -> object:
    if isinstance(v, list | tuple):
        return ", ".join(map(str, v))
    if name in _TIMES and isinstance(v, int) and not isinstance(v, bool):
        return instant_micros(v)
    return v


#: the facts of :data:`REASONS` that are times (µs since the epoch)
_TIMES = frozenset({"ts"})


class MergeFn(StrEnum):
    """docs/rules.md#merge-functions: what a ``merge`` column of a row takes when two rows
    meet in a conflict."""

    MAX = "max"
    MIN = "min"


def _rank(v: Any) -> tuple[bool, Any, str]:
    """A value's place for :data:`MERGES`: NaN above every number, as PostgreSQL and
    Spark order it, and equal values (``0.0`` and ``-0.0``, ``1.0`` and ``1.00``) by their
    text, so that the result never depends on which version is which."""
    nan = isinstance(v, float) and math.isnan(v)
    return (nan, 0.0 if nan else v, str(v))


def _larger(a: Any, b: Any) -> Any:
    return a if _rank(a) >= _rank(b) else b


def _smaller(a: Any, b: Any) -> Any:
    return a if _rank(a) <= _rank(b) else b


#: docs/rules.md#merge-functions: each function on two non-null values (a null is never
#: taken while the other version has a value)
MERGES: dict[MergeFn, Callable[[Any, Any], Any]] = {
    MergeFn.MAX: _larger,
    MergeFn.MIN: _smaller,
}


def merged(fn: MergeFn, a: Any, b: Any) -> Any:
    """``a`` and ``b`` merged by ``fn``: the non-null one when the other is null."""
    if a is None:
        return b
    if b is None:
        return a
    return MERGES[fn](a, b)


class Preset(StrEnum):
    POSTGRES = "postgres"
    DELETE_WINS = "delete_wins"
    SCYLLA = "scylla"


class TieBreak(StrEnum):
    HIGHER_SYSTEM_ID = "higher_system_id"  # PostgreSQL
    LOWER_SYSTEM_ID = "lower_system_id"  # Informix cdrserver


class Granularity(StrEnum):
    ROW = "row"
    CELL = "cell"


class Detection(StrEnum):
    ORIGIN = "origin"
    BEFORE_IMAGE = "before_image"


class Scope(StrEnum):
    ROW = "row"
    TRANSACTION = "transaction"


class DivergencePolicy(StrEnum):
    """``on_divergence``: whether a divergent key (the replicas' rows of a key differ after
    the run) fails the validation or only warns."""

    FAIL = "fail"
    WARN = "warn"


class FkPolicy(StrEnum):
    """``on_fk_violation``: what the run does with a row whose foreign key references no
    row (an orphan)."""

    FAIL = "fail"
    WARN = "warn"
    QUARANTINE = "quarantine"


_R = Resolver
_C = ConflictType
#: docs/rules.md#priority: ``priority_wins`` is allowed wherever ``latest_timestamp_wins`` is
_LATEST = frozenset({_R.LATEST_TIMESTAMP_WINS, _R.PRIORITY_WINS})
_TS = _LATEST | {_R.EARLIEST_TIMESTAMP_WINS}
_ANY = frozenset({_R.SKIP, _R.ERROR})
#: where both versions are rows: ``apply``, and a custom resolver (docs/rules.md#custom-resolvers)
_BOTH_ROWS = frozenset({_R.APPLY, _R.PYTHON})

#: docs/rules.md#resolvers (and docs/rules.md#priority): the resolvers a user may configure for each
#: conflict type.
ALLOWED: dict[ConflictType, frozenset[Resolver]] = {
    _C.INSERT_EXISTS: _TS | _ANY | _BOTH_ROWS,
    _C.UPDATE_DIFFER: _TS | _ANY | _BOTH_ROWS,
    _C.UPDATE_MISSING: _ANY | {_R.APPLY_OR_SKIP, _R.APPLY_OR_ERROR},
    _C.UPDATE_DELETED: _ANY | _LATEST | {_R.APPLY_OR_SKIP, _R.APPLY_OR_ERROR},
    _C.DELETE_DIFFER: _TS | _ANY | {_R.APPLY},
    _C.DELETE_MISSING: _ANY,
    _C.PKEY_EXISTS: _TS | _ANY | _BOTH_ROWS,
    _C.MULTIPLE_UNIQUE_CONFLICTS: _ANY | {_R.APPLY},
    _C.SOURCE_COLUMN_EXTRA: _ANY | {_R.IGNORE},
    _C.TARGET_COLUMN_EXTRA: _ANY | {_R.USE_DEFAULT},
}

#: The conflict types the delete-wins rule decides (the rest keep the postgres defaults).
ROW_TYPES: frozenset[ConflictType] = frozenset(
    {
        _C.INSERT_EXISTS,
        _C.UPDATE_DIFFER,
        _C.UPDATE_MISSING,
        _C.UPDATE_DELETED,
        _C.DELETE_DIFFER,
        _C.DELETE_MISSING,
        _C.PKEY_EXISTS,
    }
)


@dataclass(frozen=True)
class PresetRule:
    resolvers: dict[ConflictType, Resolver]
    tie_break: TieBreak
    granularity: Granularity


_POSTGRES_RESOLVERS: dict[ConflictType, Resolver] = {
    _C.INSERT_EXISTS: _R.LATEST_TIMESTAMP_WINS,
    _C.UPDATE_DIFFER: _R.LATEST_TIMESTAMP_WINS,
    _C.DELETE_DIFFER: _R.LATEST_TIMESTAMP_WINS,
    _C.PKEY_EXISTS: _R.LATEST_TIMESTAMP_WINS,
    _C.UPDATE_MISSING: _R.APPLY_OR_SKIP,
    _C.UPDATE_DELETED: _R.SKIP,
    _C.DELETE_MISSING: _R.SKIP,
    _C.MULTIPLE_UNIQUE_CONFLICTS: _R.ERROR,
    _C.SOURCE_COLUMN_EXTRA: _R.ERROR,
    _C.TARGET_COLUMN_EXTRA: _R.USE_DEFAULT,
}

#: docs/rules.md#policies: one rule per preset.
PRESETS: dict[Preset, PresetRule] = {
    Preset.POSTGRES: PresetRule(_POSTGRES_RESOLVERS, TieBreak.HIGHER_SYSTEM_ID, Granularity.ROW),
    Preset.DELETE_WINS: PresetRule(
        {t: (_R.DELETE_WINS if t in ROW_TYPES else r) for t, r in _POSTGRES_RESOLVERS.items()},
        TieBreak.LOWER_SYSTEM_ID,
        Granularity.ROW,
    ),
    Preset.SCYLLA: PresetRule(
        {t: _R.SCYLLA for t in ConflictType}, TieBreak.HIGHER_SYSTEM_ID, Granularity.CELL
    ),
}


def allowed_resolvers(conflict: ConflictType) -> list[str]:
    """The configurable resolvers of a type, sorted, for error messages and docs."""
    return sorted(r.value for r in ALLOWED[conflict])


class Cause(StrEnum):
    """docs/rules.md#divergence-causes: why a replica's row differs from the converged one,
    in the order of precedence (a key's causes are listed in this order; the first is its
    ``cause``)."""

    SCHEMA = "schema"
    MISSING_EVENTS = "missing_events"
    APPLY_ORDER = "apply_order"
    UNIQUE_COLLISION = "unique_collision"
    RESURRECTION = "resurrection"
    POLICY = "policy"
    DECISION = "decision"
    UNDETERMINED = "undetermined"


#: the resolvers no replica database applies by itself (:data:`Cause.POLICY`); the cell
#: rules are Scylla's and Cassandra's own
POLICY_RESOLVERS: frozenset[Resolver] = frozenset(
    {Resolver.DELETE_WINS, Resolver.PRIORITY_WINS, Resolver.PYTHON}
)
