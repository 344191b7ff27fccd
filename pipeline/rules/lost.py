"""Conflicts that lost a write (docs/rules.md#lost-writes): whether the two writes of a
conflict were made one after the other, or each without having seen the other.

PostgreSQL's origin rule logs every write over a row another origin wrote last, hours
later included; what an operator asks first is which writes were *lost*. The exports tell:
a replica's export lists the events in the order it applied them (its ``seq``), so the
writer of the remote event had seen the local write when that write comes before the
remote event in its export. Judged from the exports' positions alone, never from a
perspective's order (which appends the events an export lacks).

Pure Python: the fold (``pipeline.resolve.group_fold``) labels each conflict-log row."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pipeline.core.policy import Concurrency, ConflictType, Outcome
from pipeline.rules.events import Conflict, Version

#: the conflict types with no local write: nothing to have seen, nothing lost
NO_LOCAL_WRITE = frozenset(
    {
        ConflictType.UPDATE_MISSING,
        ConflictType.DELETE_MISSING,
        ConflictType.SOURCE_COLUMN_EXTRA,
        ConflictType.TARGET_COLUMN_EXTRA,
    }
)

#: where an event stands in each replica's export tonight: replica -> seq
Positions = Mapping[str, int]


@dataclass(frozen=True)
class Witness:
    """What a night's exports say of who saw what: the replicas that exported the table
    tonight; those whose ``seq`` is no apply order, and why (``sources.seq_order``); and
    the events the ledger's window records missing from a replica's export (event id ->
    replicas, ``pipeline.ingest.missing_events``)."""

    exported: frozenset[str] = frozenset()
    unordered: Mapping[str, str] = field(default_factory=dict)
    lacked: Mapping[str, frozenset[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Label:
    """A conflict's label, why it is ``unknown``, and the event whose write it lost (when
    ``concurrent``: the loser's)."""

    concurrency: Concurrency
    why: str | None = None
    lost: str | None = None


_NA = Label(Concurrency.NA)
_SEQUENTIAL = Label(Concurrency.SEQUENTIAL)


def judge_pair(
    local: Version,
    remote_id: str,
    remote_origin: str,
    positions: Mapping[str, Positions],
    tonight: frozenset[str],
    witness: Witness,
) -> Label:
    """One local version (written by ``local.event_id`` of ``local.origin``: a) against the
    remote event (``remote_id`` of ``remote_origin``: b). ``positions``: every copy's place
    in tonight's exports, by event id (duplicates of earlier nights' events included);
    ``tonight``: the ids of tonight's events (a version written by no event of tonight
    was written by an earlier night, or is a base-snapshot row: ``event_id`` None)."""
    a, b, eid = local.origin, remote_origin, local.event_id
    if eid is None or a is None or a == b:  # a base-snapshot row is seen by all
        return _SEQUENTIAL
    for r in (a, b):
        if r not in witness.exported and (r == b or eid in tonight):
            return Label(Concurrency.UNKNOWN, f"no export of {r} tonight")
        if r in witness.unordered:
            return Label(Concurrency.UNKNOWN, witness.unordered[r])
    at_r, at_l = positions.get(remote_id, {}), positions.get(eid, {})
    if b not in at_r:
        return Label(Concurrency.UNKNOWN, f"{b}'s export lacks its own event {remote_id}")
    if eid in tonight and a not in at_l:
        return Label(Concurrency.UNKNOWN, f"{a}'s export lacks its own event {eid}")
    if b in at_l:  # b applied the local write tonight: before its own?
        b_saw = at_l[b] < at_r[b]
    else:  # an earlier night's write is seen, unless the ledger's window says b lacked it
        b_saw = eid not in tonight and b not in witness.lacked.get(eid, frozenset())
    a_saw = a in at_r and a in at_l and at_r[a] < at_l[a]
    if a_saw and b_saw:
        return Label(Concurrency.UNKNOWN, f"each of {a} and {b} applied the other's write first")
    if a_saw or b_saw:
        return _SEQUENTIAL
    return Label(Concurrency.CONCURRENT)


def judge(
    c: Conflict, positions: Mapping[str, Positions], tonight: frozenset[str], witness: Witness
) -> Label:
    """A conflict-log row's label: ``n/a`` without a local write; a unique collision's
    local versions judged pair by pair (concurrent if one pair is, else unknown if one
    is, else sequential). The write a concurrent conflict lost: the remote event's when it
    did not take effect, else the local version's writer's."""
    if c.type in NO_LOCAL_WRITE or not c.local:
        return _NA
    e = c.event
    labels = [judge_pair(v, e.event_id, e.origin, positions, tonight, witness) for v in c.local]
    order = (Concurrency.CONCURRENT, Concurrency.UNKNOWN, Concurrency.SEQUENTIAL)
    worst = min(labels, key=lambda x: order.index(x.concurrency))
    if worst.concurrency is not Concurrency.CONCURRENT or c.outcome is Outcome.ERRORED:
        return worst
    if not c.outcome.remote_applied:
        return Label(Concurrency.CONCURRENT, lost=e.event_id)
    loser = next(v for v, x in zip(c.local, labels, strict=True) if x is worst)
    return Label(Concurrency.CONCURRENT, lost=loser.event_id)


def copy_positions(copies: Sequence[tuple[str, str, int | None]]) -> dict[str, dict[str, int]]:
    """Each event's place in each replica's export (event id, replica, seq), the first copy
    of a replica's where it exported an event twice."""
    out: dict[str, dict[str, int]] = {}
    for eid, replica, seq in copies:
        if seq is not None:
            out.setdefault(eid, {}).setdefault(replica, seq)
    return out
