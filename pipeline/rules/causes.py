"""docs/rules.md#divergence-causes: why a replica's row differs from the converged row,
decided from what the run already knows (each replica's order and events, the tombstones,
the conflict log, the columns a replica's snapshot holds) and never guessed: when the data
supports no cause, the cause is ``undetermined`` and the evidence says what was checked.

A key's findings are listed in the order of :class:`pipeline.core.policy.Cause`; the
divergence row's ``cause`` is the first, its ``evidence`` (JSON) holds ``causes`` (all of
them) and each cause's own evidence.

Two sources (docs/rules.md#convergence): a *perspective* is the state a replica reaches by
applying the night's events in its own order with the project's rules, so its causes are
the order and the events (:func:`perspective_findings`); a replica's *snapshot* is what it
holds, so schema and policy can be causes too, and it takes the perspective's causes of the
same key (:func:`snapshot_findings`, :func:`run_findings`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.core.config import Table
from pipeline.core.jsonvalues import dumps
from pipeline.core.policy import POLICY_RESOLVERS, Cause, ConflictType, Resolver
from pipeline.rules.decisions import key_text
from pipeline.rules.events import Event, FoldSpec, Key, Version, reader_view
from pipeline.rules.perspectives import divergent_keys, fold_perspective, replica_order
from pipeline.rules.rowfold import canonical

#: the event ids an order's evidence shows (its length is given whole)
SHOWN = 20
#: the missing events' ids a row lists: a later night that delivers them counts them
#: ``arrived_late`` (``pipeline.resolve.late``); the count is given whole
LISTED = 1000
#: the conflict types that say the replicas' tables have other columns
SCHEMA_TYPES = frozenset({ConflictType.SOURCE_COLUMN_EXTRA, ConflictType.TARGET_COLUMN_EXTRA})
_ORDER = {c: i for i, c in enumerate(Cause)}


@dataclass(frozen=True, slots=True)
class Finding:
    cause: Cause
    evidence: Mapping[str, Any]


def verdict(
    findings: Iterable[Finding],
    checked: Mapping[str, Any],
    context: Mapping[str, Any] | None = None,
) -> tuple[str, str]:
    """The row's ``cause`` and ``evidence``: the findings in precedence order (one per
    cause, the first found kept), or ``undetermined`` with what was ``checked``; and
    ``context``, what the evidence says whatever the causes (a snapshot's columns its
    replica lacks: :data:`REPLICA_LACKS`)."""
    by_cause: dict[Cause, Finding] = {}
    for f in findings:
        by_cause.setdefault(f.cause, f)
    found = sorted(by_cause.values(), key=lambda f: _ORDER[f.cause])
    if not found:
        found = [Finding(Cause.UNDETERMINED, {"checked": dict(checked)})]
    evidence: dict[str, Any] = {"causes": [f.cause.value for f in found]}
    for f in found:
        evidence.update(f.evidence)
    return found[0].cause.value, dumps({**evidence, **(context or {})})


#: the evidence key of the table's columns a replica's snapshot does not hold (every row of
#: that comparison gives it; ``cdr repair`` writes none of them)
REPLICA_LACKS = "replica_lacks"


def missing_ids(evidence: str | None) -> list[str]:
    """The ids of the events a divergence row's ``evidence`` says the replica lacked."""
    if not evidence:
        return []
    seen = json.loads(evidence)
    if Cause.MISSING_EVENTS.value not in seen.get("causes", ()):
        return []
    return list(seen.get("missing_events", {}).get("ids", ()))


def _listed(ids: Sequence[str]) -> dict[str, Any]:
    return {"count": len(ids), "ids": list(ids[:LISTED])}


# ---------------------------------------------------------------------- perspectives


def divergent_perspectives(
    spec: FoldSpec,
    replicas: Sequence[str],
    state: Mapping[Key, Version],
    events: Sequence[Event],
    converged: Mapping[Key, Version],
    decided: set[Key],
) -> Iterator[tuple[str, Key, Mapping[Key, Version], str, str]]:
    """docs/rules.md#convergence: each replica's perspective of one group (``events``
    folded from ``state`` in its order; each distinct order once) against the converged
    state; per key that differs, ``(replica, key, perspective, cause, evidence)``. A
    replica applies the resolvers, never an operator's decision (``decided``: the keys one
    resolved), so with one the canonical order's perspective is not the converged state,
    and even a single event may diverge."""
    if len(events) < 2 and not decided:  # one event has one order
        return
    in_order = canonical(events)
    undecided = fold_perspective(spec, state, in_order, "", ordered=True) if decided else {}
    seen = {tuple(e.event_id for e in in_order): undecided if decided else dict(converged)}
    for rep in replicas:
        order = replica_order(events, rep)
        ids = tuple(e.event_id for e in order)
        if ids not in seen:
            seen[ids] = fold_perspective(spec, state, order, rep, ordered=True)
        mine = seen[ids]
        for k in divergent_keys(converged, mine):
            found = perspective_findings(
                spec.table, rep, k, events, mine, converged, undecided if k in decided else None
            )
            yield (rep, k, mine, *verdict(found, perspective_checked(rep, events)))


def perspective_findings(
    table: Table,
    replica: str,
    k: Key,
    events: Sequence[Event],
    mine: Mapping[Key, Version],
    converged: Mapping[Key, Version],
    undecided: Mapping[Key, Version] | None = None,
) -> list[Finding]:
    """The causes of a perspective's divergent key ``k``: ``events`` are its group's (those
    the folds applied), ``mine`` the replica's perspective. A perspective applies the
    events the replica's export holds in its order, then those it lacks in canonical
    order: it differs from the canonical fold only when one it lacks comes before one it
    holds (``missing_events``) or when it holds them in another order (``apply_order``).
    It has the table's schema and rules, so neither is one of its causes. ``undecided``:
    when an operator's decision resolved a conflict of the group, the canonical order's
    fold by the resolvers (as the replicas apply them); where the perspective equals it,
    the order made no difference and the decision is the only cause."""
    out: list[Finding] = []
    if undecided is not None:
        out.append(Finding(Cause.DECISION, {}))
        if reader_view(mine.get(k)) == reader_view(undecided.get(k)):
            return out
    held = [e for e in events if replica in e.seqs]
    lacking = canonical(e for e in events if replica not in e.seqs)
    if held and lacking:
        last_held = max(e.position() for e in held)
        if lacking[0].position() < last_held:
            ids = [e.event_id for e in lacking]
            out.append(Finding(Cause.MISSING_EVENTS, {"missing_events": _listed(ids)}))
    theirs = [e.event_id for e in sorted(held, key=lambda e: (e.seqs[replica], e.position()))]
    ordered = [e.event_id for e in canonical(held)]
    if theirs != ordered:
        order = {"replica_order": theirs[:SHOWN], "canonical_order": ordered[:SHOWN]}
        out.append(Finding(Cause.APPLY_ORDER, order))
    collision = unique_collision(table, k, mine, converged)
    if collision is not None:
        out.append(Finding(Cause.UNIQUE_COLLISION, collision))
    tomb = converged.get(k)
    if reader_view(mine.get(k)) is not None and tomb is not None and tomb.deleted:
        out.append(Finding(Cause.RESURRECTION, {"tombstone_ts": tomb.ts}))
    return out


def perspective_checked(replica: str, events: Sequence[Event]) -> dict[str, Any]:
    """What an undetermined perspective row's evidence says was checked."""
    return {"events": len(events), "replica_events": sum(replica in e.seqs for e in events)}


def unique_collision(
    table: Table, k: Key, mine: Mapping[Key, Version], converged: Mapping[Key, Version]
) -> dict[str, Any] | None:
    """A unique constraint's value that one side's row of ``k`` holds and the other side
    gives to another key: the constraint and that key (None: no such value)."""
    for cols in table.unique:
        for here, there in ((mine, converged), (converged, mine)):
            row = reader_view(here.get(k))
            if row is None or any(row.get(c) is None for c in cols):
                continue
            value = tuple(row.get(c) for c in cols)
            for other, v in there.items():
                seen = reader_view(v)
                if other != k and seen is not None and tuple(seen.get(c) for c in cols) == value:
                    return {"unique": list(cols), "other_key": key_text(table.key, other)}
    return None


# ------------------------------------------------------------------------- snapshots


def snapshot_findings(
    mine: Mapping[str, Any] | None,
    conv: Mapping[str, Any] | None,
    missing_columns: Sequence[str],
    missing_events: Sequence[str],
    tombstone_ts: int | None,
    orphan: bool = False,
) -> list[Finding]:
    """The causes a replica snapshot's divergent row shows by itself: the table's columns
    its snapshot lacks where the rows differ, the night's events of the key its export
    lacks, a live row over a converged tombstone, a row the project's foreign-key rule
    took out of the converged state (``orphan``: ``on_fk_violation: quarantine``)."""
    out: list[Finding] = []
    if mine is not None and conv is not None:
        differ = [c for c in missing_columns if mine.get(c) != conv.get(c)]
        if differ:
            out.append(Finding(Cause.SCHEMA, {"missing_columns": differ}))
    if missing_events:
        ids = sorted(missing_events)
        out.append(Finding(Cause.MISSING_EVENTS, {"missing_events": _listed(ids)}))
    if mine is not None and conv is None and tombstone_ts is not None:
        out.append(Finding(Cause.RESURRECTION, {"tombstone_ts": tombstone_ts}))
    if mine is not None and conv is None and orphan:
        out.append(Finding(Cause.POLICY, {"rules": ["on_fk_violation:quarantine"]}))
    return out


#: the causes a snapshot row takes from the perspective of the same replica and key, with
#: the evidence keys each wrote
FROM_PERSPECTIVE: Mapping[Cause, tuple[str, ...]] = {
    Cause.MISSING_EVENTS: ("missing_events",),
    Cause.APPLY_ORDER: ("replica_order", "canonical_order"),
    Cause.UNIQUE_COLLISION: ("unique", "other_key"),
}


def run_findings(
    table: Table, perspective: str | None, resolvers: Iterable[str], types: Iterable[str]
) -> list[Finding]:
    """The causes a snapshot's divergent row takes from the rest of the run: the
    perspective's of the same replica and key (``perspective``: its evidence JSON), and
    the key's conflicts (their ``resolvers`` and conflict ``types``): other columns on
    another replica (``schema``), the project's own rules (``policy``), an operator's
    decision."""
    out: list[Finding] = []
    if perspective is not None:
        seen = json.loads(perspective)
        for c in seen.get("causes", ()):
            keys = FROM_PERSPECTIVE.get(Cause(c))
            if keys is not None:
                out.append(Finding(Cause(c), {k: seen[k] for k in keys if k in seen}))
    used, met = set(resolvers), set(types)
    columns = sorted(t for t in met if ConflictType(t) in SCHEMA_TYPES)
    if columns:
        out.append(Finding(Cause.SCHEMA, {"conflict_types": columns}))
    rules = policy_rules(table, used)
    if rules:
        out.append(Finding(Cause.POLICY, {"rules": rules}))
    if Resolver.MANUAL.value in used:
        out.append(Finding(Cause.DECISION, {}))
    return out


def policy_rules(table: Table, resolvers: set[str]) -> list[str]:
    """The project's own rules that decided a key's conflicts (``resolvers``: theirs; none:
    the key met no conflict), as no replica database applies them by itself: delete-wins,
    priority, a custom resolver, and the table's merge, delta, order-by and column-group
    rules. A conflict an operator's decision answered is the decision's, not a rule's."""
    resolvers = resolvers - {Resolver.MANUAL.value}
    if not resolvers:
        return []
    own = sorted(r for r in resolvers if r.split(":", 1)[0] in {p.value for p in POLICY_RESOLVERS})
    own += [f"merge:{c}" for c in sorted(table.merge)]
    own += [f"delta:{c}" for c in sorted(table.delta)]
    own += [f"order_by:{table.order_by}"] if table.order_by else []
    own += ["column_groups"] if table.column_groups else []
    return own
