"""The typing of JSONL blocks by Arrow (pipeline.ingest.blocks) against the typing of one record
(pipeline.rules.guards.Typer.line), pure Python: a line the blocks type is typed exactly as the
guards type it, every line is typed once, and clean exports do take the blocks' path."""

from __future__ import annotations

import json
import random

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.core.config_load import parse_config
from pipeline.ingest.blocks import BlockTyper
from pipeline.ingest.copies import arrow_schema, columns_table
from pipeline.rules.guards import Typer, TypingSpec
from tests.helpers import configs

NOW = 1795305600000000  # 2026-11-22T00:00:00Z
DAY = 86_400_000_000
COLUMNS = {
    "id": "bigint",
    "k2": "string",
    "i": "int",
    "s": "string",
    "b": "boolean",
    "d": "double",
    "m": "decimal(12,2)",
    "day": "date",
    "t": "timestamp",
    "bin": "binary",
    "u": "uuid",
    "bal": "bigint",
}
KEY = ("id", "k2")
CONFIG = configs.config(
    {
        "rows": configs.table(COLUMNS, KEY, not_null=["s"], delta=["bal"]),
        "cells": configs.table(
            {c: t for c, t in COLUMNS.items() if c != "bal"}, KEY, policy="scylla"
        ),
        # docs/rules.md#order-by-a-column: a record without its order value is malformed
        "ordered": configs.table(COLUMNS, KEY, not_null=["s"], delta=["bal"], order_by="t"),
    },
    replicas=configs.replicas(r1=3, r2=1, r3=2),
    max_clock_skew_seconds=300,
    gc_grace_seconds=864000,
)
GOOD = {
    "i": [0, -5, 2147483647, -2147483648],
    "s": ["a", "", "é \\u00e9", "x\u2028y"],
    "b": [True, False],
    "d": [0.5, -1e10, 1e-300, 3, 0.1],
    "m": [1, 20481.29, -0.5, "1.5", 9999999999.99, "1e2"],
    "day": ["2026-01-31", "1999-12-31"],
    "t": ["2026-11-21T10:00:00Z", "2026-11-21 10:00:00.1234567+02:00"],
    "bin": ["aGVsbG8=", "aGVsbG8", ""],
    "u": ["123E4567-e89b-12d3-a456-426614174000"],
    "bal": [0, 100, -7],
}
#: values the guards read, but not Arrow as their column's JSON type: typed one by one
SLOW = {"t": [0, 1795255200000000], "s": [5, 1.5, "null-ish text"], "b": ["true"], "i": ["7"]}
BAD = {
    "i": [2147483648, 1.5, "7", True, [1]],
    "s": [5, {"a": 1}, True],
    "b": ["true", 1],
    "d": ["NaN", "1e400", "x"],
    "m": [1.005, 12345678901.5, "abc", " 1.5"],
    "day": ["2026-02-30", 20260101],
    "t": ["2026-11-21T10:00:00", "x"],
    "bin": ["YQ=", 5],
    "u": ["123e4567", 7],
    "bal": [1.5, "x"],
}
#: a number of 5,000 digits, put in the JSON text in place of this string
HUGE = "<huge>"
MANGLES = [
    "none",
    "none",
    "none",
    "drop_field",
    "null_member",
    "bad_value",
    "slow_value",
    "extra_member",
    "extra_field",
    "future",
    "stale",
    "ts_text",
    "new_key",
    "key_missing_col",
    "key_contradicts",
    "delta_no_old",
    "ttl",
    "expiry",
    "two_objects",
    "bom",
    "not_json",
    "duplicate_member",
    "origin_unknown",
    "truncate",
    "empty_event_id",
    "key_null",
    "trailing_space",
    "no_order_value",
    # hostile input (docs/adapters.md): no record stops a night
    "huge_int",
    "huge_ts",
    "deep",
    "deep_member",
    "duplicate_in_after",
    "duplicate_in_text",
    "lone_surrogate",
    "control_chars",
]


def _record(rng: random.Random, table: str, n: int, mangle: str) -> str:
    cols = [c for c in COLUMNS if c in CONFIG["tables"][table]["columns"]]
    op = rng.choice(["INSERT", "UPDATE", "DELETE", "READ"])  # READ: a snapshot's read
    key = {"id": n, "k2": f"k{n % 3}"}
    after = dict(key)
    for c in cols:
        if c in key:
            continue
        if op in ("INSERT", "READ") or rng.random() < 0.5:
            after[c] = rng.choice(GOOD[c])
    after.setdefault("s", "a")
    rec: dict = {"op": op, "key": key, "ts": NOW - rng.randint(1, DAY)}
    if op != "DELETE":
        rec["after"] = after
    if op == "UPDATE" and "bal" in after:
        rec["before"] = {"bal": rng.choice(GOOD["bal"])}
    if table == "ordered":  # its order value: in after, a DELETE's in before
        if op == "DELETE":
            rec["before"] = {"t": rng.choice(GOOD["t"])}
        else:
            after.setdefault("t", rng.choice(GOOD["t"]))
    rec |= {
        "origin": rng.choice(["r1", "r2", "r3"]),
        "event_id": f"e{n}",
        "seq": n,
    }
    if rng.random() < 0.2:
        rec["txid"] = f"tx{n % 4}"
    if table == "cells" and rng.random() < 0.3:
        rec["ttl"] = rng.choice([0, 60, 3600])
    return _mangled(rng, rec, mangle, cols)


def _mangled(rng: random.Random, rec: dict, mangle: str, cols: list[str]) -> str:
    target = rec.get("after") or rec.setdefault("after", {"id": rec["key"]["id"]})
    if mangle == "drop_field":
        rec.pop(rng.choice(["op", "key", "ts", "origin", "event_id", "seq", "after"]))
    elif mangle == "null_member":
        target[rng.choice(cols)] = None
    elif mangle == "bad_value":
        c = rng.choice(list(BAD))
        if c in cols:
            target[c] = rng.choice(BAD[c])
    elif mangle == "slow_value":
        c = rng.choice(list(SLOW))
        target[c] = rng.choice(SLOW[c])
    elif mangle == "extra_member":
        target["zz"] = 1
    elif mangle == "extra_field":
        rec["source_db"] = "x"
    elif mangle == "future":
        rec["ts"] = NOW + 301_000_000
    elif mangle == "stale":
        rec["ts"] = NOW - 864001_000_000
    elif mangle == "ts_text":
        rec["ts"] = "2026-11-21T10:00:00Z"
    elif mangle == "new_key":
        rec["new_key"] = {"id": rec["key"]["id"] + 1, "k2": "n"}
    elif mangle == "key_missing_col":
        rec["key"] = {"id": rec["key"]["id"]}
    elif mangle == "key_contradicts":
        target["id"] = rec["key"]["id"] + 1
    elif mangle == "delta_no_old":
        rec["op"], target["bal"] = "UPDATE", 5
        rec.pop("before", None)
    elif mangle == "ttl":
        rec["ttl"] = rng.choice([-1, 630720001, 1.5, "60", 10**13])
    elif mangle == "expiry":
        rec["expiry"] = rng.choice([1795300000, -3, 1.5])
        if rng.random() < 0.5:
            rec["ttl"] = 60
    elif mangle == "origin_unknown":
        rec["origin"] = "r9"
    elif mangle == "truncate":
        rec["op"] = "TRUNCATE"
    elif mangle == "empty_event_id":
        rec["event_id"] = ""
    elif mangle == "key_null":
        rec["key"]["k2"] = None
    elif mangle == "no_order_value":  # order_by: quarantined on an order_by table
        target.pop("t", None)
        if rec["op"] == "DELETE":
            rec.pop("before", None)
    elif mangle == "huge_int":  # Python's int() refuses over 4,300 digits
        where = rng.choice(["key", "seq", "after"])
        rec[where] = {"id": HUGE, "k2": "k"} if where != "seq" else HUGE
    elif mangle == "huge_ts":
        rec["ts"] = rng.choice([HUGE, "0" * 5000 + "1", -(10**30)])
    elif mangle == "control_chars":
        target["s"] = "\x00\x1f\x7f"
    elif mangle == "deep_member":  # parses, but walking it nears Python's limit
        target[rng.choice(cols)] = json.loads("[" * 900 + "]" * 900)
    text = json.dumps(rec, separators=(",", ":")).replace(f'"{HUGE}"', "9" * 5000)
    if mangle == "deep":
        return text[:-1] + ',"x":' + "[" * 100_000 + "]" * 100_000 + "}"
    if mangle == "duplicate_in_after" and '"after":{' in text:
        return text.replace('"after":{', '"after":{"s":"dup",', 1)
    if mangle == "duplicate_in_text":
        rec["after"] = '{"id":1,"id":2}'
        return json.dumps(rec, separators=(",", ":"))
    if mangle == "lone_surrogate":
        return text[:-1] + ',"txid":"\\ud800"}'
    if mangle == "two_objects":
        return text + " " + text
    if mangle == "bom":
        return "\ufeff" + text
    if mangle == "not_json":
        return text[:-1]
    if mangle == "duplicate_member":
        return text[:-1] + ',"op":"DELETE"}'
    if mangle == "trailing_space":
        return text + " "
    return text


def _both_ways(table: str, lines: list[str], replica: str) -> tuple[list[dict], list[dict]]:
    """(every line typed one by one; the same lines typed the blocks' way, the lines the
    blocks leave typed one by one), each row with its line number."""
    config = parse_config(CONFIG)
    t = config.tables[table]
    typer = Typer(TypingSpec.of(config, t, NOW))
    schema = arrow_schema(t)
    numbered = [(i + 1, line.encode()) for i, line in enumerate(lines)]
    one_by_one = []
    for n, line in numbered:
        c = typer.line(line.decode(), replica)
        c |= {"replica": replica, "file": "f", "line": n}
        one_by_one.append(c)
    clean, rest = BlockTyper(typer, schema).split(numbered, replica, "f")
    by_blocks = clean.to_pylist() if clean is not None else []
    for n, line in rest:
        c = typer.line(line.decode("utf-8", "replace"), replica)
        c |= {"replica": replica, "file": "f", "line": n}
        by_blocks.append(c)
    # as written: both through Arrow (a list of flags, a struct of nulls, read back)
    one_by_one = columns_table(one_by_one, schema).to_pylist()
    by_blocks = pa.Table.from_pylist(by_blocks, schema).to_pylist()
    return (
        sorted(one_by_one, key=lambda r: r["line"]),
        sorted(by_blocks, key=lambda r: r["line"]),
    )


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    table=st.sampled_from(["rows", "cells", "ordered"]),
    size=st.integers(1, 60),
    replica=st.sampled_from(["r1", "r2", "r3"]),
)
def test_blocks_type_every_line_as_the_guards_do(seed, table, size, replica) -> None:
    rng = random.Random(seed)
    lines = [_record(rng, table, n, rng.choice(MANGLES)) for n in range(size)]
    one_by_one, by_blocks = _both_ways(table, lines, replica)
    assert len(by_blocks) == len(lines)
    for a, b in zip(one_by_one, by_blocks, strict=True):
        assert _nan_free(a) == _nan_free(b), lines[a["line"] - 1]


def _nan_free(v):
    """NaN, which a double column reads from "NaN", as text: NaN is not equal to itself."""
    if isinstance(v, dict):
        return {k: _nan_free(x) for k, x in v.items()}
    return "NaN" if isinstance(v, float) and v != v else v


@pytest.mark.parametrize("table", ["rows", "cells", "ordered"])
def test_clean_lines_take_the_blocks_path(table: str) -> None:
    """The fast path is not dead: a clean export is typed by blocks whole, a mangled line
    leaves its block to the guards alone."""
    rng = random.Random(7)
    lines = [_record(rng, table, n, "none") for n in range(2000)]
    lines[1234] = _record(rng, table, 1234, "bad_value").replace("}", ',"zz":1}', 1)
    config = parse_config(CONFIG)
    t = config.tables[table]
    typer = Typer(TypingSpec.of(config, t, NOW))
    numbered = [(i + 1, line.encode()) for i, line in enumerate(lines)]
    clean, rest = BlockTyper(typer, arrow_schema(t)).split(numbered, "r1", "f")
    assert 1235 in [n for n, _ in rest] and len(rest) <= 16  # the bad line's small block
    assert clean is not None and clean.num_rows == 2000 - len(rest)


#: docs/configuration.md#column-names: table ``rows`` exported with other names (a space,
#: upper case, a reserved one), each published by its ``as``
EXPORTED = {c: ("_ts" if c == "t" else f"{c.upper()} col") for c in COLUMNS}


def _exported(rec: dict) -> str:
    """A record of table ``rows`` with the names the ``renamed`` table's exports use."""
    rec = dict(rec)
    for part in ("key", "new_key", "after", "before"):
        if isinstance(rec.get(part), dict):
            rec[part] = {EXPORTED.get(c, c): v for c, v in rec[part].items()}
    return json.dumps(rec)


def _records(lines: list[str]) -> list[dict]:
    """The lines that Python reads as JSON objects (a key given twice read once), to be
    written again for both tables alike."""
    out = []
    for line in lines:
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), size=st.integers(1, 40))
def test_a_table_whose_exports_name_its_columns_otherwise_types_them_by_published_name(
    seed, size
) -> None:
    """Records that name the columns as exported type, both ways, to the copies table
    ``rows`` makes of the same records with the published names; a member named as a
    column is published but not exported is an unknown column."""
    import tests.unit.test_blocks as me

    renamed = {EXPORTED[c]: {"type": t, "as": c} for c, t in COLUMNS.items()}
    cfg = {**CONFIG, "tables": {**CONFIG["tables"], "renamed": {
        **CONFIG["tables"]["rows"], "columns": renamed}}}  # fmt: skip
    rng = random.Random(seed)
    recs = _records([_record(rng, "rows", n, rng.choice(MANGLES)) for n in range(size)])
    with pytest.MonkeyPatch.context() as mp:
        want = _both_ways("rows", [json.dumps(r) for r in recs], "r1")[0]
        mp.setattr(me, "CONFIG", cfg)
        got = _both_ways("renamed", [_exported(r) for r in recs], "r1")
    for a, b in zip(got[0], got[1], strict=True):
        assert _nan_free(a) == _nan_free(b)
    for a, w in zip(got[0], want, strict=True):
        if a["reason"] is None:  # a quarantined one's detail and raw name columns otherwise
            assert _nan_free(a) == _nan_free(w)
    line = json.dumps({"op": "INSERT", "key": {"ID col": 1, "K2 col": "k"}, "ts": NOW - 1,
                       "after": {"ID col": 1, "K2 col": "k", "S col": "a", "s": "x"},
                       "origin": "r1", "event_id": "x", "seq": 1})  # fmt: skip
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(me, "CONFIG", cfg)
        (copy,), _ = _both_ways("renamed", [line], "r1")
    assert copy["after"]["s"] == "a" and copy["extra_cols"] == ["s (as exported)"]
