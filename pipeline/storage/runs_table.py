"""The ``runs`` table (docs/outputs.md): one row per run, published, failed or dry,
appended last, after every other commit of the run. A published run's row names the
Delta version of every table it committed: one consistent view across tables, and the
record a later run checks the state it starts from against.

Runs are ordered by the commit that appended their row: a row names that version of the
``runs`` table itself (in ``versions``), its commit made exactly that version or
failed. Hosts' clocks (``finished_at``) order nothing; rows written before the runs
table named its own version come first, in their finish order.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, date, datetime
from typing import Any

import pyarrow as pa

from pipeline.core import layout
from pipeline.core.columns import DT, RUN_ID
from pipeline.core.report import Status
from pipeline.storage.lake import Lake
from pipeline.storage.lake_read import meta_of

SCHEMA = pa.schema(
    [
        (RUN_ID, pa.string()),
        (DT, pa.date32()),
        ("status", pa.string()),  # published | failed | dry_run
        ("started_at", pa.timestamp("us", tz="UTC")),
        ("finished_at", pa.timestamp("us", tz="UTC")),
        ("prior_run_id", pa.string()),
        ("config_sha256", pa.string()),
        ("inputs", pa.string()),  # JSON: every manifest ingested, with its sha256
        ("verdict", pa.string()),  # JSON: suites and failures
        ("counts", pa.string()),  # JSON: the run report's counts
        ("versions", pa.string()),  # JSON: table path -> Delta version this run committed
    ]
)
JSON_FIELDS = ("inputs", "verdict", "counts", "versions")
STATUSES = tuple(s.value for s in Status)


@dataclass(frozen=True)
class RunRow:
    run_id: str
    dt: date
    status: str
    started_at: datetime
    finished_at: datetime
    prior_run_id: str | None
    config_sha256: str
    inputs: list[dict[str, Any]] = field(default_factory=list)
    verdict: dict[str, Any] = field(default_factory=dict)
    counts: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, int] = field(default_factory=dict)

    @property
    def published(self) -> bool:
        return self.status == Status.PUBLISHED

    @property
    def seq(self) -> int:
        """The version of the ``runs`` table that appended this row (-1: a row of an
        older store, which did not record it)."""
        return int(self.versions.get(layout.RUNS, -1))

    def order(self) -> tuple[int, datetime, str]:
        """The key that sorts rows in the order they were committed."""
        return (self.seq, self.finished_at, self.run_id)

    def tables(self) -> dict[str, Any]:
        """The per-table counts of the run report."""
        tables: dict[str, Any] = self.counts.get("tables", {})
        return tables

    def to_arrow(self) -> pa.Table:
        row = asdict(self)
        for k in JSON_FIELDS:
            row[k] = json.dumps(row[k], sort_keys=True, default=str)
        return pa.Table.from_pylist([row], schema=SCHEMA)


def read_runs(lake: Lake) -> list[RunRow]:
    """Every row of the ``runs`` table, in commit order (none when the table is new)."""
    t = lake.read(layout.RUNS)
    if t is None:
        return []
    rows = []
    for r in t.to_pylist():
        for k in JSON_FIELDS:
            r[k] = json.loads(r[k]) if r[k] else ({} if k != "inputs" else [])
        rows.append(RunRow(**{f: r[f] for f in RunRow.__dataclass_fields__}))
    return sorted(rows, key=RunRow.order)


def latest_published(rows: list[RunRow], table: str, before: date) -> RunRow | None:
    """The run published last for the latest date before ``before`` that published
    ``table``: the state a run of ``before`` starts from."""
    mine = [r for r in rows if r.published and r.dt < before and table in r.tables()]
    return max(mine, key=lambda r: (r.dt, r.order()), default=None)


def retained_rows(runs: list[RunRow], horizon: datetime) -> list[RunRow]:
    """The ``runs`` rows whose versions stay readable (``cdr vacuum`` keeps them):
    finished within the window, and per table the run it was last published by, now and
    when the window began (a rerun of the newest date after a pause longer than the
    window starts from the latter)."""
    chosen = {r.run_id: r for r in runs if r.finished_at >= horizon}
    before = [r for r in runs if r.finished_at < horizon]
    for table in {t for r in runs for t in r.tables()}:
        for rows in (runs, before):
            last = latest_published(rows, table, date.max)
            if last is not None:
                chosen[last.run_id] = last
    return list(chosen.values())


def published_by_date(rows: list[RunRow]) -> dict[date, RunRow]:
    """Each date's run published last (in commit order): the run whose report, snapshot
    version and state the date stands for."""
    out: dict[date, RunRow] = {}
    for r in sorted(rows, key=RunRow.order):
        if r.published:
            out[r.dt] = r
    return out


def published_dates(rows: list[RunRow], table: str) -> dict[date, RunRow]:
    """Each date's run published last for ``table`` (in commit order)."""
    return {r.dt: r for r in sorted(rows, key=RunRow.order) if r.published and table in r.tables()}


def prior_run(row: RunRow, table: str) -> str | None:
    """The run whose state ``row`` started ``table`` from: its report says (None: the
    base, or nothing); a row of an earlier release names the run of the newest of its
    tables' priors."""
    counts = row.tables().get(table, {})
    found: str | None = counts.get("prior_run_id", row.prior_run_id)
    return found


@dataclass(frozen=True)
class Replaced:
    """A published date run again since the state a run starts from was built on it:
    ``later``, the dates built on the run it replaced, to run again in order."""

    table: str
    start: RunRow  # the state the run starts from
    dt: date  # the date run again
    now: RunRow  # its published run now
    later: tuple[date, ...]

    def __str__(self) -> str:
        dates = ", ".join(map(str, self.later))
        return (
            f"table {self.table!r} would start from the state of {self.start.dt} (run "
            f"{self.start.run_id}), which was built on an earlier run of {self.dt}; {self.dt} "
            f"has been run again since (run {self.now.run_id}), and that state lacks what the "
            f"new run applied. Run the dates after it again, in order ({dates}): "
            f"`cdr run --date {self.later[0]} --then-later`"
        )


def replaced_under(rows: list[RunRow], table: str, dt: date) -> Replaced | None:
    """docs/operations.md#reruns-and-backfills: whether the state a run of ``dt`` starts
    ``table`` from descends from the published run of every date before it: the chain of
    the runs each state was built on (``prior_run``) holds each date's run published last,
    back to the oldest run the chain reaches. None: it does; else the first date whose
    published run it does not hold."""
    start = latest_published(rows, table, dt)
    if start is None:
        return None
    by_id = {r.run_id: r for r in rows}
    chain: set[str] = set()
    run: RunRow | None = start
    while run is not None and run.run_id not in chain:
        chain.add(run.run_id)
        before = prior_run(run, table)
        run = by_id.get(before) if before else None
    oldest = min(by_id[x].dt for x in chain)
    published = {d: r for d, r in published_dates(rows, table).items() if oldest <= d <= start.dt}
    stale = sorted(d for d, r in published.items() if r.run_id not in chain)
    if not stale:
        return None
    later = tuple(d for d in sorted(published) if d > stale[0])
    return Replaced(table, start, stale[0], published[stale[0]], later)


def later_dates(rows: list[RunRow], tables: Iterable[str], dt: date) -> list[date]:
    """The dates after ``dt`` published for any of ``tables``: each starts from the state
    of the one before, so that a run of ``dt`` changes what they were built on."""
    names = set(tables)
    return sorted({r.dt for r in rows if r.published and r.dt > dt and names & set(r.tables())})


def latest_date(rows: list[RunRow], table: str) -> date | None:
    """The newest date published for ``table``: its ``snapshot`` holds that date."""
    dates = [r.dt for r in rows if r.published and table in r.tables()]
    return max(dates) if dates else None


def append(lake: Lake, row: RunRow) -> int:
    """Append the run's row (the run's last commit), naming the version its commit makes;
    returns that version."""
    meta = {RUN_ID: row.run_id, DT: row.dt.isoformat(), "status": row.status}
    version = lake.next_version(layout.RUNS, meta)
    mine = replace(row, versions={**row.versions, layout.RUNS: version})
    return lake.write(layout.RUNS, mine.to_arrow(), meta, mode="append", version=version).version


def version_of(lake: Lake, run_id: str) -> int | None:
    """The version of the ``runs`` table whose commit appended ``run_id``'s row: among the
    newest commits (a run asks right after its publish), else in the whole history."""
    for limit in (20, None):
        for info in lake.history(layout.RUNS, limit):  # newest first
            meta = meta_of(info)
            if meta.get(RUN_ID) == run_id and "operation" not in meta:
                return int(info["version"])
    return None


def now() -> datetime:
    return datetime.now(UTC)
