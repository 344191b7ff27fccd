"""A first ``cdr.yaml`` from a PostgreSQL schema (``cdr init --from-postgres``,
docs/configuration.md#starting-from-a-postgresql-schema-cdr-init): each table's key,
column types, ``not_null``, ``unique`` and ``foreign_keys`` as the database declares them,
and comments on what the database cannot tell (the replicas, the store) and on what its
``REPLICA IDENTITY`` allows.

The text is written, not dumped, so that it carries its comments; ``load_config`` reads
it as it is (given a store). What cannot be written is refused, every problem at once,
saying what to change: a table without a primary key or a replica identity index, a
column whose type the config cannot hold (unless ``skip_unsupported``: it is left out,
in a comment, and the table ignores it in the exports).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pipeline.app.pg_schema import PgColumn, PgSchema, PgTable, PgUniqueIndex, ReplicaIdentity
from pipeline.core.config_tables import name_problem, suggested_name
from pipeline.core.errors import ConfigError
from pipeline.core.kinds import NUMERIC_KINDS, ColumnType, parse_column_type

#: the replicas a file names when ``--replicas`` is not given
PLACEHOLDER_REPLICAS = ("replica1", "replica2")
_REPLICA_ID = re.compile(r"^[A-Za-z0-9_.-]+$")
_TABLE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
_PLAIN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: words YAML 1.1 (PyYAML) reads as booleans or null: a column so named is quoted
_YAML_WORDS = frozenset({"y", "yes", "n", "no", "true", "false", "on", "off", "null", "~"})


@dataclass(frozen=True, slots=True)
class InitOptions:
    replicas: tuple[str, ...] = ()
    store: str | None = None
    skip_unsupported: bool = False


@dataclass(frozen=True, slots=True)
class _Column:
    """A column as the file writes it: its published name and type, or why it is left out."""

    pg: PgColumn
    published: str
    ctype: ColumnType | None
    problem: str = ""


def render(schema: PgSchema, opts: InitOptions) -> str:
    """The ``cdr.yaml`` text for ``schema``'s tables; raises :class:`ConfigError` naming
    every table or column that cannot be written, and what to do."""
    problems = [p for r in opts.replicas if (p := _replica_problem(r))]
    columns = {t.name: _columns(t) for t in schema.tables}
    keys: dict[str, tuple[PgUniqueIndex, str]] = {}
    for t in schema.tables:
        problems += _table_problems(t, columns[t.name], opts.skip_unsupported)
        key = _key(t)
        if key is not None:
            keys[t.name] = key
    if not schema.tables:
        problems.append(f"schema {schema.schema!r} has no table: name another with --schema")
    if problems:
        raise ConfigError("--from-postgres", problems)
    lines = _header(schema, opts)
    for t in schema.tables:
        lines += _table(t, columns, keys, {x.name for x in schema.tables})
    return "\n".join(lines) + "\n"


def _replica_problem(rid: str) -> str | None:
    if _REPLICA_ID.match(rid):
        return None
    return f"--replicas: {rid!r} is no replica id (letters, digits, _ . -)"


def _columns(t: PgTable) -> list[_Column]:
    """Each column with its published name (docs/configuration.md#column-names) and type."""
    out: list[_Column] = []
    taken = {c.name.casefold() for c in t.columns}
    for c in t.columns:
        published = c.name if name_problem(c.name) is None else suggested_name(c.name, taken)
        taken.add(published.casefold())
        try:
            ctype = parse_column_type("text" if c.enum else c.pg_type)
        except ValueError as e:
            out.append(_Column(c, published, None, str(e)))
            continue
        out.append(_Column(c, published, ctype))
    return out


def _key(t: PgTable) -> tuple[PgUniqueIndex, str] | None:
    """The table's key: its primary key, else its replica identity index (what logical
    replication identifies a row by), with the comment that says which."""
    if (pk := t.primary_key) is not None:
        return pk, f"the primary key ({pk.name})"
    idx = t.identity_index
    if idx is not None and not idx.partial and not idx.expressions:
        return idx, f"no primary key: the REPLICA IDENTITY index {idx.name}"
    return None


def _table_problems(t: PgTable, columns: Sequence[_Column], skip: bool) -> list[str]:
    at = f"{t.schema}.{t.name}"
    out = []
    if not _TABLE_NAME.match(t.name):
        out.append(
            f"{at}: a table name is letters, digits and _, starting with a letter (it names "
            "the store's folders); leave it out with --tables"
        )
    key = _key(t)
    if key is None:
        out.append(
            f"{at} has no primary key, and no REPLICA IDENTITY USING INDEX: the pipeline "
            f"matches rows by key; give it one (ALTER TABLE {t.name} ADD PRIMARY KEY (...)), "
            "or leave it out with --tables"
        )
    key_cols = set(key[0].columns) if key else set()
    for c in columns:
        if c.ctype is None and (not skip or c.pg.name in key_cols):
            why = "a key column; " if c.pg.name in key_cols else ""
            hint = "" if why or skip else " (or --skip-unsupported leaves it out)"
            out.append(f"{at}.{c.pg.name}: {why}{c.problem}{hint}")
    return out


def _header(schema: PgSchema, opts: InitOptions) -> list[str]:
    lines = [
        "# cdr.yaml, written by `cdr init --from-postgres` from schema "
        f"{schema.schema} of {schema.source}",
        f"# (PostgreSQL {schema.server_version}). Read it through: docs/configuration.md.",
        "",
        "# store: where the replicas' exports are, and where the published tables go.",
    ]
    if opts.store:
        lines.append(f"store: {_scalar(opts.store)}")
    else:
        lines += [
            "# Give it here, or with --store to every command:",
            "# store: s3://BUCKET/PREFIX            # or file:///PATH",
        ]
    ids = opts.replicas or PLACEHOLDER_REPLICAS
    lines += [
        "",
        "# replicas: one per PostgreSQL primary, by the id its exports are filed under",
        "# (exports/replica=<id>/). system_id breaks ties between equal timestamps: each",
        "# replica needs its own (1..n here; the server's own is",
        "# `select system_identifier from pg_control_system()`).",
    ]
    if not opts.replicas:
        lines.append("# These are placeholders: name your replicas (cdr init --replicas a,b,c).")
    lines.append("replicas:")
    lines.append(
        "# source: where the replica's CDC tool writes, for `cdr manifest` (docs/sealing.md)."
    )
    for i, r in enumerate(ids, 1):
        lines += [
            f"  - id: {_scalar(r)}",
            f"    system_id: {i}",
            f"    # source: {{prefix: cdc/{r}, layout: debezium-s3-time}}",
        ]
    lines += ["", "tables:"]
    return lines


def _table(
    t: PgTable,
    columns: Mapping[str, Sequence[_Column]],
    keys: Mapping[str, tuple[PgUniqueIndex, str]],
    selected: set[str],
) -> list[str]:
    own = columns[t.name]
    published = {c.pg.name: c.published for c in own if c.ctype is not None}
    key, key_why = keys[t.name]
    lines = [f"  {t.name}:", *(f"    # {x}" for x in _identity_notes(t, key, own))]
    lines.append(f"    key: {_flow([published[c] for c in key.columns])}   # {key_why}")
    lines.append("    columns:")
    for c in own:
        lines.append(_column_line(c))
    not_null = [
        c.published for c in own if c.pg.not_null and c.ctype and c.pg.name not in key.columns
    ]
    if not_null:
        lines.append(f"    not_null: {_flow(not_null)}")
    lines += _uniques(t, key, published)
    lines += _foreign_keys(t, columns, keys, selected)
    if any(c.ctype is None for c in own):
        lines += [
            "    # the columns left out above are in the exports: ignore them there",
            "    resolvers: {source_column_extra: ignore}",
        ]
    lines.append("")
    return lines


def _column_line(c: _Column) -> str:
    source = f"{c.pg.pg_type}" + (f" (enum {c.pg.enum}: its label)" if c.pg.enum else "")
    if c.ctype is None:
        return f"      # {_scalar(c.pg.name)}: left out: {c.problem}"
    ctype = str(c.ctype)
    if c.published != c.pg.name:
        value = f"{{type: {ctype}, as: {c.published}}}"
        why = f"{source}; {c.pg.name!r} cannot name a published column as it is"
        return f"      {_scalar(c.pg.name)}: {value}   # {why}"
    return f"      {_scalar(c.pg.name)}: {ctype}" + ("" if source == ctype else f"   # {source}")


def _identity_notes(t: PgTable, key: PgUniqueIndex, columns: Sequence[_Column]) -> list[str]:
    """What the table's ``REPLICA IDENTITY`` puts in a change's before image, and so what
    ``delta`` columns and ``detection: before_image`` may do (docs/rules.md)."""
    ident = t.replica_identity
    numeric = [
        c.published
        for c in columns
        if c.ctype and c.ctype.kind in NUMERIC_KINDS and c.pg.name not in key.columns
    ]
    if ident is ReplicaIdentity.FULL:
        notes = [
            f"{t.schema}.{t.name}: REPLICA IDENTITY FULL: every UPDATE and DELETE carries the",
            "whole old row, so `delta` columns and `detection: before_image` may be used.",
        ]
        if numeric:
            notes.append(f"delta: {_flow(numeric)}   # the columns the application adds to")
        return notes
    held = {
        ReplicaIdentity.DEFAULT: "only the primary key",
        ReplicaIdentity.INDEX: "only its REPLICA IDENTITY index's columns",
        ReplicaIdentity.NOTHING: "nothing: UPDATEs and DELETEs cannot be published",
    }[ident]
    return [
        f"{t.schema}.{t.name}: REPLICA IDENTITY {ident.name}: a change's before image holds",
        f"{held}. `delta` columns and `detection: before_image` need the whole old row:",
        f"ALTER TABLE {_sql_name(t.schema)}.{_sql_name(t.name)} REPLICA IDENTITY FULL first.",
    ]


def _sql_name(name: str) -> str:
    """An identifier as SQL writes it: quoted unless lower case letters, digits and _."""
    return name if re.fullmatch(r"[a-z_][a-z0-9_]*", name) else '"' + name.replace('"', '""') + '"'


def _uniques(t: PgTable, key: PgUniqueIndex, published: Mapping[str, str]) -> list[str]:
    """The unique constraints and indexes but the key's; a partial or expression index
    cannot be said in the config: a comment."""
    kept: dict[tuple[str, ...], str] = {}
    notes = []
    for idx in t.unique_indexes:
        if idx.columns == key.columns and not (idx.partial or idx.expressions):
            continue
        if idx.partial or idx.expressions:
            what = "partial (WHERE ...)" if idx.partial else "on an expression"
            notes.append(f"    # unique index {idx.name} is {what}: the config cannot say it")
        elif any(c not in published for c in idx.columns):
            notes.append(f"    # unique index {idx.name}: a column of it is left out above")
        else:
            kept.setdefault(tuple(published[c] for c in idx.columns), idx.name)
    if not kept:
        return notes
    lines = ["    unique:"]
    lines += [f"      - {_flow(list(cols))}   # {name}" for cols, name in kept.items()]
    return lines + notes


def _foreign_keys(
    t: PgTable,
    columns: Mapping[str, Sequence[_Column]],
    keys: Mapping[str, tuple[PgUniqueIndex, str]],
    selected: set[str],
) -> list[str]:
    """A foreign key to another table written, in the order of its key; one to a table
    left out, or to columns that are not its key, or of another type: a comment."""
    kept, notes = [], []
    mine = {c.pg.name: c for c in columns[t.name]}
    for fk in t.foreign_keys:
        target = f"{fk.ref_schema}.{fk.ref_table}({', '.join(fk.ref_columns)})"
        head = f"    # foreign key {fk.name} ({', '.join(fk.columns)}) -> {target}"
        if fk.ref_schema != t.schema or fk.ref_table not in selected:
            notes.append(f"{head}: that table is not in this file (add it with --tables)")
            continue
        parent_key = keys[fk.ref_table][0].columns
        if set(fk.ref_columns) != set(parent_key):
            notes.append(f"{head}: a foreign key here references its table's key")
            continue
        by_ref = dict(zip(fk.ref_columns, fk.columns, strict=True))
        cols = [by_ref[pk] for pk in parent_key]
        parent = {c.pg.name: c for c in columns[fk.ref_table]}
        if any(mine[c].ctype is None for c in cols):
            notes.append(f"{head}: a column of it is left out above")
            continue
        if any(mine[c].ctype != parent[p].ctype for c, p in zip(cols, parent_key, strict=True)):
            notes.append(f"{head}: the columns' types differ from the key's")
            continue
        names = [mine[c].published for c in cols]
        kept.append(
            f"      - {{columns: {_flow(names)}, references: {fk.ref_table}}}   # {fk.name}"
        )
    return (["    foreign_keys:", *kept] if kept else []) + notes


def _flow(items: Sequence[str]) -> str:
    return "[" + ", ".join(_scalar(x) for x in items) + "]"


def _scalar(text: str) -> str:
    """``text`` as a YAML scalar: plain when YAML reads it back as that string, else quoted."""
    if _PLAIN.match(text) and text.lower() not in _YAML_WORDS:
        return text
    if re.fullmatch(r"(s3|file)://[^\s,\[\]{}#'\"]+", text):
        return text
    return json.dumps(text)
