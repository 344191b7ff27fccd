"""The Python side of the row engine: one Spark task folds the keys of its partition and
writes the table's outputs itself (used with ``mapInArrow`` by ``pipeline.resolve.engine``).

The input is a stream sorted by key: each key's prior state row first, then the typed
copies of its events (``frames.copy_schema``) by event and by their order of preference
(docs/rules.md#fine-points). Each key group (``pipeline.resolve.groups``) goes to the path
it needs: a key no event touches keeps its state row, and such rows pass through as Arrow
columns, without a Python object per row (most of a large table, most nights); a lone
insert is written as Arrow columns; the rest is folded in Python
(``pipeline.resolve.group_fold``).

Each task writes one Parquet file per output (:data:`OUTPUTS`) into the table's folder of
the run's work location, which the driver and the executors share, named after the task's
partition (a retried task replaces its file); the Spark job returns what each task
counts of its files (the run report's counts: no job reads the outputs to count them).
Every copy of an event meets in one task (its key's), so the task also writes the
ledger's rows of its events and counts them (``report_counts.tally``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.core import layout
from pipeline.core.columns import (
    DIGEST,
    EVENT_ID,
    FATE,
    KEY,
    REPLICA,
    SEQ,
    STATE_DELETED,
    STATE_DELETED_AT,
    STATE_EVENT_ID,
    STATE_ORIGIN,
    STATE_TS,
)
from pipeline.resolve.group_fold import FoldJob, GroupFolder
from pipeline.resolve.groups import (
    Groups,
    find_groups,
    lone_insert_outputs,
    lone_inserts,
    read_fates,
    reads,
    standing_rows,
)
from pipeline.resolve.report_counts import COUNTED_BY, SKEW, skew_counts, tally, task_events
from pipeline.spark.frames import LEDGER_COLUMNS, UNFORESEEN, arrow_instants
from pipeline.spark.schema import GROUPS
from pipeline.storage.outputs import SPARK_SCHEMA_KEY
from pipeline.storage.workpath import WorkPath, write_table

#: the outputs a fold task writes, each in a folder of that name
OUTPUTS = (
    "state_pre",
    "fates",
    "conflicts",
    "quarantine",
    "divergence",
    "skew",
    "changes",
    layout.LEDGER,
    layout.SNAPSHOT,
    UNFORESEEN,  # a table with unique constraints (``pipeline.resolve.unique``)
)
_ROWS = 8192  # rows of an output buffered before they go to its file


def arrow_schemas(job: FoldJob) -> dict[str, pa.Schema]:
    from pyspark.sql.pandas.types import to_arrow_schema  # deferred: Spark (heavy)

    return {k: to_arrow_schema(s, timezone="UTC") for k, s in job.schemas.items()}


def write_parquet(table: pa.Table, path: WorkPath, spark_schema: Any) -> None:
    """``table`` as one Parquet file at ``path``, written whole (``workpath.write_table``),
    with the Spark schema in its footer as Spark writes it (``spark.read_output`` then
    needs no Spark job to read it)."""
    meta = {SPARK_SCHEMA_KEY: spark_schema.json().encode()}
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), **meta})
    write_table(table, path, compression="zstd")


class TaskOutputs:
    """The rows a task gives each output, written to one file per output at the end."""

    def __init__(self, job: FoldJob, name: str):
        self.job, self.name = job, name
        self.arrow = arrow_schemas(job)
        self.rows: dict[str, list[dict[str, Any]]] = {k: [] for k in self.arrow}
        self.tables: dict[str, list[pa.Table]] = {k: [] for k in self.arrow}

    def add(self, kind: str, row: dict[str, Any]) -> None:
        rows = self.rows[kind]
        rows.append(row)
        if len(rows) >= _ROWS and kind != "conflicts":  # the log is sorted whole at the end
            self._batch(kind)

    def add_table(self, kind: str, table: pa.Table) -> None:
        self._batch(kind)
        self.tables[kind].append(table)

    def _batch(self, kind: str) -> None:
        rows = self.rows[kind]
        if kind == "conflicts":  # in canonical order (the event's, then its conflicts')
            rows.sort(key=_position)
        if rows:
            table = pa.Table.from_pylist(rows, schema=self.arrow[kind])
            self.tables[kind].append(arrow_instants(table) if kind == "conflicts" else table)
            self.rows[kind] = []

    def close(self) -> list[dict[str, Any]]:
        """Writes the files, the ledger's made from the fates; returns what the run
        report counts of them and of their events (the task's rows of
        :data:`TASK_RESULT`)."""
        self._batch("fates")
        fates = self.arrow["fates"].empty_table()
        if self.tables["fates"]:
            fates = pa.concat_tables(self.tables["fates"])
        ledger, events = tally(fates)
        if ledger.num_rows:
            rows = ledger_rows(ledger, self.job.run_id, self.job.table.name)
            self.tables[layout.LEDGER] = [rows.cast(self.arrow[layout.LEDGER])]
        counts = [
            {"task": self.name, "output": kind, "a": a, "b": b, "c": c, "rows": n}
            for kind, a, b, c, n in events
        ]
        told = task_events(fates)
        counts.append({"task": self.name, "output": TASK_EVENTS, "events": told, "rows": 0})
        self._batch("state_pre")
        if self.tables["state_pre"]:  # the snapshot: the live rows of the task's state
            state = pa.concat_tables(self.tables["state_pre"])
            live = state.filter(pc.invert(state[STATE_DELETED]))
            self.tables[layout.SNAPSHOT] = [live.select(self.arrow[layout.SNAPSHOT].names)]
        for kind in self.arrow:
            self._batch(kind)
            if self.tables[kind]:
                whole = pa.concat_tables(self.tables[kind])
                path = self.job.out / kind / f"part-{self.name}.parquet"
                write_parquet(whole, path, self.job.schemas[kind])
                counts += [{"task": self.name, **c} for c in _counted(kind, whole)]
        return counts


def ledger_rows(pairs: pa.Table, run_id: str, table: str) -> pa.Table:
    """The ledger's rows (``frames.LEDGER_COLUMNS``) of (event, fate, digest) triples."""
    n = pairs.num_rows
    run = [pa.array([run_id] * n, pa.string()), pa.array([table] * n, pa.string())]
    return pa.Table.from_arrays(
        [*run, pairs[EVENT_ID], pairs[FATE], pairs[DIGEST]], names=list(LEDGER_COLUMNS)
    )


def _counted(output: str, rows: pa.Table) -> list[dict[str, Any]]:
    """An output's rows counted as the run report counts them (``report_counts.COUNTED_BY``, the
    clock-skew evidence by ``report_counts.skew_counts``)."""
    if output == SKEW:
        return [{"output": output, **c} for c in skew_counts(rows)]
    by = list(COUNTED_BY[output][1]) if output in COUNTED_BY else []
    if not by:
        return [{"output": output, "rows": rows.num_rows}]
    grouped = rows.group_by(by).aggregate([([], "count_all")]).to_pylist()
    names = dict(zip(by, "abc", strict=False))
    return [
        {"output": output, **{names[c]: g[c] for c in by}, "rows": g["count_all"]} for g in grouped
    ]


def _position(r: dict[str, Any]) -> tuple[int, int, int, str, int]:
    return (r["remote_ts"], r["pos_rank"], r["pos_tx"], r["remote_event_id"], r["pos_idx"])


def _passed_through(batch: pa.Table, job: FoldJob) -> pa.Table:
    """The state rows of keys no event touches, as state rows: Arrow columns, no Python
    object per row."""
    row = batch.column("row")
    cols = {c: pc.struct_field(row, c) for c in job.table.column_names}
    cols |= {
        STATE_TS: batch.column("s_ts"),
        STATE_ORIGIN: batch.column("s_origin"),
        STATE_EVENT_ID: batch.column(EVENT_ID),
        STATE_DELETED: batch.column("s_deleted"),
        STATE_DELETED_AT: batch.column("s_deleted_at"),
    }
    if job.table.column_groups:
        cols[GROUPS] = batch.column("s_groups")
    schema = arrow_schemas(job)["state_pre"]
    return pa.Table.from_arrays([cols[f.name].cast(f.type) for f in schema], schema=schema)


def fold_function(
    job: FoldJob, single_group: bool
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The function for ``mapInArrow``: rows arrive sorted by key (``single_group``: the
    whole partition is one group, the coupled keys); a key's rows may span batches. Writes
    the partition's outputs and returns one row: the task's name and its rows per
    output."""
    prefix = "c" if single_group else "k"

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext  # deferred: Spark (heavy), in the task

        ctx = TaskContext.get()
        name = f"{prefix}-{ctx.partitionId() if ctx else 0:05d}"
        out = TaskOutputs(job, name)
        stream = _Stream(job, out)
        if single_group:
            rows = [r for b in batches for r in b.to_pylist()]
            if rows:
                stream.fold_python([rows])
        else:
            carry: pa.Table | None = None
            for batch in batches:
                t = pa.Table.from_batches([batch])
                t = (t if carry is None else pa.concat_tables([carry, t])).combine_chunks()
                cut = int(find_groups(_key(t)).starts[-2])  # the last key may go on
                if cut:
                    stream.stretch(t.slice(0, cut))
                carry = t.slice(cut)
            if carry is not None and carry.num_rows:
                stream.stretch(carry)
        yield pa.RecordBatch.from_pylist(out.close(), schema=TASK_RESULT)

    return run


def _key(t: pa.Table) -> pa.StructArray:
    return t.column(KEY).combine_chunks()


#: what the Python fold reads of a copy that does not stand for its event
_LIGHT = ("is_event", EVENT_ID, REPLICA, SEQ, DIGEST, "differs")


class _Stream:
    """A task's stretches of whole key groups, each group to the path it needs
    (``pipeline.resolve.groups``): a quiet state row passes through, a lone insert is written as
    Arrow columns, the rest is folded in Python."""

    def __init__(self, job: FoldJob, out: TaskOutputs):
        self.job, self.out = job, out
        self.folder = GroupFolder(job)

    def stretch(self, t: pa.Table) -> None:
        groups = find_groups(_key(t))
        n_groups = len(groups.starts) - 1
        quiet = np.zeros(n_groups, dtype=bool)
        lone = np.zeros(n_groups, dtype=bool)
        read = reads(t)  # snapshot reads: a group of them alone is quiet
        if not self.job.truncates:  # a TRUNCATE touches every key
            quiet = ~groups.any((np.asarray(t.column("is_event")) == 1) & ~read)
            lone = lone_inserts(t, groups, self.job.table) & ~quiet
        if quiet.any():
            rows = t.filter(groups.rows(quiet))
            state = np.asarray(rows.column("is_event")) != 1
            self.out.add_table("state_pre", _passed_through(rows.filter(state), self.job))
            if not state.all():
                self.out.add_table(
                    "fates", read_fates(rows.filter(~state), self.out.arrow["fates"])
                )
        if lone.any():
            rows = t.filter(groups.rows(lone))
            outputs = lone_insert_outputs(rows, groups.select(lone), self.job.table, self.out.arrow)
            for kind, table in outputs.items():
                self.out.add_table(kind, table)
        rest = ~(quiet | lone)
        if rest.any():
            self.fold_python(_python_groups(t.filter(groups.rows(rest)), groups.select(rest)))

    def fold_python(self, groups: Iterable[list[dict[str, Any]]]) -> None:
        for rows in groups:
            for kind, row in self.folder.fold(rows):
                self.out.add(kind, row)


def _python_groups(t: pa.Table, groups: Groups) -> Iterator[list[dict[str, Any]]]:
    """The groups of ``t`` as rows for :meth:`GroupFolder.fold`: a state row and the copy
    that stands for each event with every field, the other copies with what the fold
    reads of them (:data:`_LIGHT`)."""
    standing = standing_rows(t, groups)
    full = iter(t.filter(pa.array(standing)).to_pylist())
    light = t.select(list(_LIGHT)).to_pylist()
    rows = [next(full) if s else r for s, r in zip(standing.tolist(), light, strict=True)]
    starts = groups.starts.tolist()
    for a, b in itertools.pairwise(starts):
        yield rows[a:b]


#: what each fold task returns: its rows per output, and per the values the run report
#: counts them by (``report_counts.COUNTED_BY``: up to three, ``a`` to ``c``); and one row
#: (``output`` :data:`TASK_EVENTS`) telling its events (``report_counts.task_events``)
TASK_RESULT = pa.schema(
    [(c, pa.string()) for c in ("task", "output", "a", "b", "c")]
    + [("rows", pa.int64()), ("events", pa.binary())]
)
TASK_COLUMNS = (
    "task string, output string, a string, b string, c string, rows bigint, events binary"
)
#: the ``output`` of the row of a task's :data:`TASK_RESULT` that tells its events
TASK_EVENTS = "_events"
