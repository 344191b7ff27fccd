"""extensions.md E8 without a run: ``cdr whatif`` needs a published night. (The what-if
against a reference run, and its DAG: tests/airflow/test_whatif.py.)"""

from __future__ import annotations

from pathlib import Path

from pipeline.cli import main
from tests.helpers import configs

D = "2026-11-21"
REPLICAS = ("r1", "r2", "r3")


def _config(path: Path, store: Path, **table: object) -> Path:
    """The night's config: ``items`` with ``table``'s settings."""
    items = configs.table(configs.ITEMS, **table)
    cfg = configs.config({"items": items}, replicas=REPLICAS, on_divergence="warn")
    return configs.write(path, cfg, store=store)


def test_whatif_needs_a_published_night(tmp_path: Path, capsys):
    cfg = _config(tmp_path / "cdr.yaml", tmp_path / "store")
    assert (
        main(["whatif", "--config", str(cfg), "--date", D, "--work-dir", str(tmp_path / "w")]) == 1
    )
    assert f"no published run of {D}" in capsys.readouterr().err
