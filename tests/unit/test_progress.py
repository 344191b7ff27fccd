"""The progress lines (docs/operations.md#progress): one per step off a terminal, at most
one every few seconds on one, Spark's tasks (ticks) on a terminal only, and nothing with
``--quiet``. The clock is a test's own: nothing sleeps."""

from __future__ import annotations

import json

import pytest

from pipeline.app.cli import main
from pipeline.core.progress import SILENT, Progress, current, installed
from tests.unit.test_check_export import setup  # noqa: F401 (a fixture)
from tests.unit.test_ingest import D


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def progress(terminal: bool) -> tuple[Progress, Clock, list[str]]:
    lines: list[str] = []
    clock = Clock()
    return Progress(lines.append, terminal=terminal, clock=clock), clock, lines


def test_off_a_terminal_every_step_has_its_line_and_no_tick_is_said():
    p, clock, lines = progress(terminal=False)
    with p.stage("resolve"):
        p.step("orders", 1, 2, "tables")
        clock.now += 0.5
        p.step("customers", 2, 2, "tables")
        clock.now += 30
        p.tick("Spark: 5/8 tasks")
        clock.now += 1.4
    assert lines == [
        "resolve: orders 1/2 tables, 0s",
        "resolve: customers 2/2 tables, 0s",
        "resolve: done in 32s",
    ]
    assert not p.ticks


def test_on_a_terminal_a_line_comes_at_most_every_five_seconds():
    p, clock, lines = progress(terminal=True)
    with p.stage("resolve"):
        p.step("orders", 1, 2, "tables")  # the first line: said
        clock.now += 1
        p.step("customers", 2, 2, "tables")  # 1 s after the last line: not said
        for _ in range(12):  # Spark's tasks, polled every second for 12 s
            clock.now += 1
            p.tick("Spark: 5/8 tasks")
    assert lines == [
        "resolve: orders 1/2 tables, 0s",
        "resolve: customers 2/2 tables, 5s; Spark: 5/8 tasks",
        "resolve: customers 2/2 tables, 10s; Spark: 5/8 tasks",
        "resolve: done in 13s",  # a stage's end is always said
    ]
    assert p.ticks


def test_a_tick_waits_until_its_step_has_run_a_few_seconds():
    p, clock, lines = progress(terminal=True)
    with p.stage("publish"):
        clock.now += 10
        p.step("committing the snapshots (2 tables)")
        clock.now += 2
        p.tick("Spark: 1/2 tasks")  # the step is 2 s old
        clock.now += 3
        p.tick("Spark: 1/2 tasks")  # 5 s old, and so is the last line
    assert lines == [
        "publish: committing the snapshots (2 tables), 10s",
        "publish: committing the snapshots (2 tables), 15s; Spark: 1/2 tasks",
        "publish: done in 15s",
    ]


def test_a_step_not_said_is_said_once_it_runs_a_few_seconds_without_spark():
    p, clock, lines = progress(terminal=True)
    with p.stage("resolve"):
        p.step("orders", 1, 2, "tables")
        clock.now += 1
        p.step("measuring for validation")  # too soon after the last line: not said
        for _ in range(12):  # no Spark stage active: ticks without a detail
            clock.now += 1
            p.tick()
    assert lines == [
        "resolve: orders 1/2 tables, 0s",
        "resolve: measuring for validation, 5s",  # once: no news after it
        "resolve: done in 13s",
    ]


def test_a_stage_that_fails_says_no_end_and_gives_way_to_the_next():
    p, _, lines = progress(terminal=False)
    with pytest.raises(RuntimeError), p.stage("validate"):
        raise RuntimeError("a gate")
    with p.stage("finish"):
        p.step("lease")
    assert lines == ["finish: lease, 0s", "finish: done in 0s"]


def test_nothing_is_said_unless_a_command_installed_a_progress():
    assert current() is SILENT
    with SILENT.stage("resolve"):
        SILENT.step("orders", 1, 1, "tables")
    p, _, lines = progress(terminal=False)
    with installed(p):
        assert current() is p
        with installed(None):  # --quiet
            assert current() is SILENT
    assert current() is SILENT and lines == []


def _ingest(cfg, tmp_path, *flags: str) -> None:
    """``cdr ingest`` of a dry run: it holds no lease, and runs again."""
    work = ["--work-dir", str(tmp_path / "work"), "--allow-missing-exports", "--dry-run"]
    args = [*flags, "ingest", "--config", str(cfg), "--date", D.isoformat(), *work]
    assert main(args) == 0


def test_a_stage_says_its_steps_on_stderr_and_quiet_says_none(setup, tmp_path, capsys):  # noqa: F811
    _, cfg = setup
    _ingest(cfg, tmp_path)
    out, err = capsys.readouterr()
    assert "ingest: t 1/1 tables, 0s" in err
    assert "ingest: done in" in err
    assert "ingested" in out and "ingest:" not in out  # the result alone on stdout

    _ingest(cfg, tmp_path, "--quiet")
    out, err = capsys.readouterr()
    assert err == ""
    assert "ingested" in out


def test_json_logs_say_progress_as_json_lines_and_stdout_stays_the_result(
    setup,  # noqa: F811
    tmp_path,
    capsys,
):
    _, cfg = setup
    _ingest(cfg, tmp_path, "--log-format", "json")
    out, err = capsys.readouterr()
    lines = [json.loads(x) for x in err.splitlines()]
    said = [x["message"] for x in lines if x["logger"] == "cdr.progress"]
    assert said[0] == "ingest: t 1/1 tables, 0s" and said[-1].startswith("ingest: done in")
    assert set(json.loads(out)) == {"run_id", "work"}
