"""``cdr doctor`` on a ``file://`` store: access, the atomic create (an exclusive create
on a local folder) and each table's log retention, warned about until the next commit
sets it. A store that ignores the condition: tests/spark/test_s3server.py."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from pipeline.app.cli import main
from pipeline.publish.doctor import examine
from pipeline.storage.lake import Lake
from pipeline.storage.store import FileStore
from tests.helpers import configs

pytestmark = pytest.mark.usefixtures("spark")  # the Delta tables are written by delta-spark

CONFIG = configs.config(
    {"items": configs.table({"id": "bigint", "qty": "int"})},
    replicas=("r1", "r2"),
    retention_days=45,
)


def test_doctor_checks_a_store_and_warns_of_a_table_without_the_retention(tmp_path: Path, capsys):
    store = FileStore(tmp_path / "store")
    cfg = configs.write(tmp_path / "cdr.yaml", CONFIG, store=store.uri)
    assert [(f.check, f.ok) for f in examine(store, 45)] == [
        ("access", True), ("atomic create", True), ("retention", True), ("lease", True)
    ]  # fmt: skip
    older = "published/items/snapshot"  # written before the setting: no retention
    Lake(store).write(older, pa.table({"id": [1]}), {})
    Lake(store, 45).write("published/items/state", pa.table({"id": [1]}), {})
    assert main(["doctor", "--config", str(cfg)]) == 0  # a warning, not a failure
    out = capsys.readouterr().out
    assert "warn retention: 1 of 2 table(s)" in out and older in out, out
    assert "ok   atomic create" in out and "ok   lease: free" in out
    assert store.list("published/_probes") == []  # the probes are gone
