"""docs/operations.md#repair: a replica's repair (``pipeline.rules.repairs``) as statements
of its database, every literal and identifier rendered by the driver's own quoting
(psycopg's ``sql`` module, the cassandra-driver's encoder), never by concatenating values.

**PostgreSQL.** One transaction, in a session whose replication origin is ``cdr_repair``
(``pg_replication_origin_session_setup``; the origin created if missing; superuser or a
grant of those functions), so that its changes carry that origin in the WAL: a PostgreSQL 16
subscription with ``origin = none`` does not carry them to the other replicas, and the
wal2json adapter reads them as repairs. Each step is a ``DO`` block: its statement,
conditioned on the row (``IS NOT DISTINCT FROM`` the values the report saw, ``ON CONFLICT
(key) DO NOTHING`` for an insert); when it changes no row, or a constraint or the
column's type refuses it, a ``NOTICE`` names the row as skipped and the transaction goes
on (the block's own savepoint undoes the step). ``cdr repair --apply`` runs the same
script and reads the notices.

**CQL.** ``INSERT``/``UPDATE ... USING TIMESTAMP`` and ``DELETE ... USING TIMESTAMP`` with
the converged ``_ts``: a cell written after the report has a later timestamp and keeps its
value (Cassandra's own condition: the later write wins)."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from pipeline.core.config import Config, Table
from pipeline.core.policy import REPAIR_ORIGIN
from pipeline.rules.repairs import RowRepair, Step, Write

#: the notice a skipped step raises: the row's number, then why
SKIPPED = "cdr_repair row {}: skipped: {}"
CHANGED = "it changed since the report"


@dataclass(frozen=True)
class Script:
    """A repair as text: what comes before the steps, the steps, and the end (``COMMIT``,
    or ``ROLLBACK`` for a dry run)."""

    head: str
    steps: tuple[str, ...]
    tail: str

    def text(self) -> str:
        return self.head + "".join(self.steps) + self.tail


# ----------------------------------------------------------------------- PostgreSQL


def postgres(config: Config, steps: Sequence[Step], header: str, commit: bool = True) -> Script:
    """The PostgreSQL script of ``steps`` (module docstring); ``header``: its first
    comment lines' text (no value of a row in it)."""
    from psycopg import sql

    origin = sql.Literal(REPAIR_ORIGIN).as_string(None)
    head = (
        "".join(f"-- {line}\n" for line in header.splitlines())
        + "-- run it with: psql -v ON_ERROR_STOP=1 -f FILE (skipped rows come as NOTICEs)\n"
        "BEGIN;\n"
        "SET LOCAL TIME ZONE 'UTC';\n"
        f"SELECT pg_replication_origin_create({origin}) WHERE NOT EXISTS "
        f"(SELECT FROM pg_replication_origin WHERE roname = {origin});\n"
        f"SELECT pg_replication_origin_session_setup({origin});\n"
        "SELECT pg_replication_origin_xact_setup(pg_current_wal_lsn(), now());\n"
    )
    blocks = tuple(_do_block(_pg_statement(config.tables[s.row.table], s), s.row) for s in steps)
    return Script(head, blocks, tail(commit))


def tail(commit: bool) -> str:
    """A script's end: its transaction committed, or rolled back (a dry run)."""
    end = "COMMIT;\n" if commit else "ROLLBACK;\n"
    return end + "SELECT pg_replication_origin_session_reset();\n"


def _pg_statement(table: Table, step: Step) -> str:
    from psycopg import sql

    t = sql.Identifier(table.name)
    lit = sql.Literal

    def name(c: str) -> Any:  # the replica's column (docs/configuration.md#column-names)
        return sql.Identifier(table.exported(c))

    if step.write is Write.INSERT:
        cols = list(step.values)
        query = sql.SQL("INSERT INTO {} ({}) VALUES ({}) ON CONFLICT ({}) DO NOTHING").format(
            t,
            sql.SQL(", ").join(map(name, cols)),
            sql.SQL(", ").join(lit(step.values[c]) for c in cols),
            sql.SQL(", ").join(map(name, table.key)),
        )
        return query.as_string(None)
    assert step.expect is not None
    where = sql.SQL(" AND ").join(
        sql.SQL("{} = {}" if c in table.key else "{} IS NOT DISTINCT FROM {}").format(
            name(c), lit(step.expect[c])
        )
        for c in table.column_names
        if c in step.expect  # a column the replica's table lacks is in no step
    )
    if step.write is Write.DELETE:
        return sql.SQL("DELETE FROM {} WHERE {}").format(t, where).as_string(None)
    sets = sql.SQL(", ").join(
        sql.SQL("{} = {}").format(name(c), lit(v)) for c, v in step.values.items()
    )
    return sql.SQL("UPDATE {} SET {} WHERE {}").format(t, sets, where).as_string(None)


def _do_block(statement: str, row: RowRepair) -> str:
    """The statement in a ``DO`` block that names the row when the statement changes no
    row or a constraint refuses it. The block's dollar quote is a tag the statement does
    not hold."""
    n, notice = row.number, SKIPPED.format("%", "%")
    body = (
        "#variable_conflict use_column\nBEGIN\n"
        f"  {statement};\n"
        f"  IF NOT FOUND THEN RAISE NOTICE '{notice}', {n}, '{CHANGED}'; END IF;\n"
        "EXCEPTION WHEN integrity_constraint_violation OR data_exception THEN\n"
        f"  RAISE NOTICE '{notice}', {n}, SQLERRM;\n"
        "END\n"
    )
    tag = _dollar_tag(body)
    return f"DO {tag}\n{body}{tag};\n"


def _dollar_tag(body: str) -> str:
    """A dollar-quote tag that ``body`` does not hold (derived from it: the same script
    twice is the same text)."""
    seed = hashlib.sha256(body.encode()).hexdigest()
    for i in range(0, len(seed) - 8):
        tag = f"$cdr{seed[i : i + 8]}$"
        if tag not in body:
            return tag
    n = 0
    while f"$cdr{n}x$" in body:
        n += 1
    return f"$cdr{n}x$"


def skipped_rows(notices: Sequence[str]) -> dict[int, str]:
    """The rows the script's notices name as skipped, with why (the first reason of each)."""
    head, _, _ = SKIPPED.partition("{}")
    out: dict[int, str] = {}
    for text in notices:
        if not text.startswith(head):
            continue
        number, _, why = text[len(head) :].partition(": skipped: ")
        if number.isdigit():
            out.setdefault(int(number), why)
    return out


# ---------------------------------------------------------------------------- CQL


def cql(config: Config, rows: Sequence[RowRepair], keyspace: str) -> list[str]:
    """The CQL statements of ``rows``: each writes the converged row, or deletes the key,
    at the converged ``_ts`` (Cassandra has no foreign keys or unique constraints: the
    rows go in their order)."""
    return [_cql_statement(config.tables[r.table], r, keyspace) for r in rows if _cql_writes(r)]


def _cql_writes(r: RowRepair) -> bool:
    return r.write is not Write.UPDATE or bool(r.changed())


def _cql_statement(table: Table, r: RowRepair, keyspace: str) -> str:
    from cassandra.metadata import protect_name

    t = f"{protect_name(keyspace)}.{protect_name(table.name)}"

    def name(c: str) -> str:  # the replica's column (docs/configuration.md#column-names)
        return str(protect_name(table.exported(c)))

    key = dict(zip(table.key, r.key, strict=True))
    where = " AND ".join(f"{name(c)} = {cql_literal(v)}" for c, v in key.items())
    ts = int(r.ts)
    if r.write is Write.DELETE:
        return f"DELETE FROM {t} USING TIMESTAMP {ts} WHERE {where};"
    assert r.want is not None
    if r.write is Write.INSERT:
        cols = list(r.want)
        names = ", ".join(name(c) for c in cols)
        values = ", ".join(cql_literal(r.want[c]) for c in cols)
        return f"INSERT INTO {t} ({names}) VALUES ({values}) USING TIMESTAMP {ts};"
    sets = ", ".join(f"{name(c)} = {cql_literal(r.want[c])}" for c in r.changed())
    return f"UPDATE {t} USING TIMESTAMP {ts} SET {sets} WHERE {where};"


def cql_literal(v: Any) -> str:
    """A value as a CQL literal, by the cassandra-driver's encoder; a decimal keeps every
    digit (the encoder's goes through a float)."""
    if isinstance(v, Decimal):
        return format(v, "f")
    return str(_encoder().cql_encode_all_types(v))


@functools.cache
def _encoder() -> Any:
    from cassandra.encoder import Encoder

    return Encoder()


#: the dialects ``cdr repair --dialect`` writes
DIALECTS = ("postgres", "cql")
