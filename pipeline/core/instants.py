"""Instants as people read them (docs/outputs.md#instants): the rules compare µs since the
epoch (an event's ``ts``), and every text a person reads prints such a time as an RFC 3339
instant in UTC with the µs beside it, so that it reads as a time and still names the exact
value the rules used. Pure: the tables' ``TIMESTAMP`` columns are the same µs, typed as
instants where the frames are built (``pipeline.spark.frames.INSTANTS``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def micros_to_iso(us: int) -> str:
    """``us`` (µs since the epoch) as RFC 3339 in UTC: ``2026-11-21T10:00:02Z``, with the
    fraction only when it is not zero (``2026-11-21T10:00:02.000001Z``). A value outside
    the years 1 to 9999, which no instant holds, as its number."""
    try:
        d = _EPOCH + timedelta(microseconds=us)
    except OverflowError:
        return str(us)
    return d.isoformat().replace("+00:00", "Z")


def instant_micros(us: int) -> str:
    """``us`` as a person reads it beside the value the rules use:
    ``2026-11-21T10:00:02Z (1795168802000000)``."""
    text = micros_to_iso(us)
    return text if text == str(us) else f"{text} ({us})"
