"""A PostgreSQL schema as ``cdr init --from-postgres`` reads it from the catalog
(docs/configuration.md#starting-from-a-postgresql-schema-cdr-init): each table's columns
with their types, its unique indexes (the primary key's, the replica identity's, the
unique constraints'), its foreign keys and its ``REPLICA IDENTITY``.

Read in one read-only transaction (``SET TRANSACTION READ ONLY``): it changes nothing on
the server. ``pg_catalog`` rather than ``information_schema``: only the catalog knows
the replica identity, unique indexes that are no constraint, and which index is partial
or on an expression; and it shows every table to a role that may connect, not only the
ones it owns or may write.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import psycopg

from pipeline.core.errors import ConfigError


class ReplicaIdentity(StrEnum):
    """``pg_class.relreplident``: what an UPDATE's or DELETE's before image holds."""

    DEFAULT = "d"  # the primary key's columns
    FULL = "f"  # every column
    INDEX = "i"  # the columns of one unique index
    NOTHING = "n"  # nothing


@dataclass(frozen=True, slots=True)
class PgColumn:
    name: str
    #: ``format_type``'s text: ``numeric(10,2)``, ``character varying(80)``; a domain's
    #: base type
    pg_type: str
    not_null: bool
    #: the enum's name when the column is of an enum type ('' otherwise)
    enum: str = ""


@dataclass(frozen=True, slots=True)
class PgUniqueIndex:
    name: str
    #: its key columns in order (an expression has none: ``expressions`` says so)
    columns: tuple[str, ...]
    primary: bool
    replica_identity: bool
    partial: bool
    expressions: bool


@dataclass(frozen=True, slots=True)
class PgForeignKey:
    name: str
    columns: tuple[str, ...]
    ref_schema: str
    ref_table: str
    ref_columns: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PgTable:
    schema: str
    name: str
    replica_identity: ReplicaIdentity
    columns: tuple[PgColumn, ...]
    unique_indexes: tuple[PgUniqueIndex, ...]
    foreign_keys: tuple[PgForeignKey, ...]

    @property
    def primary_key(self) -> PgUniqueIndex | None:
        return next((i for i in self.unique_indexes if i.primary), None)

    @property
    def identity_index(self) -> PgUniqueIndex | None:
        """The ``REPLICA IDENTITY USING INDEX`` index, when that is the identity."""
        if self.replica_identity is not ReplicaIdentity.INDEX:
            return None
        return next((i for i in self.unique_indexes if i.replica_identity), None)


@dataclass(frozen=True, slots=True)
class PgSchema:
    """What was read, and from where (no password: the host, port and database)."""

    source: str
    server_version: str
    schema: str
    tables: tuple[PgTable, ...]


_TABLES = """
select c.oid, c.relname, c.relreplident
from pg_class c join pg_namespace n on n.oid = c.relnamespace
where n.nspname = %s and c.relkind in ('r', 'p') and not c.relispartition
order by c.relname
"""

_COLUMNS = """
select a.attname,
       case when t.typtype = 'd' then format_type(t.typbasetype, t.typtypmod)
            else format_type(a.atttypid, a.atttypmod) end,
       a.attnotnull,
       case when t.typtype = 'e' then format_type(a.atttypid, null) else '' end
from pg_attribute a join pg_type t on t.oid = a.atttypid
where a.attrelid = %s and a.attnum > 0 and not a.attisdropped
order by a.attnum
"""

_UNIQUE_INDEXES = """
select ic.relname,
       array(select a.attname
             from unnest((i.indkey::int2[])[0:i.indnkeyatts - 1]) with ordinality k(num, ord)
             join pg_attribute a on a.attrelid = i.indrelid and a.attnum = k.num
             order by k.ord),
       i.indisprimary, i.indisreplident, i.indpred is not null, i.indexprs is not null
from pg_index i join pg_class ic on ic.oid = i.indexrelid
where i.indrelid = %s and i.indisunique and i.indisvalid
order by not i.indisprimary, ic.relname
"""

_FOREIGN_KEYS = """
select con.conname,
       array(select a.attname from unnest(con.conkey) with ordinality k(num, ord)
             join pg_attribute a on a.attrelid = con.conrelid and a.attnum = k.num
             order by k.ord),
       rn.nspname, rc.relname,
       array(select a.attname from unnest(con.confkey) with ordinality k(num, ord)
             join pg_attribute a on a.attrelid = con.confrelid and a.attnum = k.num
             order by k.ord)
from pg_constraint con
join pg_class rc on rc.oid = con.confrelid
join pg_namespace rn on rn.oid = rc.relnamespace
where con.conrelid = %s and con.contype = 'f'
order by con.conname
"""


def read_schema(dsn: str, schema: str = "public", tables: Sequence[str] = ()) -> PgSchema:
    """The tables of ``schema`` (``tables`` only, when given; each must exist), read in a
    read-only transaction; raises :class:`ConfigError` when the server cannot be reached
    or a table named is not there."""
    try:
        with psycopg.connect(dsn, autocommit=False) as conn:
            conn.execute("set transaction read only")
            info = conn.info
            source = f"host={info.host} port={info.port} dbname={info.dbname}"
            version = str(conn.execute("show server_version").fetchone()[0])  # type: ignore[index]
            found = _tables(conn, schema)
            conn.rollback()
    except psycopg.Error as e:
        raise ConfigError("--from-postgres", [f"cannot read the schema: {e}".strip()]) from None
    by_name = {t.name: t for t in found}
    missing = [t for t in tables if t not in by_name]
    if missing:
        there = ", ".join(by_name) or "none"
        raise ConfigError(
            "--tables",
            [f"no table {t!r} in schema {schema!r} (its tables: {there})" for t in missing],
        )
    chosen = tuple(by_name[t] for t in dict.fromkeys(tables)) if tables else found
    return PgSchema(source, version, schema, chosen)


def _tables(conn: psycopg.Connection[Any], schema: str) -> tuple[PgTable, ...]:
    out = []
    for oid, name, ident in conn.execute(_TABLES, (schema,)).fetchall():
        columns = tuple(
            PgColumn(n, t, bool(nn), e) for n, t, nn, e in conn.execute(_COLUMNS, (oid,)).fetchall()
        )
        indexes = tuple(
            PgUniqueIndex(n, tuple(cols), pk, ri, partial, expr)
            for n, cols, pk, ri, partial, expr in conn.execute(_UNIQUE_INDEXES, (oid,))
        )
        fks = tuple(
            PgForeignKey(n, tuple(cols), rs, rt, tuple(rcols))
            for n, cols, rs, rt, rcols in conn.execute(_FOREIGN_KEYS, (oid,))
        )
        out.append(PgTable(schema, name, ReplicaIdentity(ident), columns, indexes, fks))
    return tuple(out)
