"""Real Debezium for the tests (tests/e2e/test_debezium.py): the embedded engine and the
PostgreSQL connector at the exact version :data:`VERSION`, from Maven Central, locked by
``debezium.lock`` (at the repository's top, beside ``jars.lock``: every jar's coordinates
and sha256) and fetched once by ``make`` into ``.venv/share/cdr/debezium``, with the test's
capture program (``tests/java/DebeziumCapture.java``) compiled there by the JDK's
``javac``. The same machinery as the project's own jars (``pipeline.spark.jars``).

    python -m tests.helpers.debezium lock     # write debezium.lock again (a maintainer's step)
    python -m tests.helpers.debezium fetch    # fetch and check the jars, build the program

:class:`Capture` runs the program: one JVM, an engine per replica, each writing every
change event as the S3 sink connector names and rotates its objects, in both of Kafka
Connect's JsonConverter modes."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import time
import uuid
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pipeline.spark import jars

VERSION = "3.6.1.Final"
ROOTS = (
    f"io.debezium:debezium-embedded:{VERSION}",
    f"io.debezium:debezium-connector-postgres:{VERSION}",
)
#: what is left out of the resolution: the test program needs no Kafka broker client
#: beyond what Connect's runtime pulls in, and no logging backend (slf4j says so once)
EXCLUDED: tuple[str, ...] = ()
ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "debezium.lock"
SOURCE = ROOT / "tests" / "java" / "DebeziumCapture.java"
PREFIX = "cdr-debezium-capture-"


def folder() -> Path:
    return Path(sys.prefix) / "share" / "cdr" / "debezium"


def locked() -> list[jars.Jar]:
    return jars.parse_lock(LOCK.read_text())


def program_name() -> str:
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    return f"{PREFIX}{digest}.jar"


def missing() -> str | None:
    """What is missing to capture with Debezium, or None: ``make`` provides it."""
    where = folder()
    if not jars.checked(where, locked()) or not (where / program_name()).is_file():
        return f"Debezium's jars and the capture program are not in {where}: run `make debezium`"
    return None


def classpath() -> str:
    where = folder()
    paths = [where / j.file_name for j in locked()] + [where / program_name()]
    return os.pathsep.join(map(str, paths))


def fetch() -> Path:
    """The locked jars, checked, and the capture program built against them."""
    where = jars.fetch(folder(), locked())
    target = where / program_name()
    if target.is_file():
        return where
    with tempfile.TemporaryDirectory(prefix="cdr-dbz-javac-") as tmp:
        classes = Path(tmp) / "classes"
        cp = os.pathsep.join(str(where / j.file_name) for j in locked())
        done = subprocess.run(
            [jars._javac(), "--release", "17", "-nowarn", "-d", str(classes), "-cp", cp,
             str(SOURCE)],
            capture_output=True, text=True,
        )  # fmt: skip
        if done.returncode != 0:
            raise SystemExit(f"javac could not build {SOURCE.name}: {done.stderr[-800:]}")
        part = where / f".{target.name}.part"
        with zipfile.ZipFile(part, "w", zipfile.ZIP_DEFLATED) as jar:
            jar.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n")
            for cls in sorted(classes.rglob("*.class")):
                jar.write(cls, cls.relative_to(classes).as_posix())
        os.replace(part, target)
    for old in where.glob(f"{PREFIX}*.jar"):
        if old != target:
            old.unlink()
    return where


#: the table of the capture's marker rows (:meth:`Capture.stop`): each server needs it
MARKER = "cdr_capture_marker"
MARKER_SQL = f"create table {MARKER}(token text primary key);"


def properties(
    name: str,
    port: int,
    offsets: Path,
    *,
    slot: str,
    tables: tuple[str, ...],
    snapshot_mode: str = "initial",
    transaction_metadata: bool = False,
    decimals: str = "precise",
    time_zone_db: str = "postgres",
) -> dict[str, str]:
    """The engine's settings for one server (``pgoutput``, its own slot and publication)."""
    return {
        "name": name,
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "offset.storage": "org.apache.kafka.connect.storage.FileOffsetBackingStore",
        "offset.storage.file.filename": str(offsets),
        "offset.flush.interval.ms": "0",
        "database.hostname": "127.0.0.1",
        "database.port": str(port),
        "database.user": "postgres",
        "database.password": "",
        "database.dbname": time_zone_db,
        "topic.prefix": name,  # each engine its own: its metrics and topics
        "plugin.name": "pgoutput",
        "slot.name": slot,
        "publication.name": f"{slot}_pub",
        "publication.autocreate.mode": "filtered",
        "table.include.list": ",".join(f"public.{t}" for t in (*tables, MARKER)),
        "snapshot.mode": snapshot_mode,
        "provide.transaction.metadata": str(transaction_metadata).lower(),
        "decimal.handling.mode": decimals,
        "tombstones.on.delete": "false",
        "errors.max.retries": "0",
    }


class Capture:
    """The capture program running: ``engines`` maps a name to its settings
    (:func:`properties`); :meth:`wait_for_slots` until every engine's task started, then
    :meth:`stop` once the workload is done (it returns when the engines caught up)."""

    def __init__(self, out: Path, engines: Mapping[str, Mapping[str, str]], rotate: int = 50):
        out.mkdir(parents=True, exist_ok=True)
        args = []
        for name, props in engines.items():
            path = out / f"{name}.properties"
            path.write_text("".join(f"{k}={_escaped(v)}\n" for k, v in props.items()))
            args.append(f"{name}={path}")
        self.names = set(engines)
        self.log = (out / "capture.log").open("w")
        self.p = subprocess.Popen(
            ["java", "-Xss4m", "-cp", classpath(), "DebeziumCapture", str(out), str(rotate), "2000",
             *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
        )  # fmt: skip
        self.said: dict[str, set[str]] = {"slot": set(), "snapshot": set()}

    def wait_for(self, what: str, names: set[str] | None = None, timeout: float = 120) -> None:
        """Until every engine (of ``names``) said ``what``: ``slot`` (its task started, its
        slot exists) or ``snapshot`` (its snapshot's last read is written)."""
        names = self.names if names is None else names
        deadline = time.monotonic() + timeout
        assert self.p.stdout is not None
        while not names <= self.said[what]:
            if time.monotonic() > deadline:
                raise TimeoutError(f"Debezium's engines said no {what}: {names - self.said[what]}")
            line = self.p.stdout.readline()
            if not line:
                raise RuntimeError(f"the capture ended: see {self.log.name}")
            word, _, rest = line.strip().partition(" ")
            if word in self.said:
                self.said[word].add(rest)
            elif word == "failed":
                raise RuntimeError(f"an engine failed: {rest} (see {self.log.name})")

    def wait_for_slots(self, timeout: float = 120) -> None:
        self.wait_for("slot", timeout=timeout)

    def stop(self, servers: Iterable[Any], timeout: float = 180) -> None:
        """Once every engine streamed a marker row inserted now into each of ``servers``
        (``pg_replicas.Server``; :data:`MARKER`): it streamed every change before it."""
        assert self.p.stdin is not None and self.p.stdout is not None
        token = uuid.uuid4().hex
        for s in servers:
            s.sql(f"insert into {MARKER} values ('{token}')")
        self.p.stdin.write(f"stop {token}\n")
        self.p.stdin.flush()
        rest = self.p.stdout.read()
        code = self.p.wait(timeout=timeout)
        self.log.close()
        if code != 0 or "done" not in rest or "failed" in rest:
            raise RuntimeError(f"the capture failed ({code}): {rest[-500:]}; see {self.log.name}")

    def __enter__(self) -> Capture:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()
        self.log.close()


def _escaped(v: str) -> str:
    """A value as Java's ``Properties`` reads it back."""
    return v.replace("\\", "\\\\").replace("\n", "\\n")


def records(out: Path, name: str, mode: str, topic: str) -> list[tuple[str, bytes]]:
    """The objects an engine wrote for ``topic`` in ``mode`` (``schemas`` or ``plain``):
    (object name, bytes), in offset order."""
    folder_ = out / name / mode / "topics" / topic / "partition=0"
    return [(p.name, p.read_bytes()) for p in sorted(folder_.glob("*.json"))]


def main(argv: list[str]) -> int:
    if argv == ["lock"]:
        head = [
            "# Debezium's embedded engine and PostgreSQL connector for the tests, exact.",
            "# Written by `python -m tests.helpers.debezium lock` from tests/helpers/debezium.py's",
            "# ROOTS; fetched and checked by `make debezium`.",
        ]
        LOCK.write_text(jars.lock_of(ROOTS, EXCLUDED, set(), head))
        print(f"wrote {LOCK.name}")
        return 0
    if argv == ["fetch"]:
        print(f"Debezium {VERSION}: {fetch()}")
        return 0
    raise SystemExit("usage: python -m tests.helpers.debezium lock|fetch")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
