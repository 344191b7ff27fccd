"""The loopback S3 server decides a conditional put atomically (pipeline.storage.s3server): of
racing creates of one key exactly one wins, the others get 412 (it exists) or 409 (a
conditional write of it is in flight), and ``S3Store.create`` reports both as a lost race.

moto checks the condition and then writes; the window between is too narrow to lose a
race in practice, so these tests widen it (each write waits 50 ms after its check) in a
moto server run inside the test's process: without the lock two creates win."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import boto3
import pytest
from botocore.config import Config

from pipeline.app.cli import main
from pipeline.publish.doctor import examine
from pipeline.storage.s3server import DUMMY_CREDENTIALS, atomic_puts, free_port
from pipeline.storage.store import S3Store
from tests.helpers import configs

RACERS, ROUNDS = 6, 5
CONFIG = configs.config(
    {"items": configs.table({"id": "bigint", "qty": "int"})}, replicas=("r1", "r2")
)
#: a key whose write waits for RELEASE once it has passed its check (REACHED)
HELD = "held"
REACHED, RELEASE = threading.Event(), threading.Event()


def _moto(monkeypatch, bucket: str) -> Iterator[S3Store]:
    """A moto server in this process (its classes patched by the caller), a bucket, and
    the environment pointing boto3 at it."""
    from moto.s3.responses import S3Response
    from moto.server import ThreadedMotoServer

    monkeypatch.setattr(S3Response, "put_object", S3Response.put_object)  # undone after
    port = free_port()
    for k, v in {**DUMMY_CREDENTIALS, "AWS_ENDPOINT_URL_S3": f"http://127.0.0.1:{port}"}.items():
        monkeypatch.setenv(k, v)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    client = boto3.client(
        "s3",
        config=Config(max_pool_connections=RACERS * 2, retries={"max_attempts": 1}),
    )
    client.create_bucket(Bucket=bucket)
    try:
        yield S3Store(bucket, "", client)
    finally:
        server.stop()


@pytest.fixture
def slow_s3(monkeypatch) -> Iterator[S3Store]:
    """An in-process moto server whose writes come 50 ms after their condition's check."""
    from moto.s3.models import S3Backend

    write = S3Backend.put_object

    def slow(self, bucket, key, *args, **kwargs):
        if key == HELD:  # waits, past its check, until the test lets it write
            REACHED.set()
            assert RELEASE.wait(10)
        time.sleep(0.05)
        return write(self, bucket, key, *args, **kwargs)

    monkeypatch.setattr(S3Backend, "put_object", slow)
    yield from _moto(monkeypatch, "races")


@pytest.fixture
def careless_s3(monkeypatch) -> Iterator[S3Store]:
    """An in-process moto server that ignores ``If-None-Match`` on PutObject, as
    S3-compatible stores without conditional writes do."""
    from moto.s3.responses import S3Response
    from werkzeug.datastructures import Headers

    put = S3Response.put_object

    def careless(self):
        headers = Headers(self.headers)
        headers.remove("If-None-Match")
        self.headers = headers
        return put(self)

    stores = _moto(monkeypatch, "careless")
    store = next(stores)
    monkeypatch.setattr(S3Response, "put_object", careless)
    yield store
    next(stores, None)


def _winners(store: S3Store, key: str) -> list[int]:
    start = threading.Barrier(RACERS)

    def race(i: int) -> bool:
        start.wait()
        return store.create(key, str(i).encode())

    with ThreadPoolExecutor(RACERS) as pool:
        won = list(pool.map(race, range(RACERS)))
    return [i for i, w in enumerate(won) if w]


def test_without_the_lock_two_racing_creates_can_both_win(slow_s3: S3Store):
    """The control: moto alone, with its window widened, lets a race have two winners."""
    counts = [len(_winners(slow_s3, f"plain/{r}")) for r in range(ROUNDS)]
    assert max(counts) > 1, counts


def test_racing_creates_of_one_key_have_one_winner(slow_s3: S3Store):
    atomic_puts()
    for r in range(ROUNDS):
        key = f"atomic/{r}"
        winners = _winners(slow_s3, key)
        assert len(winners) == 1, (r, winners)
        assert slow_s3.read_bytes(key) == str(winners[0]).encode()
    assert not slow_s3.create("atomic/0", b"late")  # an existing key: 412, deterministic


def test_a_conflict_in_flight_is_a_lost_race(slow_s3: S3Store):
    """S3's 409 ConditionalRequestConflict: the create that overlaps another is lost,
    reported like a 412, not as an error."""
    atomic_puts()
    first = threading.Thread(target=slow_s3.create, args=(HELD, b"first"))
    first.start()
    try:
        assert REACHED.wait(10)  # the first create holds the key, waiting to write
        assert slow_s3.create(HELD, b"second") is False
    finally:
        RELEASE.set()
        first.join()
    assert slow_s3.read_bytes(HELD) == b"first"


def test_doctor_fails_a_store_that_ignores_the_condition_and_run_refuses_it(
    careless_s3: S3Store, tmp_path, capsys
):
    found = {f.check: f for f in examine(careless_s3, 30)}
    assert found["access"].ok and not found["atomic create"].ok
    assert "overwrote" in found["atomic create"].detail
    cfg = configs.write(tmp_path / "cdr.yaml", CONFIG, store="s3://careless/cdr")
    assert main(["doctor", "--config", str(cfg)]) == 1
    assert "FAIL atomic create" in capsys.readouterr().out
    run = ["run", "--config", str(cfg), "--date", "2026-11-21", "--work-dir", str(tmp_path / "w")]
    # an export of no change: the run finds its inputs, then refuses the store
    empty = b'{"format": "jsonl", "files": []}'
    manifest = "cdr/exports/replica=r1/table=items/dt=2026-11-21/_manifest.json"
    careless_s3.write_bytes(manifest, empty)
    assert main(run) != 0
    err = capsys.readouterr().err
    assert "the store s3://careless/cdr cannot be written safely" in err, err
    assert careless_s3.list("published/_lock") == []  # refused before the lease
