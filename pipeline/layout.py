"""Every key of the store, in one place (formats.md "Where things live", "Outputs")."""

from __future__ import annotations

from datetime import date

MANIFEST = "_manifest.json"
#: the writer's lease (``pipeline.lease``)
LOCK = "published/_lock"


def export_dir(replica: str, table: str, dt: date) -> str:
    return f"exports/replica={replica}/table={table}/dt={dt.isoformat()}"


def export_manifest(replica: str, table: str, dt: date) -> str:
    return f"{export_dir(replica, table, dt)}/{MANIFEST}"


def replica_snapshot_dir(replica: str, table: str, dt: date) -> str:
    return f"exports/replica={replica}/table={table}/snapshot/dt={dt.isoformat()}"


def base_dir(table: str) -> str:
    return f"base/table={table}"


def table_dir(table: str) -> str:
    return f"published/{table}"


def snapshot_dir(table: str, run_id: str) -> str:
    return f"published/{table}/snapshot/run={run_id}"


def state_dir(table: str, run_id: str) -> str:
    return f"published/{table}/state/run={run_id}"


def latest_pointer(table: str) -> str:
    return f"published/{table}/_latest.json"


def dated_pointer(table: str, dt: date) -> str:
    """Which run published ``dt``: the next date's run reads its state from here, so that a
    rerun of an old date starts from the state of the date before it."""
    return f"published/{table}/_runs/dt={dt.isoformat()}.json"


def pointers_dir(table: str) -> str:
    return f"published/{table}/_runs"


def ledger_dir(table: str) -> str:
    """Every event id that reached a final fate, partitioned by ``dt=<D>/``."""
    return f"published/{table}/ledger"


def dated_output(table: str, kind: str, dt: date) -> str:
    """``conflicts``, ``quarantine``, ``divergence`` or ``orphans`` of one date."""
    return f"published/{table}/{kind}/dt={dt.isoformat()}"


CDC_TABLES = (
    "cdc_generation_descriptions",
    "cdc_streams_descriptions",
    "cdc_streams_descriptions_v2",
    "cdc_generation_timestamps",
)


def cdc_table_dir(name: str) -> str:
    """One of :data:`CDC_TABLES` (cdc.md "The tables")."""
    return f"published/cdc/{name}"


def cdc_log_dir(table: str, dt: date) -> str:
    return f"published/cdc/{table}/log/dt={dt.isoformat()}"


def reports_root() -> str:
    return "published/reports"


def report_dir(dt: date) -> str:
    return f"{reports_root()}/dt={dt.isoformat()}"


def date_report(dt: date) -> str:
    """A copy of the report of the run published for ``dt`` (written last)."""
    return f"{report_dir(dt)}/run_report.json"


def run_dir(dt: date, run_id: str) -> str:
    """Each run's own report folder, published or failed: ``run_report.json`` and
    ``validation/``."""
    return f"{report_dir(dt)}/run={run_id}"


def run_report(dt: date, run_id: str) -> str:
    return f"{run_dir(dt, run_id)}/run_report.json"


def validation_dir(dt: date, run_id: str) -> str:
    """The run's Great Expectations results (``results.json``) and Data Docs
    (``data_docs/index.html``)."""
    return f"{run_dir(dt, run_id)}/validation"


def failed_output(run_id: str, table: str, kind: str) -> str:
    """A log (``conflicts``, ``quarantine``, ...) of a run that did not publish: apart
    from the published runs' dated logs, which it never replaces."""
    return f"published/_failed/run={run_id}/{table}/{kind}"
