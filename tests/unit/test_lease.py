"""The store's lease (pipeline.storage.lease): one writer at a time, on a file store (and on the
loopback S3 server, conditional puts: tests/spark/test_lease.py)."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta

import pytest

from pipeline.core import layout
from pipeline.core.errors import LockedError
from pipeline.storage import lease
from tests.helpers.faults import expire_lease


@pytest.fixture(params=["file"])  # and "s3": tests/spark/test_lease.py
def store(request):
    return request.getfixturevalue(f"{request.param}_store")


def test_one_run_holds_the_lease_and_another_is_refused(store):
    first = lease.acquire(store, "run-a", 600)
    assert lease.holder(store) == first and first.epoch
    again = lease.acquire(store, "run-a", 600, first.epoch)  # a later stage of the same run
    assert again.acquired_at == first.acquired_at and again.run_id == "run-a"
    assert again.epoch == first.epoch and again.expires_at >= first.expires_at
    with pytest.raises(LockedError, match="run-a"):
        lease.acquire(store, "run-b", 600)
    lease.check(store, "run-a", first.epoch)
    with pytest.raises(LockedError, match="does not hold"):
        lease.check(store, "run-b")
    assert not lease.release(store, "run-b")  # not the holder's: left alone
    assert lease.release(store, "run-a", first.epoch)
    assert lease.holder(store) is None
    assert lease.acquire(store, "run-b", 600).run_id == "run-b"


def test_a_second_process_of_the_same_run_id_is_refused(store):
    """Measured before the epoch: the same run id re-entered from two processes, and both
    wrote. Re-entry needs the epoch the run got when it took the lease."""
    first = lease.acquire(store, "run-a", 600)
    with pytest.raises(LockedError, match="run run-a is running already"):
        lease.acquire(store, "run-a", 600)  # no epoch: another process
    with pytest.raises(LockedError, match="run run-a is running already"):
        lease.acquire(store, "run-a", 600, "another-epoch")
    with pytest.raises(LockedError, match="does not hold"):
        lease.check(store, "run-a", "another-epoch")
    assert not lease.release(store, "run-a", "another-epoch")
    assert lease.holder(store) == first


class _TakenOverBeforeRenewal:
    """A store whose lease is taken over by run-b between the renewer's read and its put."""

    def __init__(self, store):
        self._store = store

    def __getattr__(self, name):
        return getattr(self._store, name)

    def replace_if(self, key: str, data: bytes, token: str) -> bool:
        expire_lease(self._store)
        lease.acquire(self._store, "run-b", 600)
        return bool(self._store.replace_if(key, data, token))


def test_a_renewal_is_conditional_and_a_lost_race_names_the_holder(store):
    first = lease.acquire(store, "run-a", 600)
    with pytest.raises(LockedError) as e:
        lease.acquire(_TakenOverBeforeRenewal(store), "run-a", 600, first.epoch)
    assert "run run-a lost the lease" in str(e.value) and "held by run run-b" in str(e.value)
    assert "\n" not in str(e.value)  # one line
    assert lease.holder(store).run_id == "run-b"
    assert not lease.release(store, "run-a", first.epoch)  # never removes its successor's
    assert lease.holder(store).run_id == "run-b"


def test_a_fence_stops_a_writer_that_lost_the_lease(store):
    first = lease.acquire(store, "run-a", 600)
    fence = lease.Fence(store, "run-a", first.epoch)
    fence.before("published/t/state")
    fence.after("published/t/state", 3, "run-a", first.epoch)
    with pytest.raises(
        LockedError, match=r"version 4 was committed by run run-x, not by run run-a"
    ):
        fence.after("published/t/state", 4, "run-x", "other")
    lease.unlock(store, force=True)
    second = lease.acquire(store, "run-b", 600)
    with pytest.raises(LockedError) as e:
        fence.before("published/t/state")
    assert str(e.value).startswith("published/t/state: not committed: run run-a does not hold")
    assert "held by run run-b" in str(e.value)
    lease.Fence(store, "run-b", second.epoch).before("published/t/state")


def test_an_expired_lease_is_taken_over(store, caplog):
    lease.acquire(store, "run-a", 600)
    expire_lease(store)
    with caplog.at_level("WARNING", logger="pipeline.storage.lease"):
        assert lease.acquire(store, "run-b", 600).run_id == "run-b"
    assert "taking over the expired lease of run run-a" in caplog.text
    with pytest.raises(LockedError):
        lease.check(store, "run-a")


def test_unlock_breaks_an_expired_lease_a_live_one_with_force_and_a_garbled_one_is_named(store):
    lease.acquire(store, "run-a", 600)
    with pytest.raises(LockedError, match=r"is live: run run-a on .* --force"):
        lease.unlock(store)
    assert lease.holder(store).run_id == "run-a"
    assert lease.unlock(store, force=True).run_id == "run-a"
    assert lease.holder(store) is None
    lease.acquire(store, "run-c", 600)
    expire_lease(store)
    assert lease.unlock(store).run_id == "run-c"
    assert lease.holder(store) is None
    store.write_bytes(layout.LOCK, b"not json")
    with pytest.raises(LockedError, match="is not a lease"):
        lease.acquire(store, "run-a", 600)


def _race(store, names: list[str]) -> tuple[list[str], list[str]]:
    """The runs ``names`` acquire the lease at the same moment: (who won, who was refused)."""
    won, refused = [], []
    start = threading.Barrier(len(names))

    def race(name: str) -> None:
        start.wait()
        try:
            won.append(lease.acquire(store, name, 600).run_id)
        except LockedError:
            refused.append(name)

    threads = [threading.Thread(target=race, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return won, refused


def test_of_runs_racing_for_a_free_store_exactly_one_wins(store):
    won, refused = _race(store, [f"run-{i}" for i in range(6)])
    assert len(won) == 1 and len(refused) == 5
    assert lease.holder(store).run_id == won[0]


def test_of_runs_racing_for_an_expired_lease_exactly_one_takes_it_over(store):
    """Each round: six runs find the same expired lease at once. Exactly one takes it
    over; a takeover never deletes the lease another run has just taken."""
    for round_ in range(4):
        lease.unlock(store, force=True)
        lease.acquire(store, f"gone-{round_}", 600)
        expire_lease(store)
        won, refused = _race(store, [f"run-{round_}-{i}" for i in range(6)])
        assert len(won) == 1 and len(refused) == 5, (round_, won)
        assert lease.holder(store).run_id == won[0]


def test_a_takeover_left_unfinished_is_taken_over_after_a_minute(store):
    """A run killed between its takeover marker and the lease: for a minute the others
    are refused naming it, then the next run takes the store over."""
    import hashlib

    lease.acquire(store, "gone", 600)
    raw = expire_lease(store)
    held = json.loads(raw)
    marker = f"{layout.LOCK_TAKEOVER}/{hashlib.sha256(raw).hexdigest()[:32]}"
    taker = {**held, "run_id": "killed-taker", "acquired_at": datetime.now(UTC).isoformat()}
    store.write_bytes(marker, json.dumps(taker).encode())
    with pytest.raises(LockedError, match=r"run killed-taker on .* is taking the store"):
        lease.acquire(store, "next", 600)
    a_minute_ago = datetime.now(UTC) - timedelta(seconds=lease.TAKEOVER_SECONDS + 1)
    taker["acquired_at"] = a_minute_ago.isoformat()
    store.write_bytes(marker, json.dumps(taker).encode())
    assert lease.acquire(store, "next", 600).run_id == "next"
    assert lease.holder(store).run_id == "next"


class _RetakenBetweenRequests:
    """A store whose lease is released and taken again by another run between this run's
    failed create and its read: the read finds nothing, and then the lease exists."""

    def __init__(self, store):
        self._store, self._missed = store, False

    def __getattr__(self, name):
        return getattr(self._store, name)

    def read_token(self, key: str):
        if key == layout.LOCK and not self._missed:
            self._missed = True
            return self._store.read_token(f"{key}.gone")  # the store's own "not found"
        return self._store.read_token(key)


def test_a_lease_released_and_retaken_between_two_requests_refuses_the_run(store):
    """The race the six-run test found on S3: a run whose read of the lease misses it
    (released a moment before) while another run takes it again is refused naming the
    new holder, not stopped by a store error."""
    lease.acquire(store, "run-a", 600)
    with pytest.raises(LockedError, match="run-a"):
        lease.acquire(_RetakenBetweenRequests(store), "run-b", 600)


def test_conditional_replace_and_delete_act_on_what_was_read_only(store):
    store.write_bytes("k", b"one")
    data, token = store.read_token("k")
    assert data == b"one"
    assert store.replace_if("k", b"two", token)
    assert not store.replace_if("k", b"three", token)  # stale: the object changed
    assert store.read_bytes("k") == b"two"
    assert not store.delete_if("k", token)
    assert store.delete_if("k", store.read_token("k")[1])
    assert not store.exists("k") and store.read_token("k") is None
    assert not store.replace_if("k", b"x", token) and not store.delete_if("k", token)


def test_a_run_whose_lease_cannot_be_checked_fails_with_its_own_error(store, monkeypatch, caplog):
    """``stages.naming_a_lost_lease``: when the lease check itself fails (the store out
    of reach), the run's first error is what it fails with, the check's only logged."""
    from types import SimpleNamespace

    from pipeline import stages
    from pipeline.core.errors import StoreError

    def unreachable(*_):
        raise StoreError("the store is out of reach")

    monkeypatch.setattr(stages.lease, "check", unreachable)
    ctx = SimpleNamespace(
        config=lambda c: SimpleNamespace(store=store.uri),
        dry_run=False,
        epoch="1",
        run_id="r1",
    )
    with (
        pytest.raises(ValueError, match="the run's own failure"),
        stages.naming_a_lost_lease(None, ctx),
    ):
        raise ValueError("the run's own failure")
    assert "out of reach" in caplog.text


def _exited_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_unlock_breaks_a_live_lease_whose_process_is_gone_from_this_host(store):
    """docs/operations.md#the-lease: the lease names the process renewing it (pid and
    start); ``cdr unlock`` without ``--force`` breaks a live lease whose process is gone
    from this host, and refuses one whose process runs, one renewed on another host, and
    one held between two tasks of the run (no process: the next task takes it)."""
    mine = lease.acquire(store, "run-a", 600)
    assert mine.pid and mine.started and not mine.holder_gone()
    with pytest.raises(LockedError, match="is live"):
        lease.unlock(store)
    for changed in ({"pid": 0, "started": ""}, {"host": "elsewhere"}):
        store.write_bytes(layout.LOCK, json.dumps({**json.loads(store.read_bytes(layout.LOCK)),
                                                  **changed}).encode())  # fmt: skip
        with pytest.raises(LockedError, match="is live"):
            lease.unlock(store)
    held = json.loads(store.read_bytes(layout.LOCK))
    gone = {**held, "host": mine.host, "pid": _exited_pid(), "started": mine.started}
    store.write_bytes(layout.LOCK, json.dumps(gone).encode())
    assert lease.holder(store).holder_gone()
    assert lease.unlock(store).run_id == "run-a"
    assert lease.holder(store) is None


def test_a_heartbeat_renews_the_lease_while_the_process_works_and_hands_it_off(store):
    """A lease of 5 s renewed every second while the heartbeat runs outlives its lifetime;
    after it the lease is left as renewed last; a hand-off names no process and lasts the
    hand-off's seconds; a heartbeat stops quietly once the run released it."""
    import time

    first = lease.acquire(store, "run-a", 5)
    with lease.Heartbeat(store, "run-a", first.epoch, 5):
        time.sleep(6.5)
        now = lease.holder(store)
        assert now.expires_at > first.expires_at and not now.expired(datetime.now(UTC))
        assert now.epoch == first.epoch and now.pid == first.pid
    handed = lease.hand_off(store, "run-a", first.epoch, 3600)
    assert handed is not None and handed.pid == 0 and not handed.started
    assert datetime.fromisoformat(handed.expires_at) > datetime.now(UTC) + timedelta(minutes=59)
    assert "between two of its tasks" in handed.describe()
    beat = lease.Heartbeat(store, "run-a", first.epoch, 5)
    with beat:
        assert lease.release(store, "run-a", first.epoch)
        time.sleep(1.5)
        assert not beat._thread.is_alive()  # released: nothing to renew, never re-created
    assert lease.holder(store) is None
