"""One writer per store (docs/outputs.md, "One writer"): ``published/_lock`` is a
lease, created with a conditional put (S3 ``If-None-Match: *``, an exclusive create on
``file://``), that names the run holding it, its host, its expiry and its **epoch**, a
token new at every acquisition.

- The stages of the run that write to the store (ingest, publish, finish) and their
  Airflow retries re-enter it with the epoch ingest recorded in the run's work folder,
  and renew it with a conditional put (``If-Match``): a process of the same run id
  without that epoch is refused, and of two renewals at once one wins. Resolve and
  validate work in the run's work folder only.
- Another run fails at once, naming the holder; or, when the lease has expired, takes
  it over and says so in the log. Of runs that find the same expired lease at once,
  one takes it over: the one that creates its takeover marker,
  ``published/_lock.takeover/<digest of the expired lease>`` (a conditional put too).
- Every commit of a published table is fenced (:class:`Fence`): the lease and its epoch
  are checked just before it, the commit records the run id and the epoch, and the
  committed version is read back after it. A writer that lost the lease stops, naming
  the table and the holder; at most the one commit per table it had in flight when the
  lease went lands, and no ``runs`` row ever names it (the row is the run's last commit,
  fenced like the others).
- The run's last step releases it (a conditional delete, so a run that lost it never
  removes its successor's); ``cdr unlock`` breaks a lease that has expired, or with
  ``--force`` a live one whose run is known to be gone.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import uuid
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta

from pipeline.core import layout
from pipeline.core.errors import LockedError
from pipeline.storage.store import Store

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
    epoch: str = ""  # new at every acquisition; absent in leases of older releases

    def expired(self, now: datetime) -> bool:
        return datetime.fromisoformat(self.expires_at) <= now

    def describe(self) -> str:
        return f"run {self.run_id} on {self.host} (pid {self.pid}), until {self.expires_at}"


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def _read(store: Store) -> tuple[bytes, str] | None:
    """The lease's bytes and token, or None when the store was free at the moment of the
    read (a caller that wants the lease tries to create it again: it may have been taken
    again since)."""
    return store.read_token(layout.LOCK)


def _parse(store: Store, raw: bytes) -> Lease:
    try:
        return Lease(**json.loads(raw))
    except (ValueError, TypeError) as e:
        raise LockedError(
            f"{store.uri}/{layout.LOCK} is not a lease ({e}); `cdr unlock --force` removes it"
        ) from None


def holder(store: Store) -> Lease | None:
    """The lease as it stands, or None when the store is free."""
    got = _read(store)
    return None if got is None else _parse(store, got[0])


def _new(run_id: str, seconds: int, acquired: str | None = None, epoch: str | None = None) -> Lease:
    now = _now()
    return Lease(
        run_id=run_id,
        host=socket.gethostname(),
        pid=os.getpid(),
        acquired_at=acquired or now.isoformat(),
        expires_at=(now + timedelta(seconds=seconds)).isoformat(),
        epoch=epoch or uuid.uuid4().hex[:16],
    )


def _body(lease: Lease) -> bytes:
    return json.dumps(asdict(lease), indent=2).encode()


def acquire(store: Store, run_id: str, seconds: int, epoch: str | None = None) -> Lease:
    """Take the lease for ``run_id`` (a new epoch), or re-enter and renew it with the
    ``epoch`` the run got when it took it; raise :class:`LockedError` naming the holder
    when another run, or another process of the same run id, holds it."""
    for _attempt in range(3):
        lease = _new(run_id, seconds)
        if store.create(layout.LOCK, _body(lease)):
            log.info("lease: %s holds %s/%s", run_id, store.uri, layout.LOCK)
            return lease
        got = _read(store)
        if got is None:
            continue  # released in between: try again
        raw, token = got
        current = _parse(store, raw)
        if current.run_id == run_id and epoch is not None and current.epoch == epoch:
            return _renew(store, current, token, seconds)  # a later stage, or a retry
        if current.run_id == run_id and not current.expired(_now()):
            raise LockedError(
                f"run {run_id} is running already: {current.describe()} holds the lease "
                f"of {store.uri}; a second process of one run would write beside it"
            )
        if not current.expired(_now()):
            raise LockedError(
                f"the store {store.uri} is being written by {current.describe()}; "
                "wait for it, or run `cdr unlock --force` if that run is gone"
            )
        _take_over(store, raw, current, lease)
        log.warning("lease: taking over the expired lease of %s", current.describe())
        store.delete_if(layout.LOCK, token)  # unless released and retaken meanwhile
        # then race for the create, like everyone else (a run that found the store free)
    raise LockedError(f"could not take the lease {store.uri}/{layout.LOCK}: it keeps changing")


def _renew(store: Store, current: Lease, token: str, seconds: int) -> Lease:
    """The lease renewed by a conditional put of what was read: of two renewals (or a
    renewal and a takeover) at once, one wins; the other is refused naming the holder."""
    renewed = _new(current.run_id, seconds, current.acquired_at, current.epoch)
    if not store.replace_if(layout.LOCK, _body(renewed), token):
        now = holder(store)
        who = "nobody" if now is None else now.describe()
        raise LockedError(
            f"run {current.run_id} lost the lease of {store.uri} while renewing it: "
            f"it is held by {who}"
        )
    return renewed


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


def check(store: Store, run_id: str, epoch: str | None = None) -> Lease:
    """Raise unless ``run_id`` (with ``epoch``, when given) holds the lease: a stage about
    to write. Returns the lease."""
    got = _read(store)
    current = None if got is None else _parse(store, got[0])
    if current is None or current.run_id != run_id or (epoch and current.epoch != epoch):
        who = "nobody" if current is None else current.describe()
        raise LockedError(
            f"run {run_id} does not hold the lease of {store.uri} (held by {who}); "
            "it was broken or taken over: rerun the date"
        )
    return current


def release(store: Store, run_id: str, epoch: str | None = None) -> bool:
    """Release the lease if ``run_id`` (with ``epoch``, when given) holds it; True when
    it did. The delete is conditional: a lease taken over since is never removed."""
    got = _read(store)
    if got is None:
        return False
    current = _parse(store, got[0])
    if current.run_id != run_id or (epoch and current.epoch != epoch):
        return False
    if not store.delete_if(layout.LOCK, got[1]):
        return False
    log.info("lease: %s released", run_id)
    return True


def unlock(store: Store, force: bool = False) -> Lease | None:
    """``cdr unlock``: break the lease; returns what it was. A live lease (not expired)
    is broken only with ``force``: its run may still be writing, and it would then stop
    at its next commit (:class:`Fence`), with that one commit per table landed."""
    got = _read(store)
    if got is None:
        return None
    try:
        current: Lease | None = _parse(store, got[0])
    except LockedError:
        current = None  # a garbled lease: nobody can hold it
    if current is not None and not current.expired(_now()) and not force:
        raise LockedError(
            f"the lease of {store.uri} is live: {current.describe()}. If that run is gone "
            "(its process killed, its machine lost), `cdr unlock --force` breaks it; "
            "otherwise wait for it, or for the lease to expire"
        )
    store.delete_if(layout.LOCK, got[1])
    return current


class Fence:
    """What guards each commit of one run (:mod:`pipeline.storage.lake`): the lease held by the
    run with its epoch just before, the committed version read back just after."""

    def __init__(self, store: Store, run_id: str, epoch: str):
        self.store, self.run_id, self.epoch = store, run_id, epoch

    def before(self, table: str) -> None:
        try:
            check(self.store, self.run_id, self.epoch)
        except LockedError as e:
            raise LockedError(f"{table}: not committed: {e}") from None

    def after(self, table: str, version: int, run_id: str | None, epoch: str | None) -> None:
        """``run_id`` and ``epoch``: what the commit of ``version`` records."""
        if (run_id, epoch) != (self.run_id, self.epoch):
            now = holder(self.store)
            who = "nobody" if now is None else now.describe()
            raise LockedError(
                f"{table}: version {version} was committed by run {run_id}, not by run "
                f"{self.run_id}; the lease is held by {who}"
            )
        self.before(table)
