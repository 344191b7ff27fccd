"""The quality gate: every expectation of every suite in ``expectations/`` fails on a
crafted bad output and passes on a good one (real Great Expectations on Spark, in a
file-backed project); the gate follows ``on_divergence`` and ``on_fk_violation`` and
names the suite, the check, the table and offending keys; the Data Docs list the
suites."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from pipeline.changes.replay import replay_differences
from pipeline.core.report import RunReport
from pipeline.validate.stage import message
from pipeline.validate.suites import KEPT_ROWS, Project, find_rows, load_template, render_suite
from tests.helpers import scenarios as S
from tests.helpers.fold_helpers import make_config
from tests.helpers.reports import date_report
from tests.helpers.sparkjobs import tasks_per_stage
from tests.unit.test_validation import CONFIG

ORDERS = CONFIG.tables["orders"]
SNAPSHOT = "order_id bigint, product_no int, qty int, _ts bigint, _origin string"
STATE = SNAPSHOT + ", _event_id string, _deleted boolean, _deleted_at bigint"


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("gx")
    return Project(root, root / "docs")


def run(project, spark, suite_name: str, rows: list[tuple], schema: str, **views) -> dict:
    """Validate ``rows`` with one suite of ``orders``; ``views`` are registered first.
    Returns ``{check: success}`` (a check repeated per item passes when all do)."""
    for name, (view_rows, view_schema) in views.items():
        spark.createDataFrame(view_rows, view_schema).createOrReplaceTempView(name)
    suite = render_suite(load_template(suite_name), ORDERS)
    out: dict[str, bool] = {}
    for c in project.validate(spark.createDataFrame(rows, schema), suite):
        out[c.check] = out.get(c.check, True) and c.success
    return out


GOOD = [(1, 10, 5, 100, "pub"), (2, 10, 6, 100, "sub")]
LIVE_STATE = [(*r, "e", False, None) for r in GOOD]
VIEWS = {
    "cdr_state_orders": ([*LIVE_STATE, (3, 10, 7, 90, "pub", "e", True, 95)], STATE),
    "cdr_whole_snapshot_products": (
        [(10, "p", 100, "pub")],
        "product_no int, name string, _ts bigint, _origin string",
    ),
    # a night merged in place keeps order 9 as published (its qty 7 is unique)
    "cdr_untouched_snapshot_orders": ([(9, 10, 7, 90, "pub")], SNAPSHOT),
}


@pytest.mark.parametrize("suite", ["schema", "snapshot"])
def test_the_snapshot_suites_pass_on_a_good_snapshot(project, spark, suite):
    assert all(run(project, spark, suite, GOOD, SNAPSHOT, **VIEWS).values())


@pytest.mark.parametrize(
    ("rows", "schema", "check"),
    [
        ([*GOOD, (1, 10, 9, 100, "pub")], SNAPSHOT, "key_unique"),
        ([(None, 10, 5, 100, "pub")], SNAPSHOT, "not_null"),  # a key column
        ([(1, 10, None, 100, "pub")], SNAPSHOT, "not_null"),  # a not_null column
        ([(1, 10, 5, 100, "pub"), (2, 10, 5, 100, "pub")], SNAPSHOT, "unique_constraint"),
        # the run writes qty 7, which a row it keeps as published holds
        ([GOOD[0], (2, 10, 7, 100, "sub")], SNAPSHOT, "unique_in_table"),
        (
            [(1, "10", 5, 100, "pub")],
            SNAPSHOT.replace("product_no int", "product_no string"),
            "value_type",
        ),
        ([(1, 10, 5, 100, "pub", 0)], SNAPSHOT + ", extra int", "columns"),
        ([GOOD[0]], SNAPSHOT, "snapshot_is_state"),  # a live row of the state is missing
        ([GOOD[0], (2, 10, 6, 101, "sub")], SNAPSHOT, "snapshot_is_state"),  # a value differs
    ],
)
def test_each_snapshot_check_fails_on_a_bad_snapshot(project, spark, rows, schema, check):
    suite = "schema" if check in ("columns", "value_type") else "snapshot"
    assert run(project, spark, suite, rows, schema, **VIEWS)[check] is False


def test_foreign_keys(project, spark):
    ok = [(1, 10, 5, 100, "pub"), (2, None, 6, 100, "pub")]  # a null reference is no orphan
    assert run(project, spark, "foreign_keys", ok, SNAPSHOT, **VIEWS) == {"no_orphan": True}
    orphan = [(1, 10, 5, 100, "pub"), (103, 2, 6, 100, "pub")]
    assert run(project, spark, "foreign_keys", orphan, SNAPSHOT, **VIEWS) == {"no_orphan": False}


DIVERGENCE = "source string, replica string, key string, cause string"


@pytest.mark.parametrize(
    ("rows", "failing"),
    [
        ([], set()),
        ([("perspective", "sub", '{"order_id":1}', None)], {"no_divergent_perspective"}),
        ([("snapshot", "pub", '{"order_id":2}', None)], {"no_divergent_snapshot_export"}),
        # docs/rules.md#manual-decisions: by design, a warning only
        ([("perspective", "sub", '{"order_id":3}', "decision")], {"divergence_by_decision"}),
    ],
    ids=["none", "perspective", "snapshot", "decision"],
)
def test_convergence(project, spark, rows, failing):
    got = run(project, spark, "convergence", rows, DIVERGENCE)
    assert {c for c, ok in got.items() if not ok} == failing


FATES = "event_id string, replica string, fate string"
ACCOUNT_VIEWS = {
    "cdr_records_orders": ([("pub", 3), ("sub", 2)], "replica string, records long"),
    "cdr_conflicts_orders": ([("e2",)], "remote_event_id string"),
    "cdr_quarantine_orders": ([("e3",)], "event_id string"),
    "cdr_quarantine_shares_orders": (  # e3 is quarantined by a rule, not by the guards
        [("pub", None, 3, 0, 0.0, None, None), ("sub", None, 2, 0, 0.0, None, None)],
        "replica string, file string, records long, quarantined long, share double, "
        "reason string, detail string",
    ),
}
GOOD_FATES = [
    ("e1", "pub", "applied"),
    ("e2", "pub", "discarded"),
    ("e3", "pub", "quarantined"),
    ("e1", "sub", "applied"),
    ("e2", "sub", "discarded"),
]


@pytest.mark.parametrize(
    ("fates", "failing"),
    [
        (GOOD_FATES, set()),
        (GOOD_FATES[:-1], {"records_accounted"}),  # a record of sub's export is lost
        ([*GOOD_FATES, ("e4", "sub", "applied")], {"records_accounted"}),  # counted twice
        ([*GOOD_FATES[:4], ("e2", "sub", "errored")], {"records_accounted"}),
        ([*GOOD_FATES[:4], ("e5", "sub", "discarded")], {"discarded_logged"}),  # no conflict
        ([*GOOD_FATES[:2], ("e6", "pub", "quarantined"), *GOOD_FATES[3:]], {"quarantined_kept"}),
    ],
)
def test_accounting(project, spark, fates, failing):
    got = run(project, spark, "accounting", fates, FATES, **ACCOUNT_VIEWS)
    assert {c for c, ok in got.items() if not ok} == failing


LOG = (
    "`cdc$stream_id` binary, `cdc$time` string, `cdc$batch_seq_no` int, "
    "`cdc$end_of_batch` boolean, generation long"
)
STREAMS = {
    "cdr_cdc_streams": (
        [(0, b"A" * 16), (0, b"B" * 16), (5, b"C" * 16)],
        "time long, stream_id binary",
    )
}
T1, T2 = "00000000-0000-1000-8000-000000000001", "00000000-0000-1000-8000-000000000002"


@pytest.mark.parametrize(
    ("rows", "failing"),
    [
        (
            [
                (b"A" * 16, T1, 0, False, 0),
                (b"A" * 16, T1, 1, True, 0),
                (b"C" * 16, T2, 0, True, 5),
            ],
            set(),
        ),
        ([(b"C" * 16, T1, 0, True, 0)], {"stream_in_generation"}),  # a stream of generation 5
        ([(b"Z" * 16, T1, 0, True, 0)], {"stream_in_generation"}),  # no generation's stream
        ([(b"A" * 16, T1, 1, True, 0)], {"batches"}),  # not numbered from 0
        ([(b"A" * 16, T1, 0, True, 0), (b"A" * 16, T1, 1, True, 0)], {"batches"}),  # two ends
        ([(b"A" * 16, T1, 0, False, 0), (b"A" * 16, T1, 2, True, 0)], {"batches"}),  # a gap
    ],
)
def test_cdc(project, spark, rows, failing):
    got = run(project, spark, "cdc", rows, LOG, **STREAMS)
    assert {c for c, ok in got.items() if not ok} == failing


def test_cdc_replay(project, spark):
    """The replay suite on the differences ``pipeline.changes.replay`` finds: an insert, an update
    and a delete of the log over a prior state give the snapshot; a log that lost a
    delete does not."""
    prior = spark.createDataFrame([(*r, "e", False, None) for r in GOOD], STATE)
    uuid = "{:08x}-0000-1000-8000-00000000000{}"
    cols = (
        "`cdc$stream_id` binary, `cdc$time` string, `cdc$batch_seq_no` int, "
        "`cdc$operation` tinyint, `cdc$ttl` bigint, `cdc$end_of_batch` boolean, order_id bigint, "
        "product_no int, qty int, `cdc$deleted_product_no` boolean, `cdc$deleted_qty` boolean"
    )
    entries = [
        (b"A" * 16, uuid.format(1, 1), 0, 2, None, True, 3, 10, 7, None, None),  # insert 3
        (b"A" * 16, uuid.format(2, 1), 0, 1, None, True, 1, None, 8, None, None),  # qty of 1
        (b"A" * 16, uuid.format(3, 1), 0, 3, None, True, 2, None, None, None, None),  # del 2
        (b"A" * 16, uuid.format(4, 1), 0, 1, None, True, 3, None, None, True, None),  # null
    ]
    snapshot = spark.createDataFrame([(1, 10, 8, 100, "pub"), (3, None, 7, 100, "pub")], SNAPSHOT)
    log = spark.createDataFrame(entries, cols)
    diff = replay_differences(prior, log, snapshot, ORDERS, 10**15)
    assert diff.count() == 0
    suite = render_suite(load_template("cdc_replay"), ORDERS)
    assert all(c.success for c in project.validate(diff, suite))
    lost = replay_differences(prior, log.where("`cdc$operation` <> 3"), snapshot, ORDERS, 10**15)
    checks = project.validate(lost, suite)
    assert [c.success for c in checks] == [False]
    assert checks[0].sample[0]["key"] == '{"order_id":2}'


ROW_CHECKS = [
    "SELECT id FROM range(0, 500, 1, 3) WHERE id % 2 = 0",
    "SELECT id FROM range(0, 3, 1, 1) WHERE id > 5",
    "SELECT 'x' AS a, CAST(1.50 AS DECIMAL(4,2)) AS d",
]


@pytest.mark.parametrize("one_task", [False, True])
def test_row_checks_count_exactly_and_keep_the_first_rows(spark, one_task):
    """All the row checks in one query: each count is exact, each keeps its first
    KEPT_ROWS rows in the order of their JSON text, an empty one finds nothing; the same
    in one task (a small run's) as in the union's partitions."""
    found = find_rows(spark, ROW_CHECKS, one_task)
    assert [f.count for f in found] == [250, 0, 1]
    assert len(found[0].rows) == KEPT_ROWS
    assert found[0].rows[:3] == [{"id": 0}, {"id": 100}, {"id": 102}]  # text order
    assert found[1].rows == [] and found[2].rows == [{"a": "x", "d": 1.5}]
    assert find_rows(spark, []) == []


def test_a_small_runs_row_checks_share_one_task(spark):
    """``one_task``: the checks' union goes to one task, numbered there with no exchange;
    otherwise each of the union's partitions is a task writing a shuffle for the window
    (3 + 1 + 1 here), and the window's stage reads it."""
    assert tasks_per_stage(spark, lambda: find_rows(spark, ROW_CHECKS, True)) == [1]
    spread = tasks_per_stage(spark, lambda: find_rows(spark, ROW_CHECKS, False))
    assert len(spread) > 1 and spread[0] == 5, spread


def test_a_row_suite_is_judged_by_gx_on_the_counts(project, spark):
    """The result GX stores for a row suite: each check's count as its observed value,
    the check's own type and description, and its rows as the sample."""
    orphans = [(103, 2, 6, 100, "pub"), (104, 3, 7, 100, "pub"), (1, 10, 5, 100, "pub")]
    for name, (rows, schema) in VIEWS.items():
        spark.createDataFrame(rows, schema).createOrReplaceTempView(name)
    snapshot = render_suite(load_template("snapshot"), ORDERS)
    fks = render_suite(load_template("foreign_keys"), ORDERS)
    bad = spark.createDataFrame(orphans, SNAPSHOT)
    good, (orphan,) = project.validate_all(
        [(spark.createDataFrame(GOOD, SNAPSHOT), snapshot), (bad, fks)]
    )
    assert all(c.success for c in good) and len(good) == len(snapshot["expectations"])
    assert (orphan.success, orphan.observed, orphan.expectation) == (
        False,
        2,
        "unexpected_rows_expectation",
    )
    assert (
        orphan.description
        == "every row of orders with product_no set has a live parent in products"
    )
    assert orphan.sample == [{"order_id": 103, "product_no": 2}, {"order_id": 104, "product_no": 3}]
    assert not any(v.name.startswith("cdr_batch_") for v in spark.catalog.listTables())


# ---------------------------------------------------------------------- the gate


def test_a_failure_names_the_suite_the_check_the_table_and_keys(project, spark):
    suite = render_suite(load_template("foreign_keys"), ORDERS)
    for name, (rows, schema) in VIEWS.items():
        spark.createDataFrame(rows, schema).createOrReplaceTempView(name)
    bad = spark.createDataFrame([(103, 2, 6, 100, "pub"), (104, 3, 7, 100, "pub")], SNAPSHOT)
    (check,) = project.validate(bad, suite)
    text = message("orders", check)
    assert text.startswith("table orders: expectation foreign_keys.orders/no_orphan failed")
    assert "2 row(s)" in text and '"order_id":103' in text and '"product_no":2' in text


@pytest.mark.parametrize("on_divergence, failed", [("fail", "failures"), ("warn", "warnings")])
def test_a_failed_check_fails_the_run_by_its_gx_severity(tmp_path, spark, on_divergence, failed):
    """The verdict reads the severity GX reports on each result: a failed convergence
    check fails the run under ``on_divergence: fail`` and is a warning under ``warn``."""
    from pipeline.validate.stage import _judge
    from pipeline.validate.suites import measure_all

    config = make_config(on_divergence=on_divergence)
    suite = render_suite(load_template("convergence"), ORDERS, config)
    bad = spark.createDataFrame([("perspective", "sub", '{"order_id":1}', None)], DIVERGENCE)
    (measure,) = measure_all([(bad, suite)])
    project = Project(tmp_path, tmp_path / "docs")
    verdict = _judge(
        project, [{"table": "orders", "suite": suite, "measure": measure.to_dict()}], True
    )
    other = "warnings" if failed == "failures" else "failures"
    assert len(getattr(verdict, failed)) == 1 and not getattr(verdict, other)
    assert "convergence.orders/no_divergent_perspective failed" in getattr(verdict, failed)[0]
    (check,) = [c for c in verdict.suites["convergence.orders"]["checks"] if not c["success"]]
    assert check["severity"] == ("critical" if on_divergence == "fail" else "warning")
    # the checkpoint's action built the Data Docs, with the run's result
    assert "convergence.orders" in (tmp_path / "docs" / "index.html").read_text()


def test_data_docs_list_the_suites(project, spark):
    run(project, spark, "convergence", [], DIVERGENCE)
    project.build_docs()
    index = Path(project.context.root_directory).parent / "docs" / "index.html"
    html = index.read_text()
    assert "convergence.orders" in html


# ---------------------------------------------------------------------- through `cdr run`


def _path(name: str) -> Path:
    path = S.SCENARIOS / f"{name}.json"
    if not path.exists():
        pytest.skip("shared/scenarios not found")
    return path


def _scenario(name: str, **config: Any) -> dict[str, Any]:
    s = json.loads(_path(name).read_text())
    s["config"].update(config)
    return s


def test_a_run_whose_every_table_stopped_still_has_its_data_docs(tmp_path):
    """An ``error`` resolver stops the scenario's only table: no suite runs, and the
    failed run's report still links Data Docs that are there (an index of no suite)."""
    s = json.loads(_path("pg_insert_exists_error").read_text())
    _, failed = S.run_scenario(s, tmp_path, docs=True)
    assert failed
    report = date_report(tmp_path / "store", s["date"])
    assert report is not None and report.status == "failed"
    assert report.validation.suites == {}
    docs = report.validation.data_docs
    assert docs is not None and (tmp_path / "store" / docs).is_file()


def test_quarantine_moves_the_orphan_out_and_passes(tmp_path_factory, spark):
    """The same exports under ``on_fk_violation: quarantine`` (the scenario test's run)."""
    ran = S.scenario_run(_path("pg_fk_update_parent_quarantine"), tmp_path_factory)
    assert ran["s"]["config"]["on_fk_violation"] == "quarantine"
    got, failed = ran["got"], ran["failed"]
    assert not failed
    assert {q["reason"] for q in got["quarantine"]["orders"]} == {"fk_violation"}
    assert 103 not in {r["order_id"] for r in got["snapshot"]["orders"]}


def test_a_divergent_policy_fails_or_warns(tmp_path, tmp_path_factory, spark):
    ran = S.scenario_run(_path("divergence_skip_fails"), tmp_path_factory)
    assert ran["s"]["config"].get("on_divergence", "fail") == "fail"
    assert ran["failed"] and ran["got"]["status"] == "failed"
    (tmp_path / "warn").mkdir()
    s = _scenario("divergence_skip_fails", on_divergence="warn")
    got, failed = S.run_scenario(s, tmp_path / "warn")
    assert not failed and got["status"] == "published" and got["snapshot"]
    report = RunReport.from_json(
        (tmp_path / f"warn/store/published/reports/dt={s['date']}/run_report.json").read_text()
    )
    assert any("convergence." in w and "no_divergent_perspective" in w for w in report.warnings)


HISTORY = (
    "order_id bigint, product_no int, qty int, _valid_from timestamp, _valid_to timestamp, "
    "_deleted boolean, _version bigint"
)
T0, T1, T2 = (datetime(2026, 11, 21, h, tzinfo=UTC) for h in (8, 9, 10))
GOOD_HISTORY = [
    (1, 10, 4, T0, T1, False, 1),
    (1, 10, 5, T1, None, False, 2),
    (2, 10, 6, T0, T2, False, 1),
    (2, 10, 6, T2, None, True, 2),  # deleted since 10:00
]
ONE_ROW = {"cdr_snapshot_orders": ([GOOD[0]], SNAPSHOT)}


@pytest.mark.parametrize(
    ("rows", "failing"),
    [
        (GOOD_HISTORY, set()),
        (
            [*GOOD_HISTORY, (1, 10, 5, T2, None, False, 3)],
            {"one_current_version", "current_is_snapshot"},
        ),
        ([(1, 10, 4, T2, T1, False, 1), (1, 10, 5, T1, None, False, 2)], {"intervals_forward"}),
        ([(1, 10, 5, None, None, False, 1)], {"intervals_forward"}),
        ([(1, 10, 4, T0, T1, False, 1), (1, 10, 6, T1, None, False, 2)], {"current_is_snapshot"}),
        ([*GOOD_HISTORY[:2], (2, 10, 6, T0, None, False, 1)], {"current_is_snapshot"}),
    ],
    ids=["good", "two_current", "backwards", "no_start", "value_differs", "deletion_missing"],
)
def test_history(project, spark, rows, failing):
    """docs/outputs.md#history: the history's checks against a snapshot of order 1 alone."""
    got = run(project, spark, "history", rows, HISTORY, **ONE_ROW)
    assert {c for c, ok in got.items() if not ok} == failing
