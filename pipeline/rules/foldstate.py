"""The row fold's state as events change it: each key's version, the unique indexes over
the live rows kept in step with it, the trace of its transitions (for the CDC log,
docs/cdc.md#entries), and the journal that takes back an event that is quarantined.

Pure Python: the fold (``pipeline.rules.rowfold``) decides what each key becomes and
writes it here."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from pipeline.rules.events import Event, Key, Transition, Version
from pipeline.rules.rows import Rows
from pipeline.rules.uniques import UniqueIndex


class FoldState:
    """``state`` (``key -> Version``, changed in place) with its unique indexes; with
    ``trace``, every transition since :attr:`trace` was last emptied; with ``held``, every
    unique value a live row held since it started (:attr:`UniqueIndex.held`)."""

    def __init__(self, state: dict[Key, Version], rows: Rows, *, trace: bool, held: bool) -> None:
        self.state = state
        self.rows = rows
        self.table = rows.table
        self.trace: list[Transition] | None = [] if trace else None
        self.uniques = UniqueIndex(self.table)
        for k, v in state.items():
            self.uniques.add(k, v)
        if held:
            self.uniques.held = set()
        #: the versions the event being applied replaced, to undo it when it is quarantined
        self._journal: list[tuple[Key, Version | None]] = []
        self._traced = 0

    def set(self, key: Key, v: Version | None) -> None:
        """Write ``key``'s version (None: the key is absent)."""
        self._journal.append((key, self.state.get(key)))
        if self.trace is not None:
            self.trace.append((key, self.state.get(key), v))
        self._put(key, v)

    def _put(self, key: Key, v: Version | None) -> None:
        """The key's version, and the unique indexes with it."""
        self.uniques.remove(key, self.state.get(key))
        if v is None:
            self.state.pop(key, None)
        else:
            self.state[key] = v
            self.uniques.add(key, v)

    def begin(self) -> None:
        """An event starts: what it changes from now on :meth:`undo` takes back."""
        self._journal.clear()
        self._traced = len(self.trace) if self.trace is not None else 0

    def undo(self) -> None:
        """Take back what the event being applied changed (a merge column it raised before
        its delta overflowed): a quarantined event changes nothing."""
        for key, old in reversed(self._journal):
            self._put(key, old)
        self._journal.clear()
        if self.trace is not None:
            del self.trace[self._traced :]

    def tombstone(self, key: Key, e: Event) -> None:
        """``key`` becomes a tombstone made by ``e``."""
        self.set(key, self.rows.tombstone(key, e, self.state.get(key)))

    def add_delta(self, key: Key, e: Event) -> None:
        """docs/rules.md#delta-columns: an UPDATE whose row lost (discarded or skipped)
        still adds its delta to the live local row."""
        if e.op != "UPDATE":
            return
        changed = [c for c in e.after if c in self.table.delta]
        loc = self.state.get(key)
        if not changed or loc is None or loc.deleted:
            return
        values = dict(loc.values)
        for c in changed:
            values[c] = self.rows.plus_delta(values.get(c), e, c)
        self.set(key, replace(loc, values=values))  # its stamps (and groups) stay

    def merge_lost(
        self, key: Key, remote: Mapping[str, Any], cols: Iterable[str] | None = None
    ) -> list[str]:
        """docs/rules.md#merge-functions: the live local row kept against a remote version
        that lost (the columns an INSERT or UPDATE wrote, or the row a key change moved)
        takes the merge of each ``merge`` column (of ``cols``, when given); its stamps
        stay, as a lost UPDATE's delta leaves them."""
        loc = self.state.get(key)
        if not self.table.merge or loc is None or loc.deleted:
            return []
        values = dict(loc.values)
        took = self.rows.merge_won(values, remote, cols)
        if took:
            self.set(key, replace(loc, values=values))
        return took
