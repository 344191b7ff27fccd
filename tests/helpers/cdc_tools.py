"""Objects as the CDC tools write them, for the sealing tests (docs/sealing.md): Kafka
Connect's S3 sink with Debezium envelopes (gzipped JSON lines under the time-based or
field-based partition path), AWS DMS's S3 target (CSV change files with the ``Op``
column, named by when DMS wrote them) and ``pg_recvlogical`` with wal2json format 2."""

from __future__ import annotations

import gzip
import json
from datetime import date, datetime
from typing import Any

from pipeline.storage.store import Store

TOPIC = "pg1.public.t"


def debezium_lines(first_id: int, n: int, when: datetime) -> list[bytes]:
    """``n`` insert envelopes (no schema), keys from ``first_id``."""
    ms = int(when.timestamp() * 1000)
    out = []
    for i in range(first_id, first_id + n):
        source = {
            "connector": "postgresql",
            "name": "pg1",
            "db": "app",
            "schema": "public",
            "table": "t",
            "txId": 700 + i,
            "lsn": 10_000 + i,
            "ts_us": ms * 1000,
        }
        env = {"before": None, "after": {"id": i, "v": f"v{i}"}, "source": source}
        out.append(json.dumps({**env, "op": "c", "ts_ms": ms}).encode())
    return out


def kafka_object(partition: int, offset: int) -> str:
    return f"{TOPIC}+{partition}+{offset:010d}.json.gz"


def time_path(when: datetime) -> str:
    """The TimeBasedPartitioner's ``path.format`` of hourly partitions."""
    return f"year={when:%Y}/month={when:%m}/day={when:%d}/hour={when:%H}"


def put_debezium(
    store: Store,
    folder: str,
    when: datetime,
    partition: int,
    offset: int,
    n: int,
    path: str | None = None,
) -> tuple[str, bytes]:
    """One gzipped object of ``n`` envelopes, as the sink flushes it; (its key under the
    table's folder, its bytes)."""
    rel = f"{path or time_path(when)}/{kafka_object(partition, offset)}"
    data = gzip.compress(b"\n".join(debezium_lines(offset, n, when)) + b"\n", mtime=0)
    store.write_bytes(f"{folder}/{rel}", data)
    return rel, data


DMS_HEADER = "Op,commit_ts,id,v"


def put_dms(store: Store, folder: str, written: datetime, rows: list[tuple[str, int]]) -> str:
    """A DMS CSV change file (with a header), in the date folder of its commit date,
    named by when DMS wrote it; returns its key under the table's folder."""
    lines = [DMS_HEADER] + [f"{op},{written:%Y-%m-%d %H:%M:%S},{i},v{i}" for op, i in rows]
    rel = f"public/t/{written:%Y/%m/%d}/{written:%Y%m%d-%H%M%S}0000.csv"
    store.write_bytes(f"{folder}/{rel}", ("\n".join(lines) + "\n").encode())
    return rel


def wal2json_lines(xid: int, ids: list[int], when: datetime) -> list[bytes]:
    """One transaction in wal2json format 2: ``B``, an insert per id, ``C``."""
    ts = when.strftime("%Y-%m-%d %H:%M:%S.000000+00")
    out: list[dict[str, Any]] = [{"action": "B", "xid": xid}]
    for i in ids:
        cols = [
            {"name": "id", "type": "integer", "value": i},
            {"name": "v", "type": "text", "value": f"v{i}"},
        ]
        out.append(
            {
                "action": "I",
                "xid": xid,
                "timestamp": ts,
                "origin": 0,
                "lsn": f"0/{1000 + i:X}",
                "schema": "public",
                "table": "t",
                "columns": cols,
                "pk": [{"name": "id", "type": "integer"}],
            }
        )
    out.append({"action": "C", "xid": xid, "timestamp": ts, "lsn": f"0/{2000 + xid:X}"})
    return [json.dumps(o).encode() for o in out]


def put_wal2json(store: Store, folder: str, day: date, xid: int, ids: list[int]) -> str:
    """The receiver's file of ``day`` (pattern ``slot-{date}.json``)."""
    rel = f"slot-{day.isoformat()}.json"
    when = datetime(day.year, day.month, day.day, 12)
    store.write_bytes(f"{folder}/{rel}", b"\n".join(wal2json_lines(xid, ids, when)) + b"\n")
    return rel
