"""A run's inputs found before anything is written, on a file store without Spark
(docs/operations.md#nothing-is-written-before-the-inputs-are-found): the store's ``exports/``
folder, a manifest of the date, the dates a wrong ``--date`` is told; and reads of a
file store that never create its folder. ``cdr run`` in its own process, on a wrong store
and a wrong date, file and S3: tests/e2e/test_inputs_found.py."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

import pytest

from pipeline.core.config_load import load_config
from pipeline.core.errors import ExportError, NotFoundError
from pipeline.ingest.found import dates_with_manifests, require_inputs
from pipeline.storage.store import open_store
from tests.helpers import configs

D = date(2026, 11, 21)


def _config(tmp_path: Path, **settings):
    cfg = configs.config(replicas=("pub", "sub"), store=tmp_path / "store", **settings)
    return load_config(configs.write(tmp_path / "cdr.yaml", cfg), None)


def _manifest(store, replica: str, dt: date, snapshot: bool = False) -> None:
    where = "snapshot/" if snapshot else ""
    key = f"exports/replica={replica}/table=t/{where}dt={dt}/_manifest.json"
    store.write_bytes(key, json.dumps({"format": "jsonl", "files": []}).encode())


def test_a_store_without_exports_is_named_and_nothing_is_created(tmp_path):
    config = _config(tmp_path)
    store = open_store((tmp_path / "store").as_uri())
    with pytest.raises(ExportError) as e:
        require_inputs(config, store, D)
    assert str(e.value) == (
        f"no exports under {store.uri}/exports/ — is `store` right? (cdr.yaml `store`, or --store)"
    )
    assert not (tmp_path / "store").exists()


def test_a_date_without_a_manifest_names_what_was_looked_for_and_the_dates_that_have(tmp_path):
    config = _config(tmp_path)
    store = open_store((tmp_path / "store").as_uri())
    for day in range(10, 18):
        _manifest(store, "pub", date(2026, 11, day))
    store.write_bytes(f"exports/replica=sub/table=t/dt={date(2026, 11, 19)}/part-0.jsonl", b"")
    with pytest.raises(ExportError) as e:
        require_inputs(config, store, D)
    said = str(e.value)
    assert said.startswith(
        f"no manifest for {D} under {store.uri}/exports/replica=<id>/table=<table>/dt={D}/"
        "_manifest.json"
    )
    assert "any of the 2 replicas (pub, sub) and 1 table (t)" in said
    # the latest five that have one: 2026-11-19 holds files but no manifest
    assert "2026-11-13, 2026-11-14, 2026-11-15, 2026-11-16, 2026-11-17 (the last 5)" in said
    assert "is --date right?" in said
    assert "allow_missing_exports" not in said


def test_allow_missing_exports_does_not_run_a_date_nobody_exported(tmp_path):
    config = _config(tmp_path, allow_missing_exports=True)
    store = open_store((tmp_path / "store").as_uri())
    _manifest(store, "pub", date(2026, 11, 20))
    with pytest.raises(ExportError, match="a date with no changes still needs a manifest"):
        require_inputs(config, store, D)


@pytest.mark.parametrize("snapshot", [False, True])
def test_one_manifest_of_the_date_is_enough(tmp_path, snapshot):
    config = _config(tmp_path)
    store = open_store((tmp_path / "store").as_uri())
    _manifest(store, "sub", D, snapshot=snapshot)
    require_inputs(config, store, D)
    assert dates_with_manifests(config, store) == [D]


def test_a_manifest_of_an_unconfigured_replica_is_not_an_input(tmp_path):
    config = _config(tmp_path)
    store = open_store((tmp_path / "store").as_uri())
    _manifest(store, "other", D)
    with pytest.raises(ExportError, match="no date has a manifest there"):
        require_inputs(config, store, D)


def test_reads_of_a_file_store_never_create_its_folder(tmp_path):
    root = tmp_path / "nowhere"
    store = open_store(root.as_uri())
    assert not store.exists("exports/x")
    assert not store.any_under("exports")
    assert store.list("exports") == [] and store.folders("exports") == []
    assert store.sizes("published") == {}
    assert store.read_token("published/_lock") is None
    with pytest.raises(NotFoundError):
        store.read_bytes("published/runs/x")
    with pytest.raises(NotFoundError):
        store.read_tail("published/runs/x", 10)
    assert not root.exists()


def test_any_under_is_true_for_one_object_deep_down(tmp_path):
    store = open_store((tmp_path / "s").as_uri())
    (tmp_path / "s" / "exports" / "a" / "b").mkdir(parents=True)
    assert not store.any_under("exports")  # folders, no object
    store.write_bytes("exports/a/b/c", b"")
    assert store.any_under("exports") and not store.any_under("base")
