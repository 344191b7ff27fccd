"""``cdr init``'s file from a schema as the catalog gives it (``pipeline.app.init_config``;
the real server's test is tests/e2e/test_init_postgres.py): what it writes loads, and what
it cannot write is refused naming it."""

from __future__ import annotations

import pytest
import yaml

from pipeline.app.init_config import InitOptions, render
from pipeline.app.pg_schema import (
    PgColumn,
    PgForeignKey,
    PgSchema,
    PgTable,
    PgUniqueIndex,
    ReplicaIdentity,
)
from pipeline.core.config_load import parse_config
from pipeline.core.errors import ConfigError


def _pk(*cols: str) -> PgUniqueIndex:
    return PgUniqueIndex("pk", cols, True, False, False, False)


def _table(name: str, columns: dict[str, str], key: tuple[str, ...] = ("id",), **kw) -> PgTable:
    cols = tuple(PgColumn(n, t, n in key) for n, t in columns.items())
    indexes = (_pk(*key), *kw.pop("unique", ()))
    ident = kw.pop("ident", ReplicaIdentity.DEFAULT)
    return PgTable("public", name, ident, cols, indexes, tuple(kw.pop("fks", ())))


def _schema(*tables: PgTable) -> PgSchema:
    return PgSchema("host=h port=5432 dbname=d", "15", "public", tables)


def _loaded(text: str):
    return parse_config({**yaml.safe_load(text), "store": "file:///x"})


def test_a_partial_unique_index_is_a_comment_and_a_plain_one_is_kept():
    t = _table("t", {"id": "bigint", "a": "text", "b": "text"}, unique=(
        PgUniqueIndex("t_a", ("a",), False, False, False, False),
        PgUniqueIndex("t_b", ("b",), False, False, True, False),
    ))  # fmt: skip
    text = render(_schema(t), InitOptions())
    assert _loaded(text).tables["t"].unique == (("a",),)
    assert "unique index t_b is partial (WHERE ...): the config cannot say it" in text


def test_a_foreign_key_of_another_type_or_to_no_key_is_a_comment():
    parent = _table("p", {"id": "bigint", "code": "text"})
    child = _table("c", {"id": "bigint", "pid": "integer", "code": "text"}, fks=(
        PgForeignKey("c_pid", ("pid",), "public", "p", ("id",)),
        PgForeignKey("c_code", ("code",), "public", "p", ("code",)),
    ))  # fmt: skip
    text = render(_schema(parent, child), InitOptions())
    assert _loaded(text).tables["c"].foreign_keys == ()
    assert "c_pid (pid) -> public.p(id): the columns' types differ from the key's" in text
    assert "c_code (code) -> public.p(code): a foreign key here references its table's key" in text


def test_a_composite_foreign_key_follows_the_parents_key_order():
    parent = _table("p", {"a": "int", "b": "int"}, key=("a", "b"))
    child = _table("c", {"id": "int", "x": "int", "y": "int"}, fks=(
        PgForeignKey("c_p", ("y", "x"), "public", "p", ("b", "a")),
    ))  # fmt: skip
    fk = _loaded(render(_schema(parent, child), InitOptions())).tables["c"].foreign_keys[0]
    assert fk.columns == ("x", "y")


def test_replica_identity_nothing_says_so():
    t = _table("t", {"id": "int"}, ident=ReplicaIdentity.NOTHING)
    assert "UPDATEs and DELETEs cannot be published" in render(_schema(t), InitOptions())


@pytest.mark.parametrize(
    ("schema", "opts", "message"),
    [
        (_schema(_table("t", {"id": "int"})), InitOptions(replicas=("a b",)),
         "--replicas: 'a b' is no replica id"),
        (_schema(_table("my-t", {"id": "int"})), InitOptions(),
         "public.my-t: a table name is letters, digits and _"),
        (_schema(_table("t", {"id": "int[]"})), InitOptions(skip_unsupported=True),
         "public.t.id: a key column; 'int[]': no array type"),
        (_schema(), InitOptions(), "schema 'public' has no table"),
    ],
)  # fmt: skip
def test_what_cannot_be_written_is_refused(schema: PgSchema, opts: InitOptions, message: str):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        render(schema, opts)
