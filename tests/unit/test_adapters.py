"""The adapters' manifest options (formats.md): each format's options are checked when the
manifest is read, naming the manifest. (The records themselves: tests/spark/.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.errors import ExportError
from pipeline.exports import read_manifest
from pipeline.store import open_store
from tests.helpers import sources as src

DT = "2026-11-21"


@pytest.mark.parametrize(
    "fmt, options, message",
    [
        ("dms", {}, "needs options.timestamp_column"),
        ("dms", {"timestamp_column": "t", "header": False}, "needs options.columns"),
        ("wal2json", {"origin": {}}, "options ['origin'] are not options of wal2json"),
        ("wal2json", {"origins": {"x": "pg1"}}, "maps replication origin ids"),
        ("debezium", {"timestamp_column": "t"}, "(known: unavailable_value_placeholder)"),
        ("debezium", {"unavailable_value_placeholder": 1}, "must be a str"),
    ],
)
def test_manifest_options_are_checked(tmp_path: Path, fmt, options, message):
    store = open_store((tmp_path / "store").as_uri())
    src.put_export(store, "pg1", "items", DT, fmt, {"a.json": src.lines([{}])}, options)
    with pytest.raises(ExportError) as e:
        read_manifest(store, f"exports/replica=pg1/table=items/dt={DT}", {})
    assert message in str(e.value) and "_manifest.json" in str(e.value)
