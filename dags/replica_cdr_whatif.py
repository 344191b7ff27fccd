"""replica_cdr_whatif: what another configuration would have made of a published night
(extensions.md E8), on demand.

Triggered by hand, with a form: the date and the path of the other configuration (its
store is the one to compare in). One task runs ``cdr whatif``: D's published inputs
resolved under that configuration as a dry run, compared with what D published, written
to ``published/reports/dt=<D>/whatif/<name>.json`` and ``.html``. Nothing is published.

Settings: ``CDR_WORK_DIR`` as for ``replica_cdr``; the connection ``aws_default``
(optional) for the store's credentials.
"""

from __future__ import annotations

import logging
import os
from datetime import datetime
from pathlib import Path
from typing import Any

from airflow.sdk import Param, dag, task
from cdr_links import aws_env_from_connection

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
        minLength=1,
        title="Configuration",
        description="Path of the other cdr.yaml, as the workers see it.",
    ),
}


@task(retries=0)
def whatif(params: dict[str, Any] | None = None) -> dict[str, Any]:
    """``cdr whatif``: returns each table's count of differing rows (an XCom)."""
    import json

    from pipeline.config import load_config
    from pipeline.whatif import whatif as run_whatif

    assert params is not None
    aws_env_from_connection()
    path = Path(params["config"])
    config = load_config(path)
    day = datetime.strptime(params["date"], "%Y-%m-%d").date()
    result = run_whatif(config, day, path.stem, Path(WORK_DIR))
    counts = {t: c["differing_rows"]["count"] for t, c in result["tables"].items()}
    log.info("what-if %s for %s: differing rows %s", path.stem, day, json.dumps(counts))
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
