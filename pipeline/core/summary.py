"""The run summary: what the resolve stage found, per table and for the CDC log. Built by
the stages (resolve, its foreign-key pass and snapshot comparison, the CDC stage: each
returns a new one), saved as ``resolved/summary.json``, read by the validation gate and by
publish, which puts its tables in the run report (``pipeline.core.report``: what the
report page and the plugin read). Frozen: no stage changes the summary it is given."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from typing import Any

from pipeline.core.policy import Concurrency


class MalformedReport(ValueError):
    """A report whose numbers are not what a run writes (shown as an error row)."""


@dataclass(frozen=True)
class Stopped:
    """The conflict whose ``error`` resolver stopped a table (docs/rules.md#fine-points)."""

    table: str
    key: str
    conflict_type: str
    event_id: str
    reason: str
    #: its conflict-log row's ``conflict_id`` (a report an earlier release wrote has none)
    conflict_id: str = ""


@dataclass(frozen=True)
class TableTotals:
    """A table's headline counts (docs/outputs.md#the-run-report): the columns of the text
    report's counts table, the counts of the DAG's asset events, the Conflicts page's per
    table row. Derived by :meth:`TableSummary.totals` alone."""

    events: int = 0  # records in the exports
    distinct: int = 0  # distinct events
    applied: int = 0
    discarded: int = 0  # with the events an ``error`` resolver stopped (``errored``)
    duplicates: int = 0
    quarantined: int = 0  # every reason
    conflicts: int = 0  # every type and outcome
    concurrent: int = 0  # docs/rules.md#lost-writes: the conflicts whose writes were concurrent
    lost_writes: int = 0  # the writes they lost, each losing event once
    divergent_keys: int = 0  # every replica's perspective (not the snapshot comparison's)
    orphans: int = 0
    rows: int = 0  # of the snapshot


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
    #: docs/rules.md#lost-writes: the conflict-log rows per label (``concurrent``,
    #: ``sequential``, ``unknown``, ``n/a``), and the writes the concurrent ones lost
    concurrency: Mapping[str, int] = field(default_factory=dict)
    lost_writes: int = 0
    divergent_keys: Mapping[str, int] = field(default_factory=dict)  # by replica
    replicas: Mapping[str, Mapping[str, int]] = field(default_factory=dict)  # records, fates
    missing_exports: list[str] = field(default_factory=list)
    late_exports: list[str] = field(default_factory=list)  # accepted (``pipeline.ingest.late``)
    prior: str | None = None  # the date of the state the run started from, or "base"
    prior_run_id: str | None = None  # the run that published that state (None: base, none)
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
    quarantine_open_reasons: Mapping[str, int] = field(default_factory=dict)  # the same, by reason
    #: docs/rules.md#custom-resolvers: per ``python:<module:function>``, the conflicts where
    #: it answers another row with the sides swapped
    asymmetric: Mapping[str, int] = field(default_factory=dict)
    #: docs/rules.md#manual-decisions: per decision of the run's date, ``applied`` or why it
    #: is stale
    decisions: Mapping[str, str] = field(default_factory=dict)
    #: docs/rules.md#divergence-causes: the perspectives' divergent keys per replica by
    #: cause, and the snapshot comparisons'
    divergent_causes: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    snapshot_divergent_causes: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    #: docs/operations.md#repair: the changes ``cdr repair`` made that the exports hold
    #: (their origin ``cdr_repair``), counted and never resolved (per replica: ``replicas``)
    repaired: int = 0
    #: docs/rules.md#divergence-causes: per replica, the copies its export brings of events
    #: an earlier night's divergence reported it lacked (``missing_events``)
    arrived_late: Mapping[str, int] = field(default_factory=dict)
    #: the ledger rows this run wrote carry content digests (``prior.DIGESTS``): a later
    #: run's window matches the adapters' ids of before issue 49 only for runs without
    ledger_digests: bool = False

    def totals(self) -> TableTotals:
        """The table's headline counts: the one place they are summed."""
        return TableTotals(
            events=self.events,
            distinct=self.distinct_events,
            applied=self.applied,
            discarded=self.discarded + self.errored,
            duplicates=self.duplicates,
            quarantined=sum(self.quarantined.values()),
            conflicts=sum(n for outcomes in self.conflicts.values() for n in outcomes.values()),
            concurrent=self.concurrency.get(Concurrency.CONCURRENT.value, 0),
            lost_writes=self.lost_writes,
            divergent_keys=sum(self.divergent_keys.values()),
            orphans=self.orphans,
            rows=self.rows,
        )

    def to_dict(self) -> dict[str, Any]:
        """The table's entry of the run report's ``tables``: every field, in order."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, strict: bool = False) -> TableSummary:
        """A saved summary or a report's entry. A key no field has is ignored (a report a
        later release wrote), or with ``strict`` refused (``TypeError`` naming it); a
        missing one takes its default (a report an earlier release wrote). The values are
        taken as they are: a reader of files it did not write checks them
        (``pipeline.app.runs.table_runs``)."""
        if not isinstance(d, Mapping):
            raise MalformedReport("its tables are not a mapping of tables")
        known = dict(d) if strict else {k: v for k, v in d.items() if k in _TABLE_FIELDS}
        stopped = known.get("stopped")
        if not stopped:
            return cls(**{**known, "stopped": None})
        if not isinstance(stopped, Mapping):
            raise MalformedReport(f"its stopped conflict is a {type(stopped).__name__}")
        if not strict:
            stopped = {k: v for k, v in stopped.items() if k in _STOPPED_FIELDS}
            if not stopped.keys() >= _STOPPED_NEEDED:
                raise MalformedReport("its stopped conflict lacks a field")
        return cls(**{**known, "stopped": Stopped(**stopped)})


_TABLE_FIELDS = frozenset(f.name for f in fields(TableSummary))
_STOPPED_FIELDS = frozenset(f.name for f in fields(Stopped))
_STOPPED_NEEDED = frozenset(f.name for f in fields(Stopped) if f.default is MISSING)


@dataclass(frozen=True)
class CdcTable:
    log_rows: int = 0  # the rows of the table's CDC log this run wrote


@dataclass(frozen=True)
class CdcSection:
    """The CDC stage's section of the run report (``cdc``, docs/cdc.md#a-consumer)."""

    generation: int = 0  # the time (µs) of the generation operating at the end of the run
    new_generation: bool = False  # this run started it
    generations: int = 0  # every generation, the operating one included
    streams: int = 0  # of the operating generation
    warning: str | None = None  # why a topology change started no generation
    tables: Mapping[str, CdcTable] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CdcSection:
        """As saved; a missing key takes its default, an unknown one is ignored."""
        if not isinstance(d, Mapping):
            raise MalformedReport("its cdc section is not a mapping")
        tables = d.get("tables") or {}
        if not isinstance(tables, Mapping) or not all(
            isinstance(c, Mapping) for c in tables.values()
        ):
            raise MalformedReport("its cdc section's tables are not a mapping of tables")
        known = {k: v for k, v in d.items() if k in _CDC_FIELDS and k != "tables"}
        return cls(**known, tables={t: CdcTable(c.get("log_rows", 0)) for t, c in tables.items()})


_CDC_FIELDS = frozenset(f.name for f in fields(CdcSection))


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    resolve_id: str  # this resolve's output: a verdict names the one it saw
    dt: str
    now_us: int
    tables: Mapping[str, TableSummary]
    cdc: CdcSection | None = None  # the CDC stage's section of the run report

    def stopped(self, table: str) -> bool:
        return self.tables[table].stopped is not None

    def with_table(self, name: str, **changes: Any) -> RunSummary:
        tables = {**self.tables, name: replace(self.tables[name], **changes)}
        return replace(self, tables=tables)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if self.cdc is None:
            del d["cdc"]
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_json(cls, text: str) -> RunSummary:
        """The summary a stage of this run saved: an unknown key is refused."""
        d = json.loads(text)
        tables = {t: TableSummary.from_dict(s, strict=True) for t, s in d.pop("tables").items()}
        cdc = d.pop("cdc", None)
        return cls(**d, tables=tables, cdc=CdcSection.from_dict(cdc) if cdc is not None else None)
