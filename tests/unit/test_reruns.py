"""The store's writes under reruns (issue 14): ``replace_tree`` removes what the new tree
lacks (on a file store; on S3: tests/spark/test_reruns.py), and two writers of one key on
``file://`` no longer share a temporary file (item 3)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.storage.store import replace_tree


@pytest.fixture(params=["file"])  # and "s3": tests/spark/test_reruns.py
def store(request):
    return request.getfixturevalue(f"{request.param}_store")


def _local_file(tmp: Path, name: str, data: bytes) -> Path:
    f = tmp / name
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_bytes(data)
    return f


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


def test_two_writers_of_one_key_on_file_never_share_a_temporary_file(file_store):
    """Two runs writing the same key at once (a pointer, a report): each write lands
    whole, neither fails because the other renamed its temporary file away."""
    import threading

    errors: list[BaseException] = []
    payloads = [bytes([65 + w]) * 200_000 for w in range(2)]

    def writer(w: int) -> None:
        try:
            for _ in range(150):
                file_store.write_bytes(
                    "published/reports/dt=2026-11-21/run_report.json", payloads[w]
                )
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert file_store.read_bytes("published/reports/dt=2026-11-21/run_report.json") in payloads
