"""How the driver's JVM starts: a class-data archive, and a small run's options.

A new JVM spends the first seconds of a run loading, verifying and compiling Spark's
classes: on a 2-core machine a 3-event ``cdr run`` burned about 40 s of CPU in 22 s
(``bench/RESULTS.md``, "The JVM of a small run"). Two standard HotSpot features take most
of it away, with the same results:

- **A class-data archive** (dynamic CDS, JEP 350): the classes of a run, parsed and
  verified once and mapped from a file by later JVMs. ``cdr jvm-archive`` builds it by
  running a small workload (``make`` does it when it sets up). It belongs to one JDK
  build and one Spark classpath, so its file name holds their digest: a JVM of another
  finds none and starts as usual. ``CDR_JVM_ARCHIVE`` names another file, or ``off``.
- **A small run's options**, below :data:`pipeline.spark.session.CODEGEN_MIN_RECORDS` records:
  the JIT's first tier only (C2 compiles cost a short run more than they save) and the
  serial collector (one thread). A large run keeps the JVM's defaults.

``CDR_JVM_START=plain`` starts the JVM with neither (the bench's baseline). Under
``spark-submit`` the driver's JVM is already running: the DAG's Spark stages pass the
archive's options to spark-submit instead (:func:`submit_conf`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

from pipeline.core.errors import StageError
from pipeline.spark import jars

log = logging.getLogger(__name__)

ARCHIVE_ENV = "CDR_JVM_ARCHIVE"
START_ENV = "CDR_JVM_START"
START_MODES = ("auto", "plain")
#: the JIT's first tier and one GC thread: a small run's JVM. With the first tier only,
#: HotSpot reserves a client VM's 48 MB of code cache, which the archive's workload (and a
#: small run of many tables) fills: the compiler is then disabled and a method adapter
#: that finds no space stops the JVM ("Out of space in CodeCache for adapters"). The tiered
#: default's 240 MB is only reserved address space; the JVM commits what it uses
SMALL_RUN_OPTIONS = (
    "-XX:TieredStopAtLevel=1",
    "-XX:ReservedCodeCacheSize=240m",
    "-XX:+UseSerialGC",
)
#: the share of the code cache the archive's workload may fill before its build fails
#: (it used 52 of 240 MB when measured): a small run's JVM must not run out of it
CODE_CACHE_HEADROOM = 0.5
#: JVM warnings to stderr: stdout is the run's report (``--log-format json`` parses it)
LOG_OPTIONS = ("-Xlog:all=off:stdout", "-Xlog:all=warning:stderr")
#: the archive's build: the classes it cannot archive (signed jars, generated accessors)
#: are skipped, one warning each
BUILD_LOG = "-Xlog:all=warning,cds*=error:stderr"


def java_home() -> Path | None:
    """The JDK ``spark-submit`` runs: ``JAVA_HOME``'s, else the ``java`` on the path."""
    if os.environ.get("JAVA_HOME"):
        return Path(os.environ["JAVA_HOME"]).resolve()
    java = shutil.which("java")
    return Path(java).resolve().parent.parent if java else None


def digest() -> str:
    """What an archive is valid for: the JDK build (its ``release`` file, or where it is)
    and the jars of Spark's classpath, pyspark's and the locked ones (names, sizes and
    modification times: the JVM maps an archive's classes only if the jars it was built
    from are unchanged, so a reinstalled pyspark needs a new archive)."""
    h = hashlib.sha256()
    home = java_home()
    h.update(str(home).encode())
    release = home / "release" if home else None
    if release is not None and release.is_file():
        h.update(release.read_bytes())

    for jar in [*sorted(jars.spark_jars().glob("*.jar")), *jars.classpath()]:
        st = jar.stat()
        h.update(f"{jar.name}:{st.st_size}:{int(st.st_mtime)}\n".encode())
    return h.hexdigest()[:16]


def archive_path() -> Path | None:
    """Where this environment's archive is, or None (``CDR_JVM_ARCHIVE=off``)."""
    chosen = os.environ.get(ARCHIVE_ENV, "")
    if chosen == "off":
        return None
    if chosen:
        return Path(chosen)
    return Path(sys.prefix) / "share" / "cdr" / f"jvm-classes-{digest()}.jsa"


def start_mode() -> str:

    mode = os.environ.get(START_ENV, "auto")
    if mode not in START_MODES:
        raise StageError(f"{START_ENV}={mode!r}: use one of {', '.join(START_MODES)}")
    return mode


def driver_options(small: bool, archive: Path | None) -> list[str]:
    """The driver JVM's options: the archive's (when given), a small run's."""
    if start_mode() == "plain":
        return []
    options = list(LOG_OPTIONS)
    if archive is not None:
        # a damaged archive is then refused (a warning), not mapped; one cut short stops
        # the JVM (its crash report in the temporary folder, not where the user is)
        crash = Path(tempfile.gettempdir()) / "cdr-jvm-crash-%p.log"
        options += [
            f"-XX:SharedArchiveFile={archive}",
            "-XX:+VerifySharedSpaces",
            f"-XX:ErrorFile={crash}",
        ]
    if small:
        options += SMALL_RUN_OPTIONS
    return options


def usable_archive() -> Path | None:
    """The archive a JVM starting now maps, if it exists; one that should and does not
    (never built, or built for other jars: a new pyspark, the project's jar rebuilt) is
    said, since the JVM then starts seconds slower without a word."""
    if start_mode() == "plain":
        return None
    path = archive_path()
    if path is not None and not path.is_file():
        log.info(
            "no class-data archive for this JDK and these jars (%s): `cdr jvm-archive` "
            "builds it, and the driver's JVM starts a few seconds faster",
            path.name,
        )
        return None
    return path


def submit_conf(small: bool = False) -> dict[str, str]:
    """spark-submit's settings for a driver started on this machine (the DAG's Spark
    stages, client mode): the locked jars (on the driver's class path, and shipped to the
    executors by ``spark.jars``), the archive's options when it has one, and a small
    run's (``small``: what ingest staged is a small run, as ``cdr run`` decides)."""

    paths = [str(p) for p in jars.classpath()]
    conf = {"spark.jars": ",".join(paths), "spark.driver.extraClassPath": os.pathsep.join(paths)}
    archive = usable_archive()
    options = driver_options(small, archive) if archive is not None or small else []
    if options:
        conf["spark.driver.extraJavaOptions"] = " ".join(options)
    return conf
