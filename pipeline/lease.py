"""One writer per store (formats.md "Outputs", "One writer"): ``published/_lock`` is a
lease, created with a conditional put (S3 ``If-None-Match: *``, an exclusive create on
``file://``), that names the run holding it, its host and its expiry.

- The stages of the run that write to the store (ingest, publish, finish) and their
  Airflow retries re-enter it and renew it. Resolve and validate work in the run's work
  folder only (under spark-submit, without the store's credentials).
- Another run fails at once, naming the holder; or, when the lease has expired, takes
  it over and says so in the log. Of runs that find the same expired lease at once,
  one takes it over: the one that creates its takeover marker,
  ``published/_lock.takeover/<digest of the expired lease>`` (a conditional put too).
- The run's last step releases it, published or failed; ``cdr unlock`` breaks it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta

from pipeline import layout
from pipeline.errors import LockedError, NotFoundError
from pipeline.store import Store

log = logging.getLogger(__name__)

#: how long a lease lasts unless renewed (at ingest and at publish): it runs out for a
#: run that is gone (a killed process, a lost worker), or one whose resolve and validate
#: took longer; if another run has taken the store over by then, that run's publish
#: stops (LockedError) instead of writing
SECONDS = 4 * 3600
#: how long a takeover of an expired lease may take before the next run may take over
#: instead (it takes milliseconds: a run killed in the middle of one leaves it unfinished)
TAKEOVER_SECONDS = 60


@dataclass(frozen=True)
class Lease:
    run_id: str
    host: str
    pid: int
    acquired_at: str
    expires_at: str

    def expired(self, now: datetime) -> bool:
        return datetime.fromisoformat(self.expires_at) <= now

    def describe(self) -> str:
        return f"run {self.run_id} on {self.host} (pid {self.pid}), until {self.expires_at}"


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def _read(store: Store) -> bytes | None:
    """The lease's bytes, or None when the store was free at the moment of the read (a
    caller that wants the lease tries to create it again: it may have been taken again
    since)."""
    try:
        return store.read_bytes(layout.LOCK)
    except NotFoundError:
        return None


def _parse(store: Store, raw: bytes) -> Lease:
    try:
        return Lease(**json.loads(raw))
    except (ValueError, TypeError) as e:
        raise LockedError(
            f"{store.uri}/{layout.LOCK} is not a lease ({e}); `cdr unlock` removes it"
        ) from None


def holder(store: Store) -> Lease | None:
    """The lease as it stands, or None when the store is free."""
    raw = _read(store)
    return None if raw is None else _parse(store, raw)


def _new(run_id: str, seconds: int, acquired: str | None = None) -> Lease:
    now = _now()
    return Lease(
        run_id=run_id,
        host=socket.gethostname(),
        pid=os.getpid(),
        acquired_at=acquired or now.isoformat(),
        expires_at=(now + timedelta(seconds=seconds)).isoformat(),
    )


def _body(lease: Lease) -> bytes:
    return json.dumps(asdict(lease), indent=2).encode()


def acquire(store: Store, run_id: str, seconds: int) -> Lease:
    """Take the lease for ``run_id``, or re-enter and renew it; raise :class:`LockedError`
    naming the holder when another run holds it."""
    for _attempt in range(3):
        lease = _new(run_id, seconds)
        if store.create(layout.LOCK, _body(lease)):
            log.info("lease: %s holds %s/%s", run_id, store.uri, layout.LOCK)
            return lease
        raw = _read(store)
        if raw is None:
            continue  # released in between: try again
        current = _parse(store, raw)
        if current.run_id == run_id:  # a later stage, or a retry, of the same run
            renewed = _new(run_id, seconds, current.acquired_at)
            store.write_bytes(layout.LOCK, _body(renewed))
            return renewed
        if not current.expired(_now()):
            raise LockedError(
                f"the store {store.uri} is being written by {current.describe()}; "
                "wait for it, or run `cdr unlock` if that run is gone"
            )
        _take_over(store, raw, current, lease)
        log.warning("lease: taking over the expired lease of %s", current.describe())
        if _read(store) == raw:  # not released and retaken meanwhile
            store.delete([layout.LOCK])
        # then race for the create, like everyone else (a run that found the store free)
    raise LockedError(f"could not take the lease {store.uri}/{layout.LOCK}: it keeps changing")


def _take_over(store: Store, raw: bytes, expired: Lease, mine: Lease) -> None:
    """Win the takeover of the expired lease ``raw``, or raise :class:`LockedError`: the
    winner is the run whose conditional put of the marker succeeds. A marker whose taker
    did not finish within ``TAKEOVER_SECONDS`` (killed between the marker and the lease)
    is abandoned: the next marker in the chain, named after both, decides again."""
    key = hashlib.sha256(raw).hexdigest()[:32]
    while not store.create(f"{layout.LOCK_TAKEOVER}/{key}", _body(mine)):
        marker = store.read_bytes(f"{layout.LOCK_TAKEOVER}/{key}")
        taker = _parse(store, marker)
        started = datetime.fromisoformat(taker.acquired_at)
        if _now() - started < timedelta(seconds=TAKEOVER_SECONDS):
            raise LockedError(
                f"the lease of {expired.describe()} has expired, and {taker.describe()} "
                f"is taking the store {store.uri} over; wait for it, or run `cdr unlock`"
            )
        key = hashlib.sha256(raw + marker).hexdigest()[:32]


def takeovers(store: Store) -> list[tuple[str, Lease]]:
    """The takeover markers (key, the lease of the run that took over), a record of each
    takeover; ``cdr vacuum`` removes those older than its window."""
    return [(k, _parse(store, store.read_bytes(k))) for k in store.list(layout.LOCK_TAKEOVER)]


def check(store: Store, run_id: str) -> None:
    """Raise unless ``run_id`` holds the lease (a stage about to write)."""
    current = holder(store)
    if current is None or current.run_id != run_id:
        who = "nobody" if current is None else current.describe()
        raise LockedError(
            f"run {run_id} does not hold the lease of {store.uri} (held by {who}); "
            "it was broken or taken over: rerun the date"
        )


def release(store: Store, run_id: str) -> bool:
    """Release the lease if ``run_id`` holds it; True when it did."""
    current = holder(store)
    if current is None or current.run_id != run_id:
        return False
    store.delete([layout.LOCK])
    log.info("lease: %s released", run_id)
    return True


def unlock(store: Store) -> Lease | None:
    """``cdr unlock``: break the lease, whoever holds it; returns what it was."""
    current = holder(store) if store.exists(layout.LOCK) else None
    store.delete([layout.LOCK])
    return current
