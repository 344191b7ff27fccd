"""Instants as people read them (docs/outputs.md#instants): one formatter, the µs beside
the instant, and every reason that names a time prints it so."""

from __future__ import annotations

import pytest

from pipeline.core import policy
from pipeline.core.instants import instant_micros, micros_to_iso
from pipeline.rules.readers import rfc3339_micros


@pytest.mark.parametrize(
    ("us", "text"),
    [
        (1795168802000000, "2026-11-20T10:00:02Z"),
        (1795168802000001, "2026-11-20T10:00:02.000001Z"),
        (0, "1970-01-01T00:00:00Z"),
        (-1, "1969-12-31T23:59:59.999999Z"),
    ],
)
def test_an_instant_is_rfc3339_in_utc_and_reads_back_to_its_micros(us: int, text: str):
    assert micros_to_iso(us) == text
    assert rfc3339_micros(text) == us  # the ingest's reader: the same instant, to the µs
    assert instant_micros(us) == f"{text} ({us})"


def test_a_value_no_instant_holds_is_printed_as_its_number():
    for us in (10**19, -(10**19)):
        assert micros_to_iso(us) == str(us)
        assert instant_micros(us) == str(us)


def test_a_reason_prints_a_time_as_its_instant_with_the_micros_beside_it():
    why = policy.reason(policy.Why.LOCAL_LATER)
    text = policy.reason(policy.Why.AGAINST_LOCAL, why=why, origin="us-east", ts=1795168802000000)
    assert text == (
        "local (ts, tie_rank) is later; local origin us-east, "
        "ts 2026-11-20T10:00:02Z (1795168802000000)"
    )
