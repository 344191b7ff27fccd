"""A new user's first night of two tables (customers with a unique email, orders that
reference them), run by ``cdr run``: a unique collision that meets the postgres preset's
``multiple_unique_conflicts: error`` stops the night once, with a message that names the
setting, its choices, the conflict and the command, and its orphan does not also fail
the foreign-key suite; with the collision skipped, the orphan is quarantined
(``on_fk_violation: quarantine``) and the divergent replica does not withhold the night
(``on_divergence`` defaults to ``warn``). docs/validation.md#what-a-failure-names."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from pipeline.app.cli import main
from tests.helpers import scenarios as S
from tests.helpers.reports import date_report, log_rows

D = "2026-11-21"


def _event(op: str, key: dict, ts: str, origin: str, eid: str, after: dict, seq: int) -> dict:
    return {
        "op": op,
        "key": key,
        "ts": f"{D}T{ts}Z",
        "origin": origin,
        "event_id": eid,
        "after": after,
        "seq": seq,
    }


def _customer(cid: int, ts: str, origin: str, seq: int) -> dict:
    after = {"id": cid, "email": "ann@example.com"}
    return _event("INSERT", {"id": cid}, ts, origin, f"{origin}-c{cid}", after, seq)


def _order(seq: int) -> dict:
    after = {"order_id": 10, "customer_id": 2}
    return _event("INSERT", {"order_id": 10}, "10:02:00", "pg2", "pg2-o10", after, seq)


#: pg1 and pg2 each insert a customer with the same email; pg2 then takes an order for
#: its own customer. Each replica applied its own writes first.
NIGHT: dict[str, Any] = {
    "config": {
        "replicas": [{"id": "pg1", "system_id": 1}, {"id": "pg2", "system_id": 2}],
        "on_fk_violation": "quarantine",
        "tables": {
            "customers": {
                "key": ["id"],
                "columns": {"id": "int", "email": "string"},
                "unique": [["email"]],
            },
            "orders": {
                "key": ["order_id"],
                "columns": {"order_id": "int", "customer_id": "int"},
                "foreign_keys": [{"columns": ["customer_id"], "references": "customers"}],
            },
        },
    },
    "date": D,
    "now": "2026-11-22T00:00:00Z",
    "exports": {
        "pg1": {
            "customers": [_customer(1, "10:00:00", "pg1", 1), _customer(2, "10:01:00", "pg2", 2)],
            "orders": [_order(3)],
        },
        "pg2": {
            "customers": [_customer(2, "10:01:00", "pg2", 1), _customer(1, "10:00:00", "pg1", 3)],
            "orders": [_order(2)],
        },
    },
}


def test_a_unique_error_stops_the_night_once_and_says_what_to_change(tmp_path: Path, spark):
    got, failed = S.run_scenario(NIGHT, tmp_path)
    assert failed and not got["snapshot"]
    report = date_report(tmp_path / "store", D)
    assert report is not None and report.status == "failed"
    (errored,) = [
        c
        for c in log_rows(tmp_path / "store", report, "customers", "conflicts")
        if c["outcome"] == "errored"
    ]
    assert errored["conflict_type"] == "multiple_unique_conflicts"
    # one failure: the orphan the error left in orders is not a second one
    (failure,) = report.failures
    assert "no_orphan" not in failure
    assert failure.startswith('table customers: multiple_unique_conflicts on key {"id":2}')
    assert errored["conflict_id"] in failure
    assert "resolver `error` (the postgres preset's)" in failure
    assert "tables.customers.resolvers: {multiple_unique_conflicts: apply | skip}" in failure
    assert f"cdr run --date {D}" in failure


def test_the_collision_skipped_publishes_with_its_orphan_quarantined(tmp_path: Path, spark):
    night = copy.deepcopy(NIGHT)
    night["config"]["tables"]["customers"]["resolvers"] = {"multiple_unique_conflicts": "skip"}
    got, failed = S.run_scenario(night, tmp_path)
    assert not failed, date_report(tmp_path / "store", D)
    assert [r["id"] for r in got["snapshot"]["customers"]] == [1]
    assert got["snapshot"].get("orders", []) == []
    assert got["quarantine"]["orders"] == [{"event_id": "pg2-o10", "reason": "fk_violation"}]
    # pg2 kept its own customer: a divergence, reported with its cause, not a failure
    report = date_report(tmp_path / "store", D)
    assert report is not None and report.status == "published" and not report.failures
    assert any("no_divergent_perspective" in w for w in report.warnings)
    causes = got["causes"]["customers"]["pg2"]
    assert {json.dumps(c["key"]) for c in causes} == {'{"id": 1}', '{"id": 2}'}
    assert all(c["causes"] for c in causes)


#: pg2 updates the row pg1 inserted, with an `error` resolver for update_differ
DECIDED: dict[str, Any] = {
    "config": {
        "replicas": [{"id": "pg1", "system_id": 1}, {"id": "pg2", "system_id": 2}],
        "tables": {
            "items": {
                "key": ["id"],
                "columns": {"id": "int", "qty": "int"},
                "resolvers": {"update_differ": "error"},
            }
        },
    },
    "date": D,
    "now": "2026-11-22T00:00:00Z",
    "exports": {
        "pg1": {
            "items": [_event("INSERT", {"id": 1}, "10:00:00", "pg1", "i1", {"id": 1, "qty": 1}, 1)]
        },
        "pg2": {
            "items": [
                _event("INSERT", {"id": 1}, "10:00:00", "pg1", "i1", {"id": 1, "qty": 1}, 1),
                _event("UPDATE", {"id": 1}, "10:01:00", "pg2", "u2", {"qty": 2}, 2),
            ]
        },
    },
}


def test_a_stopped_nights_conflict_is_decided_by_the_command_its_failure_names(
    tmp_path: Path, spark
):
    """docs/rules.md#manual-decisions: the failure of a night an `error` resolver stopped
    names `cdr decide` with the conflict's id; the decision is taken from the failed run's
    own conflict log, and the date run again publishes it."""
    _, failed = S.run_scenario(DECIDED, tmp_path)
    assert failed
    report = date_report(tmp_path / "store", D)
    assert report is not None
    (failure,) = report.failures
    (errored,) = log_rows(tmp_path / "store", report, "items", "conflicts")
    command = f"cdr decide --conflict-id {errored['conflict_id']} --take local | remote"
    assert command in failure, failure
    cfg = str(tmp_path / "cdr.yaml")
    decide = ["decide", "--config", cfg, "--conflict-id", errored["conflict_id"]]
    assert main([*decide, "--take", "local", "--why", "pg1's quantity stands", "--by", "t"]) == 0
    run = ["run", "--config", cfg, "--date", D, "--now", DECIDED["now"], "--no-data-docs"]
    assert main([*run, "--work-dir", str(tmp_path / "work2")]) == 0
    report = date_report(tmp_path / "store", D)
    assert report is not None and report.status == "published", report
    (logged,) = log_rows(tmp_path / "store", report, "items", "conflicts")
    assert (logged["resolver"], logged["conflict_id"]) == ("manual", errored["conflict_id"])
    assert S.snapshot_rows(tmp_path / "store", "items")[0]["qty"] == 1
