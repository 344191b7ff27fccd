"""Two custom resolvers (docs/rules.md#custom-resolvers), as a user writes them: put the
file in a package of yours that the Airflow workers and the Spark executors can import
(installed on the cluster, or shipped with ``spark-submit --py-files``), and name the
function in ``cdr.yaml``:

    resolvers:
      update_differ: {python: "acme.cdr:prefer_paid_plan"}

``tests/unit/test_custom_resolvers.py`` runs both through the fold."""

from __future__ import annotations

import json

#: the plans, the most valuable last
PLANS = ("free", "team", "enterprise")


def prefer_paid_plan(local: dict, remote: dict, context: dict) -> str:
    """The version on the better plan wins; on the same plan, the later one (then the
    origin's name, so that both replicas pick the same one). Symmetric: swapping the sides
    picks the same version."""

    def rank(v: dict) -> tuple:
        return (PLANS.index(v["row"]["plan"]), v["ts"], v["origin"] or "")

    return "remote" if rank(remote) > rank(local) else "local"


def merge_json_documents(local: dict, remote: dict, context: dict) -> dict:
    """Both versions' ``attrs`` (a JSON object as text) merged key by key: a key only one
    side has is kept, a key both have takes the later version's value. The rest of the row
    is the later version's. Symmetric, so the replicas converge."""
    first, last = sorted((local, remote), key=lambda v: (v["ts"], v["origin"] or ""))
    attrs = {
        **json.loads(first["row"]["attrs"] or "{}"),
        **json.loads(last["row"]["attrs"] or "{}"),
    }
    return {"row": {**last["row"], "attrs": json.dumps(attrs, sort_keys=True)}}
