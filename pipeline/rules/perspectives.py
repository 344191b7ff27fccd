"""A replica's perspective (docs/rules.md#convergence): the state a replica reaches applying
the events in its own order, and the keys on which it differs from the converged state.

Pure Python: a perspective is a :class:`pipeline.rules.rowfold.RowFold` that logs nothing
and does not apply an event that would error; the divergence causes
(``pipeline.rules.causes``) compare it with the converged fold."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pipeline.rules.events import Event, FoldSpec, Key, Version, reader_view
from pipeline.rules.rowfold import RowFold, canonical


def replica_order(events: Sequence[Event], replica: str) -> list[Event]:
    """docs/rules.md#convergence: the replica's export order (``seq``), then the events
    missing from its export in canonical order."""
    mine = sorted(
        (e for e in events if replica in e.seqs), key=lambda e: (e.seqs[replica], e.position())
    )
    rest = canonical(e for e in events if replica not in e.seqs)
    return mine + rest


def fold_perspective(
    spec: FoldSpec,
    state: Mapping[Key, Version],
    events: Sequence[Event],
    replica: str,
    ordered: bool = False,
) -> dict[Key, Version]:
    """docs/rules.md#convergence: the state the replica reaches applying the events in its own order
    (``ordered``: the events are already in that order)."""
    f = RowFold(spec, dict(state), converged=False)
    for e in events if ordered else replica_order(events, replica):
        f.apply(e)
    return f.state


def divergent_keys(converged: Mapping[Key, Version], other: Mapping[Key, Version]) -> list[Key]:
    keys = set(converged) | set(other)
    return sorted(
        (k for k in keys if reader_view(converged.get(k)) != reader_view(other.get(k))),
        key=repr,
    )
