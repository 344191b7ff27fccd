"""Runs killed with SIGKILL (issue 14, "`cdr run` killed with SIGKILL at points in each
stage, commit phase included"), on a ``file://`` store (the fault sweep of
tests/e2e/test_publish_faults.py covers S3).

A published first run, then the same date run again and killed: ``cdr run`` in ingest
and in resolve, the DAG's ``cdr validate`` stage process, and the ``cdr publish`` process
after its k-th commit, for a few seeds. A kill lands when the process's own log says it
has reached that point (its stderr, read line by line). After each kill, every table
reads (with ``deltalake``) as after the first run or as after an uninterrupted rerun,
never anything else, and ``runs`` names only the first run. The lease the killed run
left is taken over once expired, or broken with ``cdr unlock --force``; the run after the last
kill gives the rows of the uninterrupted rerun.
"""

from __future__ import annotations

import json
import random
import shutil
from collections import Counter
from pathlib import Path

import pytest

from pipeline.app.cli import main
from pipeline.core import layout
from pipeline.storage.store import open_store
from tests.helpers import configs
from tests.helpers import published as P
from tests.helpers import scenarios as S
from tests.helpers.faults import SEEDS, expire_lease, killed_at

SCENARIO = "future_timestamp"  # a conflict and a quarantine
CDC = {"enabled": True, "vnodes": 4, "shards": 1, "sharding_ignore_msb": 0}


def _last_commit_by(table: Path) -> str:
    from deltalake import DeltaTable

    return str(P.commit_meta(DeltaTable(str(table)).history(1)[0])["run_id"])


@pytest.mark.timeout(900)
def test_runs_killed_in_every_stage_leave_whole_runs(tmp_path: Path, spark, capsys):
    s = json.loads((S.SCENARIOS / f"{SCENARIO}.json").read_text())
    root = tmp_path / "store"
    root.mkdir()
    S.layout_store(s, root)
    config = {**s["config"], "cdc": CDC}
    cfg = configs.write(tmp_path / "cdr.yaml", config, store=root)
    argv = ["--config", str(cfg), "--date", s["date"], "--now", s["now"]]
    argv += ["--work-dir", str(tmp_path / "work")]
    if S.missing_exports(s, s["exports"]):
        argv.append("--allow-missing-exports")
    store = open_store(root.as_uri())

    assert main(["run", *argv, "--run-id", "run-first", "--no-data-docs"]) == 0
    before, runs_before = P.all_tables(store), P.runs(store)

    # the uninterrupted rerun, on a copy of the store
    shutil.copytree(root, tmp_path / "run-ref")
    ref_cfg = configs.write(tmp_path / "ref.yaml", config, store=tmp_path / "run-ref")
    ref_argv = [a if a != str(cfg) else str(ref_cfg) for a in argv]
    assert main(["run", *ref_argv, "--run-id", "run-ref", "--no-data-docs"]) == 0
    after = P.all_tables(open_store((tmp_path / "run-ref").as_uri()), ("run-ref",))
    assert after != before and set(after) >= set(before)

    killed: list[str] = []

    def whole_runs(where: str) -> None:
        got = P.all_tables(store, tuple(killed))
        for path in set(got) | set(after):
            assert got.get(path) in (before.get(path), after[path]), (where, path)
        assert P.runs(store) == runs_before, where  # a killed run is not visible
        holder = json.loads(store.read_bytes(layout.LOCK))["run_id"]
        assert holder == killed[-1], where  # the killed run's lease stays until it expires

    rng = random.Random(SEEDS[0])
    # cdr run, killed in ingest (after it took the lease) and in resolve
    killed.append("run-k-ingest")
    killed_at(["run", *argv, "--run-id", "run-k-ingest"], r"ingest \S+/t: ", rng.randint(1, 2))
    whole_runs("ingest")
    expire_lease(store)  # the next run takes it over
    killed.append("run-k-resolve")
    resolving = rng.choice([r"resolve: t \d+/\d+ tables", r"resolve t: \d+ events", r"cdc t: "])
    killed_at(["run", *argv, "--run-id", "run-k-resolve"], resolving, 1)
    whole_runs("resolve")
    assert main(["unlock", "--config", str(cfg), "--force"]) == 0

    # the DAG's stage processes: validate killed after one of its suites
    killed.append("run-k-stages")
    stage = [*argv, "--run-id", "run-k-stages"]
    assert main(["ingest", *stage, "--no-data-docs"]) == 0
    assert main(["resolve", *stage]) == 0
    killed_at(["validate", *stage], r"validate \S+: passed", rng.randint(1, 4))
    whole_runs("validate")
    assert main(["validate", *stage]) == 0  # its retry re-enters the run

    # publish killed after its k-th commit, for each seed
    commits = len(after)  # one commit per table at most
    for seed in SEEDS:
        k = random.Random(seed).randint(1, max(1, commits // 2))
        lines = killed_at(["publish", *stage], r"commit published/", k)
        assert sum("commit published/" in line for line in lines) == k
        whole_runs(f"publish, commit {k}")
        # the kill fell inside the commit phase: some tables hold its commits, not all
        by = Counter(_last_commit_by(root / path) for path in after)
        assert k <= by["run-k-stages"] < len(after), (k, by)
    capsys.readouterr()

    assert main(["unlock", "--config", str(cfg), "--force"]) == 0
    assert main(["run", *argv, "--run-id", "run-next", "--no-data-docs"]) == 0
    killed.append("run-next")
    assert P.all_tables(store, tuple(killed)) == after
    assert [r["run_id"] for r in P.runs(store)] == ["run-first", "run-next"]


@pytest.mark.timeout(600)
def test_a_killed_runs_lease_lapses_within_its_seconds(tmp_path: Path, spark, capsys):
    """docs/operations.md#the-lease: ``cdr run`` killed with its process group in resolve
    leaves its lease, which no process renews any more: ``cdr doctor`` says its process is
    gone, a run started at once is refused naming the holder, one started after
    ``lease.seconds`` (5 here) takes the store without ``--force``. A second killed run's
    lease is broken by ``cdr unlock`` without ``--force``: its process is gone from this
    host."""
    import time

    s = json.loads((S.SCENARIOS / f"{SCENARIO}.json").read_text())
    root = tmp_path / "store"
    root.mkdir()
    S.layout_store(s, root)
    cfg = configs.write(tmp_path / "cdr.yaml", s["config"], store=root, lease={"seconds": 5})
    argv = ["--config", str(cfg), "--date", s["date"], "--now", s["now"], "--no-data-docs"]
    argv += ["--work-dir", str(tmp_path / "work"), "--allow-missing-exports"]
    store = open_store(root.as_uri())
    assert main(["run", *argv, "--run-id", "run-first"]) == 0

    killed_at(["run", *argv, "--run-id", "run-killed"], r"resolve: t \d+/\d+ tables", 1)
    killed_at_ = time.monotonic()
    capsys.readouterr()
    assert main(["doctor", "--config", str(cfg)]) == 0
    assert "lease: live, but its process is gone: run run-killed" in capsys.readouterr().out
    assert main(["run", *argv, "--run-id", "run-too-soon"]) == 1
    assert "is being written by run run-killed" in capsys.readouterr().err
    time.sleep(max(0.0, 5.5 - (time.monotonic() - killed_at_)))
    assert main(["run", *argv, "--run-id", "run-after"]) == 0  # no unlock, no --force
    assert [r["run_id"] for r in P.runs(store) if r["status"] == "published"][-1] == "run-after"

    killed_at(["run", *argv, "--run-id", "run-killed-2"], r"resolve: t \d+/\d+ tables", 1)
    assert main(["unlock", "--config", str(cfg)]) == 0  # its process is gone: no --force
    assert not store.exists(layout.LOCK)
