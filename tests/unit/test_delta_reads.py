"""No code reads a published Delta table through its file list and Parquet (docs/outputs.md
"Outputs": a reader takes a version through a Delta reader): that would return the rows
a deletion vector removed. Only the lake (``pipeline.storage.lake`` and its reader
``lake_read``) touches a table's files, and two modules see their names without reading
them: ``vacuum`` (which files a version needs) and ``prior`` (the files of a pinned
version exist before the executors read it)."""

from __future__ import annotations

import ast
from pathlib import Path

import pipeline

#: the file-list APIs of delta-rs, and the project's own (``storage.lake_read.add_actions``)
FILE_LISTS = {"file_uris", "files", "get_add_actions", "to_pyarrow_dataset", "to_pyarrow_table"}
OWN = "add_actions"
#: module -> the names it may call
ALLOWED = {
    "storage/lake.py": {OWN},
    "storage/lake_read.py": FILE_LISTS | {OWN},
    "publish/vacuum.py": {OWN},
    "ingest/prior.py": {OWN},
}


def file_list_calls(source: str) -> set[str]:
    """The file-list calls in ``source``: ``x.files(...)``, ``add_actions(...)``..."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        package_data = isinstance(f, ast.Attribute) and getattr(f.value, "id", "") == "resources"
        if (name in FILE_LISTS or name == OWN) and not package_data:
            found.add(name)
    return found


def test_the_scan_finds_a_read_through_the_file_list():
    bad = "rows = pq.read_table(DeltaTable(uri).file_uris()[0])\nkeys = add_actions(t)\n"
    assert file_list_calls(bad) == {"file_uris", "add_actions"}
    assert file_list_calls("t.files()\nresources.files('pipeline')") == {"files"}


def test_only_the_delta_layer_lists_a_tables_files():
    root = Path(pipeline.__file__).parent
    wrong = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        calls = file_list_calls(path.read_text()) - ALLOWED.get(rel, set())
        if calls:
            wrong[rel] = sorted(calls)
    assert wrong == {}
