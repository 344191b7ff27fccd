"""An S3-compatible HTTP server on loopback (moto's server mode), for ``cdr demo`` and the
tests. It runs as a child process so that it never competes with the pipeline for the
GIL, and it is stopped when the ``with`` block ends.

Its conditional puts are atomic, as S3's are. moto checks ``If-None-Match`` and then
writes, so two racing creates of one key could both succeed, and the lease and Delta
race tests could pass by luck. No server documented to decide conditional puts
atomically installs as a package here (MinIO, which does, is now source-only; so is
SeaweedFS), so the child process wraps moto's PutObject in a lock per key: a put waits
for the key's lock, and a conditional put that finds it taken answers 409
``ConditionalRequestConflict``, as S3 does for conditional writes in flight at once.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pipeline.core.errors import StoreError

DUMMY_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "cdr-local",
    "AWS_SECRET_ACCESS_KEY": "cdr-local-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def s3_server(port: int | None = None, timeout: float = 30.0) -> Iterator[str]:
    """Start the server, yield its endpoint URL (``http://127.0.0.1:PORT``), stop it."""
    port = port or free_port()
    endpoint = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline.storage.s3server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise StoreError(f"the S3 server on {endpoint} did not start") from None
                time.sleep(0.2)
        yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def use_endpoint(endpoint: str) -> dict[str, str | None]:
    """Point boto3 (in this process and its children) at ``endpoint`` with dummy
    credentials; returns the previous values to restore."""
    values = {"AWS_ENDPOINT_URL_S3": endpoint, **DUMMY_CREDENTIALS}
    previous = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    return previous


def restore_env(previous: dict[str, str | None]) -> None:
    for k, v in previous.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def create_bucket(name: str) -> None:
    import boto3

    boto3.client("s3").create_bucket(Bucket=name)


CONFLICT = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>ConditionalRequestConflict</Code>'
    b"<Message>A conditional request to this object is in progress; retry it</Message></Error>"
)


def atomic_puts() -> None:
    """Make moto's PutObject decide a conditional put and write it in one step (a lock
    per key); a conditional put that overlaps another put of its key gets a 409."""

    from moto.s3.responses import S3Response

    locks: dict[tuple[str, str], threading.Lock] = {}
    guard = threading.Lock()
    put = S3Response.put_object

    def put_object(self: S3Response) -> Any:
        with guard:
            lock = locks.setdefault((self.bucket_name, self.parse_key_name()), threading.Lock())
        conditional = "If-None-Match" in self.headers or "If-Match" in self.headers
        if not lock.acquire(blocking=not conditional):
            return 409, {"Content-Type": "application/xml"}, CONFLICT
        try:
            return put(self)
        finally:
            lock.release()

    S3Response.put_object = put_object  # type: ignore[method-assign]


if __name__ == "__main__":
    from moto.server import main

    atomic_puts()
    main(sys.argv[1:])
