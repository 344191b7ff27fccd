"""docs/operations.md#repair in pure Python: a divergence row read back typed, the order of
the writes (foreign keys, unique values, a swap through a parked value), and the
statements of both dialects (literals by the drivers, the script's DO blocks and the
notices that name the skipped rows)."""

from __future__ import annotations

import math
import uuid
from datetime import UTC, date, datetime
from decimal import Decimal

import pytest

from pipeline.app import statements
from pipeline.core.config_load import parse_config
from pipeline.core.errors import RepairError
from pipeline.core.jsonvalues import dumps
from pipeline.rules.repairs import RowRepair, Write, park_value, plan, row_repair, typed_row
from tests.helpers import configs

SHOP = parse_config(
    configs.config(
        {
            "products": configs.products(unique=[["name"]]),
            "orders": configs.orders(),
            "accounts": configs.table(
                {"id": "int", "owner": "string", "nick": "string"},
                unique=[["owner"], ["nick"]],
                not_null=["owner"],
            ),
        }
    )
)
EVERY = parse_config(
    configs.config(
        configs.table(
            {
                "id": "int",
                "s": "string",
                "d": "double",
                "n": "decimal(12,3)",
                "b": "binary",
                "ts": "timestamp",
                "day": "date",
                "u": "uuid",
                "ok": "boolean",
                "big": "bigint",
            }
        )
    )
)


def _row(table: str, key: int, seen: dict | None, want: dict | None, number: int) -> RowRepair:
    return RowRepair(table, (key,), seen, want, 1_000, None, number)


def _account(key: int, owner: str, number: int, new_owner: str, nick: str | None = None):
    """An account whose owner changes from ``owner`` to ``new_owner``."""
    row = {"id": key, "owner": owner, "nick": nick}
    return _row("accounts", key, row, {**row, "owner": new_owner}, number)


def _order(steps) -> list[tuple[str, str, tuple]]:
    return [(s.write.value, s.row.table, s.row.key) for s in steps]


def test_a_divergence_row_reads_back_as_the_columns_types():
    t = EVERY.tables["t"]
    row = {
        "id": 1,
        "s": 'it\'s \\ "q" 😀',
        "d": float("nan"),
        "n": Decimal("12.500"),
        "b": b"a\x00b",
        "ts": datetime(2026, 11, 21, 3, 4, 5, 123456, tzinfo=UTC),
        "day": date(2026, 11, 21),
        "u": "0f8fad5b-d9cb-469f-a165-70867728950e",
        "ok": True,
        "big": 2**62,
    }
    got = typed_row(t, dumps(row))
    assert got is not None and math.isnan(got.pop("d"))
    assert got == {**{k: v for k, v in row.items() if k != "d"}, "u": uuid.UUID(row["u"])}
    assert typed_row(t, None) is None
    with pytest.raises(RepairError, match="column 'big' is bigint"):
        typed_row(t, '{"id": 1, "big": "x"}')


def test_a_published_row_is_a_row_repair_with_its_converged_ts():
    t = SHOP.tables["products"]
    div = {
        "key": '{"product_no":7}',
        "replica_row": '{"product_no":7,"name":"old"}',
        "converged_row": None,
        "repair": '{"op":"DELETE","ts":42}',
        "cause": "missing_events",
    }
    r = row_repair(t, div, 3)
    assert (r.key, r.seen, r.want, r.ts, r.cause, r.number) == (
        (7,), {"product_no": 7, "name": "old"}, None, 42, "missing_events", 3
    )  # fmt: skip
    assert r.write is Write.DELETE


def test_the_columns_a_replica_lacks_are_in_no_write():
    """docs/rules.md#divergence-causes ``replica_lacks``: a replica's table without ``w``;
    a row that differs there alone has nothing left to write."""
    t = parse_config(configs.config(configs.table({"id": "uuid", "v": "string", "w": "string"})))
    key = '{"id":"0f8fad5b-d9cb-469f-a165-70867728950e"}'
    div = {
        "key": key,
        "replica_row": '{"id":"0f8fad5b-d9cb-469f-a165-70867728950e","v":"a","w":null}',
        "converged_row": '{"id":"0f8fad5b-d9cb-469f-a165-70867728950e","v":"a","w":"x"}',
        "repair": '{"ts":5}',
    }
    r = row_repair(t.tables["t"], div, 1, ["w"])
    assert r.seen == r.want == {"id": uuid.UUID("0f8fad5b-d9cb-469f-a165-70867728950e"), "v": "a"}
    assert r.label == key and r.changed() == ()
    assert plan(t, [r]) == []  # an update with nothing to write is no step


def test_parents_are_inserted_before_their_children_and_deleted_after():
    rows = [
        _row("orders", 1, None, {"order_id": 1, "product_no": 5, "qty": 1}, 1),
        _row("orders", 2, {"order_id": 2, "product_no": 6, "qty": 1}, None, 2),
        _row("products", 5, None, {"product_no": 5, "name": "five"}, 3),
        _row("products", 6, {"product_no": 6, "name": "six"}, None, 4),
    ]
    order = _order(plan(SHOP, rows))
    assert order.index(("insert", "products", (5,))) < order.index(("insert", "orders", (1,)))
    assert order.index(("delete", "orders", (2,))) < order.index(("delete", "products", (6,)))


def test_a_child_moved_to_another_parent_leaves_it_before_its_delete():
    rows = [
        _row("products", 6, {"product_no": 6, "name": "six"}, None, 1),
        _row(
            "orders",
            2,
            {"order_id": 2, "product_no": 6, "qty": 1},
            {"order_id": 2, "product_no": 7, "qty": 1},
            2,
        ),
    ]
    assert _order(plan(SHOP, rows)) == [("update", "orders", (2,)), ("delete", "products", (6,))]


def test_a_unique_value_is_given_up_before_it_is_taken():
    """A chain: 1 takes 2's owner, 2 takes 3's, 3 takes a new one: 3, 2, 1; no park."""
    rows = [_account(k, o, k + 1, chr(ord(o) + 1)) for k, o in ((1, "a"), (2, "b"), (3, "c"))]
    steps = plan(SHOP, rows)
    acc = "accounts"
    assert _order(steps) == [("update", acc, (3,)), ("update", acc, (2,)), ("update", acc, (1,))]
    assert all(s.values == {"owner": s.row.want["owner"]} for s in steps)


def test_a_swap_of_unique_values_goes_through_a_parked_value():
    acc = "accounts"
    one, two = _account(1, "a", 1, "b", "x"), _account(2, "b", 2, "a", "x2")
    steps = plan(SHOP, [one, two])
    assert [s.write for s in steps] == [Write.PARK, Write.UPDATE, Write.UPDATE]
    park, first, last = steps
    temp = park_value(SHOP.tables[acc], "owner", park.row)
    assert temp.startswith("cdr_repair:") and park.values == {"owner": temp}
    assert park.expect == one.seen and park.row is one  # the park is conditioned too
    assert first.row is two and first.values == {"owner": "a"}
    assert last.row is one and last.values == {"owner": "b"} and last.expect["owner"] == temp


def test_a_nullable_unique_column_parks_null_and_a_not_null_integer_its_smallest_values():
    acc = SHOP.tables["accounts"]
    r = _row("accounts", 1, {"id": 1, "owner": "a", "nick": "x"}, None, 4)
    assert park_value(acc, "nick", r) is None
    ints = parse_config(
        configs.config(
            configs.table({"id": "int", "seat": "int"}, unique=[["seat"]], not_null=["seat"])
        )
    ).tables["t"]
    assert park_value(ints, "seat", r) == -(2**31) + 4


def test_a_row_off_the_cycle_is_not_parked():
    """2 and 3 swap nicks, 1 takes 2's owner: 2 parks both its values (1 and 3 wait for
    it), 1 and 3 take theirs, then 2 takes its own; 1 gives nothing anyone waits for and
    is never parked."""
    rows = [
        _account(1, "r", 1, "p"),
        _row(
            "accounts",
            2,
            {"id": 2, "owner": "p", "nick": "a"},
            {"id": 2, "owner": "p2", "nick": "b"},
            2,
        ),
        _row(
            "accounts",
            3,
            {"id": 3, "owner": "o3", "nick": "b"},
            {"id": 3, "owner": "o3", "nick": "a"},
            3,
        ),
    ]
    steps = plan(SHOP, rows)
    assert _order(steps) == [
        ("park", "accounts", (2,)),
        ("update", "accounts", (1,)),
        ("update", "accounts", (3,)),
        ("update", "accounts", (2,)),
    ]
    assert set(steps[0].values) == {"owner", "nick"}
    assert steps[0].values["nick"] is None  # nullable: parked as null


def test_a_swap_no_column_can_park_is_refused_by_name():
    cfg = parse_config(
        configs.config(
            configs.table({"id": "int", "day": "date"}, unique=[["day"]], not_null=["day"])
        )
    )
    d1, d2 = date(2026, 1, 1), date(2026, 1, 2)
    rows = [
        _row("t", 1, {"id": 1, "day": d1}, {"id": 1, "day": d2}, 1),
        _row("t", 2, {"id": 2, "day": d2}, {"id": 2, "day": d1}, 2),
    ]
    with pytest.raises(RepairError, match=r"writes of t \(1,\), t \(2,\) wait for each other"):
        plan(cfg, rows)


def test_the_plan_is_the_same_for_the_same_rows():
    rows = [_row("products", k, None, {"product_no": k, "name": f"p{k}"}, k) for k in (3, 1, 2)]
    assert _order(plan(SHOP, rows)) == _order(plan(SHOP, list(reversed(rows))))


# ------------------------------------------------------------------------- PostgreSQL


def test_the_postgres_script_sets_up_the_origin_and_conditions_every_write():
    rows = [
        _row("products", 1, None, {"product_no": 1, "name": "it's"}, 1),
        _row("products", 2, {"product_no": 2, "name": "b"}, {"product_no": 2, "name": "c"}, 2),
        _row("products", 3, {"product_no": 3, "name": None}, None, 3),
    ]
    script = statements.postgres(SHOP, plan(SHOP, rows), "line one\nline two")
    text = script.text()
    assert text.startswith("-- line one\n-- line two\n")
    assert "SELECT pg_replication_origin_session_setup('cdr_repair');" in text
    assert text.index("BEGIN;") < text.index("DO ") < text.rindex("COMMIT;")
    assert len(script.steps) == 3
    delete, update, insert = script.steps
    assert (
        'DELETE FROM "products" WHERE "product_no" = 3 AND "name" IS NOT DISTINCT FROM NULL'
        in delete
    )
    assert """UPDATE "products" SET "name" = 'c' WHERE "product_no" = 2 AND""" in update
    assert """AND "name" IS NOT DISTINCT FROM 'b'""" in update
    assert """VALUES (1, 'it''s') ON CONFLICT ("product_no") DO NOTHING""" in insert
    assert "ROLLBACK;" in statements.postgres(SHOP, [], "", commit=False).tail


def test_a_dollar_tag_is_one_the_statement_does_not_hold():
    body = "x"
    tag = statements._dollar_tag(body)
    hostile = f"select '{tag}'"  # a value that holds the tag the plain body would take
    assert statements._dollar_tag(hostile) not in hostile


def test_the_notices_name_the_skipped_rows():
    notices = [
        "cdr_repair row 3: skipped: it changed since the report",
        "something else",
        'cdr_repair row 12: skipped: duplicate key value violates unique constraint "x"',
        "cdr_repair row 3: skipped: again",
    ]
    assert statements.skipped_rows(notices) == {
        3: "it changed since the report",
        12: 'duplicate key value violates unique constraint "x"',
    }


# ------------------------------------------------------------------------------- CQL


def test_cql_writes_the_converged_row_at_its_timestamp():
    new = {"id": 1, "s": "it's", "d": float("nan"), "n": Decimal("1.500")}
    rows = [
        RowRepair("t", (1,), None, new, 7, None, 1),
        RowRepair(
            "t", (2,), {"id": 2, "s": "a", "b": b"\x00"}, {"id": 2, "s": "b", "b": b"\x00"}, 8
        ),
        RowRepair("t", (3,), {"id": 3, "s": "a"}, None, 9, None, 3),
        RowRepair("t", (4,), {"id": 4, "s": "a"}, {"id": 4, "s": "a"}, 9),  # nothing to write
    ]
    got = statements.cql(EVERY, rows, "ks")
    assert got == [
        """INSERT INTO ks.t (id, s, d, n) VALUES (1, 'it''s', NaN, 1.500) USING TIMESTAMP 7;""",
        """UPDATE ks.t USING TIMESTAMP 8 SET s = 'b' WHERE id = 2;""",
        """DELETE FROM ks.t USING TIMESTAMP 9 WHERE id = 3;""",
    ]
