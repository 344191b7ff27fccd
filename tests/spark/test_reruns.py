"""A rerun of a date replaces what the first run published for it (issue 14, item 1: on
S3 the old files stayed, and a rerun doubled the date's logs and the CDC description
tables); ``replace_tree`` of tests/unit/test_reruns.py on S3."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

import tests.unit.test_reruns as unit
from pipeline.app.cli import main
from pipeline.core import layout
from tests.helpers import configs
from tests.helpers import published as P
from tests.helpers import scenarios as S
from tests.helpers.twins import store_tests

globals().update(store_tests(unit))  # the unit module's tests that take a store, on S3


def _published_rows(store) -> dict[str, Counter[str]]:
    """Every Delta table of the store but ``runs``, read with ``deltalake`` at its latest
    version, as a multiset of rows, run ids left out."""
    tables = sorted(
        {k.split("/_delta_log/")[0] for k in store.list("published") if "/_delta_log/" in k}
    )
    out: dict[str, Counter[str]] = {}
    for path in tables:
        if path == layout.RUNS:
            continue
        for row in P.rows(store, path):
            row = {k: v for k, v in row.items() if "run_id" not in k}
            out.setdefault(path, Counter())[json.dumps(row, sort_keys=True, default=str)] += 1
    return out


def test_a_rerun_of_a_date_on_s3_publishes_the_same_rows_once(s3_store, tmp_path: Path, spark):
    """One scenario with conflicts and a quarantine, run twice for its date on S3: every
    published table holds the same rows after the rerun, none twice (the CDC generation
    tables included); the runs table has both runs."""
    s = json.loads((S.SCENARIOS / "future_timestamp.json").read_text())
    folder = tmp_path / "layout"
    folder.mkdir()
    S.layout_store(s, folder)
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        s3_store.upload(f, f.relative_to(folder).as_posix())
    configs.write(tmp_path / "cdr.yaml", s["config"], cdc=S.CDC, store=s3_store.uri)
    args = ["run", "--config", str(tmp_path / "cdr.yaml"), "--date", s["date"], "--now", s["now"]]
    args += ["--no-data-docs"]
    assert main([*args, "--work-dir", str(tmp_path / "w1")]) == 0
    first = _published_rows(s3_store)
    assert main([*args, "--work-dir", str(tmp_path / "w2")]) == 0
    again = _published_rows(s3_store)
    t = next(iter(s["config"]["tables"]))
    for kind in ("snapshot", "state", "conflicts", "quarantine", "ledger"):
        assert first.get(layout.table_path(t, kind)), (kind, sorted(first))
    assert first.get(layout.cdc_table_dir("cdc_streams_descriptions")), sorted(first)
    assert again == first
    assert [r["status"] for r in P.runs(s3_store)] == ["published", "published"]


@pytest.fixture(params=["s3"])
def store(request):
    return request.getfixturevalue(f"{request.param}_store")
