"""Hostile export files without a run: ``max_record_bytes`` is a positive count, and the
reader behind it skips a long line across its read chunks, keeping the line numbers.
(The files through ``cdr run``: tests/spark/test_hostile.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import configs

CONFIG = configs.config(allow_missing_exports=True)


def test_max_record_bytes_must_be_a_positive_count(tmp_path: Path):
    from pipeline.config import load_config
    from pipeline.errors import ConfigError

    cfg = configs.write(tmp_path / "cdr.yaml", CONFIG, store="file:///x", max_record_bytes=0)
    with pytest.raises(ConfigError, match="max_record_bytes"):
        load_config(cfg)
    configs.write(cfg, CONFIG, store="file:///x")
    assert load_config(cfg).max_record_bytes == 16 << 20


@pytest.mark.parametrize("chunk", [7, 64, 1 << 20])
def test_a_long_line_is_skipped_across_chunks(tmp_path: Path, chunk: int):
    """The reader behind the limit: a long line spread over many chunks comes as its first
    bytes and its length, and the line numbers after it stay right, whatever the chunks."""
    from pipeline.exports import _line_chunks
    from pipeline.guards import LongLine

    long = b"{" + b"y" * 500 + b"}"
    f = tmp_path / "part.jsonl"
    f.write_bytes(b"\n".join([b"a", long, b"bb", long]))
    got = [
        (first + i, ln)
        for first, ls in _line_chunks(f, "part", 100, chunk)
        for i, ln in enumerate(ls)
    ]
    assert [(n, bytes(ln)) for n, ln in got if not isinstance(ln, LongLine)] == [
        (1, b"a"),
        (3, b"bb"),
    ]
    longs = [(n, ln.length, bytes(ln)) for n, ln in got if isinstance(ln, LongLine)]
    assert longs == [(2, len(long), long[:1024]), (4, len(long), long[:1024])]
