"""A failed gate through ``cdr run`` (the FK seed example under ``on_fk_violation: fail``):
its results and Data Docs are published and no snapshot, and the Data Docs render in
Chromium with every suite. (The gate's checks: tests/spark/test_validation.py.)"""

from __future__ import annotations

import json
import re

from tests.helpers import published as P
from tests.helpers import scenarios as S
from tests.helpers.browser import render
from tests.helpers.reports import date_report
from tests.spark.test_validation import _path


def test_a_failed_gate_publishes_results_and_data_docs_but_no_snapshot(
    tmp_path, tmp_path_factory, spark
):
    """The FK seed example under ``on_fk_violation: fail``: the order left pointing at a
    product whose key changed fails the run; the results and Data Docs are published,
    and render in a browser with every suite. (The scenario test's run.)"""
    ran = S.scenario_run(_path("pg_fk_update_parent_fail"), tmp_path_factory)
    s, got, failed = ran["s"], ran["got"], ran["failed"]
    assert failed and got["snapshot"] == {}
    root = ran["root"] / "store"
    assert P.snapshot_date(root, "orders") is None
    assert not (root / f"published/reports/dt={s['date']}/run_report.json").exists()
    report = date_report(root, s["date"])  # the failed run's own, under run=<id>/
    assert report is not None and report.status == "failed"
    assert (root / f"published/reports/dt={s['date']}/run={report.run_id}").is_dir()
    assert report.validation.suites["foreign_keys.orders"] is False
    assert report.validation.suites["snapshot.orders"] is True
    (failure,) = report.failures
    assert failure.startswith("table orders: expectation foreign_keys.orders/no_orphan failed")
    assert '"order_id":103' in failure
    results = json.loads((root / report.validation.results).read_text())
    assert results["passed"] is False and "foreign_keys.orders" in results["suites"]

    assert report.validation.data_docs is not None
    index = root / report.validation.data_docs
    html = index.read_text()  # bundled scripts and styles: it opens without internet
    assert not re.findall(r'<(?:script|link)[^>]*(?:src|href)="https?://', html)
    suites = report.validation.suites
    assert {"snapshot.orders", "cdc.orders", "cdc_replay.products"} <= set(suites)
    dom = render(index, tmp_path)
    assert f"of {len(suites)} rows" in dom  # the tables list a row per suite (10 a page)
    shown = [s for s in suites if f'data-href="validations/{s.replace(".", "/")}/' in dom]
    assert len(shown) >= min(10, len(suites)), shown
    page = next((index.parent / "validations/foreign_keys/orders").rglob("*.html"))
    dom = render(page, tmp_path)
    assert "every row of orders with product_no set has a live parent in products" in dom
    assert "Failed" in dom
