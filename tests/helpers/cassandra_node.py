"""A single-node Apache Cassandra on loopback, for the tests that apply CQL
(docs/operations.md#repair): ``cassandra-all`` at the exact version :data:`VERSION`, its
jars resolved by Maven from Maven Central into Maven's local repository (``CDR_MAVEN_REPO``
when set, as ``make jars`` does), started with Java 17 in a folder of its own, stopped and
removed at the end. About 5 seconds from the JVM's start to the first query here.

The JVM options are those Cassandra 5.0 ships for Java 17 (``conf/jvm17-server.options``:
the module exports and opens it needs), with a small heap, and two start-up shortcuts for
a throwaway node: C1 only, and no fsync of the system keyspace."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

VERSION = "5.0.9"
_POM = f"""<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>
<groupId>cdr.tests</groupId><artifactId>cassandra-node</artifactId><version>1</version>
<packaging>pom</packaging><dependencies><dependency><groupId>org.apache.cassandra</groupId>
<artifactId>cassandra-all</artifactId><version>{VERSION}</version></dependency></dependencies>
</project>"""
_YAML = """cluster_name: cdr-tests
num_tokens: 1
initial_token: 0
partitioner: org.apache.cassandra.dht.Murmur3Partitioner
authenticator: AllowAllAuthenticator
authorizer: AllowAllAuthorizer
role_manager: CassandraRoleManager
network_authorizer: AllowAllNetworkAuthorizer
data_file_directories: [{root}/data/data]
commitlog_directory: {root}/data/commitlog
saved_caches_directory: {root}/data/saved_caches
hints_directory: {root}/data/hints
cdc_raw_directory: {root}/data/cdc_raw
commitlog_sync: periodic
commitlog_sync_period: 10000ms
commitlog_segment_size: 8MiB
seed_provider:
  - class_name: org.apache.cassandra.locator.SimpleSeedProvider
    parameters: [{{seeds: "127.0.0.1:{storage}"}}]
listen_address: 127.0.0.1
rpc_address: 127.0.0.1
storage_port: {storage}
start_native_transport: true
native_transport_port: {cql}
native_transport_max_frame_size: 64MiB
endpoint_snitch: SimpleSnitch
memtable_heap_space: 64MiB
memtable_offheap_space: 64MiB
key_cache_size: 0MiB
counter_cache_size: 0MiB
concurrent_reads: 4
concurrent_writes: 4
concurrent_counter_writes: 4
concurrent_compactors: 1
hinted_handoff_enabled: false
dynamic_snitch: false
auto_snapshot: false
"""
_LOGBACK = """<configuration scan="false">
  <appender name="FILE" class="ch.qos.logback.core.FileAppender">
    <file>{root}/system.log</file>
    <encoder><pattern>%-5level %date{{ISO8601}} %msg%n</pattern></encoder>
  </appender>
  <root level="INFO"><appender-ref ref="FILE" /></root>
</configuration>"""
#: conf/jvm17-server.options of Cassandra 5.0: what it opens of the JDK's modules
_JAVA17 = [
    "-Djdk.attach.allowAttachSelf=true",
    *(
        f"--add-exports={m}=ALL-UNNAMED"
        for m in (
            "java.base/jdk.internal.misc",
            "java.management.rmi/com.sun.jmx.remote.internal.rmi",
            "java.rmi/sun.rmi.registry",
            "java.rmi/sun.rmi.server",
            "java.sql/java.sql",
            "java.base/java.lang.ref",
            "jdk.unsupported/sun.misc",
            "jdk.compiler/com.sun.tools.javac.file",
            "jdk.attach/sun.tools.attach",
        )
    ),
    *(
        f"--add-opens={m}=ALL-UNNAMED"
        for m in (
            "java.base/java.lang.module",
            "java.base/jdk.internal.loader",
            "java.base/jdk.internal.ref",
            "java.base/jdk.internal.reflect",
            "java.base/jdk.internal.math",
            "java.base/jdk.internal.module",
            "java.base/jdk.internal.util.jar",
            "jdk.management/com.sun.management.internal",
            "java.base/sun.nio.ch",
            "java.base/java.io",
            "java.base/java.lang.reflect",
            "jdk.compiler/com.sun.tools.javac",
            "java.base/java.lang",
            "java.base/java.util",
        )
    ),
]


def missing() -> str | None:
    """What is missing to start the node, or None."""
    if shutil.which("mvn") is None:
        return "Maven (Debian's maven)"
    if shutil.which("java") is None:
        return "Java 17"
    return None


def classpath(work: Path) -> str:
    """The node's class path: Maven resolves ``cassandra-all`` and its dependencies into
    its local repository (downloading them the first time) and lists their files."""
    (work / "pom.xml").write_text(_POM)
    out = work / "classpath.txt"
    argv = ["mvn", "-B", "-q", "dependency:build-classpath", f"-Dmdep.outputFile={out}",
            "-Dmdep.includeScope=runtime"]  # fmt: skip
    if os.environ.get("CDR_MAVEN_REPO"):
        argv.append(f"-Dmaven.repo.local={os.environ['CDR_MAVEN_REPO']}")
    done = subprocess.run(argv, cwd=work, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        why = (done.stdout + done.stderr)[-2000:]
        raise RuntimeError(f"Maven could not resolve cassandra-all {VERSION}: {why}")
    return out.read_text().strip()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def node(timeout: float = 120.0) -> Iterator[tuple[Any, str]]:
    """A started node: yields a connected cassandra-driver ``Session`` and the node's
    address as ``cdr repair --dsn`` takes it (``127.0.0.1:<port>``)."""
    from cassandra.cluster import Cluster

    root = Path(tempfile.mkdtemp(prefix="cdr-cassandra-"))
    cql, storage = _free_port(), _free_port()
    (root / "cassandra.yaml").write_text(_YAML.format(root=root, cql=cql, storage=storage))
    (root / "logback.xml").write_text(_LOGBACK.format(root=root))
    (root / "triggers").mkdir()
    argv = [
        "java", "-Xms256m", "-Xmx1g", "-Xss256k", "-XX:+UseG1GC", "-XX:+ExitOnOutOfMemoryError",
        "-XX:TieredStopAtLevel=1", "-Dcassandra.unsafesystem=true", *_JAVA17,
        "-Djava.net.preferIPv4Stack=true", "-Dio.netty.tryReflectionSetAccessible=true",
        f"-Dcassandra.config=file://{root}/cassandra.yaml", "-Dcassandra-foreground=yes",
        f"-Dcassandra.storagedir={root}/data", f"-Dcassandra.logdir={root}",
        f"-Dcassandra.triggers_dir={root}/triggers",
        f"-Dlogback.configurationFile={root}/logback.xml",
        "-Dcassandra.skip_wait_for_gossip_to_settle=0", "-Dcassandra.ring_delay_ms=0",
        "-cp", classpath(root), "org.apache.cassandra.service.CassandraDaemon",
    ]  # fmt: skip
    log = (root / "stdout.log").open("wb")
    proc = subprocess.Popen(argv, cwd=root, stdout=log, stderr=subprocess.STDOUT)
    cluster = None
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"Cassandra stopped at its start: {_tail(root)}")
            try:
                cluster = Cluster(["127.0.0.1"], port=cql, connect_timeout=2)
                session = cluster.connect()
                session.execute("SELECT release_version FROM system.local")
                break
            except Exception:
                if cluster is not None:
                    cluster.shutdown()
                    cluster = None
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"Cassandra did not answer in {timeout} s: {_tail(root)}"
                    ) from None
                time.sleep(0.5)
        yield session, f"127.0.0.1:{cql}"
    finally:
        if cluster is not None:
            cluster.shutdown()
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(root, ignore_errors=True)


def _tail(root: Path) -> str:
    for name in ("system.log", "stdout.log"):
        path = root / name
        if path.exists():
            return " | ".join(path.read_text(errors="replace").splitlines()[-8:])
    return "(no log)"
