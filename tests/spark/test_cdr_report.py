"""``cdr report`` on the store of a small night (docs/operations.md#cdr-report): the
Markdown summary and the Conflicts page of the published run, and a date without one."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from pipeline.app.cli import main
from tests.helpers import scenarios as S
from tests.helpers.cli import cdr, cdr_json
from tests.helpers.snapshots import S_, SUB, D, T, setup


def _event(k: int, origin: str, v: str, at: int) -> dict:
    return {
        "op": "INSERT",
        "key": {"id": k},
        "after": {"id": k, "v": v},
        "ts": T + at * S_,
        "origin": origin,
        "event_id": f"{origin}-{k}",
    }


def night(tmp: Path) -> Path:
    """:func:`tests.helpers.snapshots.setup`'s night (sub's snapshot differs on 3 keys),
    with key 1 inserted by both replicas, each first in its own export: its conflicts."""
    cfg = setup(tmp, "warn", SUB)
    pub = [_event(1, "pub", "a", 1), _event(2, "pub", "v2", 2), _event(3, "pub", "v3", 3)]
    sub = _event(1, "sub", "b", 4)
    orders = {"pub": [*pub, sub], "sub": [sub, *pub]}
    S.write_exports(
        tmp / "store",
        D,
        {r: {"t": [{**e, "seq": i} for i, e in enumerate(evs)]} for r, evs in orders.items()},
    )
    work = str(tmp / "work")
    assert main(["run", "--config", str(cfg), "--date", D, "--work-dir", work]) == 0
    return cfg


@pytest.fixture(scope="module")
def published(tmp_path_factory, spark) -> Path:
    """The night, run once: its ``cdr.yaml`` (a test that changes the store copies it)."""
    return night(tmp_path_factory.mktemp("night"))


def test_cdr_report_prints_the_summary_and_writes_the_page(tmp_path: Path, published, capsys):
    cfg = published
    capsys.readouterr()
    assert main(["report", "--config", str(cfg), "--date", D]) == 0
    md = capsys.readouterr().out
    assert md.startswith(f"# Run of {D}: published\n")
    lead = re.search(r"\*\*(\d+) conflicts on (\d+) keys\*\*", md)
    assert lead is not None and int(lead.group(1)) >= 1 and lead.group(2) == "1", md
    assert "| t | insert_exists |" in md
    assert "## Quarantine\n\n**0 events quarantined**." in md
    assert "| t | sub | snapshot | " in md and md.index("## Conflicts") < md.index("## Divergence")
    store = (cfg.parent / "store").as_uri()
    assert f"- t snapshot: <{store}/published/t/snapshot>" in md

    page = tmp_path / "page" / "conflicts.html"
    page.parent.mkdir()
    rc, got = cdr_json("report", "--config", str(cfg), "--date", D, "--html", str(page))
    assert rc == 0 and got["html"] == str(page) and "markdown" not in got
    html = page.read_text()
    assert html.startswith("<!doctype html>") and f"<title>Conflicts {D}</title>" in html
    assert "<script" not in html and "<link" not in html and "src=" not in html  # offline
    assert "id='conflicts'" in html and "insert_exists" in html
    assert f"{store}/published/reports/dt={D}/run={got['run_id']}/validation/data_docs/" in html

    rc, both = cdr_json(
        "report", "--config", str(cfg), "--date", D, "--html", str(page), "--markdown"
    )
    assert rc == 0 and both["markdown"] == md and both["html"] == str(page)


def test_a_date_without_a_published_run_names_the_dates_with_one(published):
    rc, out = cdr("report", "--config", str(published), "--date", "2026-11-20")
    said = json.loads(out.splitlines()[-1])
    assert rc == 1 and said["error"] == "StageError"
    assert "no published run of 2026-11-20" in said["message"]
    assert f"the dates with one: {D}" in said["message"]


def test_a_published_runs_report_damaged_or_gone_is_named(tmp_path: Path, published):
    store = tmp_path / "store"
    shutil.copytree(published.parent / "store", store)
    on = ("--config", str(published), "--store", store.as_uri(), "--date", D)
    (folder,) = (store / f"published/reports/dt={D}").glob("run=*")
    (folder / "run_report.json").write_text("{")
    rc, out = cdr("report", *on)
    said = json.loads(out.splitlines()[-1])
    assert rc == 1 and said["error"] == "StoreError"
    assert f"{folder.name}/run_report.json is not a run report: " in said["message"]
    (folder / "run_report.json").unlink()
    rc, out = cdr("report", *on)
    said = json.loads(out.splitlines()[-1])
    assert rc == 1 and said["error"] == "StoreError"
    assert f"records run {folder.name[4:]} as published for {D}" in said["message"]
    assert "is missing: cdr run --date" in said["message"]
