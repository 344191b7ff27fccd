"""docs/operations.md#what-if without a run: ``cdr whatif`` needs a published night. (The what-if
against a reference run, and its DAG: tests/airflow/test_whatif.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.app.cli import main
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


@pytest.mark.parametrize(
    "name", ["/etc/passwd", "../secret", "whatif/../../secret", "lww.yaml", "main\n", "", "x" * 65]
)
def test_the_whatif_form_refuses_a_path_before_reading_anything(name, tmp_path, monkeypatch):
    """A what-if from the UI runs ``main`` or a config of the what-if folder, named: any
    other text is refused without touching the file system, and the message quotes the
    name, not a file."""
    from pipeline.app.whatif import config_named
    from pipeline.core.errors import ConfigError

    (tmp_path / "secret.yaml").write_text("tables: {}\n")

    def no_look(*a, **k):
        raise AssertionError("the file system was looked at")

    monkeypatch.setattr(Path, "is_file", no_look)
    monkeypatch.setattr(Path, "exists", no_look)
    monkeypatch.setattr(Path, "read_text", no_look)
    with pytest.raises(ConfigError, match="is not a name"):
        config_named(name, tmp_path / "cdr.yaml", tmp_path / "whatif")


def test_the_whatif_form_runs_main_or_a_config_of_its_folder(tmp_path):
    from pipeline.app.whatif import config_named
    from pipeline.core.errors import ConfigError

    folder = tmp_path / "whatif"
    folder.mkdir()
    (folder / "lww.yaml").write_text("tables: {}\n")
    main = tmp_path / "cdr.yaml"
    assert config_named("main", main, folder) == main
    assert config_named("lww", main, folder) == folder / "lww.yaml"
    with pytest.raises(ConfigError, match=r"no other\.yaml in the what-if folder"):
        config_named("other", main, folder)
