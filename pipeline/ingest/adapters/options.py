"""What an adapter's export must say and carry, checked before its records are mapped
(no Spark here: ingest reads manifests, and a fetch task stages the files).

- :func:`check_options`: the manifest's ``options`` of each format, every problem naming
  the field;
- :func:`check_requirements`: what the table's config needs of an export (a transaction
  id for ``scope: transaction``);
- :class:`SettingsCheck`: the export settings the first record shows were on (wal2json's
  ``include-*`` options, Debezium's ``provide.transaction.metadata`` when the manifest
  says so). An export without them is refused, naming the setting: its event ids could
  not be stable (docs/adapters.md "Event ids").
"""

from __future__ import annotations

import json
import re
from typing import Any

from pipeline.core.columns import OP, ORIGIN
from pipeline.core.config import Table
from pipeline.core.errors import ExportError
from pipeline.core.policy import Scope

#: lines that are not records: wal2json's transaction framing, Kafka's tombstones. They
#: are counted (the manifest's ``rows``) as ``framing``, not as records (docs/adapters.md)
FRAMING: dict[str, re.Pattern[bytes]] = {
    "wal2json": re.compile(rb'^\s*\{\s*"action"\s*:\s*"[BC]"'),
    "debezium": re.compile(rb"^\s*null\s*$"),
}
#: the formats whose framing lines are staged all the same: wal2json's ``B`` and ``C``
#: say where a transaction starts and that it committed (``pipeline.ingest.adapters.wal2json``)
FRAMING_STAGED = frozenset({"wal2json"})

#: what the Debezium PostgreSQL connector writes for a TOASTed value a change did not
#: decode (its ``unavailable.value.placeholder``; the manifest's option overrides it)
UNAVAILABLE = "__debezium_unavailable_value"

#: the manifest's ``options`` each format accepts, and their JSON types
OPTIONS: dict[str, dict[str, type | tuple[type, ...]]] = {
    "jsonl": {},
    "parquet": {},
    "wal2json": {"origins": dict},
    "debezium": {
        "unavailable_value_placeholder": str,
        "transaction_metadata": bool,
        "origins": dict,
    },
    "dms": {
        "timestamp_column": str,
        "header": bool,
        "columns": list,
        "delimiter": str,
        "null_value": str,
        "txid_column": str,
        "origin_column": str,
        "change_seq_column": str,
    },
}
#: the DMS options that name a column of the files, and what DMS puts there
DMS_COLUMNS = {
    "timestamp_column": "the commit timestamp (DMS's TimestampColumnName)",
    "txid_column": "$AR_H_TRANSACTION_ID (a transformation rule's add-column)",
    "change_seq_column": "$AR_H_CHANGE_SEQ (a transformation rule's add-column)",
    "origin_column": "the change's origin replica (a transformation rule's add-column)",
}


def seq_order(fmt: str, options: dict[str, Any]) -> str | None:
    """docs/rules.md#lost-writes: None when an export's ``seq`` is the replica's apply order
    (the canonical formats' by contract, wal2json's and Debezium's LSN); else why not (its
    conflicts are ``unknown``): a DMS export without ``options.change_seq_column`` orders
    its changes by the files' and lines' order alone."""
    if fmt == "dms" and "change_seq_column" not in options:
        return (
            "dms export without options.change_seq_column: its seq (files, lines) is no apply order"
        )
    return None


def check_options(fmt: str, options: Any, where: str) -> dict[str, Any]:
    """The manifest's ``options`` for ``fmt``, checked; every problem names the field."""
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise ExportError(f"{where}: options must be an object")
    allowed = OPTIONS[fmt]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        known = ", ".join(sorted(allowed)) or "none"
        raise ExportError(f"{where}: options {unknown} are not options of {fmt} (known: {known})")
    for k, v in options.items():
        if not isinstance(v, allowed[k]) or isinstance(v, bool) != (allowed[k] is bool):
            raise ExportError(f"{where}: options.{k} must be a {allowed[k].__name__}")  # type: ignore[union-attr]
    if fmt == "wal2json":
        for k, v in options.get("origins", {}).items():
            if not re.fullmatch(r"\d+", k) or not isinstance(v, str):
                raise ExportError(
                    f"{where}: options.origins maps replication origin ids (digits) to "
                    f"replica ids, got {k!r}: {v!r}"
                )
    if fmt == "debezium":
        for k, v in options.get("origins", {}).items():
            if not isinstance(v, str) or not k:
                raise ExportError(
                    f"{where}: options.origins maps replication origin names (the "
                    f"connector's source.origin, e.g. pg_16392) to replica ids, got {k!r}: {v!r}"
                )
    if fmt == "dms":
        _check_dms(options, where)
    return options


def _check_dms(options: dict[str, Any], where: str) -> None:
    if "timestamp_column" not in options:
        raise ExportError(
            f"{where}: a dms export needs options.timestamp_column, the commit-timestamp "
            "column that DMS adds (its TimestampColumnName setting)"
        )
    cols = options.get("columns")
    if cols is not None and not all(isinstance(c, str) and c for c in cols):
        raise ExportError(f"{where}: options.columns must be a list of column names")
    if options.get("header") is False and cols is None:
        raise ExportError(
            f"{where}: a dms CSV without a header needs options.columns, its columns in order"
        )
    if len(options.get("delimiter", ",")) != 1:
        raise ExportError(f"{where}: options.delimiter must be one character")


def check_requirements(fmt: str, options: dict[str, Any], table: Table, where: str) -> None:
    """What ``table``'s config needs of an export of ``fmt``: ``scope: transaction`` groups
    events by their transaction id, which a DMS export carries only in a column a
    transformation rule adds."""
    if fmt == "dms" and table.scope is Scope.TRANSACTION and "txid_column" not in options:
        raise ExportError(
            f"{where}: table {table.name} has scope: transaction, which needs each change's "
            "transaction id: add $AR_H_TRANSACTION_ID as a column (a DMS transformation "
            "rule) and name it in options.txid_column"
        )


def check_dms_columns(options: dict[str, Any], columns: list[str], name: str) -> None:
    """A DMS file's columns hold every column its manifest's options name."""
    for opt, what in DMS_COLUMNS.items():
        col = options.get(opt)
        if col is not None and col not in columns:
            raise ExportError(
                f"{name}: options.{opt} names column {col!r} ({what}), which the file does "
                f"not have (its columns: {', '.join(columns)})"
            )


#: wal2json's format-2 fields each of its ``include-*`` options adds to every action
_W2J_SETTINGS = {
    "xid": "include-xids",
    "timestamp": "include-timestamp",
    ORIGIN: "include-origin",
    "lsn": "include-lsn",
}


class SettingsCheck:
    """The export settings an adapter's export needs, read from its first record: a
    wal2json action must carry what ``include-xids``, ``include-timestamp``,
    ``include-origin`` and ``include-lsn`` add; a Debezium change event (not a snapshot's
    read), when the manifest says ``options.transaction_metadata``, its ``transaction``
    block. A file
    without them is refused naming the setting and the line."""

    def __init__(self, fmt: str, options: dict[str, Any], name: str):
        self.fmt, self.name = fmt, name
        self.metadata = bool(options.get("transaction_metadata"))
        self.done = fmt == "debezium" and not self.metadata

    def feed(self, line_no: int, raw: bytes) -> None:
        """Look at one more line, until one decides."""
        if self.done:
            return
        try:
            record = json.loads(raw)
        except (ValueError, RecursionError):
            return  # not JSON: that line is quarantined, the next one decides
        if not isinstance(record, dict):
            return
        if self.fmt == "wal2json":
            self._wal2json(line_no, record)
        else:
            self._debezium(line_no, record)

    def _wal2json(self, line_no: int, action: dict[str, Any]) -> None:
        if action.get("action") not in ("B", "C", "I", "U", "D", "T"):
            return
        missing = [opt for f, opt in _W2J_SETTINGS.items() if f not in action]
        if missing:
            raise ExportError(
                f"{self.name}:{line_no}: a wal2json action without what {', '.join(missing)} "
                "add: decode with format-version 2 and include-xids, include-timestamp, "
                "include-origin and include-lsn (docs/adapters.md)"
            )
        self.done = True

    def _debezium(self, line_no: int, record: dict[str, Any]) -> None:
        payload = record.get("payload") if "schema" in record else record
        # a snapshot's read (op r) is in no transaction: the first change decides
        if not isinstance(payload, dict) or payload.get(OP) not in ("c", "u", "d", "t"):
            return
        tx = payload.get("transaction")
        if not isinstance(tx, dict) or tx.get("data_collection_order") is None:
            raise ExportError(
                f"{self.name}:{line_no}: a Debezium change event without its transaction "
                "block, but the manifest's options.transaction_metadata says the connector "
                "sets provide.transaction.metadata=true"
            )
        self.done = True
