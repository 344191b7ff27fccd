"""docs/operations.md#a-quarantine-that-heals without a run: what a ``retry`` config needs,
and the operator notes
(open quarantined events, a skewed clock). (The quarantine that heals over four
``cdr run``s: tests/spark/test_retry.py.)"""

from __future__ import annotations

import pytest

from pipeline.core.config_load import parse_config
from pipeline.core.errors import ConfigError
from tests.helpers import configs

CONFIG = configs.config(
    {"products": configs.products(), "orders": configs.orders()},
    replicas=("A", "B"),
    on_divergence="warn",
    on_fk_violation="quarantine",
    retry={"fk_violation": 3, "future_timestamp": 2, "update_missing": 3},
)


def test_a_retry_config_names_what_it_needs():
    base = {**CONFIG, "on_fk_violation": "warn"}
    with pytest.raises(ConfigError, match="needs on_fk_violation: quarantine"):
        parse_config(base)
    with pytest.raises(ConfigError, match=r"retry\.malformed"):
        parse_config({**CONFIG, "retry": {"malformed": 1}})
    with pytest.raises(ConfigError, match=r"retry\.future_timestamp"):
        parse_config({**CONFIG, "retry": {"future_timestamp": 0}})


def test_the_operator_notes_name_open_events_and_a_skewed_clock():
    """What the asset events' ``extra`` and the DAG's log lines carry (retry, clock skew)."""
    from pipeline.app.dag_notes import notes_line, operator_notes
    from pipeline.core.summary import TableSummary

    config = parse_config({**CONFIG, "max_clock_skew_seconds": 20})
    skew = {"r1": {"r2": {"events": 3, "max_seconds": 50.8}}}
    tables = {
        "orders": TableSummary(quarantine_open=2, clock_skew=skew),
        "products": TableSummary(clock_skew={"r1": {"r2": {"events": 1, "max_seconds": 19.0}}}),
    }
    notes = operator_notes(config, tables)
    assert notes["orders"]["quarantine_open"] == 2 and notes["products"]["quarantine_open"] == 0
    (warning,) = notes["orders"]["clock_skew_warnings"]
    assert "replica r1 runs behind r2's by 50.8 s" in warning
    assert notes["products"]["clock_skew_warnings"] == []  # 19 s is within the 20 allowed
    line = notes_line(notes)
    assert line.startswith("quarantine open: orders 2, products 0; clock skew: table orders: ")


#: the config's ``retry`` of the tests below: future_timestamp retried, update_missing not
RETRIES = {"future_timestamp": 2}


@pytest.mark.parametrize(
    "status, action, reason, message",
    [
        ("open", "retry", "future_timestamp", "open already: the next run offers it again"),
        ("reopened", "retry", "future_timestamp", "open already: the next run offers it again"),
        ("reopened", "retry", "update_missing", "open already: the next run offers it again"),
        ("resolved", "retry", "future_timestamp", "resolved already"),
        ("expired", "retry", "malformed", "which a run cannot retry"),
        ("dismissed", "dismiss", "future_timestamp", "dismissed already"),
        ("expired", "dismiss", "future_timestamp", "expired already"),
    ],
)
def test_cdr_quarantine_refuses_what_its_action_cannot_change(status, action, reason, message):
    """An open event the next run offers again anyway is a no-op: ``retry`` says it is
    open already (exit 1) and writes nothing, as ``dismiss`` of a closed one does."""
    from datetime import date

    from pipeline.app.quarantine import outcome_of
    from pipeline.core.errors import StageError
    from pipeline.ingest.retry import Item, Status

    it = Item("e1", reason, date(2026, 11, 20), Status(status), date(2026, 11, 20))
    with pytest.raises(StageError, match=message):
        outcome_of(it, action, RETRIES)


@pytest.mark.parametrize(
    "status, action, reason, want",
    [("expired", "retry", "future_timestamp", "reopened"),
     ("dismissed", "retry", "future_timestamp", "reopened"),
     ("open", "retry", "update_missing", "reopened"),  # no retry: no run offers it, unless reopened
     ("open", "dismiss", "future_timestamp", "dismissed"),
     ("reopened", "dismiss", "future_timestamp", "dismissed")],
)  # fmt: skip
def test_cdr_quarantine_reopens_what_no_run_offers_and_dismisses_an_open_one(
    status, action, reason, want
):
    from datetime import date

    from pipeline.app.quarantine import outcome_of
    from pipeline.ingest.retry import Item, Status

    it = Item("e1", reason, date(2026, 11, 20), Status(status), date(2026, 11, 20))
    assert outcome_of(it, action, RETRIES).value == want
