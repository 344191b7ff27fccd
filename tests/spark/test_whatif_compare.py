"""docs/operations.md#what-if, the comparison of ``cdr whatif`` (``whatif.compare_table``): the
published state's live rows against the what-if snapshot, joined on the key by Spark. (A
whole what-if against a reference run: tests/airflow/test_whatif.py.)"""

from __future__ import annotations

from pipeline.app.whatif import compare_table
from pipeline.core.config_load import parse_config
from pipeline.core.summary import RunSummary, TableSummary
from tests.helpers import configs

COLUMNS = {"a": "int", "b": "int", "name": "string"}
TABLE = parse_config(configs.config({"t": configs.table(COLUMNS, ["a", "b"])})).tables["t"]
STATE = "a int, b int, name string, _ts long, _deleted boolean"
NONE = RunSummary("r", "r", "2026-11-21", 0, {})


def test_only_rows_that_differ_are_counted_listed_in_key_order_and_sampled(spark):
    state = spark.createDataFrame(
        [
            (1, 1, "same", 10, False),
            (1, 2, None, 11, False),  # a null equals a null
            (2, 1, "old", 12, False),  # changed by the what-if
            (3, 1, "gone", 13, False),  # absent from the what-if
            (4, 1, "dead", 14, True),  # a tombstone: not a published row
        ],
        STATE,
    )
    mine = spark.createDataFrame(
        [(1, 1, "same"), (1, 2, None), (2, 1, "new"), (0, 9, "added"), (4, 1, "back")],
        "a int, b int, name string",
    )
    out = compare_table(TABLE, TableSummary(orphans=2), state, mine, NONE)
    assert out["rows"] == {"published": 4, "whatif": 5}
    d = out["differing_rows"]
    assert d["count"] == 4 and not d["keys_truncated"]
    assert d["keys"] == [{"a": 0, "b": 9}, {"a": 2, "b": 1}, {"a": 3, "b": 1}, {"a": 4, "b": 1}]
    by_key = {(s["key"]["a"], s["key"]["b"]): (s["published"], s["whatif"]) for s in d["sample"]}
    assert by_key[(0, 9)] == (None, {"a": 0, "b": 9, "name": "added"})
    assert by_key[(2, 1)] == (
        {"a": 2, "b": 1, "name": "old"},
        {"a": 2, "b": 1, "name": "new"},
    )
    assert by_key[(3, 1)] == ({"a": 3, "b": 1, "name": "gone"}, None)
    assert by_key[(4, 1)] == (None, {"a": 4, "b": 1, "name": "back"})
    assert out["orphans"] == {"published": 2, "whatif": 0}


def test_the_same_rows_on_both_sides_differ_nowhere(spark):
    state = spark.createDataFrame([(1, 1, "x", 1, None)], STATE)  # a null _deleted is live
    mine = spark.createDataFrame([(1, 1, "x")], "a int, b int, name string")
    d = compare_table(TABLE, TableSummary(), state, mine, NONE)["differing_rows"]
    assert (d["count"], d["keys"], d["sample"]) == (0, [], [])
