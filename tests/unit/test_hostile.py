"""Hostile export files without a run: ``max_record_bytes`` is a positive count, and the
reader behind it skips a long line across its read chunks, keeping the line numbers.
(The files through ``cdr run``: tests/spark/test_hostile.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import configs

CONFIG = configs.config(allow_missing_exports=True)


def test_max_record_bytes_must_be_a_positive_count(tmp_path: Path):
    from pipeline.core.config_load import load_config
    from pipeline.core.errors import ConfigError

    cfg = configs.write(tmp_path / "cdr.yaml", CONFIG, store="file:///x", max_record_bytes=0)
    with pytest.raises(ConfigError, match="max_record_bytes"):
        load_config(cfg)
    configs.write(cfg, CONFIG, store="file:///x")
    assert load_config(cfg).max_record_bytes == 16 << 20


@pytest.mark.parametrize("chunk", [7, 64, 1 << 20])
def test_a_long_line_is_skipped_across_chunks(tmp_path: Path, chunk: int):
    """The reader behind the limit: a long line spread over many chunks comes as its first
    bytes and its length, and the line numbers after it stay right, whatever the chunks."""
    from pipeline.ingest.staging import Limits, line_chunks
    from pipeline.rules.jsontext import LongLine

    long = b"{" + b"y" * 500 + b"}"
    f = tmp_path / "part.jsonl"
    f.write_bytes(b"\n".join([b"a", long, b"bb", long]))
    got = [
        (first + i, ln)
        for first, ls in line_chunks(f, "part", Limits(100), chunk)
        for i, ln in enumerate(ls)
    ]
    assert [(n, bytes(ln)) for n, ln in got if not isinstance(ln, LongLine)] == [
        (1, b"a"),
        (3, b"bb"),
    ]
    longs = [(n, ln.length, bytes(ln)) for n, ln in got if isinstance(ln, LongLine)]
    assert longs == [(2, len(long), long[:1024]), (4, len(long), long[:1024])]


def test_a_gzip_bomb_is_refused_naming_the_file_and_a_large_export_is_not(tmp_path, monkeypatch):
    """A gzipped export that decompresses to more than ``max_expansion`` times its size
    (and the floor) is refused as it is read, naming the file and the setting, before it
    fills the work volume; one within the bound is read whole."""
    import gzip

    from pipeline.core.errors import ExportError
    from pipeline.ingest import staging
    from pipeline.ingest.staging import Limits, line_chunks

    monkeypatch.setattr(staging, "EXPANSION_FLOOR", 1 << 20)  # 1 MiB, for a small bomb
    bomb = tmp_path / "bomb.jsonl.gz"
    bomb.write_bytes(gzip.compress(b"\n" * (64 << 20)))  # 64 MiB of blank lines, ~64 KiB
    with pytest.raises(ExportError, match=r"bomb\.jsonl\.gz: decompresses to more than") as e:
        for _ in line_chunks(bomb, "bomb.jsonl.gz", Limits(100, 100)):
            pass
    assert "max_expansion" in str(e.value)
    import random

    rng = random.Random(1)
    records = [
        f'{{"op": "UPDATE", "key": {{"id": {i}}}, "after": {{"v": "{rng.getrandbits(64):x}"}}}}'
        for i in range(40_000)
    ]
    large = tmp_path / "large.jsonl.gz"  # 2.4 MB over the floor, a few times its size
    large.write_bytes(gzip.compress("\n".join(records).encode()))
    n = sum(len(ls) for _, ls in line_chunks(large, "large.jsonl.gz", Limits(1000, 100)))
    assert n == 40_000


def test_a_dms_csv_whose_header_is_over_the_csv_readers_limit_names_the_file(tmp_path):
    """Python's CSV reader refuses a field over 128 KiB: a header like that is a file that
    cannot be read, said in one line naming it, not a traceback."""
    from pipeline.core.errors import ExportError
    from pipeline.ingest.staging import stage_dms_csv

    src = tmp_path / "LOAD.csv"
    src.write_text('Op,"' + "x" * (200 << 10) + '"\nI,1\n')
    with pytest.raises(ExportError, match=r"LOAD\.csv: its first line is not a CSV header"):
        stage_dms_csv(src, tmp_path / "out.parquet", "LOAD.csv", {})


def test_max_expansion_is_a_positive_factor_read_into_the_limits(tmp_path: Path):
    from pipeline.core.config_load import load_config
    from pipeline.core.errors import ConfigError
    from pipeline.ingest.staging import Limits

    cfg = configs.write(tmp_path / "cdr.yaml", CONFIG, store="file:///x", max_expansion=0)
    with pytest.raises(ConfigError, match="max_expansion"):
        load_config(cfg)
    configs.write(cfg, CONFIG, store="file:///x", max_expansion=20)
    assert Limits.of(load_config(cfg)) == Limits(16 << 20, 20)
    configs.write(cfg, CONFIG, store="file:///x")
    assert load_config(cfg).max_expansion == 100
