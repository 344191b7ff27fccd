"""docs/operations.md#metrics: each published run's metrics, for a monitoring system.

:data:`METRICS` is the one table of them: their names, kinds, labels and help, from which
the Prometheus textfile, the OTLP export and the docs' table are made. Every value comes
from the store, never from the process that publishes:

- the gauges describe each table's **latest published run** (in commit order: a backfill
  of an old date is the latest run once it publishes): its report's counts in the
  ``runs`` table, its conflicts by type, resolver and outcome in ``conflict_stats``;
  ``cdr_run_seconds`` is the stages' seconds of the latest published run of any table;
- the counters add up every published run's own work, from its ``runs`` row (E13): a
  rerun adds what it resolved again, a failed run adds nothing, and since the ``runs``
  table is never pruned (``cdr vacuum`` keeps every row) a counter never goes down, so
  Prometheus' ``increase()`` holds across reruns. What a date holds as published is the
  gauges' and ``conflict_stats``' answer. No label names a run or a date (their number
  would grow without end).

:func:`export` writes them after a publish: the textfile atomically (a temporary file in
the same folder, then a rename: node_exporter never reads half a file), and the OTLP
export through the OpenTelemetry SDK. A failure to send them is logged; the run has
published and stays published.
"""

from __future__ import annotations

import logging
import math
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pipeline.core.columns import RUN_ID
from pipeline.core.config import MetricsConfig
from pipeline.storage.lake import Lake
from pipeline.storage.runs_table import RunRow, read_runs
from pipeline.storage.stats import LOST_WRITES, PATH, REPLACED, RUN_CONFLICTS

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Metric:
    name: str
    kind: Literal["gauge", "counter"]
    labels: tuple[str, ...]
    help: str


#: every metric, in the textfile's order (docs/operations.md#metrics renders this table)
METRICS = (
    Metric("cdr_run_events", "gauge", ("table",), "Distinct events of the table's latest run."),
    Metric(
        "cdr_run_conflicts",
        "gauge",
        ("table", "type", "resolver", "outcome"),
        "Conflicts of the table's latest run, by conflict type, resolver and outcome.",
    ),
    Metric(
        "cdr_run_quarantined",
        "gauge",
        ("table", "reason"),
        "Events the table's latest run quarantined, by reason.",
    ),
    Metric(
        "cdr_quarantine_open",
        "gauge",
        ("table", "reason"),
        "Quarantined events still open after the table's latest run, by reason.",
    ),
    Metric(
        "cdr_divergent_keys",
        "gauge",
        ("table", "replica", "cause"),
        "Keys whose state a replica's perspective would hold differently, by cause.",
    ),
    Metric(
        "cdr_clock_skew_seconds",
        "gauge",
        ("table", "behind", "ahead"),
        "The largest clock skew the latest run saw between two replicas.",
    ),
    Metric(
        "cdr_run_seconds",
        "gauge",
        ("stage",),
        "Seconds each stage of the latest published run took.",
    ),
    Metric(
        "cdr_last_published_timestamp_seconds",
        "gauge",
        ("table",),
        "When the table's latest run published (Unix time).",
    ),
    Metric(
        "cdr_conflicts_total",
        "counter",
        ("table", "type", "resolver", "outcome"),
        "Conflicts resolved by every published run (a rerun adds its own).",
    ),
    Metric(
        "cdr_lost_writes_total",
        "counter",
        ("table",),
        "Writes lost to concurrent conflicts (docs/rules.md#lost-writes) in every published "
        "run (a rerun adds its own).",
    ),
    Metric(
        "cdr_events_total",
        "counter",
        ("table",),
        "Distinct events of every published run (a rerun adds its own).",
    ),
)
BY_NAME = {m.name: m for m in METRICS}
#: the ``cause`` of a divergent key a run of an earlier release counted (before causes)
UNCLASSIFIED = "unclassified"
#: the ``resolver`` label of a conflict without one (a type no resolver decides)
NO_RESOLVER = "none"


@dataclass(frozen=True)
class Sample:
    metric: str  # a name of :data:`METRICS`
    labels: tuple[tuple[str, str], ...]  # in the metric's label order
    value: float


def _sample(metric: str, value: float, **labels: Any) -> Sample:
    m = BY_NAME[metric]
    assert set(labels) == set(m.labels), (metric, labels)
    return Sample(metric, tuple((k, str(labels[k])) for k in m.labels), float(value))


def collect(lake: Lake) -> list[Sample]:
    """Every sample of :data:`METRICS`, from the store's ``runs`` and ``conflict_stats``."""

    runs = read_runs(lake)
    stats = lake.read(PATH)
    rows = stats.to_pylist() if stats is not None else []
    return samples(runs, rows)


def samples(runs: Sequence[RunRow], stats: Iterable[Mapping[str, Any]]) -> list[Sample]:
    """:func:`collect` of the ``runs`` rows (in commit order; only the published count)
    and the rows of ``conflict_stats``."""
    runs = [r for r in runs if r.published]
    latest: dict[str, RunRow] = {}
    for r in runs:
        for table in r.tables():
            latest[table] = r
    stats = list(stats)
    out: list[Sample] = []
    for table, r in sorted(latest.items()):
        out += _latest(table, r, [s for s in stats if s[RUN_ID] == r.run_id])
    if runs:
        for stage, seconds in (runs[-1].counts.get("seconds") or {}).items():
            out.append(_sample("cdr_run_seconds", seconds, stage=stage))
    return out + _counters(runs, stats)


def _latest(table: str, r: RunRow, stats: list[Mapping[str, Any]]) -> list[Sample]:
    """The gauges of ``table`` from its latest published run ``r`` (and that run's
    ``stats`` rows)."""
    s = r.tables()[table]
    out = [_sample("cdr_run_events", s.get("distinct_events", 0), table=table)]
    for row in stats:
        if row["table"] == table and row["kind"] == "conflicts":
            out.append(_conflicts("cdr_run_conflicts", table, row, row["count"]))
    for reason, n in sorted((s.get("quarantined") or {}).items()):
        out.append(_sample("cdr_run_quarantined", n, table=table, reason=reason))
    for reason, n in sorted((s.get("quarantine_open_reasons") or {}).items()):
        out.append(_sample("cdr_quarantine_open", n, table=table, reason=reason))
    for replica, cause, n in _divergent(s):
        out.append(_sample("cdr_divergent_keys", n, table=table, replica=replica, cause=cause))
    for behind, aheads in sorted((s.get("clock_skew") or {}).items()):
        for ahead, seen in sorted(aheads.items()):
            seconds = seen.get("max_seconds", 0)
            out.append(
                _sample("cdr_clock_skew_seconds", seconds, table=table, behind=behind, ahead=ahead)
            )
    finished = r.finished_at.timestamp()
    out.append(_sample("cdr_last_published_timestamp_seconds", finished, table=table))
    return out


def _divergent(s: Mapping[str, Any]) -> list[tuple[str, str, int]]:
    """``(replica, cause, keys)`` of a run's table counts (docs/rules.md#divergence-causes);
    a run of an earlier release counted keys by replica only: ``unclassified``."""
    causes = s.get("divergent_causes") or {}
    out = []
    for replica, n in sorted((s.get("divergent_keys") or {}).items()):
        by_cause = causes.get(replica) or {UNCLASSIFIED: n}
        out += [(replica, cause, k) for cause, k in sorted(by_cause.items())]
    return out


def _counters(runs: Sequence[RunRow], stats: list[Mapping[str, Any]]) -> list[Sample]:
    """The counters: every published run's own work, added once (E13): its ``runs`` row's
    distinct events and lost writes per table, and its conflicts (:func:`_own_conflicts`).
    The ``runs`` table only grows, so they never go down."""
    conflicts: dict[tuple[str, str, str, str], float] = {}
    totals: dict[str, dict[str, float]] = {"events": {}, LOST_WRITES: {}}
    replaced: dict[str, dict[tuple[Any, ...], Any]] = {}
    for r in runs:
        for run_id, *row in r.counts.get(REPLACED) or []:
            replaced.setdefault(run_id, {})[tuple(row[:4])] = row[4]
    for r in runs:
        for table, s in r.tables().items():
            for kind, field in (("events", "distinct_events"), (LOST_WRITES, LOST_WRITES)):
                totals[kind][table] = totals[kind].get(table, 0) + (s.get(field) or 0)
        for (table, ctype, resolver, outcome), n in _own_conflicts(r, stats, replaced).items():
            key = (table, ctype, resolver or NO_RESOLVER, outcome)
            conflicts[key] = conflicts.get(key, 0) + n
    out = []
    for (table, ctype, resolver, outcome), n in sorted(conflicts.items(), key=_text_key):
        row = {"conflict_type": ctype, "resolver": resolver, "outcome": outcome}
        out.append(_conflicts("cdr_conflicts_total", table, row, n))
    for kind, metric in (("events", "cdr_events_total"), (LOST_WRITES, "cdr_lost_writes_total")):
        for table, n in sorted(totals[kind].items()):
            out.append(_sample(metric, n, table=table))
    return out


def _own_conflicts(
    r: RunRow, stats: list[Mapping[str, Any]], replaced: Mapping[str, Mapping[tuple[Any, ...], Any]]
) -> dict[tuple[Any, ...], Any]:
    """(table, type, resolver, outcome) -> count of the conflicts run ``r`` resolved, as
    its ``runs`` row keeps them (``stats.RUN_CONFLICTS``). A row of a release before
    them: its rows in ``conflict_stats``, and those a later published run replaced there
    (``stats.REPLACED``), so that a rerun of its date does not take them out."""
    if RUN_CONFLICTS in r.counts:
        return {tuple(row[:4]): row[4] for row in r.counts[RUN_CONFLICTS]}
    keys = ("table", "conflict_type", "resolver", "outcome")
    mine = [s for s in stats if s[RUN_ID] == r.run_id and s["kind"] == "conflicts"]
    return {**{tuple(s[k] for k in keys): s["count"] for s in mine}, **replaced.get(r.run_id, {})}


def _conflicts(metric: str, table: str, row: Mapping[str, Any], n: float) -> Sample:
    return _sample(
        metric,
        n,
        table=table,
        type=row["conflict_type"],
        resolver=row["resolver"] or NO_RESOLVER,
        outcome=row["outcome"],
    )


def _text_key(item: tuple[tuple[Any, ...], Any]) -> tuple[str, ...]:
    return tuple(str(x or "") for x in item[0])


def _by_metric(got: Sequence[Sample]) -> dict[str, list[Sample]]:
    """The samples of each metric, in their order (a textfile lists them together, under
    the metric's help and type; an OTLP metric observes them together)."""
    out: dict[str, list[Sample]] = {}
    for s in got:
        out.setdefault(s.metric, []).append(s)
    return out


# ---------------------------------------------------------------------- Prometheus


def _label_value(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(int(v)) if v.is_integer() and abs(v) < 2**53 else repr(v)


def textfile(got: Sequence[Sample]) -> str:
    """The samples in Prometheus' text exposition format (node_exporter's textfile
    collector): each metric's ``HELP`` and ``TYPE``, then its samples."""
    lines: list[str] = []
    by_metric = _by_metric(got)
    for m in METRICS:
        lines += [f"# HELP {m.name} {m.help}", f"# TYPE {m.name} {m.kind}"]
        for s in by_metric.get(m.name, []):
            labels = ",".join(f'{k}="{_label_value(v)}"' for k, v in s.labels)
            lines.append(f"{m.name}{{{labels}}} {_number(s.value)}")
    return "\n".join(lines) + "\n"


def write_textfile(path: str | Path, text: str) -> None:
    """``text`` at ``path``, atomically: written beside it, then renamed over it."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)  # node_exporter runs as another user
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# ---------------------------------------------------------------------- OpenTelemetry


def otlp_data(got: Sequence[Sample]) -> Any:
    """The samples as OpenTelemetry's ``MetricsData``, made by the SDK: a
    ``MeterProvider`` whose gauges are observable gauges and whose counters are
    observable counters reporting the store's sums (cumulative: each published run adds
    its own work), collected once by the SDK's in-memory reader."""
    from opentelemetry.metrics import CallbackOptions, Observation
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.resources import Resource

    reader = InMemoryMetricReader()
    provider = MeterProvider(
        metric_readers=[reader], resource=Resource.create({"service.name": "replica-cdr"})
    )
    meter = provider.get_meter("pipeline.publish.metrics")
    by_metric = _by_metric(got)

    def observe(name: str) -> Any:
        def callback(_: CallbackOptions) -> list[Observation]:
            return [Observation(s.value, dict(s.labels)) for s in by_metric.get(name, [])]

        return callback

    for m in METRICS:
        make = (
            meter.create_observable_gauge if m.kind == "gauge" else meter.create_observable_counter
        )
        unit = "s" if m.name.endswith("_seconds") else "1"
        make(m.name, callbacks=[observe(m.name)], unit=unit, description=m.help)
    try:
        return reader.get_metrics_data()
    finally:
        provider.shutdown()


class MetricsNotSent(Exception):
    """The OTLP receiver did not take the metrics."""


def send_otlp(got: Sequence[Sample], endpoint: str) -> None:
    """The samples to an OTLP/HTTP metrics endpoint (protobuf), by the SDK's exporter."""
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics.export import MetricExportResult

    data = otlp_data(got)
    if data is None:  # no sample (a store without a published run): nothing to send
        return
    exporter = OTLPMetricExporter(endpoint=endpoint, timeout=10)
    try:
        result = exporter.export(data)
    finally:
        exporter.shutdown()
    if result is not MetricExportResult.SUCCESS:
        raise MetricsNotSent(f"the receiver at {endpoint} did not take them (see the log above)")


def export(settings: MetricsConfig, lake: Lake) -> None:
    """The store's metrics to where ``settings`` says; nothing when it says nowhere. A
    destination that fails is logged and the other still gets them (the caller logs a
    store that cannot be read)."""
    if settings.prometheus_textfile is None and settings.otlp_endpoint is None:
        return
    got = collect(lake)
    if settings.prometheus_textfile is not None:
        try:
            write_textfile(settings.prometheus_textfile, textfile(got))
            log.info("metrics: %d samples in %s", len(got), settings.prometheus_textfile)
        except OSError as e:
            log.warning("metrics: could not write %s: %s", settings.prometheus_textfile, e)
    if settings.otlp_endpoint is not None:
        try:
            send_otlp(got, settings.otlp_endpoint)
            log.info("metrics: %d samples sent to %s", len(got), settings.otlp_endpoint)
        except Exception as e:  # the run has published: a monitoring outage does not fail it
            log.warning("metrics: could not send them to %s: %s", settings.otlp_endpoint, e)


def metrics_table() -> str:
    """:data:`METRICS` as the Markdown table of docs/operations.md#metrics."""
    lines = ["| metric | type | labels | what |", "|---|---|---|---|"]
    for m in METRICS:
        labels = ", ".join(f"`{label}`" for label in m.labels)
        lines.append(f"| `{m.name}` | {m.kind} | {labels} | {m.help} |")
    return "\n".join(lines) + "\n"
