"""replica_cdr: the nightly conflict detection and resolution run.

Thin by design: every task calls a function of ``pipeline`` (or ``cdr`` under
spark-submit). The run for date D is triggered at the config's ``schedule`` (default
02:00 UTC) on D+1; a run triggered from the UI can name its date, a subset of tables,
a dry run, an ``on_divergence`` override, the acceptance of late exports and of a fired
alert, and a run without a replica's missing exports in the trigger form.

    plan → wait_for_exports (sensor) → [seal] → ingest → resolve (Spark: + CDC, + what validation
    measures) → validate (Great Expectations judges; no JVM) → publish (one asset per
    table)

A replica whose config names a ``source`` (docs/sealing.md) has its manifests written by
the ``seal`` task (``cdr manifest``): the sensor waits until the CDC tool's objects seal
the date, not for a manifest nothing else would write.

Runs are chained: each starts from the state the previous date published, so one runs at
a time and a task waits for its previous run's success (``depends_on_past``).

Settings (environment of the Airflow services):
- ``CDR_CONFIG``: path of cdr.yaml (default: ``cdr.yaml`` beside the dags folder;
  docs/airflow.md#settings);
- ``CDR_WORK_DIR``: where the tasks of a run hand data to each other: a folder they all
  mount, or ``s3://BUCKET/PREFIX`` (default ``$AIRFLOW_HOME/cdr-work``);
- connection ``spark_default``: the Spark master (``local[*]``, or ``spark://host:7077``);
- connection ``aws_default`` (optional): S3 credentials and ``endpoint_url`` for the store.
"""

from __future__ import annotations

import logging
import os
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import Asset, AssetAlias, Param, dag, task
from airflow.sdk.definitions.callback import SyncCallback
from airflow.sdk.definitions.deadline import DeadlineAlert, DeadlineReference
from cdr_links import DataDocsLink, aws_env_from_connection

from pipeline import ENTRY, dag_config_path, load_dag_config

DAGS = Path(__file__).resolve().parent
CONFIG = str(dag_config_path(DAGS))
WORK_DIR = os.environ.get(
    "CDR_WORK_DIR", str(Path(os.environ.get("AIRFLOW_HOME", "/tmp")) / "cdr-work")
)
PLAN = "ti.xcom_pull(task_ids='plan')"
DATE = "{{ " + PLAN + "['date'] }}"
RUN_ID = "{{ " + PLAN + "['run_id'] }}"
STAGE_ARGS = ["--config", CONFIG, "--date", DATE, "--run-id", RUN_ID, "--work-dir", WORK_DIR]

config = load_dag_config(DAGS)  # a broken or missing config shows as this DAG's import error
log = logging.getLogger("airflow.task")


def _one_line(text: Any) -> str:
    return " ".join(str(text).split())[:500]


def report_failure(context: dict[str, Any]) -> None:
    """Failure callback: the reason in one line of the task's log."""
    ti = context["ti"]
    plan = ti.xcom_pull(task_ids="plan") or {}
    reason = _one_line(context.get("exception") or "unknown")
    if ti.task_id == "wait_for_exports" and plan.get("date"):  # timed out: say on what
        missing = _missing_manifests(plan)
        if missing:
            reason = (
                f"timed out waiting for {len(missing)} export(s), e.g. {missing[0]} "
                f"(wait_for_exports.timeout_minutes: {config.wait_for_exports.timeout_minutes} "
                "in cdr.yaml; to run without them, trigger with 'Allow missing exports')"
            )
    if ti.task_id in ("validate", "publish") and plan.get("date"):  # a failed gate: say which
        from pipeline import CdrError, load_verdict  # deferred: the task's, not the DAG's parse

        try:
            failures = load_verdict(_run_context(plan)).failures
            reason = _one_line("failed gate: " + "; ".join(failures)) if failures else reason
        except CdrError:
            pass
    log.error(
        "replica_cdr %s failed for %s: %s%s",
        ti.task_id,
        plan.get("date", "?"),
        reason,
        _notes(plan),
    )


def _notes(plan: dict[str, Any]) -> str:
    """The quarantine's open count, the clock-skew warnings and the alerts of the run,
    when it got that far ("" otherwise)."""
    from pipeline import CdrError, run_notes  # deferred: the task's, not the DAG's parse

    if not plan.get("date"):
        return ""
    try:
        return " (" + run_notes(config, _run_context(plan)) + ")"
    except CdrError:
        return ""


def _summary(plan: dict[str, Any]) -> str:
    """The run's Markdown summary (docs/operations.md#cdr-report); the run is published, so
    a summary that cannot be read is said, not raised."""
    from pipeline import CdrError, report_summary  # deferred: the task's, not the DAG's parse

    assert config.store
    try:
        return report_summary(config.store, _date(plan), plan["run_id"])
    except (CdrError, ValueError) as e:
        return f"(no summary: {e})"


def _date(plan: dict[str, Any]) -> date:
    return date.fromisoformat(plan["date"])


def _run_context(plan: dict[str, Any]) -> Any:
    """The pipeline's context of the plan's run (what ingest left in the work folder)."""
    from pipeline import RunContext  # deferred: the task's, not the DAG's parse

    return RunContext.load(WORK_DIR, _date(plan), plan.get("run_id"))


def _missing_manifests(plan: dict[str, Any]) -> list[str]:
    """The exports of the plan's date and tables not in the store yet: a manifest, or for
    a replica with a ``source`` the objects that seal the date (docs/sealing.md)."""
    from pipeline import open_store, waiting_for  # deferred: the task's, not the DAG's parse

    selected = _selected(plan)
    assert selected.store
    now = datetime.now(UTC)  # the poke's clock, for a source's grace_hours
    return waiting_for(selected, open_store(selected.store), _date(plan), now)


def _selected(plan: dict[str, Any]) -> Any:
    """The config for the plan's run: its tables, and its exports allowed missing when
    the form said so (then the sensor waits for none)."""
    tables = plan["tables"].split(",") if plan["tables"] else None
    return config.select(tables, allow_missing_exports=bool(plan.get("allow_missing_exports")))


def _cli(command: str, date: str, *extra: str) -> None:
    from pipeline import cli_main as main  # deferred: the task's, not the DAG's parse

    args = [command, "--config", CONFIG, "--date", date, "--work-dir", WORK_DIR, *extra]
    rc = main(args)
    if rc != 0:
        raise RuntimeError(f"cdr {command} failed (exit {rc}); the reason is the line above")


PARAMS = {
    "date": Param(
        None,
        type=["null", "string"],
        format="date",
        title="Date",
        description="The date D whose exports to process (YYYY-MM-DD). Empty: the day "
        "before the run's date, as the nightly run does.",
    ),
    "tables": Param(
        [],
        type="array",
        items={"type": "string", "enum": list(config.tables)},
        uniqueItems=True,
        examples=list(config.tables),
        title="Tables",
        description="A subset of the tables (the tables their foreign keys reference are "
        "added). Empty: every table.",
    ),
    "dry_run": Param(
        False,
        type="boolean",
        title="Dry run",
        description="Resolve and validate, publish nothing.",
    ),
    "accept_late_exports": Param(
        False,
        type="boolean",
        title="Accept late exports",
        description="Go on when an earlier date's export arrived or changed after its run "
        "(without its events; the report warns). Otherwise rerun that date and the later ones.",
    ),
    "accept_alert": Param(
        False,
        type="boolean",
        title="Accept a fired alert",
        description="Publish past an alert whose config says on: fail (the report keeps it "
        "as a warning). For a rerun after the jump has been looked into.",
    ),
    "allow_missing_exports": Param(
        False,
        type="boolean",
        title="Allow missing exports",
        description="Run with the exports in the store now: a replica without its export "
        "of the date counts as having exported nothing (a replica down). The sensor waits "
        "for none; an export sealed later is a late export of this date.",
    ),
    "on_divergence": Param(
        None,
        type=["null", "string"],
        enum=[None, "fail", "warn"],
        values_display={
            None: f"as in the config ({config.on_divergence.value})",
            "fail": "fail: a divergent key fails the run",
            "warn": "warn: publish and report divergent keys",
        },
        title="On divergence",
        description=f"Override the config's on_divergence ({config.on_divergence.value}).",
    ),
}

# One asset per table, named by its snapshot table's URI (Airflow wants names and URIs unique
# together, so a name of its own would clash when the store moves). Publish emits them
# through an alias: a run of a subset of the tables updates only those.
ASSETS = {t: Asset(f"{config.store}/published/{t}/snapshot") for t in config.tables}
SNAPSHOTS = AssetAlias("replica_cdr_snapshots")


@task(retries=0)
def plan(params=None, logical_date=None, dag_run=None, ti=None) -> dict[str, Any]:
    """The run's date, options and pipeline run id, checked against the config. The id
    is the DAG run's with this task's try: retries of later tasks re-enter the run
    (and its lease); clearing the whole DAG run starts a new run."""
    from pipeline import safe_run_id  # deferred: the task's, not the DAG's parse

    when = logical_date or dag_run.run_after
    day = params["date"] or (when - timedelta(days=1)).date().isoformat()
    tables = params["tables"] or None
    selected = config.select(tables, params["on_divergence"])  # raises on unknown names
    log.info(
        "plan: date %s, tables %s, dry run %s",
        day,
        ", ".join(selected.tables),
        params["dry_run"],
    )
    return {
        "run_id": safe_run_id(f"{day}_{dag_run.run_id}.{ti.try_number}"),
        "date": day,
        "tables": ",".join(tables) if tables else "",
        "dry_run": bool(params["dry_run"]),
        "on_divergence": params["on_divergence"] or "",
        "accept_late_exports": bool(params["accept_late_exports"]),
        "accept_alert": bool(params.get("accept_alert")),
        "allow_missing_exports": bool(params.get("allow_missing_exports")),
        # a backfill runs its dates oldest first, each once: the later ones follow
        "backfill": str(dag_run.run_type) == "backfill",
    }


@task.sensor(
    mode="reschedule",
    poke_interval=config.wait_for_exports.poke_interval_seconds,
    timeout=config.wait_for_exports.timeout_minutes * 60,
    retries=0,
)
def wait_for_exports(p: dict[str, Any]):
    """Until every replica's export of the date is in the store, or sealable from its
    source, for every table."""
    from airflow.sdk import PokeReturnValue

    aws_env_from_connection()
    missing = _missing_manifests(p)
    if missing:
        log.info("waiting for %d export(s), e.g. %s", len(missing), missing[0])
    return PokeReturnValue(is_done=not missing)


@task
def seal(p: dict[str, Any]) -> None:
    """Write the manifests of the replicas with a ``source`` from what their CDC tool
    wrote (``cdr manifest``; docs/sealing.md); a manifest already written is left alone."""
    from pipeline import open_store, seal_for_run  # deferred: the task's, not the DAG's parse

    aws_env_from_connection()
    selected = _selected(p)
    assert selected.store
    for line in seal_for_run(selected, open_store(selected.store), _date(p), datetime.now(UTC)):
        log.info("seal: %s", line)


@task
def ingest(p: dict[str, Any]) -> str:
    """Stage the exports; returns the pipeline's run id (publish checks it)."""
    aws_env_from_connection()
    extra = ["--tables", p["tables"]] if p["tables"] else []
    extra += ["--on-divergence", p["on_divergence"]] if p["on_divergence"] else []
    extra += ["--dry-run"] if p["dry_run"] else []
    extra += ["--accept-late-exports"] if p.get("accept_late_exports") else []
    extra += ["--accept-alert"] if p.get("accept_alert") else []
    extra += ["--backfill"] if p.get("backfill") else []
    extra += ["--allow-missing-exports"] if p.get("allow_missing_exports") else []
    _cli("ingest", p["date"], "--run-id", p["run_id"], *extra)
    return p["run_id"]


SPARK_CONF = {"spark.sql.session.timeZone": "UTC", "spark.ui.showConsoleProgress": "false"}


class SparkStage(SparkSubmitOperator):
    """spark-submit with the ``aws_default`` connection in its environment: the resolve
    stage's Spark tasks fetch the exports from the store. The driver starts from the
    worker's class-data archive, if it has one, and with a small run's options when
    ingest staged a small run (``pipeline.spark.jvm``)."""

    def execute(self, context: Any) -> Any:
        from pipeline import (  # deferred: the task's, not the DAG's parse
            CdrError,
            small_run,
            submit_conf,
        )

        aws_env_from_connection()
        try:  # a small night's driver starts as `cdr run` starts it
            small = small_run(_run_context(context["ti"].xcom_pull(task_ids="plan")))
        except CdrError:  # no run to resolve: the stage itself says so
            small = False
        self.conf = {**submit_conf(small), **(self.conf or {})}
        return super().execute(context)


def spark_stage(command: str, **kwargs: Any) -> SparkSubmitOperator:
    """A stage that runs under spark-submit (``cdr <command>`` in the Spark driver): the
    run's one Spark application."""
    return SparkStage(
        task_id=command,
        name=f"cdr-{command}",
        conn_id="spark_default",
        application=str(ENTRY),
        application_args=[command, *STAGE_ARGS],
        conf=SPARK_CONF,
        **kwargs,
    )


@task(retries=0)  # a failed gate fails the same way again
def validate(p: dict[str, Any]) -> None:
    """Great Expectations judges what the resolve task measured: no Spark, no JVM. (It
    renews the run's lease while it works: the store's credentials.)"""
    aws_env_from_connection()
    _cli("validate", p["date"], "--run-id", p["run_id"])


# all_done: a failed gate still publishes the run's logs, report and Data Docs
@task(trigger_rule="all_done", outlets=[SNAPSHOTS])
def publish(p: dict[str, Any], ti=None, outlet_events=None) -> None:
    """Publish what this run validated; skip when it got no verdict (the failure is
    upstream) or is a dry run. Each table the run published gets an asset event whose
    ``extra`` carries the run id, date, status, counts and ``runs`` version."""
    from airflow.sdk.exceptions import AirflowSkipException

    if p["dry_run"]:
        raise AirflowSkipException("dry run: nothing is published")
    ingested = ti.xcom_pull(task_ids="ingest")
    if ingested is None:
        raise AirflowSkipException(f"this run did not ingest {p['date']}: nothing to publish")
    if not _run_context(p).results.exists():
        raise AirflowSkipException(f"this run did not validate {p['date']}: nothing to publish")
    aws_env_from_connection()
    _cli("publish", p["date"], "--run-id", p["run_id"])
    from pipeline import asset_extras  # deferred: the task's, not the DAG's parse

    extras = asset_extras(config, _run_context(p))
    for table, extra in extras.items():
        outlet_events[SNAPSHOTS].add(ASSETS[table], extra=extra)
    log.info("replica_cdr published %s: run %s%s", p["date"], p["run_id"], _notes(p))
    log.info("replica_cdr summary (cdr report --date %s):\n%s", p["date"], _summary(p))


@task(trigger_rule="all_done", retries=3)
def finish(p: dict[str, Any]) -> None:
    """The run's last step, whatever happened before: release the store's lease (a
    failed run must not keep the next night out)."""
    from airflow.sdk.exceptions import AirflowSkipException

    from pipeline import StageError  # deferred: the task's, not the DAG's parse

    try:
        _run_context(p)
    except StageError:
        raise AirflowSkipException(f"this run did not ingest {p['date']}: no lease") from None
    aws_env_from_connection()
    _cli("finish", p["date"], "--run-id", p["run_id"])


def deadline_missed(context: dict[str, Any] | None = None, **_: Any) -> None:
    """The deadline alert's callback (``deadline_minutes`` in cdr.yaml): the run is not
    done by its deadline, in one line of the callback's log."""
    run = (context or {}).get("dag_run") or {}
    when = (context or {}).get("deadline", {}).get("deadline_time")
    day = (run.get("conf") or {}).get("date")
    if not day and run.get("logical_date"):
        day = (datetime.fromisoformat(run["logical_date"]) - timedelta(days=1)).date()
    log.error(
        "replica_cdr missed its deadline for %s: run %s not done by %s (%s minutes after "
        "its logical date)",
        day or "?",
        run.get("dag_run_id", "?"),
        when,
        config.deadline_minutes,
    )


DEADLINE = (
    DeadlineAlert(
        reference=DeadlineReference.DAGRUN_LOGICAL_DATE,
        interval=timedelta(minutes=config.deadline_minutes),
        callback=SyncCallback(deadline_missed),
        name="replica_cdr not done",
    )
    if config.deadline_minutes
    else None
)


@dag(
    dag_id="replica_cdr",
    schedule=config.schedule,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    params=PARAMS,
    deadline=DEADLINE,
    default_args={
        "depends_on_past": True,
        "retries": 2,
        "retry_delay": timedelta(minutes=2),
        "retry_exponential_backoff": True,
        "max_retry_delay": timedelta(minutes=30),
        "on_failure_callback": report_failure,
    },
    doc_md=__doc__,
    tags=["cdr"],
)
def replica_cdr():
    p = plan()
    judged = validate(p)
    judged.operator.operator_extra_links = (*judged.operator.operator_extra_links, DataDocsLink())
    waited = wait_for_exports(p)
    if config.sources:  # docs/sealing.md: the manifests are sealed from the tools' objects
        waited = waited >> seal(p)
    waited >> ingest(p) >> spark_stage("resolve") >> judged >> publish(p) >> finish(p)


replica_cdr()
