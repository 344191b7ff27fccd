"""The row fold's values: the events it applies, the versions of its state, and what it
records of each event (its conflicts, its changes to the rows a reader sees).

Pure data, no rule: the fold (``pipeline.rules.rowfold``) decides, the Spark engine
(``pipeline.resolve``) reads and writes these values, and most of their users need
nothing else of the fold."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pipeline.core.config import Table
from pipeline.core.policy import ChangeKind, ConflictType, Outcome, QuarantineReason, Resolver
from pipeline.rules.decisions import Decisions

Key = tuple[Any, ...]

#: the place in its transaction of an event that has none (a canonical record without
#: ``pos``), and of a version read from the state: it comes before every event of its
#: transaction that has one (the state's versions were written by earlier nights)
NO_POS = -1

#: where a version or an event stands in the canonical order
#: (docs/rules.md#the-canonical-order): ``ts``, the origin's tie rank, the place in the
#: origin transaction, the event id
Position = tuple[int, int, int, str]


@dataclass(frozen=True, slots=True)
class Stamp:
    """Who wrote a column group last (docs/rules.md#column-groups), in the canonical order's
    terms."""

    ts: int
    rank: int
    event_id: str | None
    origin: str | None
    pos: int = NO_POS

    def position(self) -> Position:
        return (self.ts, self.rank, self.pos, self.event_id or "")


def read_groups(text: str) -> dict[str, Stamp]:
    """The state's ``_groups`` (``{group: [ts, rank, event_id, origin]}``)."""
    return {g: Stamp(*v) for g, v in json.loads(text).items()}


def write_groups(groups: Mapping[str, Stamp]) -> str:
    return json.dumps({g: [s.ts, s.rank, s.event_id, s.origin] for g, s in groups.items()})


@dataclass(slots=True)
class Version:
    """A key's state: a live row (``values`` holds every column) or a tombstone
    (``deleted``; ``values`` holds the key columns)."""

    values: dict[str, Any]
    ts: int
    origin: str | None
    event_id: str | None
    rank: int
    deleted: bool = False
    deleted_at: int | None = None
    #: docs/rules.md#column-groups: each column group's stamp, where the groups differ (None: every
    #: group is the row's own ``ts, origin, event_id, rank``)
    groups: Mapping[str, Stamp] | None = None
    #: the place in its transaction of the event that wrote it, while the fold that
    #: applied that event runs (the state does not keep it: :data:`NO_POS`)
    pos: int = NO_POS

    def position(self) -> Position:
        return (self.ts, self.rank, self.pos, self.event_id or "")

    def stamp(self) -> Stamp:
        return Stamp(self.ts, self.rank, self.event_id, self.origin, self.pos)

    def group(self, name: str) -> Version:
        """The row as the last writer of column group ``name`` left it: its values, with
        that group's stamp (column groups)."""
        s = (self.groups or {}).get(name)
        if s is None:
            return self
        return Version(self.values, s.ts, s.origin, s.event_id, s.rank, pos=s.pos)


def reader_view(v: Version | None) -> dict[str, Any] | None:
    """What a reader sees of a key (docs/rules.md#convergence): nothing, or the live row's
    values."""
    if v is None or v.deleted:
        return None
    return v.values


@dataclass(frozen=True, slots=True)
class Event:
    """One canonical event, typed. ``after``/``before`` hold only the columns present."""

    event_id: str
    op: str
    key: Key | None
    ts: int
    origin: str
    rank: int
    new_key: Key | None = None
    after: Mapping[str, Any] = field(default_factory=dict)
    before: Mapping[str, Any] = field(default_factory=dict)
    extra_cols: tuple[str, ...] = ()
    txid: str | None = None
    rejected: bool = False  # its transaction was rejected (delete_wins, scope: transaction)
    seqs: Mapping[str, int] = field(default_factory=dict)
    pos: int = NO_POS  # its place in its origin transaction (docs/adapters.md)

    def position(self) -> Position:
        """The canonical order (docs/rules.md#the-canonical-order): ``(ts, tie_rank(origin),
        event_id)``, the changes of one transaction (equal ``ts`` and origin) in the order
        of their places in it."""
        return (self.ts, self.rank, self.pos, self.event_id)


@dataclass(frozen=True, slots=True)
class FoldSpec:
    """Everything the rules need besides the events: the table, the clock, the ranks."""

    table: Table
    now_us: int
    #: docs/rules.md#manual-decisions: the operator's decisions of the run's date, applied
    #: by the converged fold in place of the resolver
    decisions: Decisions = field(default_factory=Decisions)


@dataclass(frozen=True, slots=True)
class Conflict:
    """One conflict-log row (docs/outputs.md)."""

    key: Key
    type: ConflictType
    resolver: Resolver
    outcome: Outcome
    event: Event
    local: tuple[Version, ...]  # the local version(s) in conflict; several for unique conflicts
    reason: str


@dataclass(frozen=True, slots=True)
class Change:
    """What an event did to one key as a reader sees it (docs/cdc.md#entries): ``cols`` are
    the value columns it wrote or cleared, with their new values in ``values``; ``pre``
    and ``post`` the key's live row before and after, if any."""

    key: Key
    kind: ChangeKind
    cols: tuple[str, ...]
    values: Mapping[str, Any]
    pre: Mapping[str, Any] | None
    post: Mapping[str, Any] | None


@dataclass(frozen=True, slots=True)
class Applied:
    """What one event did: whether the remote change took effect, its conflicts, and (when
    the fold traces) its changes to the rows a reader sees."""

    event: Event
    applied: bool
    conflicts: tuple[Conflict, ...]
    errored: bool = False
    changes: tuple[Change, ...] = ()
    quarantined: str | None = None  # why the fold quarantined it (``rows.DeltaOverflow``)
    #: the quarantine reason when ``quarantined``: a delta overflow or a custom resolver's
    #: error (docs/rules.md#custom-resolvers)
    quarantine: QuarantineReason = QuarantineReason.DELTA_OVERFLOW
    #: the columns it took effect on when not all it wrote (an UPDATE that won some
    #: column groups and lost others, column groups); None: every column it wrote
    written: frozenset[str] | None = None


#: one state transition of a key: (key, version before, version after)
Transition = tuple[Key, Version | None, Version | None]
