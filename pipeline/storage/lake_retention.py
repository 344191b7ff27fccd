"""How long a published table keeps its old versions, and which files those versions need.

Every table carries the writer's retention (:func:`retention_properties`, config
``retention_days``): Delta keeps its log and its removed files that long, so that a
version a retained ``runs`` row names still reads. ``cdr vacuum``
(``pipeline.publish.vacuum``) removes the files no version within it needs; a deletion
vector's file is named only by the log's add actions (:func:`deletion_vector_files`).
"""

from __future__ import annotations

import io
import json
import uuid
from typing import Any

import pyarrow.parquet as pq

from pipeline.storage.store import Store

#: the Delta table properties that keep a table's log (and its removed files, for a
#: Delta vacuum) as long as the runs ``cdr vacuum`` keeps: checkpoints and log clean-up
#: never remove a version a retained ``runs`` row names
RETENTION_PROPERTIES = ("delta.logRetentionDuration", "delta.deletedFileRetentionDuration")


def retention_properties(days: int) -> dict[str, str]:
    """The table properties of a retention of ``days`` (config ``retention_days``)."""
    return dict.fromkeys(RETENTION_PROPERTIES, f"interval {days} days")


#: Z85, the base-85 alphabet Delta encodes a deletion vector file's UUID in
_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
#: a deletion vector file's name, in its table's folder (or a random prefix's)
DV_PREFIX, DV_SUFFIX = "deletion_vector_", ".bin"


def deletion_vector_file(descriptor: dict[str, Any]) -> str | None:
    """The file (relative to its table) of a deletion vector descriptor stored in one,
    (PROTOCOL.md "Deletion Vector Descriptor": storage type ``u``, an optional random
    prefix and the Z85 of a UUID); None for a vector inline or at an absolute path."""
    if descriptor.get("storageType") != "u":
        return None
    text = descriptor["pathOrInlineDv"]
    prefix, encoded = text[:-20], text[-20:]
    raw = b""
    for i in range(0, 20, 5):
        n = 0
        for c in encoded[i : i + 5]:
            n = n * 85 + _Z85.index(c)
        raw += n.to_bytes(4, "big")
    name = f"{DV_PREFIX}{uuid.UUID(bytes=raw)}{DV_SUFFIX}"
    return f"{prefix}/{name}" if prefix else name


def deletion_vector_files(store: Store, path: str) -> set[str]:
    """The deletion vector files (relative to the table) that any add action of the
    table's log refers to, in its commits and checkpoints: every version a reader can
    still ask for is in the log, so a vector file outside this set is no version's."""
    found: set[str] = set()

    def note(add: dict[str, Any] | None) -> None:
        dv = (add or {}).get("deletionVector")
        name = deletion_vector_file(dv) if dv else None
        if name is not None:
            found.add(name)

    for key in store.list(f"{path}/_delta_log/"):
        if key.endswith(".json"):
            for line in store.read_bytes(key).decode().splitlines():
                if '"deletionVector"' in line:
                    note(json.loads(line).get("add"))
        elif key.endswith(".parquet"):  # a checkpoint (or a part of one)
            actions = pq.read_table(io.BytesIO(store.read_bytes(key)), columns=["add"])
            for add in actions.column("add").to_pylist():
                note(add)
    return found
