"""The run report as ``cdr run`` prints it: every section, from one report."""

from __future__ import annotations

from pipeline.app.report_text import format_report
from pipeline.core.report import RunReport

REPORT = {
    "run_id": "r1",
    "dt": "2026-11-21",
    "status": "failed",
    "tables": {
        "orders": {
            "events": 7,
            "distinct_events": 5,
            "applied": 3,
            "discarded": 1,
            "errored": 1,
            "quarantined": {"malformed": 1},
            "conflicts": {"update_differ": {"apply_remote": 2, "skip": 1}},
            "concurrency": {"concurrent": 1, "sequential": 2},
            "lost_writes": 1,
            "divergent_keys": {"pub": 1},
            "snapshot_divergent_keys": {"sub": 2},
            "orphans": 0,
            "rows": 4,
            "duplicates": 2,
        },
        "products": {
            "events": 2,
            "distinct_events": 2,
            "applied": 2,
            "discarded": 0,
            "quarantined": {},
            "conflicts": {},
            "divergent_keys": {},
            "orphans": 1,
        },
    },
    "validation": {"suites": {"snapshot.orders": True, "convergence.orders": False}},
    "cdc": {
        "tables": {"orders": {"log_rows": 6}},
        "generation": 0,
        "streams": 64,
        "new_generation": True,
    },
    "warnings": ["w1"],
    "failures": ["f1"],
}

# discarded counts the errored event; conflicts sum the outcomes; a table whose summary
# has no rows (an older report's) has 0; a replica with only a snapshot divergence is listed
EXPECTED = """\
run r1 for 2026-11-21: FAILED

table     events  distinct  lost  concurrent  conflicts  applied  discarded  quarantined  divergent  orphans  rows
--------  ------  --------  ----  ----------  ---------  -------  ---------  -----------  ---------  -------  ----
orders         7         5     1           1          3        3          2            1          1        0     4
products       2         2     0           0          0        2          0            0          0        1     0

conflicts by what the writers had seen:
table        label  count
------  ----------  -----
orders  concurrent      1
orders  sequential      2

conflicts by type and outcome (origin rule):
table   conflict type       outcome  count
------  -------------  ------------  -----
orders  update_differ  apply_remote      2
orders  update_differ          skip      1

quarantined:
table   quarantine reason  count
------  -----------------  -----
orders          malformed      1

duplicates (resolved on an earlier night, not again):
table   events
------  ------
orders       2

divergent keys by replica:
table   replica  perspective  snapshot
------  -------  -----------  --------
orders      pub            1         -
orders      sub            0         2

validation: 2 suite(s), 1 failed: convergence.orders

CDC log rows: orders 6; generation of 1970-01-01T00:00:00Z (64 streams, new)
warning: w1
FAILED: f1
"""


def test_the_report_prints_every_section():
    assert format_report(RunReport.from_dict(REPORT)) == EXPECTED.rstrip("\n")


def test_a_passed_run_without_breakdowns_prints_its_counts_only():
    d = {**REPORT, "status": "published", "warnings": [], "failures": []}
    d["tables"] = {"products": REPORT["tables"]["products"]}
    del d["validation"], d["cdc"]
    report = RunReport.from_dict(d)
    assert format_report(report).splitlines()[0] == "run r1 for 2026-11-21: PUBLISHED"
    assert len(format_report(report).splitlines()) == 5
