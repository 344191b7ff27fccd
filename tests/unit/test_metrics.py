"""docs/operations.md#metrics without a run: the config keys, the samples made from the
``runs`` rows and ``conflict_stats``, the textfile read back by Prometheus' own parser, and
the OTLP data the OpenTelemetry SDK makes of them (its in-memory reader) and sends (its
exporter, to a receiver on loopback). Whole runs: tests/spark/test_metrics.py."""

from __future__ import annotations

from datetime import UTC, date, datetime
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pipeline.core.config_load import parse_config
from pipeline.core.errors import ConfigError
from pipeline.publish import metrics as M
from pipeline.storage.runs_table import RunRow
from tests.helpers import REPO, configs
from tests.helpers.otlp import otlp_receiver, points

CONFIG = configs.config({"products": configs.products()}, replicas=("A", "B"))


def _row(
    run_id: str,
    dt: date,
    tables: dict,
    seconds: dict | None = None,
    conflicts: list | None = None,
    status: str = "published",
) -> RunRow:
    """A ``runs`` row; ``conflicts``: its own, ``[table, type, resolver, outcome, n]``
    (None: a row of a release before them)."""
    at = datetime(2026, 11, 22, 2, 30, tzinfo=UTC)
    counts = {"tables": tables} | ({"seconds": seconds} if seconds else {})
    counts |= {} if conflicts is None else {"conflicts": conflicts}
    return RunRow(run_id, dt, status, at, at, None, "c" * 64, counts=counts)


def _stats(run_id: str, dt: date, table: str, events: int, conflicts: dict) -> list[dict]:
    rows = [{"run_id": run_id, "dt": dt, "table": table, "kind": "events", "count": events}]
    # docs/rules.md#lost-writes: a tenth of the events lost a write
    rows.append(
        {"run_id": run_id, "dt": dt, "table": table, "kind": "lost_writes", "count": events // 10}
    )
    for (ctype, resolver, outcome), n in conflicts.items():
        rows.append(
            {
                "run_id": run_id,
                "dt": dt,
                "table": table,
                "kind": "conflicts",
                "conflict_type": ctype,
                "resolver": resolver,
                "outcome": outcome,
                "count": n,
            }
        )
    return rows


D1, D2 = date(2026, 11, 20), date(2026, 11, 21)
SUMMARY = {
    "distinct_events": 40,
    "lost_writes": 4,
    "quarantined": {"malformed": 2},
    "quarantine_open_reasons": {"fk_violation": 3, "malformed": 2},
    "divergent_keys": {"B": 3, "C": 1},
    "divergent_causes": {"B": {"missing_events": 2, "apply_order": 1}},  # C: an older run's
    "clock_skew": {"A": {"B": {"events": 4, "max_seconds": 61.5}}},
}


def _store_rows() -> tuple[list[RunRow], list[dict]]:
    """Two dates; D2 run twice (its rerun replaced its stats: only its rows are there).
    D1's run is of a release before the runs rows held their conflicts: its
    ``conflict_stats`` rows count for it."""
    applied = ["products", "update_differ", "apply_remote", "applied"]
    runs = [
        _row("r1", D1, {"products": {"distinct_events": 10, "lost_writes": 1}}),
        _row(
            "r2", D2, {"products": {"distinct_events": 99, "lost_writes": 9}}, None, [[*applied, 7]]
        ),
        _row(
            "r2-again",
            D2,
            {"products": SUMMARY},
            {"ingest": 1.5, "resolve": 9.25},
            [[*applied, 5], ["products", "delete_missing", None, "skipped", 2]],
        ),
    ]
    stats = _stats("r1", D1, "products", 10, {("update_differ", "apply_remote", "applied"): 1})
    stats += _stats(
        "r2-again",
        D2,
        "products",
        40,
        {
            ("update_differ", "apply_remote", "applied"): 5,
            ("delete_missing", None, "skipped"): 2,
        },
    )
    return runs, stats


def _parsed(text: str) -> dict[str, dict[tuple, float]]:
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_the_metric_table_names_what_the_spec_names():
    expected = {
        "cdr_run_events": ("table",),
        "cdr_run_conflicts": ("table", "type", "resolver", "outcome"),
        "cdr_run_quarantined": ("table", "reason"),
        "cdr_quarantine_open": ("table", "reason"),
        "cdr_divergent_keys": ("table", "replica", "cause"),
        "cdr_clock_skew_seconds": ("table", "behind", "ahead"),
        "cdr_run_seconds": ("stage",),
        "cdr_last_published_timestamp_seconds": ("table",),
        "cdr_conflicts_total": ("table", "type", "resolver", "outcome"),
        "cdr_events_total": ("table",),
        "cdr_lost_writes_total": ("table",),
    }
    assert {m.name: m.labels for m in M.METRICS} == expected
    assert {m.name for m in M.METRICS if m.kind == "counter"} == {
        "cdr_conflicts_total",
        "cdr_events_total",
        "cdr_lost_writes_total",
    }
    assert not any(set(m.labels) & {"run_id", "dt", "date"} for m in M.METRICS)


def test_the_textfile_reads_back_with_prometheus_parser():
    runs, stats = _store_rows()
    got = _parsed(M.textfile(M.samples(runs, stats)))
    t = (("table", "products"),)
    assert got["cdr_run_events"] == {t: 40}  # the latest run's, not D1's nor the first D2's
    assert got["cdr_run_conflicts"] == {
        (("outcome", "applied"), ("resolver", "apply_remote"), *t, ("type", "update_differ")): 5,
        (("outcome", "skipped"), ("resolver", "none"), *t, ("type", "delete_missing")): 2,
    }
    assert got["cdr_run_quarantined"] == {(("reason", "malformed"), *t): 2}
    assert got["cdr_quarantine_open"] == {
        (("reason", "fk_violation"), *t): 3,
        (("reason", "malformed"), *t): 2,
    }
    assert got["cdr_divergent_keys"] == {
        (("cause", "apply_order"), ("replica", "B"), *t): 1,
        (("cause", "missing_events"), ("replica", "B"), *t): 2,
        (("cause", "unclassified"), ("replica", "C"), *t): 1,
    }
    assert got["cdr_clock_skew_seconds"] == {(("ahead", "B"), ("behind", "A"), *t): 61.5}
    assert got["cdr_run_seconds"] == {(("stage", "ingest"),): 1.5, (("stage", "resolve"),): 9.25}
    assert got["cdr_last_published_timestamp_seconds"] == {t: runs[-1].finished_at.timestamp()}
    # the counters: every published run's own, D2's first run too (the parser names a
    # counter's sample with its _total)
    assert got["cdr_events_total"] == {t: 10 + 99 + 40}
    assert got["cdr_lost_writes_total"] == {t: 1 + 9 + 4}
    applied = (("outcome", "applied"), ("resolver", "apply_remote"), *t, ("type", "update_differ"))
    assert got["cdr_conflicts_total"][applied] == 1 + 7 + 5
    skipped = (("outcome", "skipped"), ("resolver", "none"), *t, ("type", "delete_missing"))
    assert got["cdr_conflicts_total"][skipped] == 2


def test_label_values_are_escaped():
    rows = [_row("r", D1, {"a": {"quarantined": {'odd "reason"\\\n': 1}}})]
    got = _parsed(M.textfile(M.samples(rows, [])))
    assert got["cdr_run_quarantined"] == {(("reason", 'odd "reason"\\\n'), ("table", "a")): 1}


def test_a_store_without_runs_gives_the_help_lines_only():
    text = M.textfile(M.samples([], []))
    assert [f.name for f in text_string_to_metric_families(text)] == [
        m.name.removesuffix("_total") for m in M.METRICS
    ]
    assert all(not f.samples for f in text_string_to_metric_families(text))


def test_the_textfile_is_replaced_whole(tmp_path: Path):
    path = tmp_path / "textfile" / "cdr.prom"
    M.write_textfile(path, "first\n")
    M.write_textfile(path, "second\n")
    assert path.read_text() == "second\n"
    assert [p.name for p in path.parent.iterdir()] == ["cdr.prom"]  # no temporary file left
    assert oct(path.stat().st_mode & 0o777) == "0o644"


def test_the_sdk_makes_gauges_and_cumulative_counters():
    from opentelemetry.sdk.metrics.export import AggregationTemporality, Gauge, Sum

    runs, stats = _store_rows()
    data = M.otlp_data(M.samples(runs, stats))
    (resource,) = data.resource_metrics
    assert resource.resource.attributes["service.name"] == "replica-cdr"
    (scope,) = resource.scope_metrics
    by_name = {m.name: m for m in scope.metrics}
    assert set(by_name) == {m.name for m in M.METRICS}
    events = by_name["cdr_events_total"].data
    assert isinstance(events, Sum) and events.is_monotonic
    assert events.aggregation_temporality is AggregationTemporality.CUMULATIVE
    assert [(dict(p.attributes), p.value) for p in events.data_points] == [
        ({"table": "products"}, 149)
    ]
    skew = by_name["cdr_clock_skew_seconds"]
    assert isinstance(skew.data, Gauge) and skew.unit == "s"
    (point,) = skew.data.data_points
    assert dict(point.attributes) == {"table": "products", "behind": "A", "ahead": "B"}
    assert point.value == 61.5


@pytest.fixture
def receiver():
    with otlp_receiver() as got:
        yield got


def test_the_exporter_sends_them_to_an_otlp_receiver(receiver):
    runs, stats = _store_rows()
    M.send_otlp(M.samples(runs, stats), receiver.url)
    (_,) = receiver.bodies
    metrics = receiver.metrics()
    assert set(metrics) == {m.name for m in M.METRICS}
    total = metrics["cdr_conflicts_total"]
    assert total.sum.is_monotonic
    key = (("table", "products"), ("type", "update_differ"), ("resolver", "apply_remote"))
    assert points(total)[(*key, ("outcome", "applied"))] == 13
    assert points(metrics["cdr_run_events"]) == {(("table", "products"),): 40}


def test_a_receiver_that_refuses_them_is_named(receiver):
    receiver.status = 400
    with pytest.raises(M.MetricsNotSent, match=r"127\.0\.0\.1"):
        M.send_otlp(M.samples(*_store_rows()), receiver.url)
    assert len(receiver.bodies) == 1  # it was asked, and said no
    M.send_otlp([], receiver.url)  # no sample: nothing to send
    assert len(receiver.bodies) == 1


@pytest.mark.parametrize(
    ("metrics", "problem"),
    [
        ({"prometheus_textfile": "/var/lib/cdr.txt"}, r"metrics\.prometheus_textfile: .*\.prom"),
        ({"prometheus_textfile": "s3://b/cdr.prom"}, r"metrics\.prometheus_textfile: .*local"),
        ({"otlp_endpoint": "collector:4318"}, r"metrics\.otlp_endpoint: .*http://"),
        ({"pushgateway": "x"}, r"metrics\.pushgateway: unknown key"),
    ],
)
def test_the_metrics_keys_are_checked_at_load(metrics, problem):
    with pytest.raises(ConfigError, match=problem):
        parse_config({**CONFIG, "metrics": metrics})


def test_where_metrics_go_is_no_part_of_a_runs_result():
    plain = parse_config(CONFIG)
    sent = parse_config(
        {
            **CONFIG,
            "metrics": {
                "prometheus_textfile": "/var/lib/node_exporter/textfile/cdr.prom",
                "otlp_endpoint": "http://c:4318/v1/metrics",
            },
        }
    )
    assert sent.metrics.prometheus_textfile == "/var/lib/node_exporter/textfile/cdr.prom"
    assert sent.digest() == plain.digest()  # a rerun with them set is the same run


def test_the_operations_page_shows_the_metric_table():
    """docs/operations.md#metrics shows :data:`METRICS`: edit the table there, then paste
    ``metrics_table()`` between the page's markers."""
    page = (REPO / "docs" / "operations.md").read_text()
    shown = page.split("<!-- metrics:begin -->\n")[1].split("<!-- metrics:end -->")[0]
    assert shown == M.metrics_table()
