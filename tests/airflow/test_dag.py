"""The DAG under real Airflow: it imports cleanly in a DagBag with the schedule, params,
sensor, assets and links the config asks for; the trigger form's params are validated;
``dag.test()`` runs the chain (ingest, resolve under spark-submit on ``local[2]``,
validate, publish) against the S3 server on loopback, with the UI's options (tables, dry
run, on_divergence override). The whole chain's published run is checked on a standalone
Spark cluster (tests/airflow/test_cluster.py)."""

from __future__ import annotations

import sys
from datetime import date, datetime, timedelta

import pytest

from pipeline.core import layout
from pipeline.core.report import RunReport
from tests.helpers import published as P
from tests.helpers.dagrun import dagbag, run_dag, write_config, xcom


def test_dagbag_imports_with_the_configured_schedule_params_and_assets(
    airflow, tmp_path, monkeypatch
):
    cfg = write_config(
        tmp_path / "cdr.yaml",
        "file:///data/cdr",
        schedule="30 3 * * *",
        wait_for_exports={"timeout_minutes": 90, "poke_interval_seconds": 60},
        deadline_minutes=240,
    )
    monkeypatch.setenv("CDR_CONFIG", str(cfg))
    bag = dagbag()
    assert bag.import_errors == {}
    dag = bag.get_dag("replica_cdr")
    assert [t.task_id for t in dag.topological_sort()] == [
        "plan",
        "wait_for_exports",
        "ingest",
        "resolve",
        "validate",
        "publish",
        "finish",
    ]
    assert dag.get_task("finish").trigger_rule == "all_done"
    assert dag.schedule == "30 3 * * *"
    assert dag.max_active_runs == 1 and not dag.catchup
    assert all(t.depends_on_past for t in dag.tasks)
    assert dag.get_task("ingest").retries == 2 and dag.get_task("ingest").retry_exponential_backoff
    sensor = dag.get_task("wait_for_exports")
    assert sensor.mode == "reschedule" and sensor.timeout == 90 * 60 and sensor.poke_interval == 60
    assert set(dag.params) == {
        "date",
        "tables",
        "dry_run",
        "on_divergence",
        "accept_late_exports",
        "accept_alert",
        "allow_missing_exports",
    }
    assert sorted(dag.params.get_param("tables").schema["items"]["enum"]) == [
        "accounts",
        "orders",
        "products",
    ]
    # publish emits one asset per table it published, through an alias
    (alias,) = dag.get_task("publish").outlets
    assert alias.name == "replica_cdr_snapshots"
    module = sys.modules[dag.get_task("publish").python_callable.__module__]
    assert {t: a.uri for t, a in module.ASSETS.items()} == {
        t: f"file:///data/cdr/published/{t}/snapshot" for t in ("products", "orders", "accounts")
    }
    (deadline,) = dag.deadline if isinstance(dag.deadline, list) else [dag.deadline]
    assert deadline.interval == timedelta(minutes=240)
    assert deadline.reference.reference_name == "DagRunLogicalDateDeadline"
    assert deadline.callback.path.endswith(".deadline_missed")
    assert "Data Docs" in {link.name for link in dag.get_task("validate").operator_extra_links}
    assert all(t.on_failure_callback for t in dag.tasks)


def test_without_deadline_minutes_the_dag_has_no_deadline(airflow, tmp_path, monkeypatch):
    monkeypatch.setenv("CDR_CONFIG", str(write_config(tmp_path / "cdr.yaml", "file:///d")))
    assert not dagbag().get_dag("replica_cdr").deadline


def test_a_broken_config_is_the_dags_import_error(airflow, tmp_path, monkeypatch):
    cfg = write_config(tmp_path / "cdr.yaml", "file:///data/cdr", schedule="every night")
    monkeypatch.setenv("CDR_CONFIG", str(cfg))
    errors = dagbag().import_errors
    assert len(errors) == 1
    assert "schedule: 'every night' is not a cron expression" in next(iter(errors.values()))


def test_a_missing_config_is_the_dags_import_error_naming_cdr_config(
    airflow, tmp_path, monkeypatch
):
    """docs/airflow.md#settings: the import error says what to set, not a ``--config``
    the DAG has no command line for."""
    monkeypatch.setenv("CDR_CONFIG", str(tmp_path / "nowhere" / "cdr.yaml"))
    errors = dagbag().import_errors
    assert len(errors) == 1  # replica_cdr's (the decide and what-if DAGs read it in a task)
    (error,) = errors.values()
    assert "CDR_CONFIG=" in error and "nowhere/cdr.yaml: no such file" in error
    assert "set CDR_CONFIG to the path of cdr.yaml (docs/airflow.md#settings)" in error


@pytest.mark.parametrize(
    "conf, message",
    [
        ({"date": "21/11/2026"}, "date"),
        ({"tables": ["orders", "invoices"]}, "invoices"),
        ({"on_divergence": "ignore"}, "ignore"),
        ({"dry_run": "yes"}, "yes"),
        ({"accept_late_exports": "yes"}, "yes"),
        ({"allow_missing_exports": "yes"}, "yes"),
    ],
)
def test_the_trigger_form_refuses_bad_params(airflow, tmp_path, monkeypatch, conf, message):
    from airflow.sdk.exceptions import ParamValidationError

    monkeypatch.setenv("CDR_CONFIG", str(write_config(tmp_path / "cdr.yaml", "file:///d")))
    params = dagbag().get_dag("replica_cdr").params
    with pytest.raises(ParamValidationError, match=message):
        params.update(conf)  # the form's values are checked as they are set
        params.validate()


def test_the_trigger_form_accepts_good_params(airflow, tmp_path, monkeypatch):
    monkeypatch.setenv("CDR_CONFIG", str(write_config(tmp_path / "cdr.yaml", "file:///d")))
    params = dagbag().get_dag("replica_cdr").params
    assert params.validate() == {
        "date": None,
        "tables": [],
        "dry_run": False,
        "on_divergence": None,
        "accept_late_exports": False,
        "accept_alert": False,
        "allow_missing_exports": False,
    }
    conf = {
        "date": "2026-11-21",
        "tables": ["orders"],
        "dry_run": True,
        "on_divergence": "fail",
        "accept_late_exports": True,
        "accept_alert": True,
        "allow_missing_exports": True,
    }
    params.update(conf)
    assert params.validate() == conf


def test_a_failed_gate_fails_the_validate_task(
    airflow, s3_endpoint, s3_store, tmp_path, monkeypatch, capfd
):
    """The generated replicas diverge and the trigger's conf overrides on_divergence with
    ``fail``: the validate task fails on the convergence suite, with the reason in one
    line of its log; publish still runs (all_done), publishes the logs, results and
    Data Docs, fails too, and no snapshot becomes visible."""
    run, states = run_dag(
        s3_endpoint, s3_store, tmp_path, monkeypatch, conf={"on_divergence": "fail"}
    )
    assert states == {
        "plan": "success",
        "wait_for_exports": "success",
        "ingest": "success",
        "resolve": "success",
        "validate": "failed",
        "publish": "failed",
        "finish": "success",
    }, states
    assert not s3_store.exists("published/_lock")  # a failed run does not keep the store
    assert P.snapshot_date(s3_store, "orders") is None
    assert not s3_store.exists("published/reports/dt=2026-11-21/run_report.json")
    run_id = xcom(run, "plan", "return_value")["run_id"]
    report = RunReport.from_json(s3_store.read_bytes(layout.run_report(date(2026, 11, 21), run_id)))
    assert report.status == "failed"
    assert any("convergence." in f for f in report.failures)
    assert report.validation.data_docs is not None
    assert s3_store.exists(report.validation.data_docs)
    assert s3_store.list(f"published/_failed/run={run_id}")  # its logs, apart
    assert [(r["run_id"], r["status"]) for r in P.runs(s3_store)] == [(run_id, "failed")]
    assert not s3_store.list("published/orders/conflicts")  # no published run's logs
    link = f"/cdr/docs/2026-11-21/{run_id}/index.html"
    assert xcom(run, "validate", "_link_DataDocsLink") == link
    err = capfd.readouterr().err.splitlines()
    for task in ("validate", "publish"):  # the failure callbacks' one line each
        line = next(ln for ln in err if f"replica_cdr {task} failed for 2026-11-21: " in ln)
        assert "failed gate: table " in line and "convergence." in line, line
        notes = (
            "(quarantine open: products 0, orders 0, accounts 0; clock skew: no warning; "
            "alerts: none)"
        )
        assert line.endswith(notes), line  # the operator notes (retry, skew, alerts) end it


def test_a_dry_run_of_one_table_publishes_nothing(
    airflow, s3_endpoint, s3_store, tmp_path, monkeypatch
):
    """tables=[orders] brings products (its foreign key's parent) and leaves accounts
    out; a dry run resolves and validates them and publishes nothing."""
    from pipeline.storage.context import RunContext

    conf = {"tables": ["orders"], "dry_run": True, "date": "2026-11-21"}
    _, states = run_dag(s3_endpoint, s3_store, tmp_path, monkeypatch, conf=conf)
    assert states["validate"] == "success" and states["publish"] == "skipped", states
    assert s3_store.list("published") == []  # a dry run writes nothing to the store
    assert not s3_store.exists("published/reports/dt=2026-11-21/run_report.json")
    ctx = RunContext.load(tmp_path / "work", datetime(2026, 11, 21).date())
    assert ctx.tables == ("orders",) and ctx.dry_run
    staged = {p.name for p in ctx.staged.glob("*") if p.is_dir()} - {"cdc"}
    assert staged == {"orders", "products"}


class _StubTI:
    """What a failure callback reads of its task instance."""

    def __init__(self, task_id: str, plan: dict):
        self.task_id, self._plan = task_id, plan

    def xcom_pull(self, task_ids: str):
        return self._plan if task_ids == "plan" else None


def test_a_sensor_timeout_names_a_missing_manifest(airflow, tmp_path, monkeypatch):
    import logging

    store = tmp_path / "store"
    monkeypatch.setenv("CDR_CONFIG", str(write_config(tmp_path / "cdr.yaml", store.as_uri())))
    dag = dagbag().get_dag("replica_cdr")
    callbacks = dag.get_task("wait_for_exports").on_failure_callback
    callback = callbacks[0] if isinstance(callbacks, list) else callbacks
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logging.getLogger("airflow.task").addHandler(handler)
    try:
        plan = {"date": "2026-11-21", "tables": "orders", "dry_run": False, "on_divergence": ""}
        callback({"ti": _StubTI("wait_for_exports", plan), "exception": "Sensor has timed out"})
    finally:
        logging.getLogger("airflow.task").removeHandler(handler)
    (line,) = [r.getMessage() for r in records]
    assert line.startswith("replica_cdr wait_for_exports failed for 2026-11-21: timed out ")
    # orders and products (its foreign key's parent), three replicas each
    assert "waiting for 6 export(s), e.g. exports/replica=" in line and "/dt=2026-11-21/" in line
    # what to change: the setting that waited, and the form's switch
    assert "wait_for_exports.timeout_minutes: 360" in line and "Allow missing exports" in line


def test_the_forms_allow_missing_exports_runs_without_the_missing_ones(
    airflow, tmp_path, monkeypatch
):
    """docs/airflow.md#triggering-from-the-ui: with the switch the sensor waits for no
    export and ingest runs with --allow-missing-exports; without it, both as before."""
    store = tmp_path / "store"
    monkeypatch.setenv("CDR_CONFIG", str(write_config(tmp_path / "cdr.yaml", store.as_uri())))
    dag = dagbag().get_dag("replica_cdr")
    module = sys.modules[dag.get_task("ingest").python_callable.__module__]
    plan = {"date": "2026-11-21", "tables": "orders", "dry_run": False, "on_divergence": "",
            "run_id": "r1"}  # fmt: skip
    assert len(module._missing_manifests(plan)) == 6
    assert module._missing_manifests({**plan, "allow_missing_exports": True}) == []
    called: list[tuple[str, ...]] = []
    monkeypatch.setattr(module, "_cli", lambda *args: called.append(args))
    monkeypatch.setattr(module, "aws_env_from_connection", lambda: None)  # a file:// store
    ingest = dag.get_task("ingest").python_callable
    ingest(plan)
    ingest({**plan, "allow_missing_exports": True})
    assert "--allow-missing-exports" not in called[0]
    assert called[1][-1] == "--allow-missing-exports"
