"""The error hierarchy. Bad *data* is not an error: it goes to quarantine with a reason.

Errors are for what stops a run: a bad config, an export that cannot be trusted, a
resolver configured as ``error`` that fired, a failed quality gate.
"""

from __future__ import annotations


class CdrError(Exception):
    """Base of every error the pipeline raises on purpose; its message is one line for users."""


class ConfigError(CdrError):
    """The config file is invalid; ``problems`` lists every mistake with its path in the file."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = problems
        listed = "; ".join(problems)
        super().__init__(f"{source}: {len(problems)} problem(s): {listed}")


class StoreError(CdrError):
    """The store cannot be read or written (bad URI, missing bucket, permissions)."""


class NotFoundError(StoreError):
    """The key is not in the store (at the moment it was read)."""


class ExportError(CdrError):
    """An export cannot be trusted: missing manifest, checksum or row-count mismatch,
    path escaping the export folder, unreadable file. Nothing is published."""


class PriorStateError(CdrError):
    """The state a run starts from is missing or damaged (removed by a retention rule, a
    partial copy, a truncated file): the run stops rather than start from nothing."""


class GateError(CdrError):
    """A quality gate failed (divergence, foreign keys, validation suites)."""


class StageError(CdrError):
    """A stage was run out of order, e.g. ``cdr resolve`` before ``cdr ingest``."""


class LockedError(CdrError):
    """Another run holds the store's lease (``published/_lock``), or this run lost it."""


class JarsError(CdrError):
    """The locked JVM packages (``jars.lock``: Delta Lake, s3a) are missing, damaged, or
    cannot be fetched."""


class RepairError(CdrError):
    """``cdr repair`` cannot write a replica's repair: a divergence row it cannot read, or
    writes no order of statements lets the database accept (docs/operations.md#repair)."""
