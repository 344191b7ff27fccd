"""Exports as real tools write them, for the adapter tests: Debezium envelopes (plain, or
wrapped with their schema as Kafka Connect's JsonConverter writes them), AWS DMS change
files (CSV and Parquet) and the manifests around them.

A :class:`Change` is one committed row change as a source database saw it (the
real-source test reads them from the audit tables of real PostgreSQL servers)."""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

from pipeline.storage.store import Store


@dataclass
class Change:
    table: str
    op: str  # I, U, D
    old: dict[str, Any] | None
    new: dict[str, Any] | None
    ts_us: int  # the commit timestamp
    txid: int
    seq: int  # the position in the server's log


def put_export(
    store: Store,
    replica: str,
    table: str,
    dt: str,
    fmt: str,
    files: dict[str, tuple[bytes, int]],
    options: dict[str, Any] | None = None,
    snapshot: bool = False,
) -> None:
    """Upload ``files`` (name -> (bytes, rows)) and then their manifest; ``snapshot``: as
    the replica's full copy of the table (docs/rules.md#convergence)."""
    folder = f"exports/replica={replica}/table={table}/{'snapshot/' if snapshot else ''}dt={dt}"
    entries = []
    for name, (data, rows) in files.items():
        store.write_bytes(f"{folder}/{name}", data)
        entries.append({"path": name, "rows": rows, "sha256": hashlib.sha256(data).hexdigest()})
    manifest: dict[str, Any] = {
        "replica": replica,
        "table": table,
        "dt": dt,
        "format": fmt,
        "files": entries,
    }
    if options:
        manifest["options"] = options
    store.write_bytes(f"{folder}/_manifest.json", json.dumps(manifest).encode())


def lines(records: list[Any]) -> tuple[bytes, int]:
    """JSON lines (a record given as text is written as it is)."""
    out = [r if isinstance(r, str) else json.dumps(r) for r in records]
    return "".join(x + "\n" for x in out).encode(), len(out)


# ----------------------------------------------------------------------------- Debezium


def decimal_bytes(value: Decimal | float | str, scale: int) -> str:
    """Kafka Connect's Decimal: the unscaled value, big-endian two's complement, base64."""
    unscaled = int((Decimal(str(value)) * (10**scale)).to_integral_value())
    n = max(1, (unscaled + (unscaled < 0)).bit_length() // 8 + 1)
    return base64.b64encode(unscaled.to_bytes(n, "big", signed=True)).decode()


#: Debezium's schema of a configured column type: (type, logical name, parameters)
def _field_schema(name: str, ctype: str) -> dict[str, Any]:
    if ctype.startswith("decimal"):
        scale = ctype.split(",")[1].rstrip(")")
        return {
            "type": "bytes",
            "optional": True,
            "name": "org.apache.kafka.connect.data.Decimal",
            "version": 1,
            "parameters": {"scale": scale, "connect.decimal.precision": ctype[8:].split(",")[0]},
            "field": name,
        }
    simple = {
        "int": ("int32", None),
        "bigint": ("int64", None),
        "string": ("string", None),
        "boolean": ("boolean", None),
        "double": ("double", None),
        "date": ("int32", "io.debezium.time.Date"),
        "timestamp": ("int64", "io.debezium.time.MicroTimestamp"),
        "binary": ("bytes", None),
        "uuid": ("string", "io.debezium.data.Uuid"),
    }[ctype]
    out: dict[str, Any] = {"type": simple[0], "optional": True, "field": name}
    if simple[1]:
        out["name"] = simple[1]
        out["version"] = 1
    return out


def dbz_value(v: Any, ctype: str) -> Any:
    """A value as Debezium's JSON converter writes it with its default settings."""
    if v is None:
        return None
    if ctype.startswith("decimal"):
        return decimal_bytes(v, int(ctype.split(",")[1].rstrip(")")))
    if ctype == "date":
        return (date.fromisoformat(str(v)) - date(1970, 1, 1)).days
    if ctype == "timestamp":
        t = datetime.fromisoformat(str(v).replace("Z", "+00:00"))
        return int(t.timestamp() * 1_000_000)
    return v


class Debezium:
    """Debezium PostgreSQL connector envelopes for one table (``columns``: name -> the
    config's column type). ``full_identity``: the table has REPLICA IDENTITY FULL, so an
    UPDATE carries its before image; otherwise ``before`` is null on UPDATE and holds the
    key alone on DELETE, as the connector writes them. ``toasted``: a text value longer than
    this that an UPDATE did not change is stored out of line, and PostgreSQL does not decode
    it: the connector writes ``placeholder`` instead."""

    PLACEHOLDER = "__debezium_unavailable_value"  # the connector's default

    def __init__(
        self,
        table: str,
        key: list[str],
        columns: dict[str, str],
        *,
        schema: bool = True,
        full_identity: bool = False,
        server: str = "pg",
        toasted: int | None = None,
        placeholder: str = PLACEHOLDER,
    ) -> None:
        self.table, self.key, self.columns = table, key, columns
        self.schema, self.full_identity, self.server = schema, full_identity, server
        self.toasted, self.placeholder = toasted, placeholder

    def _unchanged_toast(self, old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
        """``new`` as the connector decodes it: unchanged out-of-line values unavailable."""
        if self.toasted is None:
            return new
        return {
            c: self.placeholder
            if isinstance(v, str) and len(v) > self.toasted and old.get(c) == v
            else v
            for c, v in new.items()
        }

    def _row(self, row: dict[str, Any] | None, key_only: bool = False) -> dict[str, Any] | None:
        if row is None:
            return None
        return {
            c: (dbz_value(row.get(c), t) if not key_only or c in self.key else None)
            for c, t in self.columns.items()
        }

    def envelope(
        self,
        op: str,
        before: dict[str, Any] | None,
        after: dict[str, Any] | None,
        ts_us: int,
        txid: int,
        lsn: int,
    ) -> dict[str, Any]:
        payload = {
            "before": before,
            "after": after,
            "source": {
                "version": "2.7.3.Final",
                "connector": "postgresql",
                "name": self.server,
                "ts_ms": ts_us // 1000,
                "ts_us": ts_us,
                "ts_ns": ts_us * 1000,
                "snapshot": "false",
                "db": "app",
                "sequence": json.dumps([str(lsn - 1), str(lsn)]),
                "schema": "public",
                "table": self.table,
                "txId": txid,
                "lsn": lsn,
                "xmin": None,
            },
            "op": op,
            "ts_ms": ts_us // 1000 + 150,  # when the connector saw it, not the commit
            "transaction": None,
        }
        if not self.schema:
            return payload
        row_schema = {
            "type": "struct",
            "optional": True,
            "name": f"{self.server}.public.{self.table}.Value",
            "fields": [_field_schema(c, t) for c, t in self.columns.items()],
        }
        schema = {
            "type": "struct",
            "optional": False,
            "name": f"{self.server}.public.{self.table}.Envelope",
            "version": 2,
            "fields": [
                {**row_schema, "field": "before"},
                {**row_schema, "field": "after"},
                {"type": "struct", "optional": False, "field": "source", "fields": []},
                {"type": "string", "optional": False, "field": "op"},
                {"type": "int64", "optional": True, "field": "ts_ms"},
            ],
        }
        return {"schema": schema, "payload": payload}

    def records(self, changes: list[Change]) -> list[Any]:
        """The lines an S3 sink writes for these changes: a key change is a delete (and
        its tombstone, ``null``) plus a create, as the connector emits it."""
        out: list[Any] = []
        for ch in changes:
            args = (ch.ts_us, ch.txid, ch.seq)
            old_key = ch.old and {k: ch.old[k] for k in self.key}
            new_key = ch.new and {k: ch.new[k] for k in self.key}
            if ch.op == "I":
                out.append(self.envelope("c", None, self._row(ch.new), *args))
            elif ch.op == "U" and old_key != new_key:
                out.append(self.envelope("d", self._row(ch.old, key_only=True), None, *args))
                out.append("null")
                out.append(self.envelope("c", None, self._row(ch.new), *args))
            elif ch.op == "U":
                before = self._row(ch.old) if self.full_identity else None
                after = self._row(self._unchanged_toast(ch.old, ch.new))
                out.append(self.envelope("u", before, after, *args))
            else:
                key_only = not self.full_identity
                out.append(self.envelope("d", self._row(ch.old, key_only), None, *args))
                out.append("null")
        return out


# ---------------------------------------------------------------------------------- DMS


def dms_timestamp(ts_us: int) -> str:
    return datetime.fromtimestamp(ts_us / 1e6, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


def dms_rows(changes: list[Change], columns: list[str]) -> list[list[Any]]:
    """DMS's CDC rows: Op, the commit timestamp (TimestampColumnName), then the columns;
    an UPDATE carries the new row, a DELETE the old one."""
    out = []
    for ch in changes:
        row = ch.old if ch.op == "D" else ch.new
        assert row is not None
        out.append([ch.op, dms_timestamp(ch.ts_us), *[row.get(c) for c in columns]])
    return out


def _csv_field(v: Any) -> str:
    if v is None:
        return ""  # DMS writes a null as an empty field
    text = str(v)
    if text == "" or any(ch in text for ch in ',"\n\r'):
        return '"' + text.replace('"', '""') + '"'
    return text


def dms_csv(rows: list[list[Any]], header: list[str] | None = None) -> tuple[bytes, int]:
    """DMS's CSV: a null is an empty field, an empty string is quoted."""
    out = [header] if header else []
    out += rows
    text = "".join(",".join(_csv_field(v) for v in r) + "\n" for r in out)
    return text.encode(), len(rows)
