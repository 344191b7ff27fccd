"""Adapters for real exports (docs/adapters.md; docs/adapters.md):
PostgreSQL's wal2json (:mod:`.wal2json`), Debezium envelopes (:mod:`.debezium`) and AWS
DMS change files (:mod:`.dms`), each mapped on Spark, with built-ins only, to the
canonical event record the rest of the pipeline reads (:mod:`.common`, which also holds
the event id rule). What an export must say and carry is checked first, without Spark
(:mod:`.options`).

Every adapter returns the records of a staged export: ``replica, file, line, raw`` with
``raw`` the canonical record as JSON text, which ``pipeline.ingest.copies`` types like any JSONL
export's line. A record the adapter cannot map becomes ``{"_malformed": <reason>,
"_source": <the record as exported>}``: the first guard quarantines it as ``malformed``
with that reason, and the quarantine keeps the record as it was exported.

Values are read through Spark's VARIANT type, which keeps a JSON number's digits (a
``numeric(38,10)`` does not go through a double), and turned into the canonical text of
the column's configured type.
"""

from pipeline.ingest.adapters.options import (
    FRAMING,
    FRAMING_STAGED,
    OPTIONS,
    UNAVAILABLE,
    SettingsCheck,
    check_dms_columns,
    check_options,
    check_requirements,
)

__all__ = [
    "FRAMING",
    "FRAMING_STAGED",
    "OPTIONS",
    "UNAVAILABLE",
    "SettingsCheck",
    "check_dms_columns",
    "check_options",
    "check_requirements",
]
