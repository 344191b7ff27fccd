"""The events an earlier night's divergence said a replica's export lacked
(docs/rules.md#divergence-causes: ``missing_events``), and the copies of them a later export
of that replica brings: ``arrived_late``.

Ingest stages, per table, the ids the divergence rows of the ledger's window
(``[D - gc_grace_seconds, D)``, ``pipeline.ingest.prior.ledger_window``) list as missing,
by replica (``lacked.json`` in the table's staged folder; a rerun reads them again); the
resolve stage counts the night's copies of them (:func:`arrived_late`: one small job, run
only when some were staged)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import date
from typing import Any

import pyarrow as pa

from pipeline.core import layout
from pipeline.core.columns import DT, EVENT_ID, EVIDENCE, REPLICA
from pipeline.ingest.prior import ledger_window
from pipeline.rules.causes import missing_ids

STAGED = "lacked.json"


def stage(lake: Any, dt: date, gc_grace_seconds: int, tables: Iterable[str], staged: Any) -> None:
    """Each table's lacked events of the window into its staged folder (nothing when
    there are none, or the divergence predates the causes)."""
    first, _ = ledger_window(dt, gc_grace_seconds)
    for t in tables:
        path = layout.table_path(t, "divergence")
        found = lake.table(path)
        if found is None or EVIDENCE not in pa.schema(found.schema().to_arrow()).names:
            continue
        where = (
            f"\"{DT}\" >= DATE '{first.isoformat()}' AND \"{DT}\" < DATE '{dt.isoformat()}' "
            f"AND {EVIDENCE} LIKE '%missing_events%'"
        )
        rows = lake.read(path, columns=[REPLICA, EVIDENCE], where=where)
        lacked: dict[str, set[str]] = {}
        for r in rows.to_pylist() if rows is not None else ():
            lacked.setdefault(r[REPLICA], set()).update(missing_ids(r[EVIDENCE]))
        if any(lacked.values()):
            text = json.dumps({rep: sorted(ids) for rep, ids in sorted(lacked.items())})
            (staged / t / STAGED).write_text(text)


def lacked_by_event(folder: Any) -> dict[str, frozenset[str]]:
    """The staged lacked events (``folder``: the table's staged folder), by event id: the
    replicas whose exports the ledger's window says lacked it (docs/rules.md#lost-writes)."""
    path = folder / STAGED
    if not path.exists():
        return {}
    out: dict[str, set[str]] = {}
    for rep, ids in json.loads(path.read_text()).items():
        for eid in ids:
            out.setdefault(eid, set()).add(rep)
    return {eid: frozenset(reps) for eid, reps in out.items()}


def arrived_late(spark: Any, copies: Any, folder: Any) -> dict[str, int]:
    """Per replica, the night's copies (``copies``: the typed copies) of the events the
    staged divergence said its export lacked."""
    from pyspark.sql import functions as F

    from pipeline.spark.session import local_frame  # deferred: it loads Spark

    path = folder / STAGED
    if not path.exists():
        return {}
    lacked = json.loads(path.read_text())
    pairs = [(rep, eid) for rep, ids in lacked.items() for eid in ids]
    ids = local_frame(spark, pairs, f"{REPLICA} string, {EVENT_ID} string")
    got = copies.join(F.broadcast(ids), [REPLICA, EVENT_ID], "left_semi").groupBy(REPLICA).count()
    return {r[REPLICA]: r["count"] for r in got.collect()}
