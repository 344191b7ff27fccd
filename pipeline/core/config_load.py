"""Reading ``cdr.yaml`` into a :class:`~pipeline.core.config.Config`: :func:`load_config`
(a file) and :func:`parse_config` (a mapping already read), with the checks that span the
file (docs/configuration.md).

Loading collects *every* mistake and reports them together, each with its path in the
file (``tables.orders.foreign_keys[0].references: no table 'product'``): the file's shape
first (pydantic, :mod:`pipeline.core.config_file`), then each table
(:mod:`pipeline.core.config_tables`), then what spans them (replicas, priority,
foreign-key types, retry, CDC, metrics, the schedule). Of the config's modules, only
this one reads YAML.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from pipeline.core import layout
from pipeline.core.config import (
    CdcConfig,
    Config,
    ConflictRateAlert,
    MetricsConfig,
    QuarantineShare,
    Replica,
    Table,
    WaitConfig,
)
from pipeline.core.config_file import SPLIT_TYPE_HEAD, SPLIT_TYPE_TAIL, ConfigModel, MetricsModel
from pipeline.core.config_sources import resolve_sources
from pipeline.core.config_tables import Problems, resolve_table
from pipeline.core.errors import ConfigError
from pipeline.core.policy import REPAIR_ORIGIN, FkPolicy, Granularity, Resolver

#: a CDC generation holds at most this many streams (ranges x shards): building and
#: looking them up stays cheap (a real cluster has tens of thousands)
CDC_MAX_STREAMS = 2**20
#: ``cdc$time`` keeps a replica's tie rank in 9 bits (``pipeline.changes.cdc``)
CDC_MAX_REPLICAS = 500


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


def _check_top_level_nulls(m: ConfigModel, p: Problems) -> None:
    """The top-level ``ignore_null_updates`` list names value columns of the tables."""
    if not isinstance(m.ignore_null_updates, list):
        return
    if not m.ignore_null_updates:
        p.add("ignore_null_updates", "an empty list (false, or leave it out, ignores no null)")
    for i, c in enumerate(m.ignore_null_updates):
        if not any(c in t.columns and c not in t.key for t in m.tables.values()):
            p.add(f"ignore_null_updates[{i}]", f"no table has a value column {c!r}")


def _check_replicas(m: ConfigModel, p: Problems) -> None:
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


def _resolve(m: ConfigModel, p: Problems) -> Config:
    _check_replicas(m, p)
    if m.store is not None and not re.match(r"^(s3://[^/]+|file:///)", m.store):
        p.add("store", f"{m.store!r} is neither s3://BUCKET[/PREFIX] nor file:///PATH")
    tables: dict[str, Table] = {}
    for name, t in m.tables.items():
        _check_table_name(name, p)
        resolved = resolve_table(name, t, m, p)
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


def _check_table_name(name: str, p: Problems) -> None:
    """A table's name names its folders: ``published/<table>/`` beside the store's own."""
    if not re.match(r"^[A-Za-z][A-Za-z0-9_]*$", name):
        why = "a table name is letters, digits and _, and starts with a letter (it names folders)"
        p.add(f"tables.{name}", why)
    elif name in layout.OWN_NAMES:
        own = ", ".join(sorted(layout.OWN_NAMES))
        p.add(f"tables.{name}", f"{name!r} is a folder of the store's own ({own}): rename it")


def _check_metrics(m: MetricsModel, p: Problems) -> None:
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


def _check_foreign_key_types(tables: Mapping[str, Table], p: Problems) -> None:
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


def _check_retry(m: ConfigModel, tables: Mapping[str, Table], p: Problems) -> dict[str, int]:
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


def _check_priority(m: ConfigModel, tables: Mapping[str, Table], p: Problems) -> None:
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


def _check_cdc(m: ConfigModel, p: Problems) -> None:
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
    problems = Problems()
    config = replace(_resolve(model, problems), sources=resolve_sources(model, problems))
    if problems.items:
        raise ConfigError(source, problems.items)
    return config


class _ConfigLoader(yaml.SafeLoader):
    """YAML's safe loader, but a flow mapping's ``numeric(10,2)``, which YAML splits at the
    comma into a value ``numeric(10`` and a key ``2)`` with no value, is one value again
    before the mapping is built: two such columns in one mapping would otherwise share the
    key ``2)``, and one of them lose its scale (docs/configuration.md#postgresql-type-names;
    ``TableModel._rejoin_decimal`` does the same for a mapping already read)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        node.value = _rejoined(node.value)
        return super().construct_mapping(node, deep)


def _rejoined(pairs: list[tuple[yaml.Node, yaml.Node]]) -> list[tuple[yaml.Node, yaml.Node]]:
    out: list[tuple[yaml.Node, yaml.Node]] = []
    for k, v in pairs:
        if out and _is_tail(k, v) and _is_head(out[-1][1]):
            key, head = out[-1]
            joined = f"{head.value},{str(k.value).strip()}"
            out[-1] = (key, yaml.ScalarNode(head.tag, joined, head.start_mark, k.end_mark))
            continue
        out.append((k, v))
    return out


def _is_head(node: yaml.Node) -> bool:
    return (
        isinstance(node, yaml.ScalarNode)
        and node.style is None
        and SPLIT_TYPE_HEAD.fullmatch(node.value) is not None
    )


def _is_tail(key: yaml.Node, value: yaml.Node) -> bool:
    return (
        isinstance(key, yaml.ScalarNode)
        and key.style is None
        and SPLIT_TYPE_TAIL.fullmatch(key.value) is not None
        and isinstance(value, yaml.ScalarNode)
        and value.tag == "tag:yaml.org,2002:null"
        and value.value == ""
    )


#: the environment variable the DAGs take the config's path from (docs/airflow.md#settings)
CONFIG_ENV = "CDR_CONFIG"


def dag_config_path(dags: Path) -> Path:
    """The config the DAGs of the folder ``dags`` run with: ``$CDR_CONFIG``, else
    ``cdr.yaml`` beside that folder."""
    return Path(os.environ.get(CONFIG_ENV) or dags.parent / "cdr.yaml")


def load_dag_config(dags: Path) -> Config:
    """:func:`load_config` of :func:`dag_config_path`; a file that is not there is an
    error that says what to set (a DAG has no ``--config``)."""
    path = dag_config_path(dags)
    if not path.exists():
        where = (
            f"{CONFIG_ENV}={path}: no such file"
            if os.environ.get(CONFIG_ENV)
            else f"{CONFIG_ENV} is not set and there is no {path}"
        )
        fix = f"set {CONFIG_ENV} to the path of cdr.yaml (docs/airflow.md#settings)"
        raise ConfigError(str(path), [f"{where}; {fix}, in the Airflow services' environment"])
    return load_config(path)


def load_config(path: str | Path, store: str | None = None) -> Config:
    """Read and validate ``cdr.yaml``; ``store`` (e.g. from ``--store``) overrides the file's."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        hint = "pass --config FILE, or write one from a database: `cdr init --from-postgres DSN`"
        raise ConfigError(str(p), [f"(file): no such file in {Path.cwd()}; {hint}"]) from None
    except OSError as e:
        raise ConfigError(str(p), [f"(file): cannot read: {e.strerror}"]) from None
    try:
        data = yaml.load(text, Loader=_ConfigLoader)
    except yaml.YAMLError as e:
        raise ConfigError(str(p), [f"(file): not valid YAML: {e}"]) from None
    config = parse_config(data, str(p))
    if store:
        config = config.with_store(store)
    if not config.store:
        raise ConfigError(str(p), ["store: missing (give it in the file or with --store)"])
    return config
