"""``cdr repair`` (docs/operations.md#repair): the statements that bring one replica's rows
to the converged state of a published date, written to a file, printed, or applied.

The rows come from the date's published divergence (at the version the date's ``runs`` row
names): for a table the replica exported a full copy of, the snapshot comparison's rows
(what it holds); else its perspective's (what it should hold after the night's events).
A converged row that is a foreign-key orphan is left out (its parent is not live: no
database with the constraint takes it). ``pipeline.rules.repairs`` orders the writes,
``pipeline.app.statements`` renders them."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime
from typing import Any, cast

import pyarrow as pa

from pipeline.app import statements
from pipeline.app.statements import CHANGED, Script, cql_literal
from pipeline.core import layout
from pipeline.core.columns import EVIDENCE, KEY, REPLICA
from pipeline.core.config import Config, Table
from pipeline.core.errors import RepairError, StageError
from pipeline.rules.causes import REPLICA_LACKS
from pipeline.rules.repairs import RowRepair, Write, plan, row_repair, same, typed_row
from pipeline.storage.lake import Lake
from pipeline.storage.runs_table import RunRow, published_by_date, read_runs

#: why a row is left out of the repair
ORPHAN = "its converged row is a foreign-key orphan (its parent is not live)"
#: why a row is left out that differs in none but columns the replica's table lacks
SCHEMA = (
    "it differs in none but columns the replica's table lacks ({}): add them, then repair again"
)
#: why a row is left out of a PostgreSQL repair that holds a NUL in a text value
NUL = (
    "a text value holds a NUL character (U+0000), which PostgreSQL text cannot hold: "
    "repair this row by hand"
)
#: why a CQL row is skipped: a write after the report holds it
SHADOWED = "a later write holds it (its timestamp is after the converged _ts)"


@dataclass(frozen=True)
class Repair:
    """One replica's repair of one date: its rows (numbered), those left out and why, the
    statements, and, once applied (or dry-run against the database), the rows skipped
    because they changed since the report."""

    replica: str
    dt: date
    dialect: str
    sources: Mapping[str, str]  # table -> "snapshot" or "perspective"
    rows: tuple[RowRepair, ...]
    left_out: tuple[tuple[RowRepair, str], ...]
    text: str  # the file: the statements with a header
    statements: tuple[str, ...]  # each statement (PostgreSQL: each step's DO block)
    script: Script | None = None  # PostgreSQL: the script the text is
    applied: bool = False
    skipped: Mapping[int, str] = field(default_factory=dict)

    def name(self, config: Config, r: RowRepair) -> str:
        return f"{r.table} {r.label or repr(r.key)}"

    def to_dict(self, config: Config) -> dict[str, Any]:
        by_number = {r.number: r for r in self.rows}
        return {
            "replica": self.replica,
            "dt": self.dt.isoformat(),
            "dialect": self.dialect,
            "sources": dict(self.sources),
            "rows": len(self.rows),
            "statements": len(self.statements),
            "applied": self.applied,
            "left_out": [{"row": self.name(config, r), "why": w} for r, w in self.left_out],
            "skipped": [
                {"row": self.name(config, by_number[n]), "why": w}
                for n, w in sorted(self.skipped.items())
            ],
        }


def repair(
    config: Config,
    lake: Lake,
    dt: date,
    replica: str,
    dialect: str,
    keyspace: str | None = None,
    tables: Sequence[str] = (),
) -> Repair:
    """The repair of ``replica`` for ``dt`` in ``dialect`` (``postgres`` or ``cql``), of
    ``tables`` (all: none given), not applied."""

    if replica not in config.replica_ids:
        known = ", ".join(config.replica_ids)
        raise StageError(f"--replica {replica!r} is not a replica of the config ({known})")
    if dialect == "cql" and not keyspace:
        raise StageError("--dialect cql needs --keyspace (the replicas' keyspace)")
    run = published_by_date(read_runs(lake)).get(dt)
    if run is None:
        raise StageError(f"no run is published for {dt}: repair follows a published date")
    rows, left_out, sources = _rows(config, lake, run, replica, tables or tuple(config.tables))
    if dialect == "postgres":  # text there cannot hold a NUL
        left_out += [(r, NUL) for r in rows if _holds_nul(r)]
        rows = [r for r in rows if not _holds_nul(r)]
    header = (
        f"cdr repair of replica {replica} for {dt} (run {run.run_id}): {len(rows)} row(s), "
        + ", ".join(f"{t} from its {s}" for t, s in sources.items())
    )
    if dialect == "cql":
        assert keyspace is not None
        steps = tuple(statements.cql(config, rows, keyspace))
        text = "".join(f"-- {h}\n" for h in header.splitlines()) + "".join(f"{s}\n" for s in steps)
        script = None
    else:
        script = statements.postgres(config, plan(config, rows), header)
        text, steps = script.text(), script.steps
    return Repair(replica, dt, dialect, sources, tuple(rows), tuple(left_out), text, steps, script)


def _rows(
    config: Config, lake: Lake, run: RunRow, replica: str, tables: Sequence[str]
) -> tuple[list[RowRepair], list[tuple[RowRepair, str]], dict[str, str]]:
    """The replica's divergent rows of the date, numbered in config order then by key;
    those left out (orphans) apart; the source each table's rows came from."""
    rows: list[RowRepair] = []
    left_out: list[tuple[RowRepair, str]] = []
    sources: dict[str, str] = {}
    for name in config.tables:
        if name not in tables:
            continue
        table = config.tables[name]
        found = _read(lake, run, name, "divergence")
        if found is None:
            continue
        compared = replica in (run.tables().get(name, {}).get("snapshot_divergent_keys") or {})
        source = "snapshot" if compared else "perspective"
        sources[name] = source
        mine = [  # a row of a release before snapshots has no source: a perspective's
            r for r in found.to_pylist()
            if r[REPLICA] == replica and (r.get("source") or "perspective") == source
        ]  # fmt: skip
        lacked = sorted({c for r in mine for c in _evidence(r).get(REPLICA_LACKS, ())})
        orphans = _orphans(lake, run, table)
        for r in sorted(mine, key=lambda r: r[KEY]):
            row = row_repair(table, r, len(rows) + len(left_out) + 1, lacked)
            if row.want is not None and row.key in orphans:
                left_out.append((row, ORPHAN))
            elif row.write is Write.UPDATE and not row.changed():
                left_out.append((row, SCHEMA.format(", ".join(lacked))))
            else:
                rows.append(row)
    unknown = sorted(set(tables) - set(config.tables))
    if unknown:
        raise StageError(f"--table {', '.join(unknown)}: not a table of the config")
    return rows, left_out, sources


def _holds_nul(row: RowRepair) -> bool:
    values = [*row.key, *(row.seen or {}).values(), *(row.want or {}).values()]
    return any(isinstance(v, str) and "\x00" in v for v in values)


def _evidence(row: Mapping[str, Any]) -> dict[str, Any]:
    text = row.get(EVIDENCE)
    return json.loads(text) if text else {}


def _read(lake: Lake, run: RunRow, table: str, kind: str) -> pa.Table | None:
    """A dated table's partition of the run's date, at the version the run committed."""
    path = layout.table_path(table, kind)
    version = run.versions.get(path)
    if version is None:
        return None
    return lake.read(path, version=version, dt=run.dt)


def _orphans(lake: Lake, run: RunRow, table: Table) -> set[tuple[Any, ...]]:
    if not table.foreign_keys:
        return set()
    found = _read(lake, run, table.name, "orphans")
    keys = set()
    for r in found.to_pylist() if found is not None else ():
        key = typed_row(table, r[KEY]) or {}
        keys.add(tuple(key.get(c) for c in table.key))
    return keys


# ------------------------------------------------------------------------- applying


def apply_postgres(result: Repair, config: Config, dsn: str, dry_run: bool) -> Repair:
    """The repair run on the database (``dsn``: libpq's), in one transaction, committed or
    (``dry_run``) rolled back; returns it with the rows skipped and why."""

    import psycopg

    assert result.script is not None
    text = replace(result.script, tail=statements.tail(commit=not dry_run)).text()
    notices: list[str] = []
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
            conn.execute(cast(Any, text))
    except psycopg.Error as e:
        why = e.diag.message_primary if e.diag and e.diag.message_primary else str(e)
        raise RepairError(f"PostgreSQL refused the repair: {why}; nothing was applied") from None
    skipped = statements.skipped_rows(notices)
    return replace(result, applied=not dry_run, skipped=skipped)


def apply_cql(result: Repair, config: Config, hosts: str, keyspace: str, dry_run: bool) -> Repair:
    """The repair's statements run on the cluster (``hosts``: ``host[:port],...``), then
    every row read back: one that does not hold the converged row (a later write's
    timestamp won) is skipped. With ``dry_run`` nothing is written, and the rows that no
    longer hold what the report saw are named."""

    from cassandra.cluster import Cluster

    points = [h.rsplit(":", 1) for h in hosts.split(",") if h]
    port = int(points[0][1]) if len(points[0]) == 2 else 9042
    cluster = Cluster([p[0] for p in points], port=port)
    try:
        session = cluster.connect()
        if not dry_run:
            for statement in result.statements:
                session.execute(statement)
        skipped = {}
        for r in result.rows:
            held = _cql_row(session, config.tables[r.table], keyspace, r.key)
            target = r.seen if dry_run else r.want
            if not _rows_equal(config.tables[r.table], held, target):
                skipped[r.number] = CHANGED if dry_run else SHADOWED
    finally:
        cluster.shutdown()
    return replace(result, applied=not dry_run, skipped=skipped)


def _cql_row(session: Any, table: Table, keyspace: str, key: tuple[Any, ...]) -> dict | None:
    from cassandra.metadata import protect_name

    cols = ", ".join(protect_name(c) for c in table.column_names)
    where = " AND ".join(
        f"{protect_name(c)} = {cql_literal(v)}" for c, v in zip(table.key, key, strict=True)
    )
    t = f"{protect_name(keyspace)}.{protect_name(table.name)}"
    got = session.execute(f"SELECT {cols} FROM {t} WHERE {where}").one()
    return None if got is None else dict(zip(table.column_names, got, strict=True))


def _rows_equal(
    table: Table, held: Mapping[str, Any] | None, want: Mapping[str, Any] | None
) -> bool:
    if held is None or want is None:
        return held is None and want is None
    value = _driver_value
    return all(same(value(held.get(c)), value(want.get(c))) for c in table.column_names)


def _driver_value(v: Any) -> Any:
    """A value as the repair compares it: the driver's date as a date, a timestamp at the
    millisecond a Cassandra timestamp holds, naive UTC."""

    if hasattr(v, "date") and type(v).__name__ == "Date":
        return v.date()
    if isinstance(v, datetime):
        if v.tzinfo is not None:
            v = v.astimezone(UTC).replace(tzinfo=None)
        return v.replace(microsecond=v.microsecond // 1000 * 1000)
    return v


def describe(result: Repair, config: Config) -> str:
    """What ``cdr repair`` prints: the counts, then every row left out or skipped."""
    verb = "applied" if result.applied else "written"
    lines = [
        f"repair of {result.replica} for {result.dt} ({result.dialect}): {len(result.rows)} "
        f"row(s) in {len(result.statements)} statement(s) {verb}; "
        f"{len(result.skipped)} skipped, {len(result.left_out)} left out"
    ]
    by_number = {r.number: r for r in result.rows}
    for n, why in sorted(result.skipped.items()):
        lines.append(f"  skipped {result.name(config, by_number[n])}: {why}")
    for r, why in result.left_out:
        lines.append(f"  left out {result.name(config, r)}: {why}")
    return "\n".join(lines)
