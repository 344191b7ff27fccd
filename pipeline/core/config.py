"""`cdr.yaml`, parsed once into typed, frozen models (docs/configuration.md).

Loading collects *every* mistake and reports them together, each with its path in the
file (``tables.orders.foreign_keys[0].references: no table 'product'``). Nothing
downstream reads raw dicts: stages take a :class:`Config`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from decimal import Decimal, InvalidOperation
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from pipeline.core import layout
from pipeline.core.columns import RESERVED, RESERVED_PREFIXES
from pipeline.core.errors import ConfigError
from pipeline.core.kinds import (
    INTEGER_KINDS,
    MERGE_KINDS,
    NUMERIC_KINDS,
    ORDER_BY_KINDS,
    Kind,
    every_kind,
    integer_bound,
)
from pipeline.core.policy import (
    ALLOWED,
    PRESETS,
    REPAIR_ORIGIN,
    ConflictType,
    Detection,
    Granularity,
    MergeFn,
    Preset,
    Resolver,
    Scope,
    TieBreak,
    allowed_resolvers,
)

# --------------------------------------------------------------------------- column types


_DECIMAL_RE = re.compile(r"^decimal\(\s*(\d+)\s*,\s*(\d+)\s*\)$")
#: docs/operations.md#what-if: how the what-if form names a config (``main``, or a file's name in
#: the what-if folder: ``pipeline.app.whatif.config_named``), never a path
WHATIF_NAME = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"


@dataclass(frozen=True, slots=True)
class ColumnType:
    kind: Kind
    precision: int = 0
    scale: int = 0

    def __str__(self) -> str:
        if self.kind is Kind.DECIMAL:
            return f"decimal({self.precision},{self.scale})"
        return self.kind.value

    def fits(self, value: int | float | Decimal) -> bool:
        """Whether a number is in this numeric type's range (a 32- or 64-bit integer, a
        finite double, a decimal with at most ``precision - scale`` integer digits)."""
        if self.kind not in NUMERIC_KINDS:
            raise TypeError(f"{self} is not numeric")
        return _FITS[self.kind](self, value)


def _fits_integer(ct: ColumnType, value: int | float | Decimal) -> bool:
    bound = integer_bound(ct.kind)
    return -bound <= value < bound


def _fits_double(ct: ColumnType, value: int | float | Decimal) -> bool:
    return math.isfinite(value)


def _fits_decimal(ct: ColumnType, value: int | float | Decimal) -> bool:
    return abs(value) < 10 ** (ct.precision - ct.scale)


#: the range of each numeric type (``ColumnType.fits``)
_FITS: Mapping[Kind, Callable[[ColumnType, int | float | Decimal], bool]] = every_kind(
    "ColumnType.fits",
    {
        **dict.fromkeys(INTEGER_KINDS, _fits_integer),
        Kind.DOUBLE: _fits_double,
        Kind.DECIMAL: _fits_decimal,
    },
    NUMERIC_KINDS,
)


def parse_column_type(text: str) -> ColumnType:
    """``int`` ... ``decimal(p,s)``; raises ValueError naming the allowed types."""
    t = text.strip().lower()
    m = _DECIMAL_RE.match(t)
    if m:
        p, s = int(m.group(1)), int(m.group(2))
        if not 1 <= p <= 38 or s > p:
            raise ValueError(f"decimal({p},{s}): precision must be 1..38 and scale <= precision")
        return ColumnType(Kind.DECIMAL, p, s)
    try:
        kind = Kind(t)
    except ValueError:
        allowed = ", ".join(k.value for k in Kind if k is not Kind.DECIMAL)
        raise ValueError(f"unknown type {text!r}; allowed: {allowed}, decimal(p,s)") from None
    if kind is Kind.DECIMAL:
        raise ValueError("decimal needs a precision and scale: decimal(p,s)")
    return ColumnType(kind)


def coerce_value(ctype: ColumnType, value: Any) -> Any:
    """A config-supplied value (column default) as the Python value of the column type."""
    if value is None:
        return None
    return _COERCE[ctype.kind](ctype, value)


def _coerce_integer(ctype: ColumnType, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{value!r} is not an integer")
    if not ctype.fits(value):
        raise ValueError(f"{value} does not fit {ctype.kind.value}")
    return value


def _coerce_double(ctype: ColumnType, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{value!r} is not a number")
    return float(value)


def _coerce_decimal(ctype: ColumnType, value: Any) -> Decimal:
    try:
        return Decimal(str(value)).quantize(Decimal(1).scaleb(-ctype.scale))
    except InvalidOperation:
        raise ValueError(f"{value!r} is not a decimal") from None


def _coerce_boolean(ctype: ColumnType, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{value!r} is not a boolean")
    return value


def _coerce_date(ctype: ColumnType, value: Any) -> date:
    return value if isinstance(value, date) else date.fromisoformat(str(value))


def _coerce_timestamp(ctype: ColumnType, value: Any) -> datetime:
    if isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def _coerce_binary(ctype: ColumnType, value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    import base64

    return base64.b64decode(str(value), validate=True)


def _coerce_text(ctype: ColumnType, value: Any) -> str:
    return str(value)


#: how each column type reads a config-supplied value (:func:`coerce_value`)
_COERCE: Mapping[Kind, Callable[[ColumnType, Any], Any]] = every_kind(
    "coerce_value",
    {
        **dict.fromkeys(INTEGER_KINDS, _coerce_integer),
        Kind.DOUBLE: _coerce_double,
        Kind.DECIMAL: _coerce_decimal,
        Kind.BOOLEAN: _coerce_boolean,
        Kind.DATE: _coerce_date,
        Kind.TIMESTAMP: _coerce_timestamp,
        Kind.BINARY: _coerce_binary,
        Kind.STRING: _coerce_text,
        Kind.UUID: _coerce_text,
    },
)


# --------------------------------------------------------------------------- the file's shape


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ReplicaModel(_Strict):
    id: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    system_id: int = Field(ge=0, lt=2**64)


class HistoryModel(_Strict):
    track: list[str] | None = None


class RetryModel(_Strict):
    """docs/operations.md#a-quarantine-that-heals: for how many of the next runs a
    quarantined event is offered again, by reason
    (:data:`pipeline.core.policy.RETRYABLE`)."""

    fk_violation: int | None = Field(default=None, ge=1)
    future_timestamp: int | None = Field(default=None, ge=1)
    update_missing: int | None = Field(default=None, ge=1)


class CustomResolverModel(_Strict):
    """docs/rules.md#custom-resolvers: ``{python: "module:function"}``."""

    python: str


#: a resolver as the config names it: a built-in one, or the user's function
ResolverSetting = Resolver | CustomResolverModel


class ForeignKeyModel(_Strict):
    columns: list[str] = Field(min_length=1)
    references: str


class DefaultsModel(_Strict):
    policy: Preset = Preset.POSTGRES
    tie_break: TieBreak | None = None
    detection: Detection | None = None
    resolvers: dict[ConflictType, ResolverSetting] = Field(default_factory=dict)


class ColumnModel(_Strict):
    """A column given with the name it takes in the published tables:
    ``{type: date, as: order_date}`` (docs/configuration.md#column-names)."""

    type: str
    as_: str | None = Field(default=None, alias="as")


class TableModel(_Strict):
    key: list[str] = Field(default_factory=list)
    columns: dict[str, str | ColumnModel] = Field(min_length=1)
    not_null: list[str] = Field(default_factory=list)
    unique: list[list[str]] = Field(default_factory=list)
    foreign_keys: list[ForeignKeyModel] = Field(default_factory=list)
    delta: list[str] = Field(default_factory=list)
    policy: Preset | None = None
    resolvers: dict[ConflictType, ResolverSetting] | None = None
    defaults: dict[str, Any] = Field(default_factory=dict)
    tie_break: TieBreak | None = None
    scope: Scope = Scope.ROW
    detection: Detection | None = None
    order_by: str | None = None
    column_groups: dict[str, list[str]] | None = None
    history: HistoryModel | None = None
    ignore_null_updates: bool | list[str] | None = None
    merge: dict[str, str] = Field(default_factory=dict)

    @field_validator("history", mode="before")
    @classmethod
    def _history_flag(cls, value: Any) -> Any:
        """``history: true`` is ``history: {}``; ``false`` is no history."""
        if value is True:
            return {}
        if value is False:
            return None
        if value is not None and not isinstance(value, dict):
            raise ValueError("history is true, false or {track: [columns]}")
        return value

    @field_validator("columns", mode="before")
    @classmethod
    def _rejoin_decimal(cls, value: Any) -> Any:
        """``{price: decimal(10,2)}`` in a YAML flow mapping (as docs/configuration.md writes it) is
        split at the comma into ``price: "decimal(10"`` and a key ``"2)"`` with no value;
        put the type back together."""
        if not isinstance(value, dict):
            return value
        out: dict[Any, Any] = {}
        last = None
        for k, v in value.items():
            if (
                v is None
                and isinstance(k, str)
                and re.fullmatch(r"\s*\d+\s*\)", k)
                and last is not None
                and re.fullmatch(r"decimal\(\s*\d+", str(out[last]))
            ):
                out[last] = f"{out[last]},{k.strip()}"
                continue
            out[k] = v
            last = k
        return out


#: a CDC generation holds at most this many streams (ranges x shards): building and
#: looking them up stays cheap (a real cluster has tens of thousands)
CDC_MAX_STREAMS = 2**20
#: ``cdc$time`` keeps a replica's tie rank in 9 bits (``pipeline.changes.cdc``)
CDC_MAX_REPLICAS = 500


class CdcModel(_Strict):
    enabled: bool = False
    vnodes: int | None = Field(default=None, ge=1, le=65536)
    token_ring: list[int] | None = None
    shards: int = Field(default=1, ge=1, le=1024)
    sharding_ignore_msb: int = Field(default=12, ge=0, le=63)
    preimage: bool = False
    postimage: bool = False


class DivergencePolicy(StrEnum):
    FAIL = "fail"
    WARN = "warn"


class FkPolicy(StrEnum):
    FAIL = "fail"
    WARN = "warn"
    QUARANTINE = "quarantine"


class MetricsModel(_Strict):
    prometheus_textfile: str | None = Field(default=None, min_length=1)
    otlp_endpoint: str | None = Field(default=None, min_length=1)


class AlertSeverity(StrEnum):
    """What a fired alert does to the run (docs/operations.md#alerts)."""

    WARN = "warn"  # reported; the run publishes
    FAIL = "fail"  # the run fails its gate (``--accept-alert`` publishes past it)


class ConflictRateModel(_Strict):
    window: int = Field(default=30, ge=1, le=3660)
    factor: float = Field(default=3.0, gt=0, allow_inf_nan=False)
    min_runs: int = Field(default=7, ge=1)
    min_conflicts: int = Field(default=20, ge=0)
    on: AlertSeverity = AlertSeverity.WARN

    @model_validator(mode="before")
    @classmethod
    def _yaml_on(cls, data: Any) -> Any:
        """YAML 1.1 (PyYAML) reads the bare key ``on`` as the boolean true: it is ``on``."""
        if isinstance(data, dict) and True in data and "on" not in data:
            data = {("on" if k is True else k): v for k, v in data.items()}
        return data


class AlertsModel(_Strict):
    conflict_rate: ConflictRateModel | None = None


class WaitModel(_Strict):
    timeout_minutes: int = Field(default=360, ge=1)
    poke_interval_seconds: int = Field(default=300, ge=10)


_CRON_FIELD = re.compile(r"^[0-9A-Za-z*/,?#LW-]+$")
_CRON_PRESETS = frozenset({"@hourly", "@daily", "@weekly", "@monthly", "@yearly", "@once"})


def _cron_problem(text: str) -> str | None:
    """A cron expression of five fields, or one of Airflow's presets."""
    fields = text.split()
    if text.strip() in _CRON_PRESETS:
        return None
    if len(fields) != 5 or not all(_CRON_FIELD.match(f) for f in fields):
        return (
            f"{text!r} is not a cron expression of five fields "
            f"(minute hour day month weekday, e.g. '0 2 * * *') nor one of "
            f"{', '.join(sorted(_CRON_PRESETS))}"
        )
    return None


class UnknownExportPolicy(StrEnum):
    WARN = "warn"
    FAIL = "fail"


class QuarantineShareModel(_Strict):
    warn: float = Field(default=0.05, ge=0, le=1)
    fail: float = Field(default=0.5, ge=0, le=1)
    min_records: int = Field(default=10, ge=1)


class LeaseModel(_Strict):
    seconds: int = Field(default=300, ge=5)
    handoff_seconds: int = Field(default=1800, ge=5)


class ConfigModel(_Strict):
    store: str | None = None
    replicas: list[ReplicaModel] = Field(min_length=1)
    defaults: DefaultsModel = Field(default_factory=DefaultsModel)
    max_clock_skew_seconds: int = Field(default=300, ge=0)
    gc_grace_seconds: int = Field(default=864000, ge=0)
    retention_days: int = Field(default=30, ge=1)
    lease: LeaseModel = Field(default_factory=LeaseModel)
    quarantine_share: QuarantineShareModel = Field(default_factory=QuarantineShareModel)
    on_unknown_export: UnknownExportPolicy = UnknownExportPolicy.WARN
    max_record_bytes: int = Field(default=16 << 20, gt=0)
    max_expansion: int = Field(default=100, gt=0)
    on_divergence: DivergencePolicy = DivergencePolicy.FAIL
    on_fk_violation: FkPolicy = FkPolicy.FAIL
    allow_missing_exports: bool = False
    schedule: str = "0 2 * * *"
    wait_for_exports: WaitModel = Field(default_factory=WaitModel)
    deadline_minutes: int | None = Field(default=None, ge=1)
    priority: list[str] | None = None
    ignore_null_updates: bool | list[str] = False
    retry: RetryModel = Field(default_factory=RetryModel)
    tables: dict[str, TableModel] = Field(min_length=1)
    cdc: CdcModel = Field(default_factory=CdcModel)
    metrics: MetricsModel = Field(default_factory=MetricsModel)
    alerts: AlertsModel = Field(default_factory=AlertsModel)


# --------------------------------------------------------------------------- resolved, frozen


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
        import hashlib
        import json
        from dataclasses import fields, is_dataclass
        from enum import Enum

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
        ):
            data.pop(scheduling)
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()

    def with_store(self, store: str) -> Config:
        from dataclasses import replace

        return replace(self, store=store)

    def select(
        self,
        tables: Sequence[str] | None = None,
        on_divergence: str | None = None,
        accept_alert: bool = False,
    ) -> Config:
        """This config for one run: only ``tables`` and the tables their foreign keys
        reference (a child's orphans are found against its parent's snapshot),
        ``on_divergence`` overridden when given, and with ``accept_alert`` a fired alert
        that would fail the run only a warning. Unknown names raise ConfigError."""
        from dataclasses import replace

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
        return out


# --------------------------------------------------------------------------- loading


def _path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _pydantic_problems(err: ValidationError) -> list[str]:
    problems = []
    for e in err.errors():
        # pydantic appends the enum/union member tried to loc; keep the user's path only
        loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        problems.append(f"{_path(loc)}: {msg}")
    return problems


class _Problems:
    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, path: str, message: str) -> None:
        self.items.append(f"{path}: {message}")


def _resolve_table(
    name: str,
    t: TableModel,
    m: ConfigModel,
    p: _Problems,
) -> Table | None:
    defaults, tables, priority = m.defaults, m.tables, m.priority
    at = f"tables.{name}"
    sources = published_names(at, t, p)  # published name -> exported name
    t = t.model_copy(update={"columns": {n: _type_text(t.columns[s]) for n, s in sources.items()}})
    first = len(p.items)
    columns: list[Column] = []
    for col, text in t.columns.items():
        try:
            source = sources[col] if sources[col] != col else ""
            columns.append(Column(col, parse_column_type(str(text)), source))
        except ValueError as e:
            p.add(f"{at}.columns.{sources[col]}", str(e))
    ctypes = {c.name: c.type for c in columns}
    _check_constraints(at, t, ctypes, tables, p)
    col_defaults = _column_defaults(at, t, ctypes, p)
    preset = t.policy or defaults.policy
    rule = PRESETS[preset]
    resolvers, custom = _resolvers(at, t, defaults, p)
    groups = _column_groups(at, t, preset, p)
    if ConflictType.UPDATE_DIFFER in custom and groups:
        p.add(
            f"{at}.resolvers.update_differ",
            "a custom resolver cannot decide update_differ group by group (column_groups)",
        )
    _name_them_as_published(p, first, {s: n for n, s in sources.items() if s != n})
    if len(columns) != len(t.columns) or not t.key:
        return None
    return Table(
        name=name,
        columns=tuple(columns),
        key=tuple(t.key),
        not_null=frozenset(t.not_null) | frozenset(t.key),
        unique=tuple(tuple(u) for u in t.unique),
        foreign_keys=tuple(
            ForeignKey(tuple(fk.columns), fk.references, tuple(tables[fk.references].key))
            for fk in t.foreign_keys
            if fk.references in tables
        ),
        delta=frozenset(t.delta),
        defaults=col_defaults,
        preset=preset,
        resolvers=resolvers,
        tie_break=t.tie_break or defaults.tie_break or rule.tie_break,
        detection=t.detection or defaults.detection or Detection.ORIGIN,
        scope=t.scope,
        granularity=rule.granularity,
        priority=tuple(priority or ()),
        order_by=t.order_by,
        column_groups=groups,
        history=_history(at, t, p),
        ignore_nulls=_ignore_nulls(at, t, m.ignore_null_updates, rule.granularity, p),
        merge=_merge(at, t, ctypes, rule.granularity, p),
        custom=custom,
    )


def _type_text(given: str | ColumnModel) -> str:
    return given if isinstance(given, str) else given.type


#: docs/configuration.md#column-names: a name the published tables hold as it is (Spark,
#: Delta without column mapping, Parquet, and the readers of docs/outputs.md): a letter or
#: an underscore, then letters, digits, underscores and dollar signs
_HOLDABLE = re.compile(r"^[^\W\d][\w$]*$")


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a column of the published tables as it is (None: it can)."""
    folded = name.casefold()
    if folded in {r.casefold() for r in RESERVED}:
        return f"the published tables keep their own {name!r} beside a table's columns"
    if folded.startswith(RESERVED_PREFIXES):
        return f"names starting with {' or '.join(RESERVED_PREFIXES)} are the pipeline's own"
    if not _HOLDABLE.match(name):
        odd = sorted({ch for ch in name if not (ch.isalnum() or ch in "_$")})
        if not name:
            return "an empty name"
        if odd:
            shown = ", ".join("a space" if ch == " " else repr(ch) for ch in odd)
            return f"it holds {shown}, which the published tables' names cannot"
        return "it starts with a digit"
    return None


def suggested_name(name: str, taken: set[str]) -> str:
    """A name the published tables can hold for column ``name``, none of ``taken``
    (compared without case): lower case, other characters as ``_``."""
    base = re.sub(r"[^\w$]+", "_", name.casefold()).strip("_") or "column"
    if base[0].isdigit():
        base = f"c_{base}"
    base = base.lstrip("_") if name_problem(base) else base
    base = base if base and not name_problem(base) else f"col_{base}".rstrip("_")
    out, n = base, 2
    while out.casefold() in taken or name_problem(out):
        out, n = f"{base}_{n}", n + 1
    return out


def published_names(at: str, t: TableModel, p: _Problems) -> dict[str, str]:
    """Each column's published name -> its exported name
    (docs/configuration.md#column-names): the name the config gives it, or its ``as``. A
    name the tables cannot hold as
    it is, or equal to another but for case, is refused naming the column, why, and the
    ``as`` that would hold it."""
    out: dict[str, str] = {}
    seen: dict[str, str] = {}  # folded published name -> the column that took it
    exported = {s.casefold(): s for s in t.columns}
    for source, given in t.columns.items():
        alias = given.as_ if isinstance(given, ColumnModel) else None
        name = alias if alias is not None else source
        where = f"{at}.columns.{source}" + (".as" if alias is not None else "")
        why = name_problem(name)
        if why is None and name.casefold() in seen:
            why = f"it equals column {seen[name.casefold()]!r} but for case"
        if why is None and alias is not None and exported.get(name.casefold(), source) != source:
            why = f"another column is exported as {exported[name.casefold()]!r}"
        if why is not None:
            taken = set(seen) | set(exported) | {r.casefold() for r in RESERVED}
            hint = suggested_name(name, taken)
            key = source if _HOLDABLE.match(source) else json.dumps(source)
            p.add(
                where,
                f"{name!r} cannot name a column of the published tables: {why}; give it a "
                f"name they hold: {key}: {{type: {_type_text(given)}, as: {hint}}}",
            )
        seen[name.casefold()] = source
        out[name] = source
    return out


def _name_them_as_published(p: _Problems, first: int, renamed: Mapping[str, str]) -> None:
    """The settings of a table name its columns as published: a problem since ``first``
    that names a column by its exported name says which name to use."""
    for i in range(first, len(p.items)):
        for source, name in renamed.items():
            if f"no column {source!r} in" in p.items[i]:
                p.items[i] += f" (the column exported as {source!r} is published as {name!r})"


def _check_constraints(
    at: str,
    t: TableModel,
    ctypes: Mapping[str, ColumnType],
    tables: Mapping[str, TableModel],
    p: _Problems,
) -> None:
    """The key, ``not_null``, ``unique``, ``delta`` and foreign-key columns of table ``at``
    name its columns; a delta column is numeric; a foreign key matches its parent's key."""

    def check_cols(path: str, cols: list[str]) -> None:
        for i, c in enumerate(cols):
            if c not in t.columns:
                p.add(f"{path}[{i}]", f"no column {c!r} in {at}.columns")

    if not t.key:
        p.add(f"{at}.key", "a table needs a key: conflict detection matches rows by key")
    check_cols(f"{at}.key", t.key)
    if len(set(t.key)) != len(t.key):
        p.add(f"{at}.key", "a column is listed twice")
    check_cols(f"{at}.not_null", t.not_null)
    check_cols(f"{at}.delta", t.delta)
    for i, u in enumerate(t.unique):
        if not u:
            p.add(f"{at}.unique[{i}]", "an empty unique constraint")
        check_cols(f"{at}.unique[{i}]", u)
    for d in t.delta:
        if d in t.key:
            p.add(f"{at}.delta", f"key column {d!r} cannot be a delta column")
        elif d in ctypes and ctypes[d].kind not in NUMERIC_KINDS:
            p.add(f"{at}.delta", f"delta column {d!r} must be numeric, not {ctypes[d]}")
    _check_order_by(at, t, ctypes, p)
    for i, fk in enumerate(t.foreign_keys):
        fat = f"{at}.foreign_keys[{i}]"
        check_cols(f"{fat}.columns", fk.columns)
        parent = tables.get(fk.references)
        if parent is None:
            p.add(f"{fat}.references", f"no table {fk.references!r}")
        elif len(parent.key) != len(fk.columns):
            p.add(
                f"{fat}.columns",
                f"{len(fk.columns)} column(s) cannot reference the {len(parent.key)}-column "
                f"key of {fk.references!r}",
            )


def _check_order_by(at: str, t: TableModel, ctypes: Mapping[str, ColumnType], p: _Problems) -> None:
    """docs/rules.md#order-by-a-column: ``order_by`` names a column of an orderable type, on
    a row table."""
    c = t.order_by
    if c is None:
        return
    allowed = ", ".join(k.value for k in ORDER_BY_KINDS)
    if c not in t.columns:
        p.add(f"{at}.order_by", f"no column {c!r} in {at}.columns")
    elif c in ctypes and ctypes[c].kind not in ORDER_BY_KINDS:
        p.add(f"{at}.order_by", f"column {c!r} is {ctypes[c]}; order_by needs one of: {allowed}")


#: docs/rules.md#column-groups: the name of the group of the value columns in no configured group
OTHER_GROUP = "_other"


def _history(at: str, t: TableModel, p: _Problems) -> History | None:
    """docs/outputs.md#history: ``history: true``, or ``history: {track: [value columns]}``."""
    h = t.history
    if h is None:
        return None
    if h.track is None:
        return History()
    where = f"{at}.history.track"
    if not h.track:
        p.add(where, "an empty list (leave track out to track every column)")
    _check_value_columns(where, at, t, h.track, "a key change always opens a version", p)
    return History(frozenset(h.track))


def _check_value_columns(
    where: str, at: str, t: TableModel, cols: list[str], why_not_key: str, p: _Problems
) -> None:
    """Each of ``cols`` (listed at ``where``) is a value column of table ``at``, once."""
    for i, c in enumerate(cols):
        if c not in t.columns:
            p.add(f"{where}[{i}]", f"no column {c!r} in {at}.columns")
        elif c in t.key:
            p.add(f"{where}[{i}]", f"key column {c!r}: {why_not_key}")
        elif cols.index(c) != i:
            p.add(f"{where}[{i}]", f"column {c!r} is listed twice")


def _ignore_nulls(
    at: str, t: TableModel, top: bool | list[str], granularity: Granularity, p: _Problems
) -> frozenset[str]:
    """docs/rules.md#ignore-null-updates: the table's own ``ignore_null_updates`` (``true``,
    ``false`` or its value columns), else the top-level one: ``true`` is every value column
    of every row table, a list names the columns wherever a row table has them (a name
    no table has is refused by :func:`_check_top_level_nulls`). A cell table writes a null
    as a cell: it takes no top-level setting and refuses its own."""
    value_columns = [c for c in t.columns if c not in t.key]
    own = t.ignore_null_updates
    if granularity is Granularity.CELL:
        if own:
            p.add(f"{at}.ignore_null_updates", "not allowed on a cell-granularity table")
        return frozenset()
    if own is None:
        if top is True:
            return frozenset(value_columns)
        return frozenset(c for c in top or () if c in value_columns)
    if own is True:
        return frozenset(value_columns)
    if own is False:
        return frozenset()
    where = f"{at}.ignore_null_updates"
    if not own:
        p.add(where, "an empty list (false, or leave it out, ignores no null)")
    _check_value_columns(where, at, t, own, "an UPDATE's key is never unchanged", p)
    return frozenset(c for c in own if c in value_columns)


def _merge(
    at: str,
    t: TableModel,
    ctypes: Mapping[str, ColumnType],
    granularity: Granularity,
    p: _Problems,
) -> dict[str, MergeFn]:
    """docs/rules.md#merge-functions: ``merge: {column: max | min}`` on value columns of an
    ordered type (numeric, date, timestamp) of a row table. A column whose value another rule
    decides is refused: the key, ``order_by`` (it decides which version wins), a ``delta``
    column (it adds), a ``unique`` or foreign-key column (a merged value could collide or
    point nowhere)."""
    if not t.merge:
        return {}
    where = f"{at}.merge"
    if granularity is Granularity.CELL:
        p.add(where, "not allowed on a cell-granularity table (each cell has its own timestamp)")
        return {}
    unique = {c for u in t.unique for c in u}
    foreign = {c for fk in t.foreign_keys for c in fk.columns}
    fns = ", ".join(f.value for f in MergeFn)
    kinds = ", ".join(k.value for k in MERGE_KINDS)
    out: dict[str, MergeFn] = {}
    for c, fn in t.merge.items():
        at_c = f"{where}.{c}"
        if fn not in {f.value for f in MergeFn}:
            p.add(at_c, f"merge function {fn!r}: one of {fns}")
            continue
        if c not in t.columns:
            p.add(at_c, f"no column {c!r} in {at}.columns")
            continue
        taken = [
            (c in t.key, "a key column"),
            (c == t.order_by, "the order_by column (it decides which version wins)"),
            (c in t.delta, "a delta column (its changes add up)"),
            (c in unique, "a unique column (a merged value could collide)"),
            (c in foreign, "a foreign-key column (a merged value could reference no row)"),
        ]
        why = next((w for hit, w in taken if hit), None)
        if why is not None:
            p.add(at_c, f"column {c!r} is {why}; it cannot be merged")
        elif c in ctypes and ctypes[c].kind not in MERGE_KINDS:
            p.add(at_c, f"column {c!r} is {ctypes[c]}; merge needs one of: {kinds}")
        else:
            out[c] = MergeFn(fn)
    return out


def _check_top_level_nulls(m: ConfigModel, p: _Problems) -> None:
    """The top-level ``ignore_null_updates`` list names value columns of the tables."""
    if not isinstance(m.ignore_null_updates, list):
        return
    if not m.ignore_null_updates:
        p.add("ignore_null_updates", "an empty list (false, or leave it out, ignores no null)")
    for i, c in enumerate(m.ignore_null_updates):
        if not any(c in t.columns and c not in t.key for t in m.tables.values()):
            p.add(f"ignore_null_updates[{i}]", f"no table has a value column {c!r}")


def _column_groups(
    at: str, t: TableModel, preset: Preset, p: _Problems
) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """docs/rules.md#column-groups: ``column_groups`` of a postgres row table: named groups of value
    columns, each column in one group at most; the others form :data:`OTHER_GROUP`."""
    if not t.column_groups:
        return ()
    where = f"{at}.column_groups"
    if preset is not Preset.POSTGRES:
        p.add(where, f"only on a postgres table, not {preset.value}")
    seen: dict[str, str] = {}
    for g, cols in t.column_groups.items():
        if not re.match(r"^[A-Za-z][A-Za-z0-9_]*$", g):
            p.add(f"{where}.{g}", "a group name is a letter, then letters, digits and _")
        if not cols:
            p.add(f"{where}.{g}", "an empty group")
        for c in cols:
            if c not in t.columns:
                p.add(f"{where}.{g}", f"no column {c!r} in {at}.columns")
            elif c in t.key:
                p.add(f"{where}.{g}", f"key column {c!r} cannot be in a group")
            elif c in seen:
                p.add(f"{where}.{g}", f"column {c!r} is already in group {seen[c]!r}")
            else:
                seen[c] = g
    groups = [(g, tuple(cols)) for g, cols in t.column_groups.items()]
    rest = tuple(c for c in t.columns if c not in t.key and c not in seen)
    return tuple(groups + ([(OTHER_GROUP, rest)] if rest else []))


def _column_defaults(
    at: str, t: TableModel, ctypes: Mapping[str, ColumnType], p: _Problems
) -> dict[str, Any]:
    """The table's ``defaults``, each coerced to its column's type."""
    col_defaults: dict[str, Any] = {}
    for col, value in t.defaults.items():
        if col not in ctypes:
            p.add(f"{at}.defaults.{col}", f"no column {col!r} in {at}.columns")
            continue
        try:
            col_defaults[col] = coerce_value(ctypes[col], value)
        except (ValueError, TypeError) as e:
            p.add(f"{at}.defaults.{col}", f"{e} (column type {ctypes[col]})")
    return col_defaults


#: docs/rules.md#custom-resolvers: a dotted module path, a colon, a function name
_FUNCTION_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")


def _resolvers(
    at: str, t: TableModel, defaults: DefaultsModel, p: _Problems
) -> tuple[dict[ConflictType, Resolver], dict[ConflictType, str]]:
    """The table's resolver per conflict type: its policy's, then ``defaults.resolvers``,
    then its own ``resolvers`` (row tables only), each one allowed for its conflict type;
    and the ``module:function`` of each custom one (docs/rules.md#custom-resolvers: only
    its syntax is checked here, the run imports it)."""
    preset = t.policy or defaults.policy
    rule = PRESETS[preset]
    if rule.granularity is Granularity.CELL:
        for field, present in (
            ("unique", bool(t.unique)),
            ("delta", bool(t.delta)),
            ("resolvers", t.resolvers is not None),
            ("order_by", t.order_by is not None),
        ):
            if present:
                p.add(f"{at}.{field}", f"not allowed on a {preset.value} (cell-granularity) table")
    if t.scope is Scope.TRANSACTION and preset is not Preset.DELETE_WINS:
        p.add(f"{at}.scope", "scope 'transaction' needs policy 'delete_wins'")
    resolvers = dict(rule.resolvers)
    custom: dict[ConflictType, str] = {}
    if rule.granularity is Granularity.ROW:
        layered = [("defaults.resolvers", defaults.resolvers)]
        if t.resolvers is not None:
            layered.append((f"{at}.resolvers", t.resolvers))
        for path, overrides in layered:
            for ctype, setting in overrides.items():
                where = f"{path}.{ctype.value}"
                res = Resolver.PYTHON if isinstance(setting, CustomResolverModel) else setting
                if res not in ALLOWED[ctype]:
                    p.add(
                        where,
                        f"resolver {res.value!r} is not allowed for {ctype.value}; "
                        f"allowed: {', '.join(allowed_resolvers(ctype))}",
                    )
                elif not isinstance(setting, CustomResolverModel):
                    if res is Resolver.PYTHON:
                        p.add(where, 'a custom resolver is {python: "module:function"}')
                    resolvers[ctype] = res
                    custom.pop(ctype, None)
                elif preset is Preset.DELETE_WINS:
                    p.add(where, "a custom resolver is not allowed under policy delete_wins")
                elif not _FUNCTION_PATH.match(setting.python):
                    p.add(
                        f"{where}.python",
                        f"{setting.python!r} is not module:function (e.g. acme.cdr:prefer_paid)",
                    )
                else:
                    resolvers[ctype] = res
                    custom[ctype] = setting.python
    return resolvers, custom


def _check_replicas(m: ConfigModel, p: _Problems) -> None:
    """Distinct ids and system ids; no replica named as the changes ``cdr repair`` makes
    (docs/operations.md#repair)."""
    ids = [r.id for r in m.replicas]
    for i, r in enumerate(m.replicas):
        if ids.count(r.id) > 1:
            p.add(f"replicas[{i}].id", f"replica id {r.id!r} is used twice")
        if r.id == REPAIR_ORIGIN:
            p.add(f"replicas[{i}].id", f"{REPAIR_ORIGIN!r} names the changes cdr repair makes")
        if [x.system_id for x in m.replicas].count(r.system_id) > 1:
            p.add(f"replicas[{i}].system_id", "system ids must differ: they break ties")


def _resolve(m: ConfigModel, p: _Problems) -> Config:
    _check_replicas(m, p)
    if m.store is not None and not re.match(r"^(s3://[^/]+|file:///)", m.store):
        p.add("store", f"{m.store!r} is neither s3://BUCKET[/PREFIX] nor file:///PATH")
    tables: dict[str, Table] = {}
    for name, t in m.tables.items():
        _check_table_name(name, p)
        resolved = _resolve_table(name, t, m, p)
        if resolved is not None:
            tables[name] = resolved
    _check_foreign_key_types(tables, p)
    _check_priority(m, tables, p)
    _check_top_level_nulls(m, p)
    if (cron := _cron_problem(m.schedule)) is not None:
        p.add("schedule", cron)
    _check_cdc(m, p)
    retry = _check_retry(m, tables, p)
    _check_metrics(m.metrics, p)
    c = m.cdc
    rate = m.alerts.conflict_rate
    return Config(
        store=m.store,
        replicas=tuple(Replica(r.id, r.system_id) for r in m.replicas),
        tables=tables,
        max_clock_skew_seconds=m.max_clock_skew_seconds,
        gc_grace_seconds=m.gc_grace_seconds,
        retention_days=m.retention_days,
        lease_seconds=m.lease.seconds,
        lease_handoff_seconds=m.lease.handoff_seconds,
        quarantine_share=QuarantineShare(
            m.quarantine_share.warn, m.quarantine_share.fail, m.quarantine_share.min_records
        ),
        on_unknown_export=m.on_unknown_export,
        max_record_bytes=m.max_record_bytes,
        max_expansion=m.max_expansion,
        on_divergence=m.on_divergence,
        on_fk_violation=m.on_fk_violation,
        allow_missing_exports=m.allow_missing_exports,
        schedule=m.schedule.strip(),
        wait_for_exports=WaitConfig(
            m.wait_for_exports.timeout_minutes, m.wait_for_exports.poke_interval_seconds
        ),
        cdc=CdcConfig(
            enabled=c.enabled,
            vnodes=c.vnodes if c.vnodes is not None or c.token_ring is not None else 16,
            token_ring=tuple(c.token_ring) if c.token_ring is not None else None,
            shards=c.shards,
            sharding_ignore_msb=c.sharding_ignore_msb,
            preimage=c.preimage,
            postimage=c.postimage,
        ),
        deadline_minutes=m.deadline_minutes,
        retry=retry,
        metrics=MetricsConfig(m.metrics.prometheus_textfile, m.metrics.otlp_endpoint),
        conflict_rate_alert=(
            ConflictRateAlert(rate.window, rate.factor, rate.min_runs, rate.min_conflicts, rate.on)
            if rate is not None
            else None
        ),
    )


def _check_table_name(name: str, p: _Problems) -> None:
    """A table's name names its folders: ``published/<table>/`` beside the store's own."""
    if not re.match(r"^[A-Za-z][A-Za-z0-9_]*$", name):
        why = "a table name is letters, digits and _, and starts with a letter (it names folders)"
        p.add(f"tables.{name}", why)
    elif name in layout.OWN_NAMES:
        own = ", ".join(sorted(layout.OWN_NAMES))
        p.add(f"tables.{name}", f"{name!r} is a folder of the store's own ({own}): rename it")


def _check_metrics(m: MetricsModel, p: _Problems) -> None:
    """node_exporter's textfile collector reads ``*.prom`` files of a local folder; OTLP
    metrics go to an http(s) URL."""
    path = m.prometheus_textfile
    if path is not None and (not path.endswith(".prom") or "://" in path):
        p.add(
            "metrics.prometheus_textfile",
            f"{path!r}: a local file whose name ends in .prom (node_exporter's textfile "
            "collector reads only those), e.g. /var/lib/node_exporter/textfile/cdr.prom",
        )
    url = m.otlp_endpoint
    if url is not None and not re.match(r"^https?://[^/\s]+(/\S*)?$", url):
        p.add(
            "metrics.otlp_endpoint",
            f"{url!r}: an http:// or https:// URL of an OTLP/HTTP receiver, e.g. "
            "http://collector:4318/v1/metrics",
        )


def _check_foreign_key_types(tables: Mapping[str, Table], p: _Problems) -> None:
    """Each foreign-key column has the type of the parent's key column it references."""
    for name, tb in tables.items():
        for i, fk in enumerate(tb.foreign_keys):
            parent = tables.get(fk.references)
            if parent is None or len(parent.key) != len(fk.columns):
                continue
            for col, pk in zip(fk.columns, parent.key, strict=True):
                if col in tb.column_names and tb.column(col).type != parent.column(pk).type:
                    p.add(
                        f"tables.{name}.foreign_keys[{i}].columns",
                        f"{col!r} is {tb.column(col).type} but {fk.references}.{pk} is "
                        f"{parent.column(pk).type}",
                    )


def _check_retry(m: ConfigModel, tables: Mapping[str, Table], p: _Problems) -> dict[str, int]:
    """docs/operations.md#a-quarantine-that-heals: the reasons retried, and what the
    foreign-key retry needs."""
    retry = {k: v for k, v in m.retry.model_dump().items() if v is not None}
    if "fk_violation" in retry:
        if m.on_fk_violation is not FkPolicy.QUARANTINE:
            p.add(
                "retry.fk_violation",
                "retries the foreign-key quarantine: it needs on_fk_violation: quarantine",
            )
        for name, tb in tables.items():
            if tb.granularity is Granularity.CELL and tb.foreign_keys:
                p.add(
                    "retry.fk_violation",
                    f"puts orphan rows back into row tables only; {name} is a cell table "
                    "with foreign keys",
                )
    return retry


def _check_priority(m: ConfigModel, tables: Mapping[str, Table], p: _Problems) -> None:
    """docs/rules.md#priority: ``priority`` lists every replica once; a table resolving with
    ``priority_wins`` needs it."""
    ids = [r.id for r in m.replicas]
    if m.priority is None:
        users = [
            f"tables.{name}: {t.value}"
            for name, tb in tables.items()
            for t, r in tb.resolvers.items()
            if r is Resolver.PRIORITY_WINS
        ]
        if users:
            p.add(
                "priority",
                f"missing: priority_wins ({'; '.join(users)}) needs every replica ranked, "
                f"most trusted first, e.g. priority: [{', '.join(ids)}]",
            )
        return
    for i, r in enumerate(m.priority):
        if r not in ids:
            p.add(f"priority[{i}]", f"no replica {r!r} (replicas: {', '.join(ids)})")
        elif m.priority.index(r) != i:
            p.add(f"priority[{i}]", f"replica {r!r} is listed twice")
    missing = [r for r in ids if r not in m.priority]
    if missing:
        p.add(
            "priority",
            f"missing replica(s) {', '.join(repr(r) for r in missing)}: list every replica "
            "once, most trusted first",
        )


def _check_cdc(m: ConfigModel, p: _Problems) -> None:
    """The CDC log's streams fit a generation, its replicas fit its ordering, and its
    token ring is well formed."""
    c = m.cdc
    ranges = len(c.token_ring) if c.token_ring is not None else (c.vnodes or 16)
    if ranges * c.shards > CDC_MAX_STREAMS:
        p.add(
            "cdc",
            f"{ranges} token ranges x {c.shards} shards = {ranges * c.shards} streams; a "
            f"generation holds at most {CDC_MAX_STREAMS}",
        )
    if c.enabled and len(m.replicas) > CDC_MAX_REPLICAS:
        p.add("replicas", f"the CDC log orders at most {CDC_MAX_REPLICAS} replicas")
    if c.vnodes is not None and c.token_ring is not None:
        p.add("cdc", "give either vnodes or token_ring, not both")
    if c.token_ring is not None:
        ring = c.token_ring
        if not ring:
            p.add("cdc.token_ring", "an empty ring")
        if sorted(set(ring)) != ring:
            p.add("cdc.token_ring", "range-end tokens must be sorted and distinct")
        if any(not -(2**63) <= t < 2**63 for t in ring):
            p.add("cdc.token_ring", "tokens are signed 64-bit integers")


def parse_config(data: Any, source: str = "cdr.yaml") -> Config:
    """Validate a config mapping; raise :class:`ConfigError` listing every problem."""
    if not isinstance(data, dict):
        raise ConfigError(source, ["(top level): expected a mapping of config keys"])
    try:
        model = ConfigModel.model_validate(data)
    except ValidationError as e:
        raise ConfigError(source, _pydantic_problems(e)) from None
    problems = _Problems()
    config = _resolve(model, problems)
    if problems.items:
        raise ConfigError(source, problems.items)
    return config


def load_config(path: str | Path, store: str | None = None) -> Config:
    """Read and validate ``cdr.yaml``; ``store`` (e.g. from ``--store``) overrides the file's."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError(str(p), [f"(file): cannot read: {e.strerror}"]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(str(p), [f"(file): not valid YAML: {e}"]) from None
    config = parse_config(data, str(p))
    if store:
        config = config.with_store(store)
    if not config.store:
        raise ConfigError(str(p), ["store: missing (give it in the file or with --store)"])
    return config
