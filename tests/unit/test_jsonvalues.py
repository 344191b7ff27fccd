"""The logs' JSON text (pipeline.core.jsonvalues): plain values as Python's JSON encoder writes
them compactly, and the column types it cannot write exactly as the spec wants them."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime
from decimal import Decimal

from hypothesis import given
from hypothesis import strategies as st

from pipeline.core.jsonvalues import dumps

PLAIN = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@given(PLAIN)
def test_plain_values_as_the_json_encoder_writes_them(value) -> None:
    assert dumps(value) == json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def test_values_of_the_column_types() -> None:
    row = {
        "m": Decimal("10.00"),
        "small": Decimal("1E-7"),
        "d": date(2026, 1, 31),
        "t": datetime(2026, 11, 21, 8, 0, 0, 123456, tzinfo=UTC),
        "naive": datetime(2026, 11, 21, 8, 0),
        "b": b"hello",
        "k": ("a", 1),
    }
    assert dumps(row) == (
        '{"m":10.00,"small":0.0000001,"d":"2026-01-31",'
        '"t":"2026-11-21T08:00:00.123456Z","naive":"2026-11-21T08:00:00Z",'
        '"b":"aGVsbG8=","k":["a",1]}'
    )
