"""The shape of ``cdr.yaml`` as pydantic models: the keys of each level, their types,
defaults and ranges (docs/configuration.md).

pydantic checks what a key tells alone (a type, a range, a key the file may not have);
what needs several keys (a column a key names, a resolver its conflict type allows) is
checked by :mod:`pipeline.core.config_tables` and :mod:`pipeline.core.config_load` while
they turn a validated :class:`ConfigModel` into the frozen
:class:`pipeline.core.config.Config`. A module of its own so that only loading a config
imports pydantic.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from pipeline.core.config import AlertSeverity, UnknownExportPolicy
from pipeline.core.policy import (
    ConflictType,
    Detection,
    DivergencePolicy,
    FkPolicy,
    Preset,
    Resolver,
    Scope,
    TieBreak,
)
from pipeline.core.sources import SourceLayout


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SourceModel(_Strict):
    """docs/sealing.md: where a CDC tool writes the replica's changes, and in which
    layout (``cdr manifest`` seals a date's export from them)."""

    prefix: str = Field(min_length=1)
    layout: SourceLayout
    format: str | None = None
    options: dict[str, Any] = Field(default_factory=dict)
    tables: dict[str, str] = Field(default_factory=dict)
    pattern: str | None = Field(default=None, min_length=1)
    field: str = Field(default="dt", pattern=r"^[A-Za-z0-9_.-]+$")
    grace_hours: float | None = Field(default=None, ge=0, allow_inf_nan=False)


class ReplicaModel(_Strict):
    id: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    system_id: int = Field(ge=0, lt=2**64)
    source: SourceModel | None = None


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
        """``{price: decimal(10,2)}`` (or ``numeric(10, 2)``, any ``name(p,s)``) in a YAML
        flow mapping, as docs/configuration.md writes it, is split at the comma into
        ``price: "decimal(10"`` and a key ``"2)"`` with no value; put the type back
        together; in a column's own mapping (``{type: numeric(10,2), as: price}``) too."""
        if not isinstance(value, dict):
            return value
        out: dict[Any, Any] = {}
        last = None
        for k, v in value.items():
            if v is None and last is not None and _is_split_tail(k) and _is_split_head(out[last]):
                out[last] = f"{out[last]},{str(k).strip()}"
                continue
            out[k] = _rejoin_column(v) if isinstance(v, dict) else v
            last = k
        return out


#: what a YAML flow mapping leaves of ``numeric(10,2)`` split at its comma: a value
#: ``numeric(10`` (the head) and a key ``2)`` with no value (the tail)
SPLIT_TYPE_HEAD = re.compile(r"[A-Za-z][A-Za-z0-9_ ]*\(\s*\d+\s*")
SPLIT_TYPE_TAIL = re.compile(r"\s*\d+\s*\)")


def _is_split_head(value: Any) -> bool:
    return isinstance(value, str) and SPLIT_TYPE_HEAD.fullmatch(value) is not None


def _is_split_tail(key: Any) -> bool:
    return isinstance(key, str) and SPLIT_TYPE_TAIL.fullmatch(key) is not None


def _rejoin_column(column: dict[Any, Any]) -> dict[Any, Any]:
    """``{type: numeric(10,2), as: x}``: YAML's keys ``type: "numeric(10"`` and ``"2)"``
    rejoined (the split key comes right after the type)."""
    out: dict[Any, Any] = {}
    last = None
    for k, v in column.items():
        if v is None and last == "type" and _is_split_tail(k) and _is_split_head(out["type"]):
            out["type"] = f"{out['type']},{str(k).strip()}"
            continue
        out[k] = v
        last = k
    return out


class CdcModel(_Strict):
    enabled: bool = False
    vnodes: int | None = Field(default=None, ge=1, le=65536)
    token_ring: list[int] | None = None
    shards: int = Field(default=1, ge=1, le=1024)
    sharding_ignore_msb: int = Field(default=12, ge=0, le=63)
    preimage: bool = False
    postimage: bool = False


class MetricsModel(_Strict):
    prometheus_textfile: str | None = Field(default=None, min_length=1)
    otlp_endpoint: str | None = Field(default=None, min_length=1)


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
    on_divergence: DivergencePolicy = DivergencePolicy.WARN
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
