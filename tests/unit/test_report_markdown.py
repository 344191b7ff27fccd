"""``cdr report``'s Markdown summary, rendered from a run report
(pipeline/app/report_markdown.py): the sections in the order a person asks, counts with
thousands separators, times as RFC 3339."""

from __future__ import annotations

from pipeline.app.report_markdown import Summarised, instant, summary_markdown
from pipeline.core.report import RunReport

REPORT = {
    "run_id": "2026-11-21_r1",
    "dt": "2026-11-21",
    "status": "published",
    "started": "2026-11-22T03:00:00.123456+02:00",
    "now_us": 1_795_305_600_000_000,
    "warnings": ["convergence.orders/no_divergent_keys failed:\n 3 keys"],
    "tables": {
        "orders": {
            "distinct_events": 3375,
            "applied": 3000,
            "conflicts": {
                "insert_exists": {"converted_to_update": 12},
                "update_differ": {"apply_remote": 1500, "skip": 392},
            },
            "concurrency": {"concurrent": 40, "sequential": 1864},
            "lost_writes": 38,
            "quarantined": {"malformed": 1, "fk_violation": 4},
            "quarantine_open": 4,
            "divergent_keys": {"us-east": 3, "eu-west": 0},
            "divergent_causes": {"us-east": {"missing_events": 1, "apply_order": 2}},
            "snapshot_divergent_keys": {"eu-west": 2},
        },
        "products": {"distinct_events": 10, "applied": 10},
    },
    "alerts": {
        "orders": {
            "alert": "conflict_rate",
            "severity": "warn",
            "rate": 0.56,
            "factor": 3,
            "median_rate": 0.02,
            "runs": 7,
        }
    },
    "seconds": {"ingest": 1.5, "resolve": 1200.2},
}
KEYS = {"orders": {"*": 1140, "update_differ": 1130, "insert_exists": 12}}
LINKS = (("the run report", "file:///s/published/reports/dt=2026-11-21/run=r1/run_report.json"),)

EXPECTED = """\
# Run of 2026-11-21: published

run `2026-11-21_r1`, started 2026-11-22T01:00:00Z, its clock 2026-11-22T00:00:00Z, took 1,202 s.

## Writes lost

**38 writes lost** in 40 concurrent conflicts (each side wrote without having seen the other's write):

| table | concurrent | sequential | unknown | n/a | writes lost |
| --- | --: | --: | --: | --: | --: |
| orders | 40 | 1,864 | 0 | 0 | 38 |

## Conflicts by PostgreSQL's origin rule

**1,904 conflicts on 1,140 keys** among 3,385 events in 2 table(s), resolved:

| table | conflict type | conflicts | keys | resolved as |
| --- | --- | --: | --: | --- |
| orders | update_differ | 1,892 | 1,130 | apply_remote 1,500, skip 392 |
| orders | insert_exists | 12 | 12 | converted_to_update 12 |

## Quarantine

**5 events quarantined** (4 still open after the run), by reason:

| table | reason | events |
| --- | --- | --: |
| orders | fk_violation | 4 |
| orders | malformed | 1 |

## Divergence

**3 divergent keys** in the replicas' own orders, 2 in their snapshot exports:

| table | replica | source | causes | keys |
| --- | --- | --- | --- | --: |
| orders | us-east | own order | apply_order 2, missing_events 1 | 3 |
| orders | eu-west | snapshot | unclassified 2 | 2 |

## Alerts

- orders conflict_rate (warn): 0.56 conflicts per event, over 3x the median 0.02 of 7 runs

1 warning(s):
- convergence.orders/no_divergent_keys failed: 3 keys

## Where to look

- the run report: <file:///s/published/reports/dt=2026-11-21/run=r1/run_report.json>
"""


def test_the_summary_leads_with_writes_lost_conflicts_quarantine_divergence_alerts_links():
    got = summary_markdown(RunReport.from_dict(REPORT), Summarised(KEYS, LINKS))
    assert got == EXPECTED


def test_a_quiet_night_says_so_in_each_section():
    quiet = {**REPORT, "tables": {"t": {"distinct_events": 2_000_000}}, "alerts": {}}
    got = summary_markdown(RunReport.from_dict({**quiet, "warnings": []}))
    assert "**0 conflicts** among 2,000,000 events in 1 table(s): nothing to resolve." in got
    assert "**0 events quarantined**." in got
    assert "**0 divergent keys** in the replicas' own orders: every replica converges." in got
    assert "No alert fired." in got and "warning" not in got
    assert "Where to look" not in got  # no links given


def test_without_the_conflict_log_the_keys_are_not_counted():
    got = summary_markdown(RunReport.from_dict(REPORT))
    assert "**1,904 conflicts** among 3,385 events" in got
    assert "| orders | update_differ | 1,892 |  | apply_remote 1,500, skip 392 |" in got


def test_a_failed_run_names_its_failures_and_many_warnings_are_cut():
    failed = {
        **REPORT,
        "status": "failed",
        "failures": ["x" * 400],
        "warnings": [f"w{i}" for i in range(8)],
        "alerts": {"orders": {"rate": 3}},  # a hand-written report's alert: as it is
    }
    got = summary_markdown(RunReport.from_dict(failed))
    assert got.startswith("# Run of 2026-11-21: failed\n")
    assert f"- **failed:** {'x' * 299}…\n" in got
    assert "8 warning(s):\n- w0\n- w1\n- w2\n- w3\n- w4\n- and 3 more in the run report" in got
    assert "- orders: {'rate': 3}" in got


def test_an_instant_is_rfc_3339_in_utc_to_the_second():
    assert instant("2026-11-22T03:00:00.5+02:00") == "2026-11-22T01:00:00Z"
    assert instant("2026-11-22T01:00:00") == "2026-11-22T01:00:00Z"  # naive: UTC
    assert instant("yesterday") == "yesterday"
