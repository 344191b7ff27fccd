"""``cdr doctor`` (docs/operations.md#one-writer-per-store): what a store can be trusted
with, checked
rather than assumed.

- **Access:** the credentials can write, read and delete an object under ``published/``.
- **Atomic create:** a conditional create (S3 ``If-None-Match: *``, an exclusive create
  on ``file://``) of a key that exists must fail (S3 answers 412). A store that writes it
  anyway would let two runs both take the lease and two writers both make a Delta
  version. This check is deterministic: ``cdr run`` makes it before it takes the lease
  and refuses a store that fails it, naming the store.
- **Retention:** every published table keeps its log ``retention_days`` (the config's);
  a table that does not gets it at its next commit (``pipeline.storage.lake``), so this is a
  warning, not a failure.
- **Lease:** who holds the store's lease and until when; a live lease whose process is
  gone from this host is a warning (``cdr unlock`` breaks it).
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

from pipeline.core import layout
from pipeline.core.errors import StoreError
from pipeline.publish.vacuum import table_paths
from pipeline.storage import lease
from pipeline.storage.lake import Lake
from pipeline.storage.lake_retention import RETENTION_PROPERTIES, retention_properties
from pipeline.storage.store import Store


@dataclass(frozen=True)
class Finding:
    check: str
    ok: bool
    detail: str
    #: a failure the store cannot run with (not a warning)
    fatal: bool = True

    def line(self) -> str:
        mark = "ok  " if self.ok else ("FAIL" if self.fatal else "warn")
        return f"{mark} {self.check}: {self.detail}"


def _probe_key() -> str:
    return f"{layout.PROBES}/{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:12]}"


def access(store: Store) -> Finding:
    """Write, read back and delete a small object."""
    key = _probe_key()
    try:
        store.write_bytes(key, b"cdr doctor")
        ok = store.read_bytes(key) == b"cdr doctor"
        store.delete([key])
    except StoreError as e:
        return Finding("access", False, f"cannot write, read and delete {key}: {e}")
    if not ok:
        return Finding("access", False, f"{key} did not read back as written")
    return Finding("access", True, f"write, read and delete under {store.uri}/{layout.PUBLISHED}")


def atomic_create(store: Store) -> Finding:
    """A conditional create of a new key succeeds, and of the same key again fails."""
    key = _probe_key()
    try:
        first = store.create(key, b"first")
        second = store.create(key, b"second")
        body = store.read_bytes(key)
    except StoreError as e:
        return Finding("atomic create", False, f"a conditional create of {key} failed: {e}")
    finally:
        store.delete([key])
    if not first:
        detail = f"a conditional create of the new key {key} was refused"
        return Finding("atomic create", False, detail)
    if second or body != b"first":
        detail = (
            f"a conditional create (If-None-Match: *) of the existing key {key} overwrote it: "
            "the store ignores the condition, so the lease and Delta's commits cannot keep "
            "two writers apart"
        )
        return Finding("atomic create", False, detail)
    return Finding("atomic create", True, "a conditional create of an existing key is refused")


def retention(store: Store, days: int) -> Finding:
    """Every published table's log retention against the config's ``retention_days``."""

    lake = Lake(store)
    want = retention_properties(days)
    paths = table_paths(store)
    off = []
    for path in paths:
        table = lake.table(path)
        if table is None:
            continue
        config = table.metadata().configuration
        if any(config.get(k) != want[k] for k in RETENTION_PROPERTIES):
            off.append(f"{path} ({config.get(RETENTION_PROPERTIES[0]) or 'the default, 30 days'})")
    if off:
        detail = (
            f"{len(off)} of {len(paths)} table(s) keep their log other than {days} days "
            f"(the next run sets it): {', '.join(off)}"
        )
        return Finding("retention", False, detail, fatal=False)
    return Finding("retention", True, f"{len(paths)} table(s) keep their log {days} days")


def held(store: Store) -> Finding:
    """Who holds the store's lease (docs/operations.md#the-lease): a warning when it is
    live and its process is gone from this host (``cdr unlock`` breaks it)."""

    try:
        current = lease.holder(store)
    except StoreError as e:
        return Finding("lease", False, str(e), fatal=False)
    if current is None:
        return Finding("lease", True, "free")
    if current.expired(datetime.now(UTC)):
        return Finding("lease", True, f"expired ({current.describe()}): the next run takes it")
    if current.holder_gone():
        detail = f"live, but its process is gone: {current.describe()}; `cdr unlock` breaks it"
        return Finding("lease", False, detail, fatal=False)
    return Finding("lease", True, f"held by {current.describe()}")


def examine(store: Store, retention_days: int) -> list[Finding]:
    """``cdr doctor``: every check, in order; the later ones only if access works."""
    found = [access(store)]
    if found[0].ok:
        found += [atomic_create(store), retention(store, retention_days), held(store)]
    return found


def require_atomic_create(store: Store) -> None:
    """Refuse a store whose conditional create is not atomic (``cdr run``, before the
    lease)."""
    found = atomic_create(store)
    if not found.ok:
        raise StoreError(
            f"the store {store.uri} cannot be written safely: {found.detail} "
            "(`cdr doctor` checks a store)"
        )
