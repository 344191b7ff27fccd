"""How the row fold resolves one conflict against a local version: an operator's decision
first (docs/rules.md#manual-decisions), else the user's function
(docs/rules.md#custom-resolvers) or the type's resolver in the resolver table
(``pipeline.rules.resolvers``).

Pure Python: the fold (``pipeline.rules.rowfold``) asks :meth:`Resolution.decide` and
writes the :class:`Ruling` it answers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pipeline.core.policy import ConflictType, Outcome, Resolver, Why, reason
from pipeline.rules import custom
from pipeline.rules.custom import ResolverError
from pipeline.rules.decisions import Take
from pipeline.rules.events import Event, FoldSpec, Version
from pipeline.rules.resolvers import RULES

_C = ConflictType
_R = Resolver
_O = Outcome
_W = Why


@dataclass(frozen=True, slots=True)
class Ruling:
    """A resolver's decision on a conflict against a local version: the outcome, the
    resolver, the reason, and the row a custom resolver answered (its value columns; None:
    the winner's row as it is)."""

    outcome: Outcome
    resolver: Resolver
    why: str
    row: Mapping[str, Any] | None = None
    #: a custom resolver failed in a perspective: the local row stays as it is (no merge,
    #: no delta: docs/rules.md#custom-resolvers)
    failed: bool = False


class Resolution:
    """The decisions of one fold: the converged fold's (``converged``), which applies the
    operator's decisions and quarantines an event whose custom resolver fails, or a
    replica's perspective's, which does neither."""

    def __init__(self, spec: FoldSpec, converged: bool) -> None:
        self.spec = spec
        self.table = spec.table
        self.converged = converged

    def decide(
        self, t: ConflictType, e: Event, loc: Version, win: Outcome, remote: Mapping[str, Any]
    ) -> Ruling:
        """The type's resolver (:data:`pipeline.rules.resolvers.RULES`, or the user's
        function) on a conflict against a local version; ``win`` is the outcome when the
        remote event wins, ``remote`` the remote version's row. A manual decision of this
        conflict (docs/rules.md#manual-decisions) comes first, in the converged fold only:
        the replicas applied their resolver."""
        if self.converged and self.spec.decisions:
            key = tuple(loc.values[c] for c in self.table.key)
            d = self.spec.decisions.ruling(self.table, key, t, e, loc)
            if d is not None:
                why = reason(_W.MANUAL, decision=d.decision_id, take=d.take.value, note=d.why)
                out = _O.DISCARDED if d.take is Take.LOCAL else win
                return Ruling(out, _R.MANUAL, why, d.row if d.take is Take.ROW else None)
        r = self.table.resolvers[t]
        rule = RULES[r]
        if rule.by_function:
            return self._custom(t, e, loc, win, remote)
        if rule.weigh is None:
            raise AssertionError(f"resolver {r} is not valid for {t}")  # config forbids it
        op = "INSERT" if t is _C.PKEY_EXISTS else e.op  # a key change meets its new key
        out, why = rule.weigh(e, loc, win, op, self.table)
        return Ruling(out, r, why)

    def _custom(
        self, t: ConflictType, e: Event, loc: Version, win: Outcome, remote_row: Mapping[str, Any]
    ) -> Ruling:
        """docs/rules.md#custom-resolvers: the user's function on the two rows. An error
        quarantines the event in the converged fold (:class:`ResolverError` goes up to
        ``RowFold.apply``); a perspective keeps the local version. The converged fold also
        asks with the sides swapped, and says so in the reason when that gives another
        row."""
        path = self.table.custom[t]
        name = f"python:{path}"
        local = custom.version(loc.values, loc.ts, loc.origin, loc.event_id)
        remote = custom.version(remote_row, e.ts, e.origin, e.event_id)
        key = {c: loc.values.get(c) for c in self.table.key}
        context = {"table": self.table.name, "conflict_type": t.value, "key": key}
        try:
            side, row = custom.answer(self.table, path, local, remote, context)
        except ResolverError as err:
            if self.converged:
                raise
            why = reason(_W.CUSTOM, function=name, answer=err)
            return Ruling(_O.DISCARDED, _R.PYTHON, why, failed=True)
        why = reason(_W.CUSTOM, function=name, answer=side)
        if self.converged:
            swapped = self._swapped(
                path, local, remote, context, self._resolved(side, row, local, remote)
            )
            if swapped is not None:
                why = reason(_W.ASYMMETRIC, why=why, swapped=swapped)
        return Ruling(_O.DISCARDED if side == "local" else win, _R.PYTHON, why, row)

    def _resolved(
        self, side: str, row: Mapping[str, Any] | None, local: dict, remote: dict
    ) -> dict[str, Any]:
        """The value columns an answer resolves to, but the delta and merge columns (they
        follow their own rules): the chosen side's row, or the remote row with the answered
        columns written."""
        base = local["row"] if side == "local" else remote["row"]
        values = {**base, **(row or {})}
        own = self.table.delta | self.table.merge.keys() | set(self.table.key)
        return {c: v for c, v in values.items() if c not in own}

    def _swapped(
        self, path: str, local: dict, remote: dict, context: dict, resolved: Mapping[str, Any]
    ) -> str | None:
        """What the function answers with the sides swapped, when that resolves to another
        row than ``resolved`` (None: the same row)."""
        try:
            side, row = custom.answer(self.table, path, remote, local, context)
        except ResolverError:
            return "an error"
        if self._resolved(side, row, remote, local) == resolved:
            return None
        return side

    def given(self, values: dict[str, Any], ruling: Ruling) -> dict[str, Any]:
        """The row a custom resolver answered, over the winner's ``values``: its value
        columns but the delta and merge ones (they follow their own rules)."""
        for c, v in (ruling.row or {}).items():
            if c not in self.table.delta and c not in self.table.merge:
                values[c] = v
        return values
