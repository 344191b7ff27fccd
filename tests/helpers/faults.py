"""Faults for the publish tests. ``killed_at``: a ``cdr`` command in its own process
group, SIGKILLed when its log reaches a given line; ``Paused``: one stopped there
(SIGSTOP) until the test resumes it.

A loopback HTTP proxy (a process of its own) in front of the S3 server that fails writes
on demand: from the N-th PUT on, every PUT (an upload, a Delta commit, the lease) gets
``403 AccessDenied``, an error no client retries, as if the writer lost its credentials
or its machine mid-publish. Reads and deletes go through. Every client (boto3, delta-rs,
s3a) reaches S3 through it (``AWS_ENDPOINT_URL_S3``), so every write of a publish is
counted, whichever client makes it. It also keeps a log of every request: its method,
its object's path and the access key that signed it (``ProxyControl.requests``)."""

from __future__ import annotations

import http.client
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from pipeline.core import layout

#: seeds of the commit-phase kills: one in CI, more with CDR_CRASH_SEEDS=1,2,3,...
SEEDS = [int(s) for s in os.environ.get("CDR_CRASH_SEEDS", "1").split(",")]


def fault_points(puts: int) -> list[int]:
    """The PUTs of a write to fail, of ``puts``: the first, the second, the last and two
    seeded ones; every one with ``CDR_FULL_FAULT_SWEEP=1`` (through s3a, a publish is
    many requests)."""
    if os.environ.get("CDR_FULL_FAULT_SWEEP") == "1":
        return list(range(1, puts + 1))
    rng = random.Random(SEEDS[0])
    return sorted({1, min(2, puts), puts, *rng.sample(range(1, puts + 1), min(2, puts))})


def _start(argv: list[str]) -> subprocess.Popen[str]:
    """``cdr argv`` in a process group of its own (its Spark JVM is a child process)."""
    cmd = [sys.executable, "-m", "pipeline.app.cli", *argv]
    env = {**os.environ, "CDR_SHUFFLE_PARTITIONS": "2"}
    return subprocess.Popen(
        cmd,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=env,
        start_new_session=True,
    )


def started_together(
    argvs: dict[str, list[str]], logs: Path, env: dict[str, str] | None = None
) -> tuple[dict[str, int], dict[str, str]]:
    """``cdr argv`` for each name at once; their exit statuses and stderr. The stderr goes
    to files, not pipes: a process is never held up by a pipe the test is not reading yet,
    and ``PYTHONFAULTHANDLER`` makes one that dies of a signal leave its threads' stacks."""
    env = {**os.environ, "CDR_SHUFFLE_PARTITIONS": "2", "PYTHONFAULTHANDLER": "1", **(env or {})}
    procs = {}
    for name, argv in argvs.items():
        with (logs / f"{name}.stderr").open("w") as err:
            cmd = [sys.executable, "-m", "pipeline.app.cli", *argv]
            procs[name] = subprocess.Popen(cmd, stderr=err, stdout=subprocess.DEVNULL, env=env)
    codes = {name: p.wait(timeout=600) for name, p in procs.items()}
    return codes, {name: (logs / f"{name}.stderr").read_text() for name in argvs}


def told(codes: dict[str, int], errors: dict[str, str]) -> str:
    """The exit statuses and the end of each process's stderr, for an assertion."""
    ends = (f"--- {n} (exit {codes[n]}), its stderr ends:\n{errors[n][-3000:]}" for n in codes)
    return f"{codes}\n" + "\n".join(ends)


def _until(p: subprocess.Popen[str], pattern: str, nth: int) -> list[str]:
    """The process's log up to the ``nth`` line matching ``pattern``."""
    assert p.stderr is not None
    lines, seen = [], 0
    for line in p.stderr:
        lines.append(line)
        if re.search(pattern, line):
            seen += 1
            if seen == nth:
                return lines
    raise AssertionError(f"no {nth}th line matching {pattern!r}: " + "".join(lines)[-3000:])


def group_gone(pgid: int, timeout: float = 60) -> None:
    """Wait until no process of the group is left (the JVM exits after its parent)."""
    import psutil

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [q for q in psutil.process_iter(["pid"]) if _group_of(q.pid) == pgid]
        if not left:
            return
        time.sleep(0.2)
    raise AssertionError(f"processes of group {pgid} still run after {timeout} s")


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def killed_at(argv: list[str], pattern: str, nth: int) -> list[str]:
    """Run ``cdr argv`` in its own process group and SIGKILL the group as soon as the
    ``nth`` line of its log matching ``pattern`` appears; returns its log up to there."""
    p = _start(argv)
    lines = _until(p, pattern, nth)
    os.killpg(p.pid, signal.SIGKILL)
    assert p.stderr is not None
    p.stderr.close()
    code = p.wait()
    assert code == -signal.SIGKILL, (code, "".join(lines))
    group_gone(p.pid)
    return lines


class Paused:
    """``cdr argv`` in its own process group, stopped (SIGSTOP to the group, JVM and
    Python workers included) at the ``nth`` line of its log matching ``pattern``."""

    def __init__(self, argv: list[str], pattern: str, nth: int = 1):
        self.p = _start(argv)
        self.lines = _until(self.p, pattern, nth)
        os.killpg(self.p.pid, signal.SIGSTOP)

    def resume(self, timeout: float = 300) -> tuple[int, str]:
        """SIGCONT, then its exit status and whole log, once every process of it is gone."""
        os.killpg(self.p.pid, signal.SIGCONT)
        assert self.p.stderr is not None
        rest = self.p.stderr.read()
        code = self.p.wait(timeout=timeout)
        group_gone(self.p.pid)
        return code, "".join(self.lines) + rest

    def kill(self) -> None:
        """Its whole group killed, if it still runs (a failed test leaves none stopped)."""
        if self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGKILL)
            self.p.wait(timeout=60)


def expire_lease(store: Any) -> bytes:
    """Make the store's lease one that has expired (its run gone for hours); its bytes."""
    held = json.loads(store.read_bytes(layout.LOCK))
    past = datetime.now(UTC) - timedelta(seconds=1)
    raw = json.dumps({**held, "expires_at": past.isoformat()}).encode()
    store.write_bytes(layout.LOCK, raw)
    return raw


_DENIED = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AccessDenied</Code>'
    b"<Message>injected fault</Message></Error>"
)
_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "upgrade", "expect"}


class FaultyProxy:
    def __init__(self, upstream: str):
        u = urlparse(upstream)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        self.fail_from: int | None = None  # the first PUT that fails (1-based)
        self.puts = 0
        self.failed = 0
        self.lock = threading.Lock()
        self.requests: list[tuple[str, str, str]] = []  # (method, path, access key id)

    def note(self, method: str, path: str, authorization: str | None) -> None:
        signed = re.search(r"Credential=([^/]+)/", authorization or "")
        with self.lock:
            self.requests.append((method, path, signed.group(1) if signed else ""))

    def arm(self, fail_from: int | None) -> None:
        with self.lock:
            self.fail_from, self.puts, self.failed = fail_from, 0, 0

    def _should_fail(self, method: str) -> bool:
        if method != "PUT":
            return False
        with self.lock:
            self.puts += 1
            if self.fail_from is not None and self.puts >= self.fail_from:
                self.failed += 1
                return True
        return False

    def handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # headers and body go out as two writes: without TCP_NODELAY each response
            # waits for the client's delayed ACK (about 40 ms a request)
            disable_nagle_algorithm = True

            def log_message(self, *args: object) -> None:
                pass

            def _forward(self) -> None:
                if self.path.startswith(CONTROL):
                    return self._control()
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    body = self._read_chunked()
                proxy.note(self.command, self.path, self.headers.get("Authorization"))
                if proxy._should_fail(self.command):
                    self.send_response(403)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(_DENIED)))
                    self.end_headers()
                    self.wfile.write(_DENIED)
                    return
                conn = http.client.HTTPConnection(proxy.host, proxy.port, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                if body is not None:
                    headers["Content-Length"] = str(len(body))
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status, resp.reason)
                head = self.command == "HEAD"  # its Content-Length is the object's
                for k, v in resp.getheaders():
                    if k.lower() not in _HOP and (head or k.lower() != "content-length"):
                        self.send_header(k, v)
                if not head:
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()

            def _control(self) -> None:
                """The test's orders: ``arm?from=N`` (or ``none``), ``state`` and
                ``requests``."""
                if self.path.startswith(f"{CONTROL}arm"):
                    said = self.path.split("from=", 1)[1]
                    proxy.arm(None if said == "none" else int(said))
                with proxy.lock:
                    state: Any = {"puts": proxy.puts, "failed": proxy.failed}
                    if self.path.startswith(f"{CONTROL}requests"):
                        state = list(proxy.requests)
                data = json.dumps(state).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _read_chunked(self) -> bytes:
                out = b""
                while True:
                    size = int(self.rfile.readline().strip().split(b";")[0], 16)
                    if size == 0:
                        self.rfile.readline()
                        return out
                    out += self.rfile.read(size)
                    self.rfile.readline()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        return Handler


#: the path under which the proxy takes the test's orders
CONTROL = "/__cdr_proxy/"


class ProxyControl:
    """The test's side of a proxy in its own process: arm it, read its counts."""

    def __init__(self, endpoint: str):
        self.endpoint = endpoint

    def _ask(self, what: str) -> Any:
        u = urlparse(self.endpoint)
        conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port, timeout=10)
        try:
            conn.request("GET", f"{CONTROL}{what}")
            return json.loads(conn.getresponse().read())
        finally:
            conn.close()

    def requests(self) -> list[tuple[str, str, str]]:
        """Every request so far: (method, path with its query, the signing access key)."""
        return [tuple(r) for r in self._ask("requests")]  # type: ignore[misc]

    def arm(self, fail_from: int | None) -> None:
        self._ask(f"arm?from={'none' if fail_from is None else fail_from}")

    @property
    def puts(self) -> int:
        return int(self._ask("state")["puts"])

    @property
    def failed(self) -> int:
        return int(self._ask("state")["failed"])


@contextmanager
def faulty_proxy(upstream: str) -> Iterator[tuple[str, ProxyControl]]:
    """The proxy in a process of its own: a client that holds the GIL while it waits
    for S3 (delta-rs' query engine does) cannot starve it."""
    root = Path(__file__).resolve().parents[2]
    p = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.faults", upstream],
        cwd=root,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout is not None
        endpoint = p.stdout.readline().strip()
        if not endpoint.startswith("http://"):
            raise RuntimeError(f"the fault proxy did not start (exit {p.poll()})")
        yield endpoint, ProxyControl(endpoint)
    finally:
        p.terminate()
        p.wait(10)


def _serve(upstream: str) -> None:
    proxy = FaultyProxy(upstream)
    server = ThreadingHTTPServer(("127.0.0.1", 0), proxy.handler())
    print(f"http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    _serve(sys.argv[1])
