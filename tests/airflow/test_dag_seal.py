"""The DAG with a replica's ``source`` (docs/sealing.md): a ``seal`` task between the
sensor and ingest; without one, none (DagBag import only: no Spark)."""

from __future__ import annotations

from tests.helpers.dagrun import dagbag, write_config


def _tasks(tmp_path, monkeypatch, **overrides):
    monkeypatch.setenv(
        "CDR_CONFIG", str(write_config(tmp_path / "cdr.yaml", "file:///d", **overrides))
    )
    bag = dagbag()
    assert bag.import_errors == {}
    return [t.task_id for t in bag.get_dag("replica_cdr").topological_sort()]


def test_a_source_adds_the_seal_task_before_ingest(airflow, tmp_path, monkeypatch):
    from pipeline.app.demo import DEMO_CONFIG

    replicas = [dict(r) for r in DEMO_CONFIG["replicas"]]
    replicas[0]["source"] = {"prefix": "cdc/pub", "layout": "debezium-s3-time"}
    assert _tasks(tmp_path, monkeypatch, replicas=replicas)[:4] == [
        "plan",
        "wait_for_exports",
        "seal",
        "ingest",
    ]
    assert "seal" not in _tasks(tmp_path, monkeypatch)
