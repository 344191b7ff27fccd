"""docs/outputs.md#backfills: a run starts only from a published state whose versions
``cdr vacuum`` keeps (``runs_table.retained_rows``, the config's ``retention_days``); a
run of an older date is refused before anything reads it, naming the horizon."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest

from pipeline.core.errors import PriorStateError
from pipeline.ingest.prior import refuse_outside_retention
from pipeline.storage.runs_table import RunRow

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
TABLES = {"tables": {"t": {"state_rows": 3}}}


def _row(run_id: str, dt: date, days_ago: int) -> RunRow:
    at = NOW - timedelta(days=days_ago)
    return RunRow(run_id, dt, "published", at, at, None, "c" * 64, counts=TABLES)


def test_a_backfill_from_a_state_older_than_the_retention_is_refused_naming_the_horizon():
    old = _row("old", date(2026, 10, 1), 40)
    newer = _row("newer", date(2026, 10, 2), 39)
    runs = [old, newer]
    with pytest.raises(PriorStateError) as e:
        refuse_outside_retention(runs, old, "t", date(2026, 10, 2), 30, NOW)
    assert "state of 2026-10-01 (run old" in str(e.value)
    assert "retention horizon 2026-10-30 12:00 UTC (retention_days: 30)" in str(e.value)
    # a longer retention keeps it
    refuse_outside_retention(runs, old, "t", date(2026, 10, 2), 45, NOW)


def test_the_last_published_state_is_always_a_start_however_old():
    """Vacuum keeps a table's last published run whatever its age: the next night after a
    long pause starts from it."""
    last = _row("last", date(2026, 10, 2), 39)
    refuse_outside_retention([_row("old", date(2026, 10, 1), 40), last], last, "t",
                             date(2026, 11, 29), 30, NOW)  # fmt: skip


def test_a_rerun_of_the_newest_date_after_a_long_pause_starts_from_the_date_before():
    """The table's last published run when the window began is kept too: after a pause
    longer than the retention, the newest date's rerun starts from it."""
    before_pause = _row("before-pause", date(2026, 10, 1), 40)
    runs = [
        _row("older", date(2026, 9, 30), 41),
        before_pause,
        _row("after", date(2026, 11, 28), 1),
    ]
    refuse_outside_retention(runs, before_pause, "t", date(2026, 11, 28), 30, NOW)
    with pytest.raises(PriorStateError, match="state of 2026-09-30"):
        refuse_outside_retention(runs, runs[0], "t", date(2026, 10, 1), 30, NOW)


def test_a_state_within_the_retention_is_a_start():
    recent = _row("recent", date(2026, 11, 20), 5)
    runs = [recent, _row("later", date(2026, 11, 21), 4)]
    refuse_outside_retention(runs, recent, "t", date(2026, 11, 21), 30, NOW)
