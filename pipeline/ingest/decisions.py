"""The ``decisions`` table (docs/rules.md#manual-decisions): ``published/decisions/``, by
``dt``, one row per decision, withdrawn in place (``withdrawn_at``), never deleted.

Ingest stages the table's decisions of the run's date that are not withdrawn
(``decisions.json`` in the table's staged folder: a rerun reads them again from the
store); the resolve stage loads them for the fold (:func:`load`) and tells, from the
run's conflict log, which it applied and why the others are stale (:func:`statuses`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import date
from typing import Any

import pyarrow as pa

from pipeline.core import layout
from pipeline.core.columns import CONFLICT_ID, DT, KEY
from pipeline.core.config import Table
from pipeline.core.policy import Resolver
from pipeline.rules.custom import RowMisfit
from pipeline.rules.decisions import Decision, Decisions, Stale, Take, digest, typed_row

#: the columns of ``published/decisions/`` (``dt`` is its partition)
SCHEMA = pa.schema(
    [
        ("decision_id", pa.string()),
        (CONFLICT_ID, pa.string()),
        ("table", pa.string()),
        (KEY, pa.string()),
        (DT, pa.date32()),
        ("take", pa.string()),
        ("row", pa.string()),
        ("why", pa.string()),
        ("by", pa.string()),
        ("at", pa.timestamp("us", tz="UTC")),
        ("local_digest", pa.string()),
        ("remote_digest", pa.string()),
        ("withdrawn_at", pa.timestamp("us", tz="UTC")),
    ]
)
STAGED = "decisions.json"
#: what the fold needs of a decision, as staged
_STAGED_FIELDS = ("decision_id", CONFLICT_ID, KEY, "take", "row", "why")
APPLIED = "applied"


def read(lake: Any, dt: date | None = None, where: str | None = None) -> list[dict[str, Any]]:
    """The decisions (of ``dt``), every row, withdrawn ones too."""
    got = lake.read(layout.DECISIONS, dt=dt, where=where)
    return [] if got is None else got.to_pylist()


def active(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r["withdrawn_at"] is None]


def stage(lake: Any, dt: date, tables: Mapping[str, Any], staged: Any) -> None:
    """Each table's decisions of ``dt`` that are not withdrawn into its staged folder."""
    rows = active(read(lake, dt))
    for t in tables:
        mine = [
            {
                **{f: r[f] for f in _STAGED_FIELDS},
                "digests": [r["local_digest"], r["remote_digest"]],
            }
            for r in rows
            if r["table"] == t
        ]
        if mine:
            (staged / t / STAGED).write_text(json.dumps(mine))


def load(folder: Any, table: Table, dt: date) -> Decisions:
    """The table's staged decisions, as the fold applies them."""
    by: dict[str, Decision] = {}
    unfit: dict[str, str] = {}
    path = folder / STAGED
    for r in json.loads(path.read_text()) if path.exists() else []:
        take = Take(r["take"])
        try:
            row = typed_row(table, json.loads(r["row"])) if take is Take.ROW else None
        except RowMisfit as err:  # the table changed since: not applied, reported
            unfit[r["decision_id"]] = str(err)
            continue
        local, remote = r["digests"]
        by[r[CONFLICT_ID]] = Decision(
            r["decision_id"], r[CONFLICT_ID], take, row, r["why"], local, remote
        )
    return Decisions(dt.isoformat(), by, unfit)


def statuses(chosen: Decisions, logged: list[dict[str, Any]]) -> dict[str, str]:
    """Per decision :func:`load` found, ``applied`` or why it is stale, from the run's
    conflict-log rows of their conflict ids (``conflict_id``, ``resolver``)."""
    seen: dict[str, list[dict[str, Any]]] = {}
    for c in logged:
        seen.setdefault(c[CONFLICT_ID], []).append(c)
    out = {d: f"{Stale.UNFIT.value}: {why}" for d, why in chosen.unfit.items()}
    for cid, d in chosen.by_conflict.items():
        rows = seen.get(cid, [])
        if any(c["resolver"] == Resolver.MANUAL.value for c in rows):
            out[d.decision_id] = APPLIED
        else:
            out[d.decision_id] = (Stale.CHANGED if rows else Stale.GONE).value
    return out


def digests(conflict: Mapping[str, Any]) -> tuple[str, str]:
    """The content digests of a conflict-log row's two versions."""
    return digest(conflict["local_row"] or ""), digest(conflict["remote_row"])


def stale_warnings(tables: Mapping[str, Any]) -> list[str]:
    """A warning per decision a run of its date did not apply."""
    return [
        f"table {t}: decision {d} is stale ({why}): not applied; withdraw it (cdr decide "
        f"--withdraw {d}), then decide the conflict again from this run's conflict log"
        for t, s in tables.items()
        for d, why in sorted(s.decisions.items())
        if why != APPLIED
    ]
