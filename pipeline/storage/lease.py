"""One writer per store (docs/outputs.md, "One writer"; docs/operations.md#the-lease):
``published/_lock`` is a lease, created with a conditional put (S3 ``If-None-Match: *``,
an exclusive create on ``file://``), that names the run holding it, its host, the
process renewing it (its pid and start), its expiry and its **epoch**, a token new at
every acquisition.

- The lease lives ``lease.seconds`` (a setting, minutes) past its last renewal. Every
  process that works on the run renews it while it works (:class:`Heartbeat`, a thread):
  the stages that write (ingest, publish, finish) and those that only read the store
  (resolve, validate), so a killed run's lease lapses within minutes. A stage that ends
  cleanly as a task of its own (the DAG's) leaves it to the run's next task for
  ``lease.handoff_seconds`` (:func:`hand_off`: the DAG's retry horizon), naming no
  process.
- The stages of the run and their Airflow retries re-enter it with the epoch ingest
  recorded in the run's work folder, and renew it with a conditional put (``If-Match``):
  a process of the same run id without that epoch is refused, and of two renewals at once
  one wins.
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
  removes its successor's); ``cdr unlock`` breaks a lease that has expired, or one whose
  process is gone from this host, or with ``--force`` any live one whose run is known to
  be gone.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import threading
import uuid
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from pipeline.core import layout
from pipeline.core.errors import LockedError
from pipeline.storage.store import Store

log = logging.getLogger(__name__)

#: how long a lease lasts past its last renewal unless the config says (``lease.seconds``):
#: it runs out within minutes for a run that is gone (a killed process, a lost worker);
#: if another run has taken the store over by then, the first run's publish stops
#: (LockedError) instead of writing
SECONDS = 300
#: how often a :class:`Heartbeat` renews the lease, as a share of its lifetime
BEATS_PER_LIFETIME = 5
#: how long a takeover of an expired lease may take before the next run may take over
#: instead (it takes milliseconds: a run killed in the middle of one leaves it unfinished)
TAKEOVER_SECONDS = 60


@dataclass(frozen=True)
class Lease:
    run_id: str
    host: str
    pid: int  # the process that renews it (0: none, between two tasks of the run)
    acquired_at: str
    expires_at: str
    epoch: str = ""  # new at every acquisition; absent in leases of older releases
    #: when that process started (:func:`process_start`; "": unknown, or between tasks):
    #: with the pid, which process it is, though the pid be reused
    started: str = ""

    def expired(self, now: datetime) -> bool:
        return datetime.fromisoformat(self.expires_at) <= now

    def describe(self) -> str:
        who = f"pid {self.pid}" if self.pid else "between two of its tasks"
        return f"run {self.run_id} on {self.host} ({who}), until {self.expires_at}"

    def holder_gone(self) -> bool:
        """Whether the process that renews the lease is known to be gone: on this host,
        no process with its pid and start is running. False when it may run elsewhere,
        or between two tasks of the run, or its start was not recorded."""
        if self.host != socket.gethostname() or not self.pid or not self.started:
            return False
        return process_start(self.pid) != self.started


def process_start(pid: int) -> str:
    """When process ``pid`` started, as the kernel counts it since boot, with the boot's
    id (``/proc``); "" when it is not running or this is not Linux."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""
    fields = stat[stat.rindex(")") + 2 :].split()  # after the command, which may hold spaces
    return f"{boot}/{fields[19]}"  # field 22 of stat: the start time in clock ticks


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


def _new(
    run_id: str,
    seconds: int,
    acquired: str | None = None,
    epoch: str | None = None,
    between: bool = False,
) -> Lease:
    """A lease of ``run_id`` for ``seconds`` from now, renewed by this process (or by
    none, ``between`` two tasks of the run)."""
    now = _now()
    pid = 0 if between else os.getpid()
    return Lease(
        run_id=run_id,
        host=socket.gethostname(),
        pid=pid,
        acquired_at=acquired or now.isoformat(),
        expires_at=(now + timedelta(seconds=seconds)).isoformat(),
        epoch=epoch or uuid.uuid4().hex[:16],
        started=process_start(pid) if pid else "",
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


def _renew(store: Store, current: Lease, token: str, seconds: int, between: bool = False) -> Lease:
    """The lease renewed by a conditional put of what was read: of two renewals (or a
    renewal and a takeover) at once, one wins; the other is refused naming the holder."""
    renewed = _new(current.run_id, seconds, current.acquired_at, current.epoch, between)
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


def renew(
    store: Store, run_id: str, epoch: str, seconds: int, between: bool = False
) -> Lease | None:
    """``run_id``'s lease (with ``epoch``) renewed for ``seconds`` from now, by this
    process (or by none, ``between`` two tasks of the run); never created: None when the
    store is free (the run released it). :class:`LockedError` names the holder when
    another run or epoch holds it."""
    got = _read(store)
    if got is None:
        return None
    current = _parse(store, got[0])
    if current.run_id != run_id or current.epoch != epoch:
        raise LockedError(
            f"run {run_id} does not hold the lease of {store.uri} (held by "
            f"{current.describe()}); it was broken or taken over: rerun the date"
        )
    try:
        return _renew(store, current, got[1], seconds, between)
    except LockedError:
        if holder(store) is None:
            return None  # released meanwhile
        raise


def hand_off(store: Store, run_id: str, epoch: str, seconds: int) -> Lease | None:
    """A stage that ended cleanly as a task of its own leaves the lease to the run's next
    task: renewed for ``seconds`` (the DAG's retry horizon), naming no process. None when
    ``run_id`` no longer holds it (its next stage then fails naming the holder)."""
    try:
        return renew(store, run_id, epoch, seconds, between=True)
    except LockedError as e:
        log.warning("lease: %s", e)
        return None


class Heartbeat:
    """Renews ``run_id``'s lease every ``seconds / BEATS_PER_LIFETIME`` in a daemon thread
    while the process works on the run (a context manager). A renewal that finds the lease
    taken stops the beat and says so: the run's next fenced commit stops it."""

    def __init__(self, store: Store, run_id: str, epoch: str, seconds: int):
        self.store, self.run_id, self.epoch, self.seconds = store, run_id, epoch, seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="cdr-lease", daemon=True)

    def __enter__(self) -> Heartbeat:
        renew(self.store, self.run_id, self.epoch, self.seconds)  # this process holds it
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _beat(self) -> None:
        while not self._stop.wait(self.seconds / BEATS_PER_LIFETIME):
            try:
                if renew(self.store, self.run_id, self.epoch, self.seconds) is None:
                    return  # released: the run is done
            except LockedError as e:
                log.error("lease: %s", e)
                return
            except Exception as e:  # the store out of reach for a moment: try again
                log.warning("lease: could not renew the lease of run %s: %s", self.run_id, e)


def unlock(store: Store, force: bool = False) -> Lease | None:
    """``cdr unlock``: break the lease; returns what it was. A live lease (not expired)
    is broken without ``force`` only when the process renewing it is gone from this host
    (:meth:`Lease.holder_gone`); otherwise its run may still be writing, and with
    ``force`` it would then stop at its next commit (:class:`Fence`), with that one
    commit per table landed."""
    got = _read(store)
    if got is None:
        return None
    try:
        current: Lease | None = _parse(store, got[0])
    except LockedError:
        current = None  # a garbled lease: nobody can hold it
    live = current is not None and not current.expired(_now())
    if live and current is not None and not force and not current.holder_gone():
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
