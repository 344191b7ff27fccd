"""The resolver table: one row per resolver, saying how it decides in each step of the row
fold that can meet it (docs/rules.md#resolvers, docs/rules.md#priority,
docs/rules.md#policies).

A conflict against a local version is weighed (:attr:`Rule.weigh`) or handed to the user's
function (:attr:`Rule.by_function`, docs/rules.md#custom-resolvers); a step with no local
version to weigh (an extra or missing column, a unique collision) takes the event under
one resolver (:attr:`Rule.takes`) and any other refuses it (:attr:`Rule.refused`); an
UPDATE or a DELETE that finds no live row follows :attr:`Rule.absent`. The delete-wins
rule's rulings are the rows of ``pipeline.core.policy.DELETE_WINS_TABLE``; how a
resolver meets a tombstone is in the table too. ``tests/unit/test_policy.py`` fails for
a resolver allowed for a type and decided by no row here.

Pure Python: the fold (``pipeline.rules.rowfold``) looks its resolvers up here and
nowhere else."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from pipeline.core.config import Table
from pipeline.core.policy import (
    ConflictType,
    Outcome,
    Resolver,
    Standing,
    Why,
    delete_wins,
    reason,
)
from pipeline.rules.detection import when
from pipeline.rules.events import Event, Version

_C = ConflictType
_R = Resolver
_O = Outcome
_W = Why

#: what a resolver weighs a conflict to: the outcome and the reason the conflict log shows
Weighed = tuple[Outcome, str]
#: how a resolver weighs the event against the local version, given the outcome the event
#: has when it wins, its operation as the local key meets it, and the table
Weigh = Callable[[Event, Version, Outcome, str, Table], Weighed]


def wins_latest(e: Event, loc: Version, table: Table) -> bool:
    return (when(e, table), e.position()[1:]) > (when(loc, table), loc.position()[1:])


def _wins_earliest(e: Event, loc: Version, table: Table) -> bool:
    # docs/rules.md#resolvers: earlier ts wins; on equal ts the tie-break winner (higher
    # rank) still wins.
    we, wl = when(e, table), when(loc, table)
    if we != wl:
        return we < wl
    return e.position()[1:] > loc.position()[1:]


def _latest(e: Event, loc: Version, win: Outcome, op: str, table: Table) -> Weighed:
    if wins_latest(e, loc, table):
        return win, reason(_W.REMOTE_LATER)
    return _O.DISCARDED, reason(_W.LOCAL_LATER)


def _earliest(e: Event, loc: Version, win: Outcome, op: str, table: Table) -> Weighed:
    if _wins_earliest(e, loc, table):
        return win, reason(_W.REMOTE_EARLIER)
    return _O.DISCARDED, reason(_W.LOCAL_EARLIER)


def _origin_rank(table: Table, origin: str | None) -> int:
    """docs/rules.md#priority: the higher, the more trusted; a base row (no origin) ranks below
    every replica, as it does in the tie-break (docs/rules.md#the-canonical-order)."""
    order = table.priority
    return len(order) - order.index(origin) if origin in order else 0


def _priority(e: Event, loc: Version, win: Outcome, op: str, table: Table) -> Weighed:
    """docs/rules.md#priority: the version whose origin comes first in ``priority`` wins; the
    same origin on both sides falls back to ``latest_timestamp_wins``."""
    if e.origin == loc.origin:
        out, why = _latest(e, loc, win, op, table)
        return out, reason(_W.SAME_ORIGIN, origin=e.origin, why=why)
    local = loc.origin or "(base row)"
    if _origin_rank(table, e.origin) > _origin_rank(table, loc.origin):
        return win, reason(_W.REMOTE_RANKS_ABOVE, remote=e.origin, local=local)
    return _O.DISCARDED, reason(_W.LOCAL_RANKS_ABOVE, remote=e.origin, local=local)


def _apply(e: Event, loc: Version, win: Outcome, op: str, table: Table) -> Weighed:
    return win, reason(_W.APPLY)


def _skip(e: Event, loc: Version, win: Outcome, op: str, table: Table) -> Weighed:
    return _O.SKIPPED, reason(_W.SKIP)


def _error(e: Event, loc: Version, win: Outcome, op: str, table: Table) -> Weighed:
    return _O.ERRORED, reason(_W.ERROR)


def standing(e: Event, loc: Version | None, table: Table) -> Standing:
    """Where the local version stands against the event: a row of docs/rules.md#policies's
    delete-wins table (with ``order_by``, "newer" compares the order value first)."""
    if loc is None:
        return Standing.ABSENT
    we, wl = when(e, table), when(loc, table)
    if we == wl:
        return Standing.OLDER if e.position() > loc.position() else Standing.TIE_WON
    return Standing.OLDER if we > wl else Standing.NEWER


def delete_wins_ruling(
    e: Event, loc: Version | None, op: str, table: Table, live: bool
) -> tuple[bool, str]:
    """docs/rules.md#policies's table for ``e`` against ``loc``: whether it applies, and why
    (naming the ``order_by`` column when "newer" compared it first, order_by)."""
    applies, why = delete_wins(standing(e, loc, table), op, live)
    if table.order_by is not None and loc is not None:
        why = reason(_W.COMPARED_BY, why=why, order_by=table.order_by)
    return applies, why


def _delete_wins(e: Event, loc: Version, win: Outcome, op: str, table: Table) -> Weighed:
    """docs/rules.md#policies's table (:data:`pipeline.core.policy.DELETE_WINS_TABLE`)
    against a live row or a tombstone."""
    applies, why = delete_wins_ruling(e, loc, op, table, live=not loc.deleted)
    return (win if applies else _O.DISCARDED), why


class Absent(StrEnum):
    """How a resolver decides an UPDATE or a DELETE that finds no live row
    (update_missing, update_deleted, delete_missing)."""

    #: the event is refused: :attr:`Rule.refused`
    REFUSE = "refuse"
    #: an UPDATE that carries the full row is converted to an INSERT, else refused
    FULL_ROW = "full_row"
    #: an UPDATE is weighed against the tombstone (update_deleted); if it wins, it is
    #: converted to an INSERT when it carries the full row
    WEIGH = "weigh"
    #: the delete-wins table decides (an update never creates a row)
    DELETE_WINS = "delete_wins"


@dataclass(frozen=True, slots=True)
class Rule:
    """How one resolver decides, in each step of the row fold that can meet it."""

    #: a conflict against a local version (insert_exists, update_differ, delete_differ,
    #: pkey_exists, and update_deleted's weighing resolvers): the decision
    weigh: Weigh | None = None
    #: the user's function decides a conflict against a local version
    #: (docs/rules.md#custom-resolvers; ``pipeline.rules.resolution``)
    by_function: bool = False
    #: the steps with no local version to weigh whose event it takes: the extra columns
    #: dropped, the missing ones filled from ``defaults``, the rows it collides with on a
    #: ``unique`` deleted
    takes: frozenset[ConflictType] = frozenset()
    #: what it makes of the remote event when it refuses it, in the steps with no local
    #: version to weigh (an extra or missing column, a missing row, a unique collision,
    #: an ``apply_or_*`` without the full row); None: it never refuses
    refused: Outcome | None = None
    #: an UPDATE or a DELETE that finds no live row
    absent: Absent = Absent.REFUSE
    #: a tombstone is a row it weighs: an INSERT (or a key change) that meets one is in
    #: conflict; under the other resolvers it is none (docs/rules.md#fine-points)
    tombstone_is_row: bool = False
    #: a DELETE that wins against a newer live row keeps the row's ts (and order value) in
    #: its tombstone: a delete is never undone, and what the row had beaten still loses
    keeps_newer_tombstone: bool = False


#: docs/rules.md#resolvers, docs/rules.md#priority and docs/rules.md#policies: the one table
#: of how each resolver decides (``scylla``'s cells are decided by ``pipeline.rules.cellfold``,
#: and a manual decision comes before the table: neither meets a step of the row fold)
RULES: dict[Resolver, Rule] = {
    _R.LATEST_TIMESTAMP_WINS: Rule(weigh=_latest, absent=Absent.WEIGH),
    _R.EARLIEST_TIMESTAMP_WINS: Rule(weigh=_earliest),
    _R.APPLY: Rule(weigh=_apply, takes=frozenset({_C.MULTIPLE_UNIQUE_CONFLICTS})),
    _R.APPLY_OR_SKIP: Rule(refused=_O.SKIPPED, absent=Absent.FULL_ROW),
    _R.APPLY_OR_ERROR: Rule(refused=_O.ERRORED, absent=Absent.FULL_ROW),
    _R.SKIP: Rule(weigh=_skip, refused=_O.SKIPPED),
    _R.ERROR: Rule(weigh=_error, refused=_O.ERRORED),
    _R.IGNORE: Rule(takes=frozenset({_C.SOURCE_COLUMN_EXTRA})),
    _R.USE_DEFAULT: Rule(takes=frozenset({_C.TARGET_COLUMN_EXTRA})),
    _R.PRIORITY_WINS: Rule(weigh=_priority, absent=Absent.WEIGH),
    _R.DELETE_WINS: Rule(
        weigh=_delete_wins,
        absent=Absent.DELETE_WINS,
        tombstone_is_row=True,
        keeps_newer_tombstone=True,
    ),
    _R.SCYLLA: Rule(),
    _R.PYTHON: Rule(by_function=True),
    _R.MANUAL: Rule(),
}


def refusal(r: Resolver) -> Outcome:
    """What resolver ``r`` makes of an event it refuses (:attr:`Rule.refused`)."""
    out = RULES[r].refused
    if out is None:
        raise AssertionError(f"resolver {r} never refuses an event")  # config forbids it
    return out
