"""The run's output files put in the store by Spark tasks, at the end of the resolve stage,
so that publish only commits them (issue 15, "I/O on the executors").

Each file publish may commit (every dated output of every table, its snapshot, the CDC
log and description tables: :func:`outputs`) is uploaded by a Spark task of its own (a
small run's files share one task per core), with boto3 in the task and the driver's
``AWS_*`` settings: it reads its Parquet footer for the Delta statistics, puts the file
in the run's staging folder of the store (``published/_staging/run=<id>/``, a name no
earlier attempt used) and returns what the commit needs (:class:`Upload`). The driver
keeps the list in the run's ``resolved/uploads.json``; no byte of an output goes through
the driver. Publish has the store copy each file into the table it belongs to (S3's
server-side copy; a hard link on ``file://``): into the published tables when the run
passed its gate, into its own ``_failed/`` tables (its logs) when it did not; nothing of
a failed run lands in a published table's folder. Publish then removes the run's staging
folder; ``cdr vacuum`` removes those a killed run left.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline import layout
from pipeline.lake import DT, file_stats, parquet_files
from pipeline.store import open_store

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from pipeline.config import Config
    from pipeline.context import RunContext

log = logging.getLogger(__name__)

#: the run's uploads, in its ``resolved`` folder
UPLOADS = "uploads.json"


@dataclass(frozen=True)
class Output:
    """A folder of the run's ``resolved`` outputs and the table its files go to."""

    folder: str  # relative to ``resolved``
    path: str  # the table's key in the store
    dated: bool  # partitioned by ``dt``


def outputs(config: Config) -> list[Output]:
    """Every output a publish may commit (``pipeline.published``)."""
    from pipeline import stats

    out = [Output(stats.FOLDER, stats.PATH, True)]  # E6
    if config.cdc.enabled:
        out += [Output(f"cdc/{n}", layout.cdc_table_dir(n), False) for n in layout.CDC_TABLES]
    for t in config.tables:
        out += [Output(f"{t}/{k}", layout.table_path(t, k), True) for k in layout.DATED]
        if config.cdc.enabled:
            out.append(Output(f"cdc/{t}/log", layout.cdc_log_path(t), True))
        if config.tables[t].history is not None:
            out.append(Output(f"{t}/{layout.HISTORY}", layout.table_path(t, layout.HISTORY), False))
        out.append(Output(f"{t}/{layout.SNAPSHOT}", layout.table_path(t, layout.SNAPSHOT), False))
    return out


@dataclass(frozen=True)
class Upload:
    """One output file in the run's staging folder of the store: its key, its name under
    its table's folder (``rel``, with the ``dt=`` folder of a dated table), and what its
    add action says of it."""

    key: str
    rel: str
    size: int
    mtime_ms: int
    rows: int
    stats: str  # the Delta statistics (JSON)
    schema: str  # the file's Arrow schema (IPC, base64)

    def arrow_schema(self) -> pa.Schema:
        return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(self.schema)))


@dataclass(frozen=True)
class _Task:
    src: str
    key: str
    rel: str


def _upload(task: _Task, store_uri: str) -> Upload:
    """In a Spark task: the file's statistics, then the file into the store."""
    src = Path(task.src)
    rows, stats = file_stats(src)
    schema = pq.read_schema(src).remove_metadata()
    open_store(store_uri).upload(src, task.key)
    st = src.stat()
    return Upload(
        task.key,
        task.rel,
        st.st_size,
        int(st.st_mtime * 1000),
        rows,
        stats,
        base64.b64encode(schema.serialize().to_pybytes()).decode(),
    )


def _in_task(task: dict[str, str], store_uri: str, settings: dict[str, str]) -> dict[str, Any]:
    os.environ.update(settings)
    return asdict(_upload(_Task(**task), store_uri))


def upload_outputs(
    spark: SparkSession, config: Config, ctx: RunContext, small: bool = False
) -> int:
    """Upload every output file of the resolved run in Spark tasks, and keep their list
    in ``resolved/uploads.json``; returns the number of files.

    One task per file, so that a large run's files spread over the executors; a
    ``small`` run's files (a few KB each) share one task per core: there a task's own
    cost is most of a file's (a scenario's 40 files took 0.6-1.0 s in 40 tasks, 0.1 s
    in 2)."""
    assert config.store
    attempt = uuid.uuid4().hex[:12]  # a name no earlier attempt of the run used
    tasks: list[_Task] = []
    folders: dict[str, list[int]] = {}
    for o in outputs(config):
        where = f"{DT}={ctx.dt.isoformat()}/" if o.dated else ""
        for i, f in enumerate(parquet_files(ctx.resolved / o.folder)):
            rel = f"{where}{ctx.run_id}-{attempt}-{i:05d}.parquet"
            folders.setdefault(o.folder, []).append(len(tasks))
            key = f"{layout.staging_dir(ctx.run_id)}/{o.folder}/{rel}"
            tasks.append(_Task(str(f), key, rel))
    settings = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
    store_uri = config.store
    done: list[dict[str, Any]] = []
    if tasks:
        payload = [asdict(t) for t in tasks]
        slices = min(len(payload), spark.sparkContext.defaultParallelism) if small else len(payload)
        rdd = spark.sparkContext.parallelize(payload, slices)
        done = rdd.map(lambda t: _in_task(t, store_uri, settings)).collect()
    body = {folder: [done[i] for i in idx] for folder, idx in folders.items()}
    (ctx.resolved / UPLOADS).write_text(json.dumps(body, indent=1))
    log.info("uploads: %d output file(s) put in the store by Spark tasks", len(tasks))
    return len(tasks)


def load_uploads(ctx: RunContext) -> dict[str, list[Upload]] | None:
    """The run's uploads by ``resolved`` folder; None for a run resolved without them (a
    dry run, or a resolve of an earlier version: publish uploads its files itself)."""
    path = ctx.resolved / UPLOADS
    if not path.exists():
        return None
    body = json.loads(path.read_text())
    return {folder: [Upload(**u) for u in files] for folder, files in body.items()}
