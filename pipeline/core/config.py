"""A run's configuration as typed, frozen objects: the :class:`Config` every stage takes,
its :class:`Table` objects with their policy resolved (docs/configuration.md).

Nothing downstream reads raw dicts: :func:`pipeline.core.config_load.load_config` reads
``cdr.yaml`` into these objects once. This module holds only them, no pydantic and no
YAML, so that the rules and the stages that take a config load neither; the file's shape
is :mod:`pipeline.core.config_file`'s.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass, replace
from enum import Enum, StrEnum
from typing import Any

from pipeline.core.errors import ConfigError
from pipeline.core.kinds import ColumnType
from pipeline.core.policy import (
    ConflictType,
    Detection,
    DivergencePolicy,
    FkPolicy,
    Granularity,
    MergeFn,
    Preset,
    Resolver,
    Scope,
    TieBreak,
)
from pipeline.core.sources import Source

#: docs/operations.md#what-if: how the what-if form names a config (``main``, or a file's name in
#: the what-if folder: ``pipeline.app.whatif.config_named``), never a path
WHATIF_NAME = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"


#: docs/rules.md#column-groups: the name of the group of the value columns in no configured group
OTHER_GROUP = "_other"


class AlertSeverity(StrEnum):
    """What a fired alert does to the run (docs/operations.md#alerts)."""

    WARN = "warn"  # reported; the run publishes
    FAIL = "fail"  # the run fails its gate (``--accept-alert`` publishes past it)


class UnknownExportPolicy(StrEnum):
    WARN = "warn"
    FAIL = "fail"


@dataclass(frozen=True, slots=True)
class WaitConfig:
    """How long the DAG's sensor waits for every replica's manifests of a date."""

    timeout_minutes: int
    poke_interval_seconds: int


@dataclass(frozen=True, slots=True)
class Replica:
    id: str
    system_id: int


@dataclass(frozen=True, slots=True)
class Column:
    name: str  # as the published tables name it
    type: ColumnType
    #: docs/configuration.md#column-names: as the exports name it ("": ``name``)
    source: str = ""

    @property
    def exported(self) -> str:
        return self.source or self.name


@dataclass(frozen=True, slots=True)
class ForeignKey:
    columns: tuple[str, ...]
    references: str
    parent_key: tuple[str, ...]  # the referenced table's key, matched column by column


@dataclass(frozen=True, slots=True)
class History:
    """docs/outputs.md#history: the table's SCD type 2 history; ``track``: the columns whose
    change opens a version (None: every column)."""

    track: frozenset[str] | None = None


@dataclass(frozen=True, slots=True)
class Table:
    """One table with its policy resolved: every conflict type has exactly one resolver."""

    name: str
    columns: tuple[Column, ...]
    key: tuple[str, ...]
    not_null: frozenset[str]
    unique: tuple[tuple[str, ...], ...]
    foreign_keys: tuple[ForeignKey, ...]
    delta: frozenset[str]
    defaults: Mapping[str, Any]
    preset: Preset
    resolvers: Mapping[ConflictType, Resolver]
    tie_break: TieBreak
    detection: Detection
    scope: Scope
    granularity: Granularity
    #: docs/rules.md#priority: the replicas, most trusted first (the top-level ``priority``)
    priority: tuple[str, ...] = ()
    #: docs/rules.md#order-by-a-column: the column "later" compares first, before ts and the
    #: tie-break
    order_by: str | None = None
    #: docs/rules.md#column-groups: the groups of value columns an UPDATE meets one by one, the
    #: implicit :data:`OTHER_GROUP` (the columns in no group) last; empty: no groups
    column_groups: tuple[tuple[str, tuple[str, ...]], ...] = ()
    #: docs/outputs.md#history: publish ``published/<table>/history``; None: no history
    history: History | None = None
    #: docs/rules.md#ignore-null-updates: the value columns whose null in an UPDATE's
    #: ``after`` means "unchanged" (the typed copy does not hold them)
    ignore_nulls: frozenset[str] = frozenset()
    #: docs/rules.md#merge-functions: the value columns that take the larger (smaller) of
    #: two rows' values when they meet in a conflict
    merge: Mapping[str, MergeFn] = field(default_factory=dict)
    #: docs/rules.md#custom-resolvers: the ``module:function`` of each conflict type whose
    #: resolver is :attr:`Resolver.PYTHON`
    custom: Mapping[ConflictType, str] = field(default_factory=dict)

    def resolver_name(self, t: ConflictType) -> str:
        """The resolver of conflict type ``t`` as the conflict log names it."""
        r = self.resolvers[t]
        return f"python:{self.custom[t]}" if r is Resolver.PYTHON else r.value

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    @property
    def value_columns(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns if c.name not in self.key)

    def column(self, name: str) -> Column:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(name)

    @property
    def renamed(self) -> Mapping[str, str]:
        """docs/configuration.md#column-names: each column the exports name otherwise,
        exported name -> published name (empty for most tables)."""
        return {c.source: c.name for c in self.columns if c.source and c.source != c.name}

    def exported(self, name: str) -> str:
        """The name the exports give column ``name``."""
        return self.column(name).exported


@dataclass(frozen=True, slots=True)
class CdcConfig:
    enabled: bool
    vnodes: int | None
    token_ring: tuple[int, ...] | None
    shards: int
    sharding_ignore_msb: int
    preimage: bool
    postimage: bool


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    """docs/operations.md#metrics: where each published run's metrics go (None: nowhere)."""

    prometheus_textfile: str | None = None  # a local ``*.prom`` file (node_exporter)
    otlp_endpoint: str | None = None  # an OTLP/HTTP metrics endpoint


@dataclass(frozen=True, slots=True)
class ConflictRateAlert:
    """docs/operations.md#alerts: a table's conflicts per event above ``factor`` times
    its median over the published runs of the ``window`` dates before the run's."""

    window: int = 30
    factor: float = 3.0
    min_runs: int = 7
    min_conflicts: int = 20
    on: AlertSeverity = AlertSeverity.WARN
    accepted: bool = False  # the run's ``--accept-alert``: a fired ``fail`` alert only warns

    @property
    def fails(self) -> bool:
        return self.on is AlertSeverity.FAIL and not self.accepted


@dataclass(frozen=True, slots=True)
class QuarantineShare:
    """docs/operations.md#a-loud-quarantine (:attr:`Config.quarantine_share`)."""

    warn: float = 0.05
    fail: float = 0.5
    min_records: int = 10


@dataclass(frozen=True, slots=True)
class Config:
    store: str | None
    replicas: tuple[Replica, ...]
    tables: Mapping[str, Table]
    max_clock_skew_seconds: int
    gc_grace_seconds: int
    max_record_bytes: int  # a longer line of an export is malformed (not read whole)
    max_expansion: int  # a gzipped export may decompress to this many times its size
    on_divergence: DivergencePolicy
    on_fk_violation: FkPolicy
    allow_missing_exports: bool
    schedule: str
    wait_for_exports: WaitConfig
    cdc: CdcConfig
    # the DAG's deadline alert: a run not done this long after its logical date (the
    # schedule's time) is missed; None: no alert
    deadline_minutes: int | None = None
    #: docs/operations.md#a-quarantine-that-heals: quarantine reason -> how many of the next
    #: runs it is offered to
    retry: Mapping[str, int] = field(default_factory=dict)
    #: docs/operations.md#retention: how many days of runs stay readable
    #: (``cdr vacuum``'s window) and so how long every published table keeps its log
    retention_days: int = 30
    metrics: MetricsConfig = MetricsConfig()
    conflict_rate_alert: ConflictRateAlert | None = None
    #: docs/operations.md#the-lease: how long the store's lease outlives the last renewal
    #: of a process that works on the run, and how long a stage that ended cleanly keeps it
    #: for the next task of the run (the DAG's retry horizon)
    lease_seconds: int = 300
    lease_handoff_seconds: int = 1800
    #: docs/operations.md#a-loud-quarantine: the share of an export's (or a file's) records
    #: the guards quarantine above which the night warns, and at which it fails (an export
    #: of at least ``min_records``)
    quarantine_share: QuarantineShare = field(default_factory=lambda: QuarantineShare())
    #: docs/operations.md#a-loud-quarantine: an export folder of a replica the config does
    #: not name: a warning, or the run stops
    on_unknown_export: UnknownExportPolicy = UnknownExportPolicy.WARN
    #: docs/sealing.md: replica id -> where a CDC tool writes its changes (``cdr manifest``
    #: seals each date's export from them); a replica not named uploads its manifests itself
    sources: Mapping[str, Source] = field(default_factory=dict)

    @property
    def replica_ids(self) -> tuple[str, ...]:
        return tuple(r.id for r in self.replicas)

    def captures(self, table: Table) -> bool:
        """Whether the resolve stage records what each event changed (``changes``): the
        CDC log's input, and the history's (history)."""
        return self.cdc.enabled or table.history is not None

    def tie_ranks(self, tie_break: TieBreak) -> dict[str, int]:
        """docs/rules.md#the-canonical-order: ``tie_rank`` orders replicas so that the
        tie-break winner comes last (the highest rank). Base rows without an origin rank
        below every replica."""
        ordered = sorted(
            self.replicas,
            key=lambda r: r.system_id,
            reverse=tie_break is TieBreak.LOWER_SYSTEM_ID,
        )
        return {r.id: i for i, r in enumerate(ordered)}

    def digest(self) -> str:
        """A fingerprint of what decides a run's result (everything but the DAG's schedule
        and sensor settings, and the retention): the stages of one run refuse a config
        that changed under them."""

        def plain(v: Any) -> Any:
            if is_dataclass(v) and not isinstance(v, type):
                return {f.name: plain(getattr(v, f.name)) for f in fields(v)}
            if isinstance(v, Mapping):
                return {str(k): plain(x) for k, x in v.items()}
            if isinstance(v, (list, tuple)):
                return [plain(x) for x in v]
            if isinstance(v, (set, frozenset)):  # iteration order varies by process
                return sorted((plain(x) for x in v), key=json.dumps)
            if isinstance(v, Enum):
                return v.value
            if v is None or isinstance(v, (bool, int, float, str)):
                return v
            raise TypeError(f"Config.digest: no canonical form for {type(v).__name__}")

        data = plain(self)
        # how a run is scheduled, and how long its outputs are kept, decide nothing of it
        # nor where its metrics are sent
        for scheduling in (
            "schedule",
            "wait_for_exports",
            "deadline_minutes",
            "retention_days",
            "metrics",
            "lease_seconds",
            "lease_handoff_seconds",
            "sources",  # where the exports came from: their manifests are the inputs
        ):
            data.pop(scheduling)
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()

    def with_store(self, store: str) -> Config:
        return replace(self, store=store)

    def select(
        self,
        tables: Sequence[str] | None = None,
        on_divergence: str | None = None,
        accept_alert: bool = False,
        allow_missing_exports: bool = False,
    ) -> Config:
        """This config for one run: only ``tables`` and the tables their foreign keys
        reference (a child's orphans are found against its parent's snapshot),
        ``on_divergence`` overridden when given, with ``accept_alert`` a fired alert
        that would fail the run only a warning, and with ``allow_missing_exports`` a
        replica's missing export allowed (as the config's own setting allows it).
        Unknown names raise ConfigError."""
        problems = [f"tables: no table {t!r}" for t in tables or () if t not in self.tables]
        if on_divergence is not None and on_divergence not in {p.value for p in DivergencePolicy}:
            problems.append(f"on_divergence: {on_divergence!r} is not fail or warn")
        if problems:
            raise ConfigError(
                "run options", [*problems, f"(the config's tables: {', '.join(self.tables)})"]
            )
        out = self
        if tables:
            wanted, todo = set(), list(tables)
            while todo:
                t = todo.pop()
                if t not in wanted:
                    wanted.add(t)
                    todo.extend(fk.references for fk in self.tables[t].foreign_keys)
            out = replace(out, tables={t: v for t, v in self.tables.items() if t in wanted})
        if on_divergence is not None:
            out = replace(out, on_divergence=DivergencePolicy(on_divergence))
        if accept_alert and out.conflict_rate_alert is not None:
            out = replace(out, conflict_rate_alert=replace(out.conflict_rate_alert, accepted=True))
        if allow_missing_exports:
            out = replace(out, allow_missing_exports=True)
        return out
