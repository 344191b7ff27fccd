"""Detection in the row fold: what "later" compares (docs/rules.md#the-canonical-order,
docs/rules.md#order-by-a-column) and whether an event meets a conflict with the local
version (docs/rules.md#conflict-types).

Pure Python: the fold (``pipeline.rules.rowfold``) asks it, and the resolver table
(``pipeline.rules.resolvers``) weighs with the same order."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pipeline.core.config import Table
from pipeline.core.policy import ConflictType, Detection
from pipeline.rules.events import Event, Version

_C = ConflictType


def order_value(x: Event | Version, column: str) -> Any:
    """docs/rules.md#order-by-a-column: the ``order_by`` value of an event (its ``after``; a
    DELETE's ``before``) or of a version (its row's; a tombstone keeps its DELETE's)."""
    if isinstance(x, Event):
        return (x.before if x.op == "DELETE" else x.after).get(column)
    return x.values.get(column)


def when(x: Event | Version, table: Table) -> tuple[Any, ...]:
    """What "later" compares before the tie-break (docs/rules.md#the-canonical-order):
    ``ts``, or with ``order_by`` (docs/rules.md#order-by-a-column) ``(order value, ts)``. A
    version without an order value (a base row with a null) comes before every value."""
    if table.order_by is None:
        return (x.ts,)
    o = order_value(x, table.order_by)
    return ((o is not None, o), x.ts)


def differs(
    table: Table, e: Event, loc: Version, use_before: bool, cols: Sequence[str] | None = None
) -> bool:
    """docs/rules.md#conflict-types update_differ / delete_differ: another origin wrote
    the row, or it is newer (with ``order_by``, by its order value first:
    docs/rules.md#order-by-a-column). Base rows (no origin) raise no origin conflict
    (docs/rules.md#fine-points)."""
    if when(loc, table) > when(e, table):
        return True
    if use_before and table.detection is Detection.BEFORE_IMAGE:
        image = {
            c: v
            for c, v in e.before.items()
            if c not in table.delta and (cols is None or c in cols)
        }
        # docs/rules.md#fine-points: compare only the columns present; no conflict when
        # equal
        if image:
            return any(loc.values.get(c) != v for c, v in image.items())
    return loc.origin is not None and loc.origin != e.origin


def rejected_type(e: Event, loc: Version | None) -> ConflictType:
    """The conflict type an event of a rejected transaction is logged under
    (docs/rules.md#fine-points transaction scope), against the key's version ``loc``."""
    if e.op == "INSERT":
        return _C.INSERT_EXISTS
    if e.op == "UPDATE":
        if loc is None:
            return _C.UPDATE_MISSING
        return _C.UPDATE_DELETED if loc.deleted else _C.UPDATE_DIFFER
    return _C.DELETE_MISSING if loc is None or loc.deleted else _C.DELETE_DIFFER
