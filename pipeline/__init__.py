"""Conflict detection and resolution for active-active replicas.

The public face of the package: what the DAGs, the plugin and a user's own code use,
each name imported where it lives when it is first used, so that ``import pipeline``
(at a DAG's parse) loads neither Spark nor Great Expectations. The package's folders
follow a run (CONTRIBUTING.md "The layout"): ``core`` and ``rules`` (no Spark, no store),
``spark``, ``storage``, ``ingest``, ``publish``, ``resolve``, ``changes``, ``validate``,
the spine ``stages`` and the entry points in ``app``. It never imports Airflow.

    from pipeline import RunOptions, load_config, run
    report = run(load_config("cdr.yaml"), date(2026, 11, 21), RunOptions(work_dir=...))
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: each name of the face and where it lives: ``module`` (the same name in it),
#: ``module:name``, or ``module:`` (the module itself)
_FACE: dict[str, str] = {
    # a run and its stages
    "run": "pipeline.stages",
    "ingest": "pipeline.stages",
    "resolve": "pipeline.stages",
    "validate": "pipeline.stages",
    "publish": "pipeline.stages",
    "finish": "pipeline.stages",
    "RunOptions": "pipeline.stages",
    "asset_extras": "pipeline.app.dag_notes",
    "notes_line": "pipeline.app.dag_notes",
    "operator_notes": "pipeline.app.dag_notes",
    "run_notes": "pipeline.app.dag_notes",
    "small_run": "pipeline.stages",
    "load_summary": "pipeline.resolve.stage",
    "load_verdict": "pipeline.validate.stage",
    "RunReport": "pipeline.core.report",  # what ``run`` and ``publish`` return
    # the config, the store, a run's identity
    "load_config": "pipeline.core.config_load",
    "load_dag_config": "pipeline.core.config_load",  # $CDR_CONFIG (docs/airflow.md#settings)
    "dag_config_path": "pipeline.core.config_load",
    "WHATIF_NAME": "pipeline.core.config",
    "layout": "pipeline.core.layout:",  # the module: every key of the store
    "open_store": "pipeline.storage.store",
    "Lake": "pipeline.storage.lake",
    "RunContext": "pipeline.storage.context",
    "safe_run_id": "pipeline.storage.context",
    "check_run_id": "pipeline.storage.context",
    "missing_manifests": "pipeline.ingest.manifests",
    "safe_relpath": "pipeline.ingest.manifests",
    "waiting_for": "pipeline.ingest.seal",  # docs/sealing.md: the sensor of a source's exports
    "seal_for_run": "pipeline.ingest.seal",
    # errors
    "CdrError": "pipeline.core.errors",
    "ExportError": "pipeline.core.errors",
    "StageError": "pipeline.core.errors",
    "StoreError": "pipeline.core.errors",
    # entry points: the command line, spark-submit, what-if, the Conflicts page
    "cli_main": "pipeline.app.cli:main",
    "ENTRY": "pipeline.app.jobs",
    "submit_conf": "pipeline.spark.jvm",
    "whatif": "pipeline.app.whatif",
    "config_named": "pipeline.app.whatif",
    "decide_conflict": "pipeline.app.decide",
    "list_decisions": "pipeline.app.runs",
    "DecideForm": "pipeline.app.runs",
    "list_reports": "pipeline.app.runs",
    "render_page": "pipeline.app.runs",
    "table_runs": "pipeline.app.runs",
    "conflicts_page": "pipeline.app.report_page",
    "report_summary": "pipeline.app.report_page",
    "MalformedReport": "pipeline.core.summary",
    "trends": "pipeline.storage.stats",
}

__all__ = ["__version__", *_FACE]


def __getattr__(name: str) -> Any:
    where = _FACE.get(name)
    if where is None:
        raise AttributeError(f"module 'pipeline' has no attribute {name!r}")
    module, colon, attr = where.partition(":")
    found = importlib.import_module(module)
    value = found if colon and not attr else getattr(found, attr or name)
    globals()[name] = value  # found once
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:  # what the names are, for type checkers
    from pipeline.app.cli import main as cli_main
    from pipeline.app.dag_notes import asset_extras, notes_line, operator_notes, run_notes
    from pipeline.app.decide import decide_conflict
    from pipeline.app.jobs import ENTRY
    from pipeline.app.report_page import conflicts_page, report_summary
    from pipeline.app.runs import (
        DecideForm,
        list_decisions,
        list_reports,
        render_page,
        table_runs,
    )
    from pipeline.app.whatif import config_named, whatif
    from pipeline.core import layout
    from pipeline.core.config import WHATIF_NAME
    from pipeline.core.config_load import dag_config_path, load_config, load_dag_config
    from pipeline.core.errors import CdrError, ExportError, StageError, StoreError
    from pipeline.core.report import RunReport
    from pipeline.core.summary import MalformedReport
    from pipeline.ingest.manifests import missing_manifests, safe_relpath
    from pipeline.resolve.stage import load_summary
    from pipeline.spark.jvm import submit_conf
    from pipeline.stages import (
        RunOptions,
        finish,
        ingest,
        publish,
        resolve,
        run,
        small_run,
        validate,
    )
    from pipeline.storage.context import RunContext, check_run_id, safe_run_id
    from pipeline.storage.lake import Lake
    from pipeline.storage.stats import trends
    from pipeline.storage.store import open_store
    from pipeline.validate.stage import load_verdict
