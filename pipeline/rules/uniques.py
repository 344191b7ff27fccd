"""The row fold's unique indexes: for each ``unique`` constraint of a table, the live rows
that hold each value, to find the rows an event's row collides with
(docs/rules.md#conflict-types multiple_unique_conflicts).

Pure Python: the fold (``pipeline.rules.rowfold``) keeps them in step with its state."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline.core.config import Table
from pipeline.rules.events import Key, Version

#: a row's values of one constraint's columns
Values = tuple[Any, ...]


class UniqueIndex:
    """The live rows of a state by their values of each ``unique`` constraint."""

    def __init__(self, table: Table) -> None:
        self.table = table
        self._indexes: list[dict[Values, set[Key]]] = [{} for _ in table.unique]
        #: every (key, constraint, values) a live row held in this fold, when asked for
        #: (``pipeline.resolve.unique``: the values no export states)
        self.held: set[tuple[Key, int, Values]] | None = None

    def add(self, key: Key, v: Version | None) -> None:
        self._index(key, v, remove=False)

    def remove(self, key: Key, v: Version | None) -> None:
        self._index(key, v, remove=True)

    def _index(self, key: Key, v: Version | None, remove: bool) -> None:
        if v is None or v.deleted:
            return
        for i, cols in enumerate(self.table.unique):
            vals = tuple(v.values.get(c) for c in cols)
            if any(x is None for x in vals):
                continue  # nulls never collide
            bucket = self._indexes[i].setdefault(vals, set())
            if remove:
                bucket.discard(key)
            else:
                bucket.add(key)
                if self.held is not None:
                    self.held.add((key, i, vals))

    def collisions(
        self, values: Mapping[str, Any], target: Key, moved_from: Key | None
    ) -> list[Key]:
        """The keys of the live rows ``values`` collides with on a constraint, but
        ``target`` (the key it is written at) and ``moved_from`` (the key a key change
        leaves)."""
        found: list[Key] = []
        for i, cols in enumerate(self.table.unique):
            vals = tuple(values.get(c) for c in cols)
            if any(x is None for x in vals):
                continue
            for k in sorted(self._indexes[i].get(vals, ()), key=repr):
                if k not in (target, moved_from) and k not in found:
                    found.append(k)
        return found
