"""The typing and guards of a record (pipeline.rules.guards and .readers), pure Python: how
each column type reads a value's text, and the first guard that quarantines a copy
(docs/rules.md#conflict-types, docs/rules.md#what-is-quarantined).
``tests/spark/test_malformed.py`` runs the messages end to end through ``cdr run``."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, date, datetime
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.config_load import parse_config
from pipeline.core.kinds import ColumnType, Kind
from pipeline.rules.guards import Typer, TypingSpec
from pipeline.rules.readers import reader
from tests.helpers import configs

INT, BIGINT = ColumnType(Kind.INT), ColumnType(Kind.BIGINT)


@pytest.mark.parametrize(
    ("ct", "text", "want"),
    [
        (INT, "12", 12),
        (INT, " +12 ", 12),
        (INT, "00012", 12),
        (INT, "0" * 5000 + "12", 12),  # leading zeros count for nothing
        (BIGINT, "9" * 5000, None),  # over Python's 4,300 digits: not read, nothing raised
        (INT, "12.0", None),  # an integer column takes integers only
        (INT, "2147483648", None),
        (BIGINT, "9223372036854775807", 9223372036854775807),
        (BIGINT, "9223372036854775808", None),
        (INT, "1_000", None),
        (INT, "１２", None),  # ASCII digits only
        (ColumnType(Kind.DOUBLE), "1e2", 100.0),
        (ColumnType(Kind.DOUBLE), "-Infinity", float("-inf")),
        (ColumnType(Kind.DOUBLE), "1_0", None),
        (ColumnType(Kind.DECIMAL, 5, 2), "1.5", Decimal("1.50")),
        (ColumnType(Kind.DECIMAL, 5, 2), "1e2", Decimal("100.00")),
        (ColumnType(Kind.DECIMAL, 5, 2), "0.005", Decimal("0.01")),  # half up
        (ColumnType(Kind.DECIMAL, 5, 2), "999.995", None),  # rounds past the precision
        (ColumnType(Kind.DECIMAL, 5, 2), "NaN", None),
        (
            ColumnType(Kind.DECIMAL, 38, 10),
            "1234567890123456789012345678.1234567891",
            Decimal("1234567890123456789012345678.1234567891"),
        ),
        (ColumnType(Kind.DATE), "2026-01-31", date(2026, 1, 31)),
        (ColumnType(Kind.DATE), "2026-02-30", None),
        (ColumnType(Kind.DATE), "2026-1-01", None),
        (ColumnType(Kind.TIMESTAMP), "0", datetime(1970, 1, 1, tzinfo=UTC)),
        (
            ColumnType(Kind.TIMESTAMP),
            "2026-11-21 10:00:00.1234567+02:00",
            datetime(2026, 11, 21, 8, 0, 0, 123456, tzinfo=UTC),
        ),
        (ColumnType(Kind.TIMESTAMP), "2026-11-21T10:00:00", None),  # no UTC offset
        (ColumnType(Kind.TIMESTAMP), "2026-11-21T24:00:00Z", None),
        (ColumnType(Kind.BINARY), "aGVsbG8", b"hello"),  # padding may be left out
        (ColumnType(Kind.BINARY), "YQ=", None),  # but not half written
        (
            ColumnType(Kind.UUID),
            "123E4567-e89b-12d3-a456-426614174000",
            "123e4567-e89b-12d3-a456-426614174000",
        ),
        (ColumnType(Kind.UUID), "123e4567", None),
        (ColumnType(Kind.BOOLEAN), "true", True),
        (ColumnType(Kind.BOOLEAN), "TRUE", None),
        (ColumnType(Kind.STRING), "", ""),
    ],
)
def test_each_type_reads_the_text_of_a_value(ct: ColumnType, text: str, want) -> None:
    assert reader(ct)(text) == want


CONFIG = configs.config(
    configs.table({"id": "int", "v": "string", "x": "decimal(38,10)"}, not_null=["v"])
)
NOW = 1795305600000000  # 2026-11-22T00:00:00Z


def typed(record: dict | str, replica: str = "sub") -> dict:
    config = parse_config(CONFIG)
    table = config.tables["t"]
    line = record if isinstance(record, str) else json.dumps(record)
    return Typer(TypingSpec.of(config, table, NOW)).line(line, replica)


def rec(**kw) -> dict:
    r = {
        "op": "INSERT",
        "key": {"id": 1},
        "after": {"id": 1, "v": "a", "x": 1},
        "ts": "2026-11-21T10:00:00Z",
        "origin": "pub",
        "event_id": "e1",
        "seq": 1,
    }
    r.update(kw)
    return r


def test_a_good_record_is_typed_and_ranked() -> None:
    c = typed(rec(txid=7))
    assert c["reason"] is None and c["raw"] is None
    assert c["key"] == {"id": 1} and c["after"]["x"] == Decimal("1.0000000000")
    assert c["after_has"] == [True, True, True] and c["before_has"] == [False] * 3
    assert c["ts"] == 1795255200000000 and c["seq"] == 1 and c["txid"] == "7"
    assert c["pref"] == 1 and c["rank"] == 0  # sub's copy, second in config order; pub ranks first
    assert typed(rec(), replica="pub")["pref"] == -1  # the origin's own copy


@pytest.mark.parametrize(
    ("record", "detail"),
    [
        ("[1, 2]", "not a JSON object"),
        ('{"op": "INSERT", "ts": NaN}', "not a JSON object"),
        # docs/adapters.md: a name given twice is malformed, and named
        ('{"op": "DELETE", "op": "INSERT"}', 'not a JSON object: duplicate key "op"'),
        (rec(after='{"id": 1, "id": 2}'), 'after is not a JSON object: duplicate key "id"'),
        ("[" * 100_000 + "]" * 100_000, "not a JSON object: nested too deep"),
        (json.dumps(rec(key={"id": "§"})).replace('"§"', "9" * 5000), "key.id"),
        (json.dumps(rec(seq="§")).replace('"§"', "9" * 5000), "seq"),
        (json.dumps(rec(ts="§")).replace('"§"', "9" * 5000), "ts"),
        (rec(_malformed="the adapter's reason"), "the adapter's reason"),
        (rec(event_id=""), "no event_id"),
        (rec(key="not an object"), "key is not a JSON object"),
        (rec(key=json.dumps({"id": 1}), after=None, op="DELETE"), None),  # JSON text of one
        (rec(after={"id": 2, "v": "a"}), "after.id = '2' contradicts the key '1'"),
        (rec(after={"id": 1, "v": None}), "after.v is null in a NOT NULL column"),
        (rec(after={"id": 1, "v": "a", "x": "1e40"}), "after.x: '1e40' is not decimal(38,10)"),
        (rec(ts="2026-11-23T10:00:00Z"), "after the run's clock"),
    ],
)
def test_the_first_guard_that_matches_is_the_reason(record, detail) -> None:
    c = typed(record)
    if detail is None:
        assert c["reason"] is None, c
        return
    assert detail in c["detail"], c
    assert c["raw"] == (record if isinstance(record, str) else json.dumps(record))


def test_an_adapters_record_keeps_its_source_for_the_quarantine() -> None:
    c = typed(rec(op="UPSERT", _source={"line": "as exported"}))
    assert c["detail"] == "unknown op 'UPSERT'"
    assert c["raw"] == '{"line":"as exported"}'


@pytest.mark.parametrize(
    ("record", "detail"),
    [
        (rec(), None),
        (rec(op="UPDATE", after={"v": "b", "x": 2}), None),
        (rec(op="UPDATE", after={"v": "b"}), "no order_by value (after.x is missing or null)"),
        (rec(op="DELETE", after=None), "no order_by value (before.x is missing or null)"),
        (rec(op="DELETE", after=None, before={"x": 3}), None),
        (rec(op="DELETE", after=None, before={"x": None}), "no order_by value (before.x"),
        (rec(op="TRUNCATE", key=None, after=None), None),
    ],
)
def test_an_event_without_its_order_value_is_malformed(record, detail) -> None:
    """docs/rules.md#order-by-a-column: with ``order_by``, an INSERT or UPDATE carries the value in
    ``after``, a DELETE in ``before``; without it the event is quarantined ``malformed``."""
    config = parse_config({**CONFIG, "tables": {"t": {**CONFIG["tables"]["t"], "order_by": "x"}}})
    c = Typer(TypingSpec.of(config, config.tables["t"], NOW)).line(json.dumps(record), "sub")
    if detail is None:
        assert c["reason"] is None, c
    else:
        assert c["reason"] == "malformed" and detail in c["detail"], c


@pytest.mark.parametrize("setting", [True, ["v", "x"]])
def test_an_ignored_null_in_an_update_is_not_written(setting) -> None:
    """docs/rules.md#ignore-null-updates: a null in an UPDATE's ``after`` for an ignored
    column reads as "unchanged": the copy does not hold the column (so a NOT NULL column's
    null is no violation), whichever path reads the record; an INSERT's null stays a null,
    and a column not listed keeps its null."""
    cfg = configs.config(
        configs.table(
            {"id": "int", "v": "string", "x": "decimal(38,10)", "w": "string"},
            not_null=["v"],
            ignore_null_updates=setting if setting is True else ["v", "x"],
        )
    )
    config = parse_config(cfg)
    typer = Typer(TypingSpec.of(config, config.tables["t"], NOW))
    update = rec(op="UPDATE", after={"v": None, "x": None, "w": None})
    c = typer.line(json.dumps(update), "sub")
    assert c["reason"] is None, c
    assert c["after_has"] == [False, False, False, setting is not True]
    insert = typer.line(json.dumps(rec(after={"id": 1, "v": None, "x": None, "w": "a"})), "sub")
    assert insert["detail"] == "after.v is null in a NOT NULL column"
    # without the setting, the same UPDATE breaks the NOT NULL rule
    assert typed(update)["detail"] == "after.v is null in a NOT NULL column"


_NULLS_CONFIG = configs.config(
    configs.table(
        {"id": "int", "v": "string", "x": "decimal(38,10)", "w": "int"},
        not_null=["v"],
        ignore_null_updates=["v", "x"],
    )
)


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["v", "x", "w"]),
        st.one_of(st.none(), st.sampled_from(["a", "1", "2.5"])),
    ),
    st.sampled_from(["INSERT", "UPDATE", "DELETE"]),
)
def test_an_ignored_null_reads_as_the_member_left_out(after, op) -> None:
    """docs/rules.md#ignore-null-updates as a property: an UPDATE with an ignored column's
    null is typed exactly as the same UPDATE without that member (reason, detail, values;
    a quarantine keeps the record as exported); any other op is typed as if the setting were off."""
    config = parse_config(_NULLS_CONFIG)
    plain = dataclasses.replace(config.tables["t"], ignore_nulls=frozenset())
    on = Typer(TypingSpec.of(config, config.tables["t"], NOW))
    without = Typer(TypingSpec.of(config, plain, NOW))
    record = rec(op=op, after={"id": 1, **after})
    got = on.line(json.dumps(record), "sub")
    if op == "UPDATE":
        kept = {c: v for c, v in record["after"].items() if v is not None or c not in ("v", "x")}
        want = without.line(json.dumps({**record, "after": kept}), "sub")
    else:
        want = without.line(json.dumps(record), "sub")
    assert got.pop("raw") == (json.dumps(record) if got["reason"] else None)  # as exported
    assert got == {k: v for k, v in want.items() if k != "raw"}
