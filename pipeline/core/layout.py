"""Every key of the store, in one place (docs/outputs.md, "Outputs")."""

from __future__ import annotations

from datetime import date

MANIFEST = "_manifest.json"
PUBLISHED = "published"
#: the writer's lease (``pipeline.storage.lease``)
LOCK = f"{PUBLISHED}/_lock"
#: one marker per expired lease taken over (pipeline.storage.lease)
LOCK_TAKEOVER = f"{PUBLISHED}/_lock.takeover"
#: one row per run, published or not; committed last (``pipeline.storage.runs_table``)
RUNS = f"{PUBLISHED}/runs"
#: the operators' manual decisions, by ``dt`` (``pipeline.ingest.decisions``)
DECISIONS = f"{PUBLISHED}/decisions"
#: the names under ``published/`` that are the store's own, so no table's
#: (``published/<table>/``); a name that starts with ``_`` is the store's too
OWN_NAMES = frozenset({"runs", "decisions", "conflict_stats", "cdc", "reports"})
#: per run and table, the statistics in long form (``pipeline.storage.stats``)
CONFLICT_STATS = f"{PUBLISHED}/conflict_stats"
#: the small objects ``cdr doctor`` writes and removes to check a store (``publish.doctor``)
PROBES = f"{PUBLISHED}/_probes"


#: the folder of the replicas' exports, under the store's root (docs/adapters.md)
EXPORTS = "exports"


def export_dir(replica: str, table: str, dt: date) -> str:
    return f"exports/replica={replica}/table={table}/dt={dt.isoformat()}"


def export_manifest(replica: str, table: str, dt: date) -> str:
    return f"{export_dir(replica, table, dt)}/{MANIFEST}"


def replica_snapshot_dir(replica: str, table: str, dt: date) -> str:
    return f"exports/replica={replica}/table={table}/snapshot/dt={dt.isoformat()}"


def base_dir(table: str) -> str:
    return f"base/table={table}"


def generated_keys(table: str, dt: date) -> str:
    """``cdr generate``'s record of the keys it made for ``table`` up to ``dt`` (the next
    new key, the keys deleted): the next date's new keys continue after them."""
    return f"generated/table={table}/dt={dt.isoformat()}.json"


def generated_keys_dir(table: str) -> str:
    return f"generated/table={table}"


#: a table's outputs, each a Delta table ``published/<table>/<kind>``: ``snapshot`` holds
#: the latest published date, ``state`` the newest date's state (the state of a date is
#: the version its ``runs`` row names; a run of an older date writes its own,
#: :func:`backfill_state`); the others are partitioned by ``dt``
SNAPSHOT = "snapshot"
STATE = "state"
LEDGER = "ledger"
#: docs/outputs.md#history: the versions of a table with ``history``, committed whole like the
#: snapshot (each version carries the ``dt`` of the run that appended it)
HISTORY = "history"
#: the logs, a failed run's too (``quarantine_outcomes``:
#: docs/operations.md#a-quarantine-that-heals, written by ``resolve.retry`` and
#: ``app.quarantine``, read by ``ingest.retry``)
LOGS = (
    "conflicts",
    "quarantine",
    "divergence",
    "orphans",
    "differing_copies",
    "quarantine_outcomes",
)
#: the lines of wal2json transactions still waiting for their commit (``pipeline.ingest.pending``)
PENDING = "pending"
DATED = (*LOGS, LEDGER, PENDING)


def table_dir(table: str) -> str:
    return f"{PUBLISHED}/{table}"


def table_path(table: str, kind: str) -> str:
    """``published/<table>/<kind>``: :data:`SNAPSHOT`, :data:`STATE`, :data:`HISTORY` or
    one of :data:`DATED`."""
    return f"{table_dir(table)}/{kind}"


def legacy_pointers_dir(table: str) -> str:
    """The earlier layout's per-date pointers ``_runs/dt=<D>.json`` (a store it published
    is read as the prior once: ``pipeline.ingest.prior``)."""
    return f"{table_dir(table)}/_runs"


CDC_TABLES = (
    "cdc_generation_descriptions",
    "cdc_streams_descriptions",
    "cdc_streams_descriptions_v2",
    "cdc_generation_timestamps",
)


def cdc_table_dir(name: str) -> str:
    """One of :data:`CDC_TABLES` (docs/cdc.md)."""
    return f"{PUBLISHED}/cdc/{name}"


def cdc_log_path(table: str) -> str:
    """A table's CDC log, partitioned by ``dt``."""
    return f"{PUBLISHED}/cdc/{table}/log"


def reports_root() -> str:
    return f"{PUBLISHED}/reports"


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


#: where releases before delta-spark staged a run's output files (one folder per run):
#: ``cdr vacuum`` removes what killed runs of those releases left
STAGING = f"{PUBLISHED}/_staging"


FAILED = f"{PUBLISHED}/_failed"


def failed_output(run_id: str, table: str, kind: str) -> str:
    """A log (``conflicts``, ``quarantine``, ...) of a run that did not publish, as its
    own Delta table: apart from the published runs' dated logs, which it never replaces."""
    return f"{FAILED}/run={run_id}/{table}/{kind}"


#: the states of runs of an older date than the newest published one (backfills)
BACKFILLS = f"{PUBLISHED}/_backfills"


def backfill_state(run_id: str, table: str) -> str:
    """The state of a run of an older date than its table's newest published one, as a
    Delta table of its own that the run's ``runs`` row names: ``state`` stays on the
    newest date, and a run of the next date starts from this one."""
    return f"{BACKFILLS}/run={run_id}/{table}/{STATE}"


def run_table_of(path: str) -> str | None:
    """The run id of a table that belongs to one run (:func:`failed_output`,
    :func:`backfill_state`); None for any other table."""
    for root in (FAILED, BACKFILLS):
        prefix = f"{root}/run="
        if path.startswith(prefix):
            return path.removeprefix(prefix).split("/", 1)[0]
    return None
