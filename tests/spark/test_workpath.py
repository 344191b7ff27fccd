"""The work location (``pipeline.storage.workpath``): the same operations on a local folder and
on an S3 prefix of the test server, and what a Spark task carries of it."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.storage.workpath import WorkPath, metadata, read_folder, read_table, write_table


@pytest.fixture(params=["file", "s3"])
def root(request, tmp_path: Path) -> WorkPath:
    if request.param == "file":
        return WorkPath.of(tmp_path / "work")
    store = request.getfixturevalue("s3_store")
    return WorkPath.of(store.uri + "/work")


def test_files_and_folders(root: WorkPath):
    run = root / "run=r1"
    assert not run.exists() and not run.is_dir()
    (run / "run.json").write_text('{"a": 1}')
    (run / "staged" / "t" / "run.json").write_text("{}")  # deeper: not a run's own
    assert run.exists() and run.is_dir() and (run / "run.json").is_file()
    assert (run / "run.json").read_text() == '{"a": 1}'
    assert root.glob("run=*/run.json") == [run / "run.json"]
    assert (run / "run.json").parent == run and run.name == "run=r1"
    run.rmtree()
    assert not run.exists() and root.glob("run=*/run.json") == []


def test_parquet_folders(root: WorkPath):
    out = root / "resolved" / "t" / "state_pre"
    write_table(pa.table({"k": [1, 2]}), out / "part-0.parquet")
    write_table(pa.table({"k": [3]}), out / "part-1.parquet")
    (out / "_SUCCESS").write_bytes(b"")
    assert [p.name for p in out.parquet_files()] == ["part-0.parquet", "part-1.parquet"]
    got = read_folder(out)
    assert got is not None and sorted(got["k"].to_pylist()) == [1, 2, 3]
    out.move_to(out.parent / "state")
    assert not out.exists() and read_table(out.parent / "state" / "part-1.parquet").num_rows == 1
    assert read_folder(root / "nothing") is None


def test_a_task_writes_into_a_local_folder_that_lands_in_the_location(root: WorkPath):
    dest = root / "staged" / "t" / "replica=a"
    with dest.writing() as folder:
        (folder / "copies").mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"k": [1]}), folder / "copies" / "part-0.parquet")
    assert [p.name for p in (dest / "copies").parquet_files()] == ["part-0.parquet"]
    with pytest.raises(RuntimeError), dest.writing() as folder:
        (folder / "half.parquet").write_bytes(b"PAR1")
        raise RuntimeError("the task failed")
    if root.local is None:  # uploaded only when the block ends well
        assert not (dest / "half.parquet").exists()
    with (dest / "copies").fetched() as local:
        assert [p.name for p in local.iterdir()] == ["part-0.parquet"]


def test_a_long_footer_is_read_from_the_files_end(root: WorkPath, tmp_path: Path):
    """A footer longer than the first ranged read (a thousand columns): read in two."""
    wide = pa.table({f"column_{i:04d}_with_a_long_name": [i] for i in range(1000)})
    local = tmp_path / "wide.parquet"
    pq.write_table(wide, local)
    assert pq.read_metadata(local).serialized_size > 64 * 1024
    (root / "wide.parquet").write_bytes(local.read_bytes())
    got = metadata(root / "wide.parquet")
    assert got.num_columns == 1000 and got.num_rows == 1
    assert got.schema.equals(pq.read_metadata(local).schema)


def test_spark_finds_it_and_a_task_carries_no_credentials(root: WorkPath):
    if root.local is not None:
        assert str(root) == str(root.local)
    else:
        assert str(root).startswith("s3a://cdr-test-") and str(root).endswith("/work")
    sent = pickle.dumps(root / "x")
    assert os.environ.get("AWS_SECRET_ACCESS_KEY", "not set").encode() not in sent
    assert pickle.loads(sent) == root / "x"
