"""What ingest staged for a run, table by table (:class:`StagedTable`): each replica's
export (:class:`StagedExport`), the state the run starts from, the replicas' full copies,
the ledger window; saved as ``staged/inputs.json`` for the stages after it to read."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from pipeline.storage.context import RunContext


@dataclass
class StagedExport:
    replica: str
    format: str
    rows: int  # what the manifest counts: lines (or CSV records, Parquet rows)
    files: list[str]
    watermark: str | None = None
    framing: int = 0  # lines that are no record (wal2json's B and C, Kafka tombstones)
    options: dict[str, Any] = field(default_factory=dict)
    #: typed copies the driver settles or that change their key, as the fetch's typing
    #: counted them (``copies.special_count``); None: not counted (an adapter's export)
    specials: int | None = None

    @property
    def records(self) -> int:
        """The records the export holds: each ends applied, discarded or quarantined."""
        return self.rows - self.framing


@dataclass
class StagedTable:
    """What ingest found for one table; saved as ``staged/inputs.json``."""

    exports: dict[str, StagedExport] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    base_rows: int | None = None
    prior: dict[str, Any] | None = None  # the pointer of the run whose state we start from
    snapshots: dict[str, int] = field(default_factory=dict)  # replica -> rows of its full copy
    ledger: list[str] = field(default_factory=list)  # the dates of the ledger window staged
    #: a run of the window wrote the adapters' ids of before issue 49 (its ledger rows
    #: have no digest): they are matched too (docs/adapters.md "Upgrading")
    legacy_ids: bool = False
    manifests: list[dict[str, Any]] = field(default_factory=list)  # key, sha256 (runs row)
    start: str = ""  # what the run starts from, for the report
    late_exports: list[str] = field(default_factory=list)  # accepted (``pipeline.ingest.late``)

    @property
    def records(self) -> int:
        """How much resolve reads: the export records, the state it starts from and the
        replicas' full copies (what sizes the run's Spark settings)."""
        prior = max(0, (self.prior or {}).get("state_rows", 0))
        exported = sum(e.rows for e in self.exports.values())
        return exported + prior + (self.base_rows or 0) + sum(self.snapshots.values())


def save_inputs(ctx: RunContext, tables: dict[str, StagedTable]) -> None:
    data = {t: asdict(s) for t, s in tables.items()}
    (ctx.staged / "inputs.json").write_text(json.dumps(data, indent=2))


def load_inputs(ctx: RunContext) -> dict[str, StagedTable]:
    p = ctx.staged / "inputs.json"
    data = json.loads(p.read_text())
    out = {}
    for t, s in data.items():
        exports = {r: StagedExport(**e) for r, e in s["exports"].items()}
        out[t] = StagedTable(
            exports,
            s["missing"],
            s["base_rows"],
            s["prior"],
            snapshots=s.get("snapshots", {}),
            ledger=s.get("ledger", []),
            legacy_ids=s.get("legacy_ids", False),
            manifests=s.get("manifests", []),
            start=s.get("start", ""),
            late_exports=s.get("late_exports", []),
        )
    return out
