"""PostgreSQL's type names in ``cdr.yaml`` (docs/configuration.md#postgresql-type-names):
each name of ``PG_NAMES`` is read as its kind, whatever its case and blanks; the types
the config cannot hold are refused saying what to use; the docs' table is rendered from
the data; a ``numeric(10,2)`` that a YAML flow mapping split at its comma is put back
together."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.core import kinds
from pipeline.core.config_load import load_config
from pipeline.core.errors import ConfigError
from pipeline.core.kinds import PG_NAMES, ColumnType, Kind, parse_column_type, pg_names_table
from tests.helpers import REPO

K = Kind

READ = {
    "text": ColumnType(K.STRING),
    "VARCHAR(80)": ColumnType(K.STRING),
    "character varying (80)": ColumnType(K.STRING),
    "char(3)": ColumnType(K.STRING),
    "bpchar": ColumnType(K.STRING),
    "citext": ColumnType(K.STRING),
    "jsonb": ColumnType(K.STRING),
    "int4": ColumnType(K.INT),
    "Integer": ColumnType(K.INT),
    "smallserial": ColumnType(K.INT),
    "int8": ColumnType(K.BIGINT),
    "bigserial": ColumnType(K.BIGINT),
    "numeric(10,2)": ColumnType(K.DECIMAL, 10, 2),
    "numeric( 12 , 2 )": ColumnType(K.DECIMAL, 12, 2),
    "NUMERIC(12)": ColumnType(K.DECIMAL, 12, 0),
    "decimal(38,0)": ColumnType(K.DECIMAL, 38, 0),
    "real": ColumnType(K.DOUBLE),
    "double  precision": ColumnType(K.DOUBLE),
    "float(53)": ColumnType(K.DOUBLE),
    "bool": ColumnType(K.BOOLEAN),
    "timestamptz": ColumnType(K.TIMESTAMP),
    "timestamp(3) with time zone": ColumnType(K.TIMESTAMP),
    "timestamp without time zone": ColumnType(K.TIMESTAMP),
    "timestamp(6)": ColumnType(K.TIMESTAMP),
    "bytea": ColumnType(K.BINARY),
    "uuid": ColumnType(K.UUID),
}


@pytest.mark.parametrize("text", sorted(READ))
def test_a_postgresql_name_is_read_as_its_kind(text: str):
    assert parse_column_type(text) == READ[text]


@pytest.mark.parametrize("name", sorted(n for n, pg in PG_NAMES.items() if pg.kind))
def test_every_accepted_name_of_the_table_is_read_as_its_kind(name: str):
    pg = PG_NAMES[name]
    text = f"{name}(10,2)" if pg.modifier == "p,s" else name
    assert parse_column_type(text).kind is pg.kind
    assert parse_column_type(text.upper()).kind is pg.kind


def test_a_loaded_type_is_named_canonically():
    assert [str(parse_column_type(t)) for t in ("text", "int8", "numeric(10, 2)", "jsonb")] == [
        "string",
        "bigint",
        "decimal(10,2)",
        "string",
    ]


REFUSED = {
    "numeric": "no precision.*write numeric\\(p,s\\)",
    "decimal": "decimal needs a precision and scale",
    "numeric(40,2)": "precision must be 1..38",
    "numeric(4,5)": "scale <= precision",
    "numeric(1,2,3)": "write numeric\\(p,s\\) or numeric\\(p\\)",
    "int[]": "no array type.*declare `string`",
    "integer array": "no array type",
    "_int4": "no array type",
    "money": "lc_monetary.*decimal\\(p,2\\)",
    "interval": "no interval type",
    "time with time zone": "no time-of-day type.*`string`",
    "tstzrange": "no range type",
    "varchar(x)": "write varchar\\(n\\)",
    "text(3)": "write text$",
    "integr": "unknown type 'integr'; allowed: int, .*postgresql-type-names",
}


@pytest.mark.parametrize("text", sorted(REFUSED))
def test_a_type_the_config_cannot_hold_is_refused_saying_what_to_use(text: str):
    with pytest.raises(ValueError, match=REFUSED[text]):
        parse_column_type(text)


@pytest.mark.parametrize("name", sorted(n for n, pg in PG_NAMES.items() if pg.kind is None))
def test_every_refused_name_of_the_table_says_what_to_use(name: str):
    with pytest.raises(ValueError, match=r"declare|export"):
        parse_column_type(name)


def test_the_configuration_page_shows_the_postgresql_names():
    """Edit ``PG_NAMES`` in ``pipeline/core/kinds.py``, then paste ``pg_names_table()``
    between the page's markers."""
    page = (REPO / "docs" / "configuration.md").read_text()
    shown = page.split("<!-- pg-names:begin -->\n")[1].split("<!-- pg-names:end -->")[0]
    assert shown == pg_names_table()


def test_the_page_table_names_every_name():
    table = pg_names_table()
    assert all(kinds._pg_shown(name, pg) in table for name, pg in PG_NAMES.items())


CONFIG = """\
store: file:///cdr-store
replicas: [{id: a, system_id: 1}, {id: b, system_id: 2}]
tables:
  orders:
    key: [id]
    columns: {id: int8, price: numeric(10,2), tax: numeric(10, 2), name: text, n: integer}
  items:
    key: [id]
    columns:
      id: bigserial
      "Unit Price": {type: numeric(12,4), as: unit_price}
"""


def test_a_flow_mapping_as_a_user_writes_it_loads(tmp_path: Path):
    path = tmp_path / "cdr.yaml"
    path.write_text(CONFIG)
    config = load_config(path)
    orders = {c.name: str(c.type) for c in config.tables["orders"].columns}
    assert orders == {
        "id": "bigint",
        "price": "decimal(10,2)",
        "tax": "decimal(10,2)",
        "name": "string",
        "n": "int",
    }
    items = {c.name: str(c.type) for c in config.tables["items"].columns}
    assert items == {"id": "bigint", "unit_price": "decimal(12,4)"}


def test_a_split_that_is_no_type_is_left_as_yaml_read_it(tmp_path: Path):
    """A key ``2)`` after a value that is no ``name(digits`` is not a type's tail: it stays
    a column of its own, and the config says it has no type."""
    path = tmp_path / "cdr.yaml"
    path.write_text(CONFIG.replace("numeric(10, 2)", "numeric10, 2)"))
    with pytest.raises(ConfigError, match=r"tables\.orders\.columns\.2\)"):
        load_config(path)
