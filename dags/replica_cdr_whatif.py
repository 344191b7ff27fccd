"""replica_cdr_whatif: what another configuration would have made of a published night
(docs/operations.md#what-if), on demand.

Triggered by hand, with a form: the date and the name of the other configuration:
``main`` (the main DAG's) or the name of a ``.yaml`` file in the what-if folder (its store
is the one to compare in). A path is refused without being read. One task runs
``cdr whatif``: D's published inputs resolved under that configuration as a dry run,
compared with what D published, written to
``published/reports/dt=<D>/whatif/<name>.json`` and ``.html``. Nothing is published.

Settings: ``CDR_CONFIG`` and ``CDR_WORK_DIR`` as for ``replica_cdr``; ``CDR_WHATIF_DIR``,
the folder of the configurations a what-if may run (default: ``whatif/`` beside the
main config); the connection ``aws_default`` (optional) for the store's credentials.
"""

from __future__ import annotations

import logging
import os
from datetime import datetime
from pathlib import Path
from typing import Any

from airflow.sdk import Param, dag, task
from cdr_links import aws_env_from_connection

from pipeline import WHATIF_NAME

DAGS = Path(__file__).resolve().parent
WORK_DIR = os.environ.get(
    "CDR_WORK_DIR", str(Path(os.environ.get("AIRFLOW_HOME", "/tmp")) / "cdr-work")
)

log = logging.getLogger("airflow.task")

PARAMS = {
    "date": Param(
        type="string",
        format="date",
        title="Date",
        description="The published night to replay (YYYY-MM-DD).",
    ),
    "config": Param(
        type="string",
        pattern=WHATIF_NAME,
        title="Configuration",
        description=(
            "'main' (the main DAG's config), or the name of a .yaml file in the what-if "
            "folder (CDR_WHATIF_DIR), without its suffix; not a path."
        ),
    ),
}


@task(retries=0)
def whatif(params: dict[str, Any] | None = None) -> dict[str, Any]:
    """``cdr whatif``: returns each table's count of differing rows (an XCom)."""
    import json  # deferred: the task's, not the DAG's parse

    from pipeline import (  # deferred: the task's, not the DAG's parse
        config_named,
        dag_config_path,
        load_config,
    )
    from pipeline import whatif as run_whatif  # deferred: the task's, not the DAG's parse

    assert params is not None
    main = dag_config_path(DAGS)
    folder = Path(os.environ.get("CDR_WHATIF_DIR", str(main.parent / "whatif")))
    name = params["config"]
    path = config_named(name, main, folder)  # a path: refused, nothing read
    aws_env_from_connection()
    config = load_config(path)
    day = datetime.strptime(params["date"], "%Y-%m-%d").date()
    result = run_whatif(config, day, name, Path(WORK_DIR))
    counts = {t: c["differing_rows"]["count"] for t, c in result["tables"].items()}
    log.info("what-if %s for %s: differing rows %s", name, day, json.dumps(counts))
    return counts


@dag(
    dag_id="replica_cdr_whatif",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    params=PARAMS,
    doc_md=__doc__,
    tags=["cdr"],
)
def replica_cdr_whatif():
    whatif()


replica_cdr_whatif()
