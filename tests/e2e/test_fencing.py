"""Commits fenced by the lease (issue 47): measured before the fence, a writer that lost
its lease went on committing, and two writers of one new date both landed.

A publisher stopped (SIGSTOP to its process group, its JVM included) right after its
first commit; ``cdr unlock`` refuses its live lease and ``--force`` breaks it; a second
run of the date takes the lease and is stopped after its own first commit. The first,
resumed, commits nothing more and exits naming the holder; the second, resumed,
publishes. No ``runs`` row names the first run, and every table is as after one
uninterrupted run. Then two runs of a new date start at once: one publishes, the other
stops naming it."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from pipeline.app.cli import main
from pipeline.storage.lake import Lake
from pipeline.storage.store import open_store
from tests.helpers import configs
from tests.helpers import published as P
from tests.helpers import scenarios as S
from tests.helpers.faults import Paused, started_together, told

SCENARIO = "future_timestamp"  # a conflict and a quarantine: every kind of table


def _setup(tmp_path: Path, scenario: str = SCENARIO) -> tuple[Path, list[str], Path]:
    s = json.loads((S.SCENARIOS / f"{scenario}.json").read_text())
    root = tmp_path / "store"
    root.mkdir()
    S.layout_store(s, root)
    cfg = configs.write(tmp_path / "cdr.yaml", s["config"], store=root)
    argv = ["--config", str(cfg), "--date", s["date"], "--now", s["now"], "--no-data-docs"]
    argv += ["--work-dir", str(tmp_path / "work")]
    if S.missing_exports(s, s["exports"]):
        argv.append("--allow-missing-exports")
    return root, argv, cfg


def _reference(tmp_path: Path, root: Path, argv: list[str], cfg: Path) -> dict:
    """The tables after one uninterrupted run, on a copy of the store as it is now."""
    shutil.copytree(root, tmp_path / "ref")
    text = cfg.read_text().replace(root.as_uri(), (tmp_path / "ref").as_uri())
    ref_cfg = tmp_path / "ref.yaml"
    ref_cfg.write_text(text)
    ref_argv = [a if a != str(cfg) else str(ref_cfg) for a in argv]
    ref_argv = [a if a != str(tmp_path / "work") else str(tmp_path / "ref-work") for a in ref_argv]
    assert main(["run", *ref_argv, "--run-id", "run-ref"]) == 0
    return P.all_tables(open_store((tmp_path / "ref").as_uri()), ("run-ref",))


def _commits_of(store, run_id: str) -> set[tuple[str, int]]:
    """(table, version) of every commit of ``run_id`` in the published tables."""
    lake = Lake(store)
    tables = {k.split("/_delta_log/")[0] for k in store.list("published") if "/_delta_log/" in k}
    return {
        (path, int(h["version"]))
        for path in tables
        for h in lake.history(path)
        if P.commit_meta(h).get("run_id") == run_id
    }


@pytest.mark.timeout(900)
def test_a_writer_that_lost_its_lease_commits_nothing_more(tmp_path: Path, spark, capsys):
    root, argv, cfg = _setup(tmp_path)
    after = _reference(tmp_path, root, argv, cfg)
    store = open_store(root.as_uri())

    first = Paused(["run", *argv, "--run-id", "run-first"], r"commit published/")
    second = None
    try:
        made = _commits_of(store, "run-first")  # its commits so far (a step's tables go at once)
        assert made
        capsys.readouterr()
        assert main(["unlock", "--config", str(cfg)]) == 1  # its lease is live
        assert "is live: run run-first" in capsys.readouterr().err
        assert main(["unlock", "--config", str(cfg), "--force"]) == 0
        second = Paused(["run", *argv, "--run-id", "run-second"], r"commit published/")

        code, log = first.resume()
        assert code == 1, log
        # refused by the check before its next commit, or (paused a moment later than its
        # log line, inside that commit) by the read-back after it: both name the holder
        refused = ("run run-first does not hold the lease", "not by run run-first")
        assert any(r in log for r in refused), log
        assert "held by run run-second on" in log, log
        assert "Traceback" not in log, log
        assert _commits_of(store, "run-first") == made  # none after

        code, log = second.resume()
        assert code == 0, log
        assert [(r["run_id"], r["status"]) for r in P.runs(store)] == [("run-second", "published")]
        assert P.all_tables(store, ("run-second",)) == after  # nothing of the first run is left
    finally:  # a failed test leaves no process stopped
        for p in (first, second):
            if p is not None:
                p.kill()


@pytest.mark.timeout(900)
def test_a_run_paused_before_publish_stops_naming_the_lease_holder(tmp_path: Path, spark):
    """Broken while it validates: the next run of the date removes its work folder, and
    publishing, it fails on the lease, not on its missing files (before: "StageError: no
    resolved run for <date>: run `cdr resolve` first")."""
    root, argv, cfg = _setup(tmp_path)
    store = open_store(root.as_uri())
    first = Paused(["run", *argv, "--run-id", "run-first"], r"validate: \d+ suites")
    try:
        assert main(["unlock", "--config", str(cfg), "--force"]) == 0
        assert main(["run", *argv, "--run-id", "run-second"]) == 0
        assert not (tmp_path / "work" / "run=run-first").exists()  # removed by the second
        code, log = first.resume()
    finally:
        first.kill()
    assert code == 1, log
    # on the lease: its check on the failure, its renewal if that comes first, or the next
    # commit (naming its table) if the stop came as publish began
    lost = ("does not hold the lease", "lost the lease")
    assert re.search(r"cdr run: LockedError: (\S+: not committed: )?run run-first ", log), log
    assert any(m in log for m in lost), log
    assert "Traceback" not in log, log
    # stopped as publish began (CI met it: the stop lands a moment after the line), a commit
    # whose lease check had passed lands: the residual window the README states, at most
    # one per table, and no runs row names it
    landed = _commits_of(store, "run-first")
    assert len({table for table, _ in landed}) == len(landed), landed
    assert [(r["run_id"], r["status"]) for r in P.runs(store)] == [("run-second", "published")]


def test_a_run_that_fails_its_gate_says_so_not_the_lease_it_released(tmp_path: Path, spark, capsys):
    """Publish releases the lease of a failed run before it raises the gate's failure:
    that failure is the message, not the lease (``stages.naming_a_lost_lease``)."""
    _, argv, _ = _setup(tmp_path, "divergence_skip_fails")
    capsys.readouterr()
    assert main(["run", *argv]) == 1
    err = capsys.readouterr().err
    assert "cdr run: GateError: " in err and "LockedError" not in err, err


@pytest.mark.timeout(900)
def test_of_two_runs_of_a_new_date_started_at_once_one_publishes(tmp_path: Path, spark):
    root, argv, cfg = _setup(tmp_path)
    after = _reference(tmp_path, root, argv, cfg)
    argvs = {f"run-{i}": ["run", *argv, "--run-id", f"run-{i}"] for i in (1, 2)}
    codes, errors = started_together(argvs, tmp_path)
    assert sorted(codes.values()) == [0, 1], told(codes, errors)
    (loser_log,) = [errors[r] for r, code in codes.items() if code == 1]
    assert "is being written by run run-" in loser_log and "Traceback" not in loser_log
    store = open_store(root.as_uri())
    runs = P.runs(store)
    assert [r["status"] for r in runs] == ["published"]  # the loser never got the lease
    assert P.all_tables(store, (runs[0]["run_id"],)) == after  # its rows once
