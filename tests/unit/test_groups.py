"""A fold task (resolve.fold_task) with the Arrow paths of resolve.groups against the same
task with every touched key folded in Python (pipeline.rules.rowfold, the rules' one home): the
same state, fates, conflicts, quarantine, divergence and changes, whatever the cuts between
its batches. Pure Python: the task's function runs on Arrow batches built here, as Spark's
``mapInArrow`` would give them."""

from __future__ import annotations

import itertools
import json
import random
from datetime import date
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql.pandas.types import to_arrow_schema

from pipeline.core.config_load import parse_config
from pipeline.core.jsonvalues import dumps
from pipeline.resolve import fold_task
from pipeline.resolve.fold_task import fold_function
from pipeline.resolve.group_fold import FoldJob
from pipeline.rules.events import FoldSpec
from pipeline.rules.guards import Typer, TypingSpec
from pipeline.spark.frames import FOLD_INPUT, fold_input_schema, fold_outputs
from pipeline.storage.workpath import WorkPath
from tests.helpers import configs

NOW = 1795305600000000  # 2026-11-22T00:00:00Z
DAY = 86_400_000_000
REPLICAS = ["r1", "r2", "r3"]
CONFIG = configs.config(
    configs.table({"id": "int", "v": "string", "n": "int"}, defaults={"n": 0}), replicas=REPLICAS
)
KINDS = [
    "lone",
    "lone",
    "lone",
    "lone_one_copy",
    "lone_twice_in_one_export",
    "lone_missing_column",
    "lone_extra_column",
    "lone_seen",
    "lone_quarantined",
    "lone_rejected",
    "contended",
    "quiet_state",
    "touched_state",
    "insert_over_row",
    "insert_over_tombstone",
    "exported_again",
    "unreadable_key",
]


def _stream(rng: random.Random, typer: Typer, keys: int) -> tuple[list[dict], int]:
    """The sorted rows of a task's stream for ``keys`` generated keys, and how many of
    them are lone inserts."""
    rows: list[dict] = []
    lone = 0
    for k in range(keys):
        kind = rng.choice(KINDS)
        lone += kind in ("lone", "lone_one_copy")
        if kind in ("quiet_state", "touched_state", "insert_over_row", "insert_over_tombstone"):
            rows.append(_state_row(k, rng, deleted=kind == "insert_over_tombstone"))
        if kind == "exported_again":  # the row an earlier night's copy of the event made
            rows.append(_state_row(k, rng, deleted=False, event_id=f"e{k}-0"))
        n_events = rng.randint(2, 3) if kind == "contended" else 1
        for i in range(n_events if kind != "quiet_state" else 0):
            op = "INSERT" if kind != "touched_state" else rng.choice(["UPDATE", "DELETE"])
            if kind == "contended":
                op = rng.choice(["INSERT", "UPDATE", "DELETE"])
            rec: dict = {
                "op": op,
                "key": {"id": k},
                "ts": NOW - DAY + rng.randint(0, DAY // 2),
                "origin": rng.choice(REPLICAS),
                "event_id": f"e{k}-{i}",
                "seq": k,
            }
            if op != "DELETE":
                rec["after"] = {"id": k, "v": f"v{k}-{i}", "n": rng.randint(0, 9)}
            if kind == "lone_missing_column":
                del rec["after"]["n"]
            if kind == "lone_extra_column":
                rec["after"]["zz"] = 1
            if kind == "lone_quarantined":
                rec["ts"] = NOW + DAY
            if kind == "unreadable_key":
                rec["key"] = {"id": "x"}
            replicas = [rng.choice(REPLICAS)] if kind == "lone_one_copy" else REPLICAS
            if kind == "lone_twice_in_one_export":
                replicas = [*REPLICAS, rng.choice(REPLICAS)]
            for rep in replicas:
                copy = typer.line(json.dumps(rec), rep)
                copy |= {"replica": rep, "file": f"{rep}.jsonl", "line": k}
                copy |= {"is_event": 1, "seen": kind == "lone_seen", "rejected": False}
                copy |= {"digest": k * 31 + i, "differs": False}
                copy["rejected"] = kind == "lone_rejected"
                rows.append(copy)
    rows.sort(
        key=lambda r: (
            r["key"] is not None,
            r["key"]["id"] if r["key"] else 0,
            r["is_event"],
            r["event_id"] or "",
            r.get("pref") or 0,
            r.get("replica") or "",
        )
    )
    return rows, lone


def _state_row(k: int, rng: random.Random, deleted: bool, event_id: str | None = None) -> dict:
    origin = rng.choice(REPLICAS)
    return {
        "key": {"id": k},
        "is_event": 0,
        "event_id": event_id or f"prior-{k}",
        "row": {"id": k, "v": None if deleted else f"p{k}", "n": None if deleted else 1},
        "s_ts": NOW - 2 * DAY,
        "s_rank": REPLICAS.index(origin),
        "s_origin": origin,
        "s_deleted": deleted,
        "s_deleted_at": NOW - DAY if deleted else None,
    }


def _run_task(tmp: Path, rows: list[dict], cuts: list[int], table) -> dict[str, list[str]]:
    job = FoldJob(
        FoldSpec(table, NOW),
        tuple(REPLICAS),
        (),
        date(2026, 11, 21),
        "run-1",
        WorkPath.of(tmp),
        trace=True,
        schemas=fold_outputs(table, True),
    )
    schema = to_arrow_schema(fold_input_schema(table), timezone="UTC")
    data = pa.Table.from_pylist([{c: r.get(c) for c in FOLD_INPUT} for r in rows], schema)
    bounds = [0, *sorted(set(cuts)), data.num_rows]
    batches = [data.slice(a, b - a).to_batches()[0] for a, b in itertools.pairwise(bounds) if b > a]
    list(fold_function(job, single_group=False)(iter(batches)))
    out = {}
    for kind in job.schemas:
        files = sorted((tmp / kind).glob("*.parquet"))
        got = [dumps(r) for f in files for r in pq.read_table(f).to_pylist()]
        out[kind] = sorted(got)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_the_arrow_paths_give_what_the_python_fold_gives(seed: int, tmp_path: Path, monkeypatch):
    config = parse_config(CONFIG)
    table = config.tables["t"]
    typer = Typer(TypingSpec.of(config, table, NOW))
    rng = random.Random(seed)
    rows, lone = _stream(rng, typer, 120)
    cuts = rng.sample(range(1, len(rows)), k=min(len(rows) - 1, rng.randint(0, 12)))
    assert lone > 10
    taken: list[int] = []
    real = fold_task.lone_insert_outputs

    def spy(rows, groups, table, schemas):
        taken.append(len(groups.starts) - 1)
        return real(rows, groups, table, schemas)

    monkeypatch.setattr(fold_task, "lone_insert_outputs", spy)
    fast = _run_task(tmp_path / "fast", rows, cuts, table)
    assert sum(taken) >= lone  # those keys took the Arrow path (a cut may split none)
    monkeypatch.setattr(
        fold_task, "lone_inserts", lambda t, g, table: np.zeros(len(g.starts) - 1, bool)
    )
    python = _run_task(tmp_path / "python", rows, cuts, table)
    assert fast == python
    assert fast["state_pre"] and fast["changes"] and fast["quarantine"] and fast["conflicts"]
