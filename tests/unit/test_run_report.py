"""The typed run report (``pipeline.core.report``, docs/outputs.md#the-run-report): the JSON
it writes is the one publish wrote before it was typed, it reads back equal, it reads the
reports of earlier releases, every field is in its JSON, and a table's headline counts
are the same ``TableTotals`` in the text report, the asset events, the ``runs`` row and
the Conflicts page."""

from __future__ import annotations

import dataclasses
import json
from datetime import date
from pathlib import Path

import pytest

from pipeline.app.dag_notes import ASSET_COUNTS, table_extras
from pipeline.app.report_text import COUNTS, format_report
from pipeline.app.runs import list_reports, render_page, table_runs
from pipeline.core.report import ReportValidation, RunReport, Status
from pipeline.core.summary import (
    CdcSection,
    CdcTable,
    MalformedReport,
    RunSummary,
    Stopped,
    TableSummary,
    TableTotals,
)
from pipeline.publish.commit import run_row
from pipeline.stages import run_report
from pipeline.storage.context import RunContext
from pipeline.storage.store import FileStore
from pipeline.validate.stage import Verdict
from tests.helpers import REPO
from tests.helpers.fold_helpers import make_config

STOP = Stopped("orders", '{"id":1}', "insert_exists", "e7", "resolver error")
#: a value other than its default in every field (test_every_field_is_in_the_json)
ORDERS = TableSummary(
    policy="postgres",
    events=9,
    distinct_events=7,
    applied=3,
    discarded=1,
    duplicates=2,
    differing_copies=1,
    changed_copies=1,
    errored=1,
    not_reached=1,
    quarantined={"malformed": 1, "fk_violation": 2},
    conflicts={"update_differ": {"apply_remote": 2, "skip": 1}, "insert_exists": {"applied": 4}},
    divergent_keys={"pub": 1, "sub": 2},
    replicas={"pub": {"records": 5, "applied": 3}},
    missing_exports=["sub"],
    late_exports=["pub 2026-11-20"],
    prior="2026-11-20",
    prior_run_id="2026-11-20_run",
    start="the state of 2026-11-20",
    stopped=STOP,
    orphans=1,
    rows=4,
    state_rows=5,
    snapshot_divergent_keys={"sub": 6},
    history={"rows": 3, "new": 1, "late": 0},
    clock_skew={"pub": {"sub": {"events": 2, "max_seconds": 400.0}}},
    retried={"applied": 1},
    quarantine_open=2,
    quarantine_open_reasons={"fk_violation": 2},
    decisions={"d-000000000001": "applied"},
    divergent_causes={"pub": {"missing_events": 1, "apply_order": 1}},
    snapshot_divergent_causes={"pub": {"schema": 1}},
    repaired=2,
    arrived_late={"pub": 1},
    concurrency={"concurrent": 2, "sequential": 4, "n/a": 1},
    lost_writes=2,
    asymmetric={"python:acme.cdr:prefer": 1},
    ledger_digests=True,
)
CDC = CdcSection(
    generation=5,
    new_generation=True,
    generations=2,
    streams=64,
    warning="the topology change waits",
    tables={"orders": CdcTable(log_rows=6)},
)
VALIDATION = ReportValidation(
    results="published/reports/dt=2026-11-21/run=r1/validation/results.json",
    data_docs="published/reports/dt=2026-11-21/run=r1/validation/data_docs/index.html",
    suites={"snapshot.orders": True, "convergence.orders": False},
    data_docs_files={"index.html": "ab" * 32},
)
REPORT = RunReport(
    run_id="r1",
    dt="2026-11-21",
    status=Status.FAILED,
    started="2026-11-22T01:00:00+00:00",
    now_us=1_795_305_600_000_000,
    store="file:///fixture/store",
    failures=("convergence.orders: 2 divergent keys",),
    warnings=("w1",),
    tables={"orders": ORDERS, "products": TableSummary(policy="scylla", events=2, rows=2)},
    validation=VALIDATION,
    cdc=CDC,
    versions={"published/orders/snapshot": 3, "published/runs": 7},
    alerts={"orders": {"alert": "conflict_rate", "severity": "fail", "rate": 0.5}},
    seconds={"ingest": 1.25, "resolve": 30.5},
)


def test_a_report_reads_back_equal_through_its_json():
    text = REPORT.to_json()
    assert json.loads(text) == REPORT.to_dict()
    back = RunReport.from_json(text)
    assert back == REPORT
    assert back.status is Status.FAILED and back.tables["orders"].stopped == STOP
    assert type(REPORT.to_dict()["status"]) is str  # plain JSON, not the enum


def test_the_json_is_the_one_publish_wrote_before_the_report_was_typed(tmp_path: Path):
    """``stages.run_report`` then publish's additions give the keys, order and values of
    the dict the stages built by hand."""
    config = make_config(store="file:///fixture/store")
    ctx = RunContext.create(tmp_path, date(2026, 11, 21), 1_795_305_600_000_000, "r1")
    summary = RunSummary("r1", "x", "2026-11-21", ctx.now_us, {"orders": ORDERS}, CDC)
    suites = {"snapshot.orders": {"success": True}, "convergence.orders": {"success": False}}
    verdict = Verdict(["f1"], ["w1"], suites)
    dry = run_report(config, ctx, summary, verdict, Status.DRY_RUN)
    skew = (
        "table orders: the clock of replica pub runs behind sub's by 400.0 s at least (2 "
        "event(s) saw a version of sub stamped later than themselves; "
        f"max_clock_skew_seconds: {config.max_clock_skew_seconds})"
    )
    asymmetric = (
        "table orders: python:acme.cdr:prefer answered another row with the sides swapped in 1 "
        "conflict(s): replicas converge only if it gives the same row whichever side is local"
    )
    validation = "published/reports/dt=2026-11-21/run=r1/validation"
    expected = {
        "run_id": "r1",
        "dt": "2026-11-21",
        "started": ctx.started,
        "now_us": 1_795_305_600_000_000,
        "store": "file:///fixture/store",
        "status": "dry_run",
        "failures": ["f1"],
        "warnings": ["w1", skew, asymmetric],
        "tables": {"orders": dataclasses.asdict(ORDERS)},
        "validation": {
            "results": f"{validation}/results.json",
            "data_docs": f"{validation}/data_docs/index.html",
            "suites": {"snapshot.orders": True, "convergence.orders": False},
        },
        "cdc": dataclasses.asdict(CDC),
    }
    assert json.loads(dry.to_json()) == expected
    assert list(dry.to_dict()) == list(expected)
    assert list(dry.to_dict()["tables"]["orders"]) == list(dataclasses.asdict(ORDERS))
    # publish: the Data Docs files after the suites, the versions last
    published = dataclasses.replace(
        dry,
        status=Status.PUBLISHED,
        validation=dataclasses.replace(dry.validation, data_docs_files={"index.html": "cd"}),
        versions={"published/orders/snapshot": 3},
    )
    d = published.to_dict()
    assert list(d) == [*expected, "versions"] and d["versions"] == {"published/orders/snapshot": 3}
    assert list(d["validation"]) == ["results", "data_docs", "suites", "data_docs_files"]
    without_cdc = dataclasses.replace(dry, cdc=None, now_us=None)
    assert "cdc" not in without_cdc.to_dict() and "now_us" not in without_cdc.to_dict()


@pytest.mark.parametrize(
    "instance",
    [REPORT, VALIDATION, CDC, ORDERS],
    ids=["RunReport", "ReportValidation", "CdcSection", "TableSummary"],
)
def test_every_field_is_in_the_json(instance):
    """A field added to a report type must reach its JSON and come back from it: each
    instance here sets every field to another value than its default."""
    cls = type(instance)
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            continue
        assert getattr(instance, f.name) != default, f"set {cls.__name__}.{f.name} here"
    d = instance.to_dict()
    assert set(d) == {f.name for f in dataclasses.fields(cls)}
    assert cls.from_dict(json.loads(json.dumps(d))) == instance


FIXTURES = REPO / "tests" / "fixtures"


@pytest.mark.parametrize(
    "path",
    [
        "store-before-stable-ids/store/published/reports/dt=2026-11-21/run_report.json",
        "store-before-delta-spark/store/published/reports/dt=2026-11-21/run_report.json",
    ],
)
def test_a_report_of_an_earlier_release_reads_with_defaults(path: str):
    """Reports an earlier release wrote (the fixtures' stores): the keys added since
    (``changed_copies``, ``ledger_digests``, ``asymmetric``, ``quarantine_open_reasons``,
    ``decisions``, ``divergent_causes``, ``snapshot_divergent_causes``, ``repaired``,
    ``arrived_late``, ``prior_run_id``; ``data_docs_files``; ``alerts``, ``seconds``) take
    their defaults."""
    raw = json.loads((FIXTURES / path).read_text())
    report = RunReport.from_dict(raw)
    assert (report.run_id, report.dt, report.status) == (raw["run_id"], raw["dt"], "published")
    assert report.published and report.versions == raw["versions"]
    assert report.validation.suites == raw["validation"]["suites"]
    for name, s in report.tables.items():
        assert "changed_copies" not in raw["tables"][name]
        assert (s.changed_copies, s.ledger_digests) == (0, False)
        added = {
            "changed_copies": 0,
            "ledger_digests": False,
            "asymmetric": {},
            "quarantine_open_reasons": {},
            "decisions": {},
            "divergent_causes": {},
            "snapshot_divergent_causes": {},
            "repaired": 0,
            "arrived_late": {},
            "prior_run_id": None,
            "concurrency": {},
            "lost_writes": 0,
        }
        assert s.to_dict() == {**raw["tables"][name], **added}
    assert (report.alerts, report.seconds) == ({}, {})
    assert (report.cdc is None) == ("cdc" not in raw)
    if report.cdc is not None:
        assert report.cdc.to_dict() == raw["cdc"]
    files = raw["validation"].get("data_docs_files")
    assert report.validation.data_docs_files == files


def test_missing_keys_default_and_unknown_keys_are_ignored():
    old = {
        "run_id": "r0",
        "dt": "2026-11-01",
        "status": "published",
        "tables": {"t": {"events": 3, "applied": 3, "from_a_later_release": {"x": 1}}},
        "validation": {"suites": {"snapshot.t": True}, "later": 1},
        "cdc": {"generation": 0, "streams": 8, "tables": {"t": {"log_rows": 3, "later": 2}}},
        "later_section": {"anything": True},
    }
    report = RunReport.from_dict(old)
    assert report.tables["t"] == TableSummary(events=3, applied=3)
    assert report.validation == ReportValidation(suites={"snapshot.t": True})
    assert report.cdc == CdcSection(streams=8, tables={"t": CdcTable(3)})
    assert (report.now_us, report.failures, report.versions) == (None, (), None)
    assert TableSummary.from_dict({"rows": 2, "later": 1}) == TableSummary(rows=2)
    stopped = {**dataclasses.asdict(STOP), "later": 1}
    assert TableSummary.from_dict({"stopped": stopped}).stopped == STOP
    with pytest.raises(TypeError, match="later"):  # the summary a stage saved: refused
        TableSummary.from_dict({"rows": 2, "later": 1}, strict=True)


@pytest.mark.parametrize(
    "bad, says",
    [
        ([1, 2], "not a JSON object"),
        ({"dt": "2026-11-01", "status": "failed"}, "no run_id"),
        ({"run_id": "r", "dt": "d", "status": "x", "tables": ["t"]}, "not a mapping of tables"),
        ({"run_id": "r", "dt": "d", "status": "x", "tables": {"t": [1]}}, "mapping of tables"),
        ({"run_id": "r", "dt": "d", "status": "x", "tables": {"t": {"stopped": 1}}}, "stopped"),
        (
            {"run_id": "r", "dt": "d", "status": "x", "tables": {"t": {"stopped": {"key": 1}}}},
            "lacks",
        ),
        ({"run_id": "r", "dt": "d", "status": "x", "validation": [1]}, "validation"),
        ({"run_id": "r", "dt": "d", "status": "x", "cdc": "on"}, "cdc"),
    ],
)
def test_what_is_not_a_report_is_refused(bad, says):
    with pytest.raises(MalformedReport, match=says):
        RunReport.from_dict(bad)


def test_a_status_no_run_writes_is_kept_as_its_text():
    """A report file is anyone's: the page shows (escaped) what it says."""
    report = RunReport.from_dict({"run_id": "r", "dt": "d", "status": "<b>"})
    assert report.status == "<b>" and not isinstance(report.status, Status)
    assert not report.published


# --------------------------------------------------------------- one headline count

#: ORDERS' headline counts, summed by hand: the errored event is discarded; the
#: divergent keys are the perspectives' (1 + 2), not the snapshot comparison's (6)
ORDERS_TOTALS = TableTotals(
    events=9,
    distinct=7,
    applied=3,
    discarded=2,
    duplicates=2,
    quarantined=3,
    conflicts=7,
    concurrent=2,
    lost_writes=2,
    divergent_keys=3,
    orphans=1,
    rows=4,
)


def test_the_totals_are_the_summary_summed_once():
    assert ORDERS.totals() == ORDERS_TOTALS
    assert TableSummary().totals() == TableTotals()


def _text_counts(report: RunReport) -> dict[str, dict[str, str]]:
    """The counts table of the text report, per table, by its column."""
    lines = format_report(report).splitlines()
    header = lines[2].split()
    assert header == COUNTS
    rows = [line.split() for line in lines[4 : 4 + len(report.tables)]]
    return {r[0]: dict(zip(header[1:], r[1:], strict=True)) for r in rows}


def test_every_reader_shows_the_same_headline_counts(tmp_path: Path):
    """The text report, the asset event's ``extra``, the ``runs`` row and the page take a
    table's counts from its ``TableTotals``: a reader that summed them its own way
    (discarded without the errored events, the snapshot's divergent keys added) fails."""
    totals = REPORT.tables["orders"].totals()
    assert totals == ORDERS_TOTALS
    named = {f.name: getattr(totals, f.name) for f in dataclasses.fields(TableTotals)}

    text = _text_counts(REPORT)["orders"]
    column = {"divergent": "divergent_keys", "lost": "lost_writes"}  # its short headers
    assert {column.get(c, c): int(v) for c, v in text.items()} == {
        k: v for k, v in named.items() if k != "duplicates"
    }

    extra = table_extras(make_config(), REPORT, runs_version=7)["orders"]
    assert {k: extra[k] for k in ASSET_COUNTS} == {k: named[k] for k in ASSET_COUNTS}
    assert (extra["status"], extra["runs_version"], extra["snapshot_version"]) == ("failed", 7, 3)
    assert extra["quarantine_open"] == 2 and len(extra["clock_skew_warnings"]) == 1
    assert extra["alert"] == REPORT.alerts["orders"]  # docs/operations.md#alerts
    assert table_extras(make_config(), REPORT, runs_version=7)["products"]["alert"] is None

    row = run_row("r1", date(2026, 11, 21), REPORT.status, REPORT.started, None, None, REPORT, {})
    assert row.tables()["orders"] == ORDERS.to_dict()  # the summary whole
    assert TableSummary.from_dict(row.tables()["orders"]).totals() == totals
    assert row.status == "failed" and row.counts["now_us"] == REPORT.now_us
    assert row.counts["seconds"] == REPORT.seconds  # the metrics read them from the row

    page = next(t for t in table_runs(REPORT) if t.table == "orders")
    assert page.totals == totals
    assert (page.events, page.applied, page.discarded, page.orphans) == (
        totals.distinct,
        totals.applied,
        totals.discarded,
        totals.orphans,
    )
    assert (page.conflict_total, page.quarantined_total, page.divergent_total) == (
        totals.conflicts,
        totals.quarantined,
        totals.divergent_keys,
    )
    html = render_page([REPORT], None, "/d/{dt}/{run_id}")
    cells = "".join(
        f"<td class=n>{n}</td>"
        for n in (
            totals.distinct,
            totals.lost_writes,
            totals.concurrent,
            totals.applied,
            totals.discarded,
            totals.conflicts,
            totals.quarantined,
            totals.divergent_keys,
            totals.orphans,
        )
    )
    assert f"<tr><td>orders</td>{cells}</tr>" in html
    assert "<b>2 writes lost</b> in 2 concurrent conflicts" in html  # it leads


def test_a_report_file_that_is_not_one_is_a_failure_of_its_run(tmp_path: Path):
    """The page reads every report file of the bucket: one that is not a report shows
    as its run's failure, with what its file says of the run; the others are listed."""
    store = FileStore(tmp_path / "store")
    good = RunReport("r2", "2026-11-21", Status.PUBLISHED, tables={"t": TableSummary(applied=1)})
    store.write_bytes("published/reports/dt=2026-11-21/run_report.json", good.to_json().encode())
    bad = {"run_id": "r1", "dt": "2026-11-20", "status": "failed", "tables": {"t": [1]}}
    store.write_bytes("published/reports/dt=2026-11-20/run_report.json", json.dumps(bad).encode())
    store.write_bytes("published/reports/dt=2026-11-19/run_report.json", b"not json")
    newest, broken, not_json = list_reports(store)
    assert newest == good
    assert (broken.run_id, broken.dt, broken.status, broken.tables) == (
        "r1",
        "2026-11-20",
        Status.FAILED,
        {},
    )
    (failure,) = broken.failures
    assert "cannot be read: its tables are not a mapping of tables" in failure
    assert not_json.dt == "2026-11-19" and "is not JSON" in not_json.failures[0]


@pytest.mark.parametrize(
    "table",
    [
        {"applied": "<img src=x onerror=alert(1)>"},
        {"conflicts": {"x": {"applied": -1}}},
        {"errored": 1.5},
        {"clock_skew": {"a": {"b": {"max_seconds": "9"}}}},
    ],
    ids=["text-count", "negative-count", "fraction", "skew-not-seconds"],
)
def test_a_report_whose_numbers_are_not_counts_is_an_error_row(table):
    """``RunReport.from_dict`` takes the numbers as the file holds them; the page checks
    each one it shows before it sums them."""
    report = RunReport.from_dict(
        {"run_id": "r", "dt": "2026-11-22", "status": "failed"} | {"tables": {"t": table}}
    )
    with pytest.raises(MalformedReport):
        table_runs(report)
    html = render_page([report], None, "/d/{dt}/{run_id}")
    assert "this run's report cannot be read" in html and "<img" not in html
