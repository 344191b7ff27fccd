"""The run summary: what the resolve stage found, per table and for the CDC log. Built by
the stages (resolve, its foreign-key pass and snapshot comparison, the CDC stage: each
returns a new one), saved as ``resolved/summary.json``, read by the validation gate and by
publish, which puts its tables in the run report (what the report page and the plugin
read). Frozen: no stage changes the summary it is given."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any


@dataclass(frozen=True)
class Stopped:
    """The conflict whose ``error`` resolver stopped a table (docs/rules.md#fine-points)."""

    table: str
    key: str
    conflict_type: str
    event_id: str
    reason: str


@dataclass(frozen=True)
class TableSummary:
    """One table's counts, in the order of the run report's ``tables`` entries."""

    policy: str = ""
    events: int = 0  # records in the exports
    distinct_events: int = 0
    applied: int = 0
    discarded: int = 0
    duplicates: int = 0  # records: of earlier nights' events, or repeats
    differing_copies: int = 0  # events a replica's export holds in different versions
    #: copies of events an earlier night resolved, with other content (``pipeline.resolve.ledger``)
    changed_copies: int = 0
    errored: int = 0
    not_reached: int = 0
    quarantined: Mapping[str, int] = field(default_factory=dict)  # events by reason
    conflicts: Mapping[str, Mapping[str, int]] = field(default_factory=dict)  # type, outcome
    divergent_keys: Mapping[str, int] = field(default_factory=dict)  # by replica
    replicas: Mapping[str, Mapping[str, int]] = field(default_factory=dict)  # records, fates
    missing_exports: list[str] = field(default_factory=list)
    late_exports: list[str] = field(default_factory=list)  # accepted (``pipeline.ingest.late``)
    prior: str | None = None  # the date of the state the run started from, or "base"
    start: str = ""  # what the table started from, in words
    stopped: Stopped | None = None
    orphans: int = 0
    rows: int = 0  # of the snapshot
    state_rows: int = 0  # the next run checks it
    snapshot_divergent_keys: Mapping[str, int] = field(default_factory=dict)  # by replica
    history: Mapping[str, int] = field(default_factory=dict)  # history: rows, new, late versions
    #: clock skew: behind -> ahead -> {events, max_seconds} (``pipeline.resolve.skew``)
    clock_skew: Mapping[str, Mapping[str, Mapping[str, Any]]] = field(default_factory=dict)
    #: retry: the quarantined events offered again, by what became of them (``applied``,
    #: ``discarded``, ``expired``, ...), apart from the night's own events
    retried: Mapping[str, int] = field(default_factory=dict)
    quarantine_open: int = 0  # retry: quarantined events still open after the run
    #: the ledger rows this run wrote carry content digests (``prior.DIGESTS``): a later
    #: run's window matches the adapters' ids of before issue 49 only for runs without
    ledger_digests: bool = False

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TableSummary:
        stopped = d.get("stopped")
        return cls(**{**d, "stopped": Stopped(**stopped) if stopped else None})


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    resolve_id: str  # this resolve's output: a verdict names the one it saw
    dt: str
    now_us: int
    tables: Mapping[str, TableSummary]
    cdc: Mapping[str, Any] | None = None  # the CDC stage's section of the run report

    def stopped(self, table: str) -> bool:
        return self.tables[table].stopped is not None

    def with_table(self, name: str, **changes: Any) -> RunSummary:
        tables = {**self.tables, name: replace(self.tables[name], **changes)}
        return replace(self, tables=tables)

    def table_dicts(self) -> dict[str, dict[str, Any]]:
        """The run report's ``tables``."""
        return {t: asdict(s) for t, s in self.tables.items()}

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if self.cdc is None:
            del d["cdc"]
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_json(cls, text: str) -> RunSummary:
        d = json.loads(text)
        tables = {t: TableSummary.from_dict(s) for t, s in d.pop("tables").items()}
        return cls(**d, tables=tables)
