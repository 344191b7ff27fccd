"""The custom resolver of ``bench/extensions_bench.py`` (docs/rules.md#custom-resolvers),
in a module of its own so that the Spark workers import nothing else: last writer wins by
``(ts, origin)``, as ``latest_timestamp_wins`` decides with the tie-break, in Python."""

from __future__ import annotations


def latest(local: dict, remote: dict, context: dict) -> str:
    later = (remote["ts"], remote["origin"] or "") > (local["ts"], local["origin"] or "")
    return "remote" if later else "local"
