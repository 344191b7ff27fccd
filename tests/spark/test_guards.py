"""The typing of a record through ``cdr run``: a decimal keeps every digit it was written
with. (The guards in pure Python: tests/unit/test_guards.py.)"""

from __future__ import annotations

import hashlib
import json
from decimal import Decimal
from pathlib import Path

from pipeline.app.cli import main
from tests.helpers import configs
from tests.helpers import published as P
from tests.unit.test_guards import CONFIG, rec


def test_a_decimal_keeps_every_digit_it_was_written_with(tmp_path: Path, spark) -> None:
    """A JSON number is read from its digits: a decimal(38,10) of 38 digits is published
    as written (it used to go through a double and lose its last 21 digits)."""
    store = tmp_path / "store"
    big = "1234567890123456789012345678.1234567891"
    line = json.dumps(rec(after={"id": 1, "v": "a", "x": "@"})).replace('"@"', big)
    folder = store / "exports/replica=pub/table=t/dt=2026-11-21"
    folder.mkdir(parents=True)
    data = (line + "\n").encode()
    (folder / "part-0.jsonl").write_bytes(data)
    entry = {"path": "part-0.jsonl", "rows": 1, "sha256": hashlib.sha256(data).hexdigest()}
    manifest = {"replica": "pub", "table": "t", "dt": "2026-11-21", "format": "jsonl"}
    (folder / "_manifest.json").write_text(json.dumps({**manifest, "files": [entry]}))
    configs.write(tmp_path / "cdr.yaml", CONFIG, store=store)
    args = ["run", "--config", str(tmp_path / "cdr.yaml"), "--date", "2026-11-21"]
    rc = main([*args, "--work-dir", str(tmp_path / "work"), "--allow-missing-exports"])
    assert rc == 0
    [row] = P.snapshot(store, "t")
    assert row["x"] == Decimal(big)
