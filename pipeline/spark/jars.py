"""The JVM packages Spark needs beside pyspark's own jars: Delta Lake and s3a.

``jars.lock`` (at the repository's top, beside ``constraints.txt``; the wheel carries it
as ``pipeline/spark/jars.lock``) names every jar by its Maven coordinates and sha256. ``make``
fetches them once (``cdr jars fetch``): Maven copies exactly the locked artifacts (no
transitive resolution, so nothing unlocked arrives; Maven's settings and mirrors apply)
into the jar folder, and each file's sha256 is checked against the lock before it is
kept. At run time the session puts the folder's jars on the driver's class path and in
``spark.jars`` (:mod:`pipeline.spark.session`): Spark never resolves a package.

The lock holds only what pyspark lacks. Its roots (:data:`ROOTS`) are delta-spark for
pyspark's Spark, hadoop-aws at pyspark's Hadoop client version, and the AWS SDK v2
modules s3a uses at the version hadoop-aws's POM declares, in place of the SDK's 655 MB
shaded bundle (the modules take Spark's own netty and HTTP client); Maven resolves them
and a jar whose artifact pyspark already ships (Jackson, Parquet, Hadoop's client...) is
left out, so the class path holds one version of each. ``python -m pipeline.spark.jars lock``
writes the lock again (a maintainer's step; ``make jars-lock``).

Beside them, one jar of the project's own, compiled by ``cdr jars fetch`` with the JDK's
``javac`` into ``cdr-logstore-<digest of its sources>.jar``: the Delta log store every table
is written through (``pipeline/spark/java/FencedLogStore.java``: a commit file created only if
absent, across processes, and only while the run holds the store's lease), the
replacement of a table's files that needs no scan of its state, and the commit of files a
run's tasks wrote as they are (``pipeline/spark/java/Replace.java``), the commit protocol of the
run's Parquet writes (``pipeline/spark/java/PathCommitProtocol.java``) and the local file system
that starts no process per file (``pipeline/spark/java/LocalFileSystem.java``).

Where the jars are: ``CDR_JARS`` (a folder), else ``<venv>/share/cdr/jars``. Where
Maven keeps its downloads: its own local repository, or ``CDR_MAVEN_REPO`` (CI gives it
an empty one, so a broken fetch fails CI).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from pipeline.core.errors import JarsError

JARS_ENV = "CDR_JARS"
MAVEN_REPO_ENV = "CDR_MAVEN_REPO"
LOCK_NAME = "jars.lock"
#: what the lock is resolved from (``python -m pipeline.spark.jars lock``)
ROOTS = (
    "io.delta:delta-spark_4.2_2.13:4.4.0",
    "org.apache.hadoop:hadoop-aws:3.5.0",
    "software.amazon.awssdk:s3:2.35.4",
    "software.amazon.awssdk:s3-transfer-manager:2.35.4",
    "software.amazon.awssdk:sts:2.35.4",
)
#: left out of the resolution: the SDK's shaded bundle (the modules above replace it), and
#: what pyspark ships under another name (jcl-over-slf4j is commons-logging's API,
#: RoaringBitmap 1.x holds the shims of 0.9)
EXCLUDED = (
    "software.amazon.awssdk:bundle",
    "commons-logging:commons-logging",
    "org.roaringbitmap:shims",
)
#: the file in the jar folder that says its jars were checked against this lock
STAMP = ".locked"
#: the project's own Java source (package data), and the jar it is compiled into
OWN_SOURCES = (
    "java/FencedLogStore.java",
    "java/Replace.java",
    "java/PathCommitProtocol.java",
    "java/LocalFileSystem.java",
)
OWN_PREFIX = "cdr-logstore-"


@dataclass(frozen=True)
class Jar:
    group: str
    artifact: str
    version: str
    sha256: str

    @property
    def coordinate(self) -> str:
        return f"{self.group}:{self.artifact}:{self.version}"

    @property
    def file_name(self) -> str:
        """The name Maven's ``copy-dependencies`` gives it."""
        return f"{self.artifact}-{self.version}.jar"


def lock_text() -> str:
    return (resources.files("pipeline.spark") / LOCK_NAME).read_text()


def parse_lock(text: str) -> list[Jar]:
    jars = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            coordinate, sha = line.split()
            group, artifact, version = coordinate.split(":")
        except ValueError:
            raise JarsError(
                f"{LOCK_NAME} line {n}: expected 'group:artifact:version sha256'"
            ) from None
        jars.append(Jar(group, artifact, version, sha))
    return jars


def locked() -> list[Jar]:
    return parse_lock(lock_text())


def folder() -> Path:
    chosen = os.environ.get(JARS_ENV)
    return Path(chosen) if chosen else Path(sys.prefix) / "share" / "cdr" / "jars"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _stamp(where: Path, jars: list[Jar]) -> str:
    """What the stamp holds: each jar's coordinate and sha256, with the size it was
    checked at."""
    sizes = {j.coordinate: [j.sha256, (where / j.file_name).stat().st_size] for j in jars}
    return json.dumps(sizes, sort_keys=True)


def checked(where: Path | None = None, jars: list[Jar] | None = None) -> bool:
    """Whether the folder holds the lock's jars as they were checked (a cheap test: the
    stamp, written after every sha256 matched, and each file's size)."""
    where = where or folder()
    stamp = where / STAMP
    if not stamp.is_file():
        return False
    try:
        return stamp.read_text() == _stamp(where, locked() if jars is None else jars)
    except OSError:
        return False


def classpath(where: Path | None = None) -> list[Path]:
    """The locked jars, in the lock's order, and the project's own; an error says how to
    fetch them."""
    where = where or folder()
    own = where / own_jar_name()
    if not checked(where) or not own.is_file():
        raise JarsError(
            f"the JVM packages of {LOCK_NAME} (Delta Lake, s3a) and the project's log store "
            f"are not in {where}: run `cdr jars fetch` (make does), or set {JARS_ENV} to a "
            "folder that holds them"
        )
    return [*(where / j.file_name for j in locked()), own]


def _own_sources() -> dict[str, bytes]:
    return {n: resources.files("pipeline.spark").joinpath(n).read_bytes() for n in OWN_SOURCES}


def own_jar_name() -> str:
    """The own jar's name: it changes with its sources."""
    digest = hashlib.sha256()
    for name, text in _own_sources().items():
        digest.update(name.encode() + b"\0" + text)
    return f"{OWN_PREFIX}{digest.hexdigest()[:12]}.jar"


def _javac() -> str:
    home = os.environ.get("JAVA_HOME")
    found = home and Path(home, "bin", "javac")
    if found and found.is_file():
        return str(found)
    javac = shutil.which("javac")
    if javac is None:
        raise JarsError(
            "a JDK's javac is needed to build the project's Delta log store: on Debian, "
            "apt-get install default-jdk-headless"
        )
    return javac


def build_own(where: Path) -> Path:
    """Compile the project's Java source against the locked jars and Spark's, into the
    jar folder (whole, or not at all)."""

    target = where / own_jar_name()
    if target.is_file():
        return target
    deps = [str(where / j.file_name) for j in locked()] + [str(spark_jars() / "*")]
    with tempfile.TemporaryDirectory(prefix="cdr-javac-") as tmp:
        sources = []
        for name, text in _own_sources().items():
            sources.append(Path(tmp) / Path(name).name)
            sources[-1].write_bytes(text)
        classes = Path(tmp) / "classes"
        argv = [_javac(), "--release", "17", "-nowarn", "-d", str(classes)]
        done = subprocess.run(
            [*argv, "-cp", os.pathsep.join(deps), *map(str, sources)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise JarsError(
                f"javac could not build {', '.join(OWN_SOURCES)}: {done.stderr.strip()[-800:]}"
            )
        part = where / f".{target.name}.part"
        with zipfile.ZipFile(part, "w", zipfile.ZIP_DEFLATED) as jar:
            jar.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n")
            for cls in sorted(classes.rglob("*.class")):
                jar.write(cls, cls.relative_to(classes).as_posix())
        os.replace(part, target)
    for old in where.glob(f"{OWN_PREFIX}*.jar"):  # of an older source
        if old != target:
            old.unlink()
    return target


def _pom(jars: list[Jar]) -> str:
    deps = "".join(
        f"<dependency><groupId>{j.group}</groupId><artifactId>{j.artifact}</artifactId>"
        f"<version>{j.version}</version><exclusions><exclusion><groupId>*</groupId>"
        "<artifactId>*</artifactId></exclusion></exclusions></dependency>"
        for j in jars
    )
    return (
        '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
        "<groupId>cdr</groupId><artifactId>cdr-jars</artifactId><version>1</version>"
        f"<packaging>pom</packaging><dependencies>{deps}</dependencies></project>"
    )


def _maven(pom: str, goals: list[str], cwd: Path) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise JarsError("Maven (mvn) is needed to fetch the jars: on Debian, apt-get install maven")
    (cwd / "pom.xml").write_text(pom)
    argv = [mvn, "-B", "-q", *goals]
    if os.environ.get(MAVEN_REPO_ENV):
        argv.append(f"-Dmaven.repo.local={os.environ[MAVEN_REPO_ENV]}")
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
        raise JarsError("Maven could not fetch the jars: " + " | ".join(tail))


def fetch(where: Path | None = None, jars: list[Jar] | None = None) -> Path:
    """Put the locked jars (or ``jars``) in the folder, each checked against its sha256,
    and with the lock's, the project's log store (:func:`build_own`); quick when they are
    there already."""
    where = where or folder()
    ours = jars is None  # the project's lock: its log store goes with it
    jars = locked() if jars is None else jars
    if checked(where, jars):
        if ours:
            build_own(where)
        return where
    where.mkdir(parents=True, exist_ok=True)
    (where / STAMP).unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="cdr-jars-") as tmp:
        out = Path(tmp) / "jars"
        _maven(
            _pom(jars),
            ["dependency:copy-dependencies", f"-DoutputDirectory={out}"],
            Path(tmp),
        )
        for j in jars:
            got = out / j.file_name
            if not got.is_file():
                raise JarsError(f"Maven fetched no {j.coordinate}")
            if sha256(got) != j.sha256:
                raise JarsError(
                    f"{j.coordinate}: its sha256 is not the one {LOCK_NAME} holds; "
                    "the file was not kept"
                )
            shutil.copyfile(got, where / f".{j.file_name}.part")
            os.replace(where / f".{j.file_name}.part", where / j.file_name)
    names = {j.file_name for j in jars}
    for old in where.glob("*.jar"):  # of an older lock
        if old.name not in names and not old.name.startswith(OWN_PREFIX):
            old.unlink()
    (where / STAMP).write_text(_stamp(where, jars))
    if ours:
        build_own(where)
    return where


def resolve_lock() -> str:
    """The lock's text, resolved from :data:`ROOTS` by Maven (needs the network)."""
    from pyspark.find_spark_home import _find_spark_home

    jars = (Path(_find_spark_home()) / "jars").glob("*.jar")
    shipped = {re.sub(r"-\d.*", "", p.name) for p in jars}  # the artifact, without its version
    head = [
        "# The JVM packages Spark needs beside pyspark's own jars (Delta Lake, s3a), exact.",
        "# Written by `make jars-lock` (python -m pipeline.spark.jars lock) from",
        "# pipeline/spark/jars.py's ROOTS; fetched and checked by `make` (cdr jars fetch).",
    ]
    return lock_of(ROOTS, EXCLUDED, shipped, head)


def lock_of(
    roots: Sequence[str], excluded: Sequence[str], shipped: set[str], head: list[str]
) -> str:
    """A lock's text: every runtime jar Maven resolves from ``roots`` (``group:artifact:
    version``), but ``excluded`` (``group:artifact``) and the artifacts ``shipped``
    (already on the class path), each with its sha256, below ``head``'s comment lines."""
    exclusions = "".join(
        f"<exclusion><groupId>{g}</groupId><artifactId>{a}</artifactId></exclusion>"
        for g, a in (x.split(":") for x in excluded)
    )
    deps = "".join(
        f"<dependency><groupId>{g}</groupId><artifactId>{a}</artifactId><version>{v}</version>"
        f"<exclusions>{exclusions}</exclusions></dependency>"
        for g, a, v in (r.split(":") for r in roots)
    )
    pom = (
        '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
        "<groupId>cdr</groupId><artifactId>cdr-jars-lock</artifactId><version>1</version>"
        f"<packaging>pom</packaging><dependencies>{deps}</dependencies></project>"
    )
    with tempfile.TemporaryDirectory(prefix="cdr-jars-lock-") as tmp:
        listed = Path(tmp) / "list.txt"
        out = Path(tmp) / "jars"
        _maven(
            pom, ["dependency:list", "-DincludeScope=runtime", f"-DoutputFile={listed}"], Path(tmp)
        )
        _maven(
            pom,
            ["dependency:copy-dependencies", "-DincludeScope=runtime", f"-DoutputDirectory={out}"],
            Path(tmp),
        )
        lines = []
        for row in listed.read_text().split():
            parts = row.split(":")
            if len(parts) < 5 or parts[2] != "jar":
                continue
            group, artifact, version = parts[0], parts[1], parts[3]
            if artifact in shipped or f"{group}:{artifact}" in excluded:
                continue
            lines.append(
                f"{group}:{artifact}:{version}  {sha256(out / f'{artifact}-{version}.jar')}"
            )
    return "\n".join([*head, "# group:artifact:version  sha256", *sorted(lines)]) + "\n"


def main(argv: list[str]) -> int:
    if argv == ["lock"]:
        target = Path(__file__).resolve().parents[2] / LOCK_NAME
        target.write_text(resolve_lock())
        print(f"wrote {target.name}")
        return 0
    raise SystemExit("usage: python -m pipeline.spark.jars lock")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


def spark_jars() -> Path:
    from pyspark.find_spark_home import _find_spark_home

    return Path(_find_spark_home()) / "jars"
