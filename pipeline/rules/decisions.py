"""Manual decisions (docs/rules.md#manual-decisions): an operator's answer to one conflict,
which every run that resolves the conflict's date applies in place of the resolver.

A conflict is named by its ``conflict_id``: a digest of the date, the table, the key, the
conflict type and the two versions' event ids (the local version's row digest when it has
no event id: a base row), so every rerun that meets the same conflict names it the same.
A decision also keeps the content digests of the two versions as the conflict log showed
them; a run whose conflict has other contents (an export replaced, an earlier event
decided otherwise) does not apply it and reports it ``stale``.

Pure Python: the fold (``pipeline.rules.resolution``) asks :meth:`Decisions.ruling`, the
fold tasks render the conflict log with :func:`local_text` and :func:`remote_text`, and
``cdr decide`` (``pipeline.app.decide``) checks what it records with :func:`take_row`."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date
from enum import StrEnum
from typing import Any, Protocol

from pipeline.core.columns import AFTER, BEFORE, KEY, OP, STATE_DELETED
from pipeline.core.config import Table
from pipeline.core.jsonvalues import dumps
from pipeline.core.policy import ConflictType
from pipeline.rules import custom
from pipeline.rules.readers import read_values


class Version(Protocol):
    """What a decision reads of a local version (``events.Version``)."""

    @property
    def values(self) -> Mapping[str, Any]: ...
    @property
    def deleted(self) -> bool: ...
    @property
    def event_id(self) -> str | None: ...


class Event(Protocol):
    """What a decision reads of the remote event (``events.Event``)."""

    @property
    def event_id(self) -> str: ...
    @property
    def op(self) -> str: ...
    @property
    def key(self) -> tuple[Any, ...] | None: ...
    @property
    def new_key(self) -> tuple[Any, ...] | None: ...
    @property
    def after(self) -> Mapping[str, Any]: ...
    @property
    def before(self) -> Mapping[str, Any]: ...


class Take(StrEnum):
    """What a decision takes at its conflict."""

    LOCAL = "local"  # the local version stays: the remote event is discarded
    REMOTE = "remote"  # the remote event is applied
    ROW = "row"  # the given row is written (key kept, ts the larger, origin the remote's)


#: the conflict types a decision may answer: those whose resolver chooses between a local
#: version and the remote event (``resolution.Resolution.decide``); ``row`` not on a DELETE's
DECIDABLE: Mapping[ConflictType, frozenset[Take]] = {
    ConflictType.INSERT_EXISTS: frozenset(Take),
    ConflictType.UPDATE_DIFFER: frozenset(Take),
    ConflictType.PKEY_EXISTS: frozenset(Take),
    ConflictType.DELETE_DIFFER: frozenset({Take.LOCAL, Take.REMOTE}),
}


class Stale(StrEnum):
    """Why a decision was not applied by a run of its date."""

    GONE = "its conflict did not occur"
    CHANGED = "the versions in conflict changed since it was decided"
    UNFIT = "its row no longer fits the table"


def digest(text: str) -> str:
    """A content digest: 32 hex digits of SHA-256."""
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def local_text(v: Version) -> str:
    """The conflict log's ``local_row`` of one version: its row (a tombstone: its key and
    ``_deleted``), in the order the state keeps its columns."""
    return dumps({**v.values, STATE_DELETED: True} if v.deleted else dict(v.values))


def remote_text(e: Event, key_cols: Sequence[str]) -> str:
    """The conflict log's ``remote_row``: the event's operation, key, new key and images."""
    out: dict[str, Any] = {OP: e.op}
    if e.key is not None:
        out[KEY] = dict(zip(key_cols, e.key, strict=True))
    if e.new_key is not None:
        out["new_key"] = dict(zip(key_cols, e.new_key, strict=True))
    if e.after:
        out[AFTER] = dict(e.after)
    if e.before:
        out[BEFORE] = dict(e.before)
    return dumps(out)


def key_text(key_cols: Sequence[str], key: Sequence[Any]) -> str:
    """The conflict log's ``key``."""
    return dumps(dict(zip(key_cols, key, strict=True)))


def local_ref(local: Sequence[Version]) -> str:
    """The local side of a conflict id: each version's event id, or its row's digest."""
    return ",".join(v.event_id or digest(local_text(v)) for v in local)


def conflict_id(
    dt: date | str, table: str, key: str, conflict_type: str, event_id: str, local: str
) -> str:
    """The conflict's name, the same in every run that meets it (``key``: its
    :func:`key_text`; ``local``: its :func:`local_ref`)."""
    day = dt.isoformat() if isinstance(dt, date) else dt
    return digest("\x1f".join((day, table, key, conflict_type, event_id, local)))


@dataclass(frozen=True, slots=True)
class Decision:
    """One row of ``published/decisions/`` as the fold needs it."""

    decision_id: str
    conflict_id: str
    take: Take
    row: Mapping[str, Any] | None  # Take.ROW: the value columns, typed
    why: str
    local_digest: str
    remote_digest: str


@dataclass(slots=True)
class Decisions:
    """A table's decisions of one date, by conflict id, as one fold task applies them."""

    dt: str = ""
    by_conflict: Mapping[str, Decision] = field(default_factory=dict)
    #: the decisions not applied because their row no longer fits the table (its schema
    #: changed since), by id: what does not fit
    unfit: Mapping[str, str] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.by_conflict)

    def ruling(
        self, table: Table, key: Sequence[Any], t: ConflictType, e: Event, loc: Version
    ) -> Decision | None:
        """The decision of this conflict, when one is recorded and both versions are as it
        saw them (None: the resolver decides)."""
        cid = conflict_id(
            self.dt, table.name, key_text(table.key, key), t.value, e.event_id, local_ref([loc])
        )
        d = self.by_conflict.get(cid)
        if d is None:
            return None
        if d.local_digest != digest(local_text(loc)) or d.remote_digest != digest(
            remote_text(e, table.key)
        ):
            return None
        return d


def typed_row(table: Table, given: Mapping[str, Any]) -> dict[str, Any]:
    """A decision's ``--row`` (JSON values) read as the guards read an export's values,
    then checked as a custom resolver's row (the key columns left out). Raises
    ``custom.RowMisfit`` naming each column that does not fit."""
    out, problems = read_values(table, given)
    if problems:
        raise custom.RowMisfit("; ".join(problems))
    return custom.checked(table, out)


def row_json(row: Mapping[str, Any] | None) -> str | None:
    """A decision's row as the ``decisions`` table keeps it."""
    return None if row is None else dumps(dict(row))
