"""The typed run summary (``pipeline.core.summary``): what resolve saves is what validate and
publish read back, and building a new summary leaves the one it came from as it was."""

from __future__ import annotations

import dataclasses
import json

import pytest

from pipeline.core.summary import CdcSection, RunSummary, Stopped, TableSummary

STOP = Stopped("orders", '{"id":1}', "insert_exists", "e7", "resolver error")
SUMMARY = RunSummary(
    "run-1",
    "abc",
    "2026-11-21",
    1_700_000_000_000_000,
    {
        "orders": TableSummary(
            policy="postgres",
            events=7,
            distinct_events=5,
            applied=3,
            quarantined={"malformed": 1},
            conflicts={"insert_exists": {"applied": 1}},
            replicas={"r1": {"records": 4, "applied": 3}},
            stopped=STOP,
        ),
        "products": TableSummary(policy="scylla", rows=2, snapshot_divergent_keys={"r2": 1}),
    },
    cdc=CdcSection(generation=5, warning=None, tables={}),
)


def test_the_saved_summary_reads_back_equal():
    back = RunSummary.from_json(SUMMARY.to_json())
    assert back == SUMMARY
    assert back.tables["orders"].stopped == STOP
    assert back.stopped("orders") and not back.stopped("products")


def test_without_a_cdc_log_the_summary_has_no_cdc_section():
    plain = dataclasses.replace(SUMMARY, cdc=None)
    assert "cdc" not in json.loads(plain.to_json())
    assert RunSummary.from_json(plain.to_json()) == plain


def test_the_report_tables_keep_the_field_order_and_every_field():
    d = SUMMARY.tables["orders"].to_dict()
    assert list(d) == [f.name for f in dataclasses.fields(TableSummary)]
    assert d["stopped"] == {
        "table": "orders",
        "key": '{"id":1}',
        "conflict_type": "insert_exists",
        "event_id": "e7",
        "reason": "resolver error",
        "conflict_id": "",
    }


def test_a_stage_gets_a_new_summary_and_the_old_one_is_unchanged():
    new = SUMMARY.with_table("products", orphans=3, rows=9)
    assert (new.tables["products"].orphans, new.tables["products"].rows) == (3, 9)
    assert (SUMMARY.tables["products"].orphans, SUMMARY.tables["products"].rows) == (0, 2)
    assert new.tables["orders"] is SUMMARY.tables["orders"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        SUMMARY.tables["orders"].applied = 4  # type: ignore[misc]


def test_an_unknown_field_in_a_saved_summary_is_refused():
    d = json.loads(SUMMARY.to_json())
    d["tables"]["orders"]["surprise"] = 1
    with pytest.raises(TypeError, match="surprise"):
        RunSummary.from_json(json.dumps(d))
