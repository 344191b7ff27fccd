"""replica_cdr_decide: an operator's decision of one conflict (docs/rules.md#manual-decisions),
from the Conflicts page's form or by hand.

One task runs ``cdr decide`` under the store's lease: it records the decision in
``published/decisions/`` with the user who triggered the run as ``by`` (Airflow keeps who
triggered it, and the run's conf), and logs the dates that must run again, in order, for
the decision to reach the published state (a backfill of ``replica_cdr`` over them, or
``cdr decide --rerun``). A decision that does not fit (an unknown conflict, a type a
decision cannot answer, a row whose column does not fit the table) fails the task with
the reason; nothing is written.

Settings: ``CDR_CONFIG`` as for ``replica_cdr``; the connection ``aws_default``
(optional) for the store's credentials.
"""

from __future__ import annotations

import logging
from datetime import datetime
from pathlib import Path
from typing import Any

from airflow.sdk import Param, dag, get_current_context, task
from cdr_links import aws_env_from_connection

DAGS = Path(__file__).resolve().parent

log = logging.getLogger("airflow.task")

PARAMS = {
    "conflict_id": Param(
        type="string",
        pattern=r"^[0-9a-f]{32}$",
        title="Conflict",
        description="The conflict log's conflict_id (32 hex digits).",
    ),
    "take": Param(
        "local",
        type="string",
        enum=["local", "remote", "row"],
        title="Take",
        description="local: the local version stays; remote: the remote event applies; "
        "row: the row below is written.",
    ),
    "row": Param(
        "",
        type="string",
        title="Row",
        description='With take = row: a JSON object of the columns to write ({"v": "x"}).',
    ),
    "why": Param(type="string", minLength=1, title="Why", description="Kept with the decision."),
}


@task(retries=0)
def decide(params: dict[str, Any] | None = None) -> dict[str, Any]:
    """``cdr decide``: returns the decision and the dates to rerun (an XCom)."""
    from pipeline import decide_conflict, load_dag_config  # deferred: the task's, not the parse's

    assert params is not None
    run = get_current_context()["dag_run"]
    by = getattr(run, "triggering_user_name", None) or "airflow"
    aws_env_from_connection()
    config = load_dag_config(DAGS)
    take = params["take"]
    result = decide_conflict(
        config,
        conflict_id=params["conflict_id"],
        take=None if take == "row" else take,
        row=params["row"] if take == "row" else None,
        why=params["why"],
        by=by,
    )
    out = result.to_dict()
    log.info(
        "decision %s by %s; rerun in order: %s",
        out["decision"]["decision_id"],
        by,
        " ".join(out["rerun"]),
    )
    return out


@dag(
    dag_id="replica_cdr_decide",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    params=PARAMS,
    doc_md=__doc__,
    tags=["cdr"],
)
def replica_cdr_decide():
    decide()


replica_cdr_decide()
