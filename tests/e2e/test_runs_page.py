"""The Conflicts page's trends (docs/operations.md#conflict-trends), rendered by headless
Chromium. (The page's numbers: tests/spark/test_runs_page.py.)"""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pytest

from pipeline.app.runs import list_reports, render_page
from pipeline.storage.lake import Lake
from pipeline.storage.store import FileStore
from tests.helpers.browser import render
from tests.spark.test_runs_page import runs_store


@pytest.fixture
def store(tmp_path: Path) -> FileStore:
    return runs_store(tmp_path)


def _stats_of_runs(s: FileStore, days: int) -> None:
    """``published/conflict_stats`` as ``days`` runs left it (conflict stats), one commit per date:
    orders with conflicts rising by date, products with none but a quarantine."""
    from datetime import timedelta

    import pyarrow as pa

    from pipeline.storage import stats

    lake = Lake(s)
    first = date(2026, 10, 1)
    for i in range(days):
        dt = first + timedelta(days=i)
        run = f"{dt}_n"
        rows = [
            {"run_id": run, "table": "orders", "kind": "events", "count": 100},
            {
                "run_id": run,
                "table": "orders",
                "kind": "conflicts",
                "conflict_type": "update_differ",
                "resolver": "latest_timestamp_wins",
                "outcome": "applied",
                "count": i,
            },
            {
                "run_id": run,
                "table": "orders",
                "kind": "divergent_keys",
                "replica": "r1",
                "count": i % 3,
            },
            {"run_id": run, "table": "products", "kind": "events", "count": 5},
            {
                "run_id": run,
                "table": "products",
                "kind": "quarantined",
                "reason": "malformed",
                "count": 1,
            },
        ]
        lake.write(stats.PATH, pa.Table.from_pylist(rows, stats.SCHEMA), {"run_id": run}, dt=dt)


def test_the_trends_draw_each_tables_last_30_runs_in_chromium(store, tmp_path: Path):
    """conflict stats: 32 runs in ``conflict_stats``; the page draws, per table, the last 30 (oldest
    on the left) with a line and a point per run for each series, each point naming its
    date and count; rendered by headless Chromium, with a screenshot kept beside the page."""
    from pipeline.storage.stats import trends

    _stats_of_runs(store, 32)
    last = trends(Lake(store))
    assert sorted(last) == ["orders", "products"]
    assert [p.dt for p in last["orders"]][:1] == ["2026-10-03"] and len(last["orders"]) == 30
    assert [p.conflicts for p in last["orders"]] == list(range(2, 32))
    assert {p.quarantined for p in last["products"]} == {1}
    page = tmp_path / "conflicts-trends.html"
    page.write_text(render_page(list_reports(store), None, "/d/{dt}/{run_id}", last))
    dom = render(page, tmp_path)
    for table in ("orders", "products"):
        svg = dom[dom.index(f'id="trend-{table}"') :]
        svg = svg[: svg.index("</svg>")]
        for kind in ("conflicts", "quarantined", "divergent_keys"):
            assert svg.count(f'<circle class="{kind}"') == 30, (table, kind)
        assert "2026-10-03" in svg and "2026-10-32" not in svg and "2026-11-01" in svg
    assert "<title>2026-11-01 conflicts: 31</title>" in dom
    assert (tmp_path / "conflicts-trends.png").stat().st_size > 10_000
