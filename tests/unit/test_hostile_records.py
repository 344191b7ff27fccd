"""No record stops a night (docs/adapters.md, "Each event once"): whatever bytes a
JSONL export holds, each line becomes exactly one typed copy, typed or quarantined with
its reason, nothing is raised, and the blocks' path (Arrow) and the guards' path (one
line at a time) agree. Hypothesis feeds arbitrary bytes and JSON: deep, huge, odd
numbers, names given twice, NaN and Infinity, control characters, lone surrogates.
(The adapters' Spark path: ``tests/spark/test_hostile_adapters.py``.)"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.core.config_load import parse_config
from pipeline.core.policy import QuarantineReason
from pipeline.ingest.copies import CopyWriter, arrow_schema, columns_table
from pipeline.rules.guards import Typer, TypingSpec
from tests.unit.test_blocks import CONFIG, NOW, _both_ways

REASONS = {r.value for r in QuarantineReason}

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8)
    | st.sampled_from(["NaN", "Infinity", "-Infinity", "\x00\x1f", "1e400", "9" * 30])
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=5,
)
FIELDS = ("op", "key", "new_key", "after", "before", "ts", "origin", "event_id", "seq", "txid")


@st.composite
def records(draw) -> dict:
    """A canonical record's fields, each one plausible or hostile."""
    key = {"id": draw(st.integers(-(2**70), 2**70) | values), "k2": draw(st.text(max_size=3))}
    rec = {
        "op": draw(st.sampled_from(["INSERT", "UPDATE", "DELETE", "TRUNCATE"]) | values),
        "key": draw(st.just(key) | values),
        "ts": draw(st.sampled_from([NOW - 10**9, "2026-11-21T10:00:00Z"]) | values),
        "origin": draw(st.sampled_from(["r1", "r2", "r3"]) | values),
        "event_id": draw(st.text(min_size=1, max_size=8) | values),
        "seq": draw(st.integers(0, 2**64) | values),
    }
    if draw(st.booleans()):
        rec["after"] = {**key, "s": draw(st.text()), "d": draw(scalars), "i": draw(values)}
    extra = draw(st.dictionaries(st.sampled_from(FIELDS), values, max_size=2))
    return {**rec, **extra}


@st.composite
def lines(draw) -> bytes:
    """One line of an export: a record as JSON, then maybe mangled in its text."""
    kind = draw(st.sampled_from(["record", "record", "bytes", "value"]))
    if kind == "bytes":
        return draw(st.binary(max_size=64)).replace(b"\n", b" ")
    doc = draw(records()) if kind == "record" else draw(values)
    text = json.dumps(doc, allow_nan=True, ensure_ascii=draw(st.booleans()))
    mangle = draw(
        st.sampled_from(["none", "dup", "huge", "deep", "surrogate", "cut", "control", "none"])
    )
    if mangle == "dup" and text.startswith("{") and len(text) > 2:
        name = draw(st.sampled_from(FIELDS))
        text = text[:-1] + f', "{name}": {json.dumps(draw(scalars), allow_nan=True)}}}'
    elif mangle == "huge":
        text = text.replace("0", "9" * 4400, 1) if "0" in text else "9" * 4400
    elif mangle == "deep":
        n = draw(st.sampled_from([900, 990, 5000]))
        text = text[:-1] + ', "after": ' + "[" * n + "]" * n + "}" if text[:1] == "{" else text
    elif mangle == "surrogate":
        text = text.replace('"', '"\\udc80', 1)
    elif mangle == "cut":
        text = text[: draw(st.integers(0, len(text)))]
    elif mangle == "control":
        text = text.replace(" ", "\t\x0b", 1)
    return text.replace("\n", " ").encode("utf-8", "surrogatepass")


@pytest.fixture(scope="module")
def dest(tmp_path_factory) -> Path:
    """Where each example's copies are written (again and again)."""
    return Path(tmp_path_factory.mktemp("copies")) / "part.parquet"


@settings(max_examples=2000, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(lines(), min_size=1, max_size=4), st.sampled_from(["rows", "cells"]))
def test_every_line_gets_one_fate_and_both_paths_agree(dest, batch, table):
    config = parse_config(CONFIG)
    spec = TypingSpec.of(config, config.tables[table], NOW)
    writer = CopyWriter(dest, spec, "r1", "f.jsonl")
    writer.lines([(i + 1, b) for i, b in enumerate(batch)])
    writer.close()
    copies = pq.read_table(dest).to_pylist()
    assert sorted(c["line"] for c in copies) == list(range(1, len(batch) + 1))
    for c in copies:
        assert c["reason"] is None or c["reason"] in REASONS, c
        assert c["reason"] != "malformed" or c["detail"], c
    texts = [b.decode("utf-8", "replace") for b in batch]
    if all(b == t.encode("utf-8", "surrogatepass") for b, t in zip(batch, texts, strict=True)):
        one_by_one, by_blocks = _both_ways(table, texts, "r1")
        assert [c["reason"] for c in one_by_one] == [c["reason"] for c in by_blocks]
        assert [c["detail"] for c in one_by_one] == [c["detail"] for c in by_blocks]


def test_a_typer_line_raises_nothing_on_the_named_cases():
    """The cases the issue names, each one line: a malformed copy naming its problem."""
    config = parse_config(CONFIG)
    typer = Typer(TypingSpec.of(config, config.tables["rows"], NOW))
    cases = {
        '{"op": "DELETE", "op": "INSERT"}': 'duplicate key "op"',
        '{"event_id": "a", "event_id": "b"}': 'duplicate key "event_id"',
        "[" * 100_000 + "]" * 100_000: "nested too deep",
        '{"op": "INSERT", "txid": "\\ud800"}': "lone UTF-16 surrogate",
        '{"\\udc80": 1, "\\udc80": 2}': 'duplicate key "\\udc80"',  # said in ASCII
        '{"_malformed": "not JSON", "_source": ' + "[" * 700 + "]" * 700 + "}": "too deep",
    }
    schema = arrow_schema(config.tables["rows"])
    for line, detail in cases.items():
        c = typer.line(line, "r1")
        assert c["reason"] == "malformed" and detail in c["detail"], (line[:40], c["detail"])
        columns_table([{**c, "replica": "r1", "file": "f", "line": 1}], schema)  # writable


def test_a_parquet_time_past_year_9999_is_quarantined_not_raised(tmp_path):
    """A canonical Parquet export whose ``ts`` (or a date) Python cannot hold: that row is
    malformed, saying why; the rows beside it are typed."""
    import pyarrow as pa

    from pipeline.ingest.copies import parquet_records

    path = tmp_path / "part.parquet"
    good = NOW - 10**9
    table = pa.table(
        {
            "op": ["INSERT", "INSERT", "INSERT"],
            "key": ['{"id": 1, "k2": "a"}', '{"id": 2, "k2": "a"}', '{"id": 3, "k2": "a"}'],
            "after": [f'{{"id": {i}, "k2": "a", "s": "x"}}' for i in (1, 2, 3)],
            "ts": pa.array([good, 2**62, good], pa.timestamp("us", tz="UTC")),
            "origin": ["r1"] * 3,
            "event_id": ["e1", "e2", "e3"],
            "seq": [1, 2, 3],
        }
    )
    pq.write_table(table, path)
    config = parse_config(CONFIG)
    typer = Typer(TypingSpec.of(config, config.tables["rows"], NOW))
    copies = [typer.record(fields, text, "r1") for _, fields, text in parquet_records(path)]
    assert [c["reason"] for c in copies] == [None, "malformed", None]
    assert "past year 9999" in copies[1]["detail"]
