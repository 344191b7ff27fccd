"""``cdr verify`` (``pipeline.app.verify``): each whole-table check passes on a sound
table and fails on the defect it is for. (The command on published nights:
tests/spark/test_inplace.py.)"""

from __future__ import annotations

import pytest

from pipeline.app.verify import CHECKS, check_table
from pipeline.core.config_load import parse_config
from tests.helpers import configs

CONFIG = parse_config(
    configs.config(
        {
            "products": configs.products(unique=[["name"]]),
            "orders": configs.orders(),
        },
        on_fk_violation="quarantine",
    )
)
PRODUCTS = "product_no int, name string, _ts long, _origin string, _deleted boolean"
ORDERS = "order_id int, product_no int, qty int, _ts long, _origin string, _deleted boolean"
SNAP_P = "product_no int, name string, _ts long, _origin string"
SNAP_O = "order_id int, product_no int, qty int, _ts long, _origin string"
GOOD_P = [(1, "a", 1, "r", False), (2, "b", 1, "r", False), (3, "c", 1, "r", True)]
GOOD_O = [(10, 1, 5, 1, "r", False), (11, None, 1, 1, "r", False)]


def _failed(spark, products=GOOD_P, snap_p=None, counts=None, orders=GOOD_O) -> set[str]:
    """The checks that fail, products' and orders' together."""
    p = spark.createDataFrame(products, PRODUCTS)
    live = [r[:4] for r in products if not r[4]]
    sp = spark.createDataFrame(live if snap_p is None else snap_p, SNAP_P)
    o = spark.createDataFrame(orders, ORDERS)
    so = spark.createDataFrame([r[:5] for r in orders if not r[5]], SNAP_O)
    states = {"products": p, "orders": o}
    pc = counts or {"state_rows": len(products), "rows": len(live)}
    oc = {"state_rows": len(orders), "rows": len(orders)}
    found = check_table(CONFIG, CONFIG.tables["products"], p, sp, pc, states)
    found += check_table(CONFIG, CONFIG.tables["orders"], o, so, oc, states)
    assert {f.check for f in found} == set(CHECKS)  # every check ran
    return {f.check for f in found if not f.ok}


def test_sound_tables_pass_every_check(spark):
    assert _failed(spark) == set()


@pytest.mark.parametrize(
    ("case", "fails"),
    [
        ("counts", {"state_rows", "snapshot_rows"}),
        ("key twice", {"state_keys", "snapshot_keys", "state_rows", "snapshot_rows"}),
        ("snapshot differs", {"snapshot_is_live_state"}),
        ("unique twice", {"unique"}),
        ("orphan", {"foreign_keys"}),
    ],
)
def test_each_check_fails_on_its_defect(spark, case, fails):
    if case == "counts":
        got = _failed(spark, counts={"state_rows": 4, "rows": 3})
    elif case == "key twice":
        twice = [*GOOD_P, (1, "z", 2, "r", False)]
        got = _failed(spark, twice, counts={"state_rows": 3, "rows": 2})
    elif case == "snapshot differs":
        got = _failed(spark, snap_p=[(1, "a", 1, "r"), (2, "B", 1, "r")])
    elif case == "unique twice":
        got = _failed(spark, [*GOOD_P, (4, "a", 1, "r", False)])
    else:
        got = _failed(spark, orders=[*GOOD_O, (12, 3, 1, 1, "r", False)])  # 3: a tombstone
    assert got == fails
