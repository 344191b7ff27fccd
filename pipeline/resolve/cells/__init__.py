"""Cell-granularity resolution on Spark: the ``scylla`` preset (docs/rules.md#cell-rules,
docs/rules.md#tombstones-and-gc_grace_seconds, docs/rules.md#fine-points).

The rules are those of ``pipeline.rules.cellfold`` (the pure-Python reference, which the tests
compare with this module on generated data). Each slot of a row (a column's cell, the
row marker, the row tombstone) keeps the maximum of its writes under one total order, so
the whole table is resolved by one shuffle by key and one window over each key's writes
in the canonical order, with Spark built-ins only (no Python per row). One module per
responsibility: ``order`` (rule 4), ``writes`` (each slot's writes), ``state``,
``conflicts``, ``changes`` (for the CDC log) and ``stage`` (the shuffle and windows):

1. the copies of each event meet in their key's partition; a window over each replica's
   copies of the key in ``seq`` order finds the clock-skew evidence (clock skew,
   ``skew.with_evidence``); the next, over ``(key, event_id)``, keeps the copy that stands
   for the event (docs/rules.md#fine-points) alone, with its copies' replicas (their fates)
   and evidence;
2. the last window, over the key in the canonical order ``(ts, tie_rank, event_id)``
   with the prior state row first, computes for every event the maximum of each slot
   *before* it: whether one of its writes met an equal or later write of another event
   (a conflict, docs/rules.md#fine-points) and whether any of them won (``applied``, else
   ``discarded``); at the key's last row, the maximum including it is the new state.

Value ties (rule 4) compare the unsigned bytes of the Cassandra serialization. Rather
than build those bytes for every cell, ``order.value_order`` maps each value to a Spark
value whose ordering is the same as its serialized bytes' (a signed fixed-width integer
``v`` as ``(v < 0, v)``, text as its UTF-8, ...); only ``decimal``, whose varint form does
not order like the number, is serialized, with built-ins up to 18 digits and a vectorized
UDF above. ``tests/spark/test_cells.py`` checks every type against ``cellfold.serialize``.
"""

from pipeline.resolve.cells.order import value_order
from pipeline.resolve.cells.stage import resolve_cells

__all__ = ["resolve_cells", "value_order"]
