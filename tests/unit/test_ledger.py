"""Each event once (docs/outputs.md#each-event-once) without a run: the ledger window a run
reads is the ``gc_grace_seconds`` before its date, and ``cdr generate`` gives each night
its own event ids. (Through ``cdr run``: tests/spark/test_ledger.py.)"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import yaml

from tests.helpers import configs
from tests.helpers import scenarios as S

D1, D2 = "2026-11-21", "2026-11-22"


def _update(eid: str, hour: str, before: int, after: int) -> dict:
    return {
        "op": "UPDATE",
        "key": {"id": 1},
        "ts": f"{hour}Z",
        "origin": "A",
        "event_id": eid,
        "before": {"balance": before},
        "after": {"balance": after},
    }


def _setup(tmp: Path, gc_grace_seconds: int = 864000) -> Path:
    store = tmp / "store"
    accounts = configs.table({"id": "bigint", "balance": "bigint"}, delta=["balance"])
    cfg = configs.config(
        {"accounts": accounts}, replicas=("A", "B"), store=store, gc_grace_seconds=gc_grace_seconds
    )
    insert = {
        "op": "INSERT",
        "key": {"id": 1},
        "ts": f"{D1}T08:00:00Z",
        "origin": "A",
        "event_id": "A-1",
        "after": {"id": 1, "balance": 100},
    }
    credit = _update("A-2", f"{D1}T09:00:00", 100, 110)  # +10
    night1 = [insert, credit]
    # the next night, A's export holds the credit again (delivered twice), then +5, and
    # that twice too (two export files that overlap)
    plus5 = _update("A-3", f"{D2}T09:00:00", 110, 115)
    night2 = [credit, plus5, plus5]
    for d, events in ((D1, night1), (D2, night2)):
        exports = {"A": {"accounts": [{**e, "seq": i} for i, e in enumerate(events)]}}
        S.write_exports(store, d, {**exports, "B": {"accounts": []}})
    return configs.write(tmp / "cdr.yaml", cfg)


def test_generated_nights_have_their_own_event_ids(tmp_path: Path):
    """``cdr generate`` numbered each night's events from 1 again: the next night's events
    took the ids of the night before, and the ledger set them all aside as duplicates."""
    from datetime import date

    from pipeline.app.generate import GenerateOptions, generate
    from pipeline.core.config_load import parse_config
    from pipeline.storage.store import FileStore

    (tmp_path / "hand").mkdir()
    config = parse_config(yaml.safe_load(_setup(tmp_path / "hand").read_text()))
    store = FileStore(tmp_path / "store")  # only what generate writes
    ids = []
    for i, d in enumerate((date(2026, 11, 21), date(2026, 11, 22))):
        generate(config, store, d, GenerateOptions(events=40, seed=i))
        folder = tmp_path / f"store/exports/replica=A/table=accounts/dt={d}"
        lines = []
        for f in folder.iterdir():
            if f.name != "_manifest.json":
                data = f.read_bytes()
                lines += (gzip.decompress(data) if f.suffix == ".gz" else data).splitlines()
        ids.append({json.loads(line)["event_id"] for line in lines if line.strip()})
    assert ids[0] and ids[1] and not ids[0] & ids[1]
