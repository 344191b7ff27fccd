"""extensions.md E8 without a run: ``cdr whatif`` needs a published night. (The what-if
against a reference run, and its DAG: tests/airflow/test_whatif.py.)"""

from __future__ import annotations

from pathlib import Path

import yaml

from pipeline.cli import main

D = "2026-11-21"
BASE = {
    "replicas": [
        {"id": "r1", "system_id": 1},
        {"id": "r2", "system_id": 2},
        {"id": "r3", "system_id": 3},
    ],
    "on_divergence": "warn",
    "tables": {
        "items": {"key": ["id"], "columns": {"id": "bigint", "name": "string", "qty": "int"}}
    },
}


def _config(path: Path, store: Path, **table: object) -> Path:
    items = {**BASE["tables"]["items"], **table}
    path.write_text(yaml.safe_dump({**BASE, "store": store.as_uri(), "tables": {"items": items}}))
    return path


def test_whatif_needs_a_published_night(tmp_path: Path, capsys):
    cfg = _config(tmp_path / "cdr.yaml", tmp_path / "store")
    assert (
        main(["whatif", "--config", str(cfg), "--date", D, "--work-dir", str(tmp_path / "w")]) == 1
    )
    assert f"no published run of {D}" in capsys.readouterr().err
