"""A rerun of a date replaces what the first run published for it, on both stores
(issue 14, item 1: on S3 the old files stayed, and a rerun doubled the date's logs and
the CDC description tables); two writers of one key on ``file://`` no longer share a
temporary file (item 3)."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import scenarios as S
import yaml
from test_scenarios import CDC

from pipeline.cli import main
from pipeline.published import replace_dated, replace_tree


@pytest.fixture(params=["file", "s3"])
def store(request, tmp_path: Path):
    return request.getfixturevalue(f"{request.param}_store")


def _local_file(tmp: Path, name: str, data: bytes) -> Path:
    f = tmp / name
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_bytes(data)
    return f


def test_replace_dated_leaves_only_the_new_runs_files(store, tmp_path: Path):
    src1, src2 = tmp_path / "one", tmp_path / "two"
    _local_file(src1, "part-0.parquet", b"first")
    _local_file(src1, "part-1.parquet", b"first")
    _local_file(src2, "part-0.parquet", b"second")
    replace_dated(store, src1, "published/t/conflicts/dt=2026-11-21", "run1")
    replace_dated(store, src2, "published/t/conflicts/dt=2026-11-21", "run2")
    assert store.list("published/t/conflicts/dt=2026-11-21") == [
        "published/t/conflicts/dt=2026-11-21/run2-part-0.parquet"
    ]


def test_replace_tree_removes_what_the_new_tree_lacks(store, tmp_path: Path):
    src1, src2 = tmp_path / "one", tmp_path / "two"
    _local_file(src1, "results.json", b"{}")
    _local_file(src1, "docs/index.html", b"<html>")
    _local_file(src2, "results.json", b"{}")
    replace_tree(store, src1, "published/validation/dt=2026-11-21")
    replace_tree(store, src2, "published/validation/dt=2026-11-21")
    assert store.list("published/validation/dt=2026-11-21") == [
        "published/validation/dt=2026-11-21/results.json"
    ]


def _published_rows(store, tmp: Path) -> dict[str, Counter[str]]:
    """Every published Parquet folder of the store (a run's snapshot folder by table) as a
    multiset of rows, run ids left out."""
    out: dict[str, Counter[str]] = {}
    for key in store.list("published"):
        if not key.endswith(".parquet"):
            continue
        folder = key.rsplit("/", 1)[0]
        folder = re.sub(r"run=[^/]+", "run=*", folder)  # a run's snapshot or state folder
        local = tmp / key
        store.download(key, local)
        for row in pq.read_table(local).to_pylist():
            row = {k: v for k, v in row.items() if "run_id" not in k}
            out.setdefault(folder, Counter())[json.dumps(row, sort_keys=True, default=str)] += 1
    return out


def test_a_rerun_of_a_date_on_s3_publishes_the_same_rows_once(s3_store, tmp_path: Path, spark):
    """One scenario with conflicts and a quarantine, run twice for its date on S3: every
    published folder holds the same rows after the rerun, none twice."""
    s = json.loads((S.SCENARIOS / "future_timestamp.json").read_text())
    layout = tmp_path / "layout"
    layout.mkdir()
    S.layout_store(s, layout)
    for f in sorted(p for p in layout.rglob("*") if p.is_file()):
        s3_store.upload(f, f.relative_to(layout).as_posix())
    cfg = {**s["config"], "cdc": CDC, "store": s3_store.uri}
    (tmp_path / "cdr.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    args = ["run", "--config", str(tmp_path / "cdr.yaml"), "--date", s["date"], "--now", s["now"]]
    args += ["--no-data-docs"]
    assert main([*args, "--work-dir", str(tmp_path / "w1")]) == 0
    first = _published_rows(s3_store, tmp_path / "first")
    assert main([*args, "--work-dir", str(tmp_path / "w2")]) == 0
    again = _published_rows(s3_store, tmp_path / "again")
    assert any("conflicts/dt=" in f for f in first) and any("quarantine/dt=" in f for f in first)
    assert any("cdc_streams" in f or "cdc/" in f for f in first), sorted(first)
    snapshots = [f for f in again if "/run=*" in f]
    assert len(snapshots) >= 1, sorted(again)
    assert again == {**first, **{f: again[f] for f in snapshots}}  # two runs' snapshot folders
    for f in snapshots:
        assert set(again[f]) == set(first[f]) and sum(again[f].values()) == 2 * sum(
            first[f].values()
        ), f


def test_two_writers_of_one_key_on_file_never_share_a_temporary_file(file_store):
    """Two runs writing the same key at once (a pointer, a report): each write lands
    whole, neither fails because the other renamed its temporary file away."""
    import threading

    errors: list[BaseException] = []
    payloads = [bytes([65 + w]) * 200_000 for w in range(2)]

    def writer(w: int) -> None:
        try:
            for _ in range(150):
                file_store.write_bytes("published/t/_latest.json", payloads[w])
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert file_store.read_bytes("published/t/_latest.json") in payloads
