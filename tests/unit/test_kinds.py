"""The column types' table (``pipeline.core.kinds``, docs/configuration.md#column-types):
one row per kind; the sets the code used to spell out are derived from it unchanged;
every layer's mapping of the kinds (a Spark type, Cassandra's bytes, a reader...) has an
entry for each, and :func:`every_kind` refuses one that lacks a kind; the table's data
agrees with what the layers do."""

from __future__ import annotations

import random
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest

from pipeline.app import generate
from pipeline.changes import tokens
from pipeline.core import kinds
from pipeline.core.kinds import (
    INTEGER_KINDS,
    KINDS,
    NUMERIC_KINDS,
    ORDER_BY_KINDS,
    ColumnType,
    Kind,
    KindRow,
    every_kind,
    integer_bound,
    kinds_table,
)
from pipeline.ingest import blocks
from pipeline.ingest.adapters import debezium, wal2json
from pipeline.resolve.cells import order
from pipeline.rules import cellfold, readers
from pipeline.spark import schema
from tests.helpers import REPO
from tests.helpers.cassandra import DRIVER_TYPES, random_value

K = Kind


def test_the_table_has_one_row_per_kind_in_the_kinds_order():
    assert list(KINDS) == list(Kind)
    assert all(isinstance(row, KindRow) for row in KINDS.values())


def test_the_derived_sets_are_the_ones_the_code_spelled_out():
    """The literals as they were written before the table."""
    assert frozenset({K.INT, K.BIGINT, K.DOUBLE, K.DECIMAL}) == NUMERIC_KINDS
    assert ORDER_BY_KINDS == (K.TIMESTAMP, K.BIGINT, K.INT, K.DECIMAL)
    assert frozenset({K.INT, K.BIGINT}) == INTEGER_KINDS
    assert blocks._ARROW_KINDS == (K.INT, K.BIGINT, K.STRING, K.BOOLEAN, K.DOUBLE, K.DECIMAL)
    assert frozenset({K.INT, K.BIGINT}) == order._SIGNED
    assert frozenset({K.STRING, K.BOOLEAN, K.DATE, K.BINARY, K.UUID}) == order._AS_IS
    assert (readers._INT, readers._LONG) == (2**31, 2**63)


#: every mapping of the kinds a layer keeps, with the kinds it covers
LAYERS = {
    "kinds._FITS": (kinds._FITS, NUMERIC_KINDS),
    "kinds._COERCE": (kinds._COERCE, set(Kind)),
    "readers.READERS": (readers.READERS, set(Kind)),
    "cellfold._SERIALIZE": (cellfold._SERIALIZE, set(Kind)),
    "schema._SPARK_TYPES": (schema._SPARK_TYPES, set(Kind)),
    "schema._TYPED": (schema._TYPED, set(Kind)),
    "tokens._SERIALIZE": (tokens._SERIALIZE, set(Kind)),
    "order._ORDER": (order._ORDER, set(Kind)),
    "debezium._DBZ_DECODE": (debezium._DBZ_DECODE, set(Kind)),
    "debezium._UNAVAILABLE": (debezium._UNAVAILABLE, set(Kind)),
    "wal2json._PG_TEXT": (wal2json._PG_TEXT, set(Kind)),
    "generate._VALUES": (generate._VALUES, set(Kind)),
    "generate._KEY_VALUES": (generate._KEY_VALUES, set(Kind)),
    "generate._ORDER_VALUES": (generate._ORDER_VALUES, set(ORDER_BY_KINDS)),
}


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_every_layer_has_an_entry_for_every_kind(name: str):
    mapping, kinds = LAYERS[name]
    assert set(mapping) == set(kinds)
    assert all(isinstance(k, Kind) for k in mapping)
    assert all(f is None or callable(f) for f in mapping.values())


def test_the_helper_refuses_a_mapping_without_a_kind():
    lacking = {k: k.value for k in Kind if k is not K.UUID}
    with pytest.raises(ValueError, match=r"^the test's: no entry for uuid$"):
        every_kind("the test's", lacking)
    with pytest.raises(ValueError, match=r"^the test's: an entry for string, not a kind it"):
        every_kind("the test's", {K.INT: 1, K.STRING: 2}, (K.INT,))
    with pytest.raises(ValueError, match=r"^the test's: no entry for int, bigint; an entry for"):
        every_kind("the test's", {K.STRING: 1}, (K.INT, K.BIGINT))
    whole = every_kind("the test's", dict(reversed([(k, k.value) for k in Kind])))
    assert list(whole.items()) == [(k, k.value) for k in Kind]


def _type(k: Kind) -> ColumnType:
    return ColumnType(k, 12, 3) if k is K.DECIMAL else ColumnType(k)


@pytest.mark.parametrize("k", list(Kind))
def test_the_spark_type_is_the_one_the_table_names(k: Kind):
    assert schema.spark_type(_type(k)).simpleString() == KINDS[k].spark.replace("(p,s)", "(12,3)")


def test_the_cql_type_is_the_one_whose_driver_type_serializes_the_column():
    """``tests/unit/test_tokens.py`` checks the bytes against these driver types."""
    assert {k: DRIVER_TYPES[k.value].typename for k in Kind} == {
        k: row.cql for k, row in KINDS.items()
    }


@pytest.mark.parametrize("k", sorted(INTEGER_KINDS))
def test_an_integer_type_has_the_bits_of_its_range(k: Kind):
    ct, bound = ColumnType(k), integer_bound(k)
    assert bound == {K.INT: 2**31, K.BIGINT: 2**63}[k]
    assert len(cellfold.serialize(1, ct)) * 8 == KINDS[k].bits
    assert ct.fits(-bound) and ct.fits(bound - 1)
    assert not ct.fits(-bound - 1) and not ct.fits(bound)
    read = readers.reader(ct)
    assert read(str(bound - 1)) == bound - 1
    assert read(str(bound)) is None


@pytest.mark.parametrize("k", sorted(set(Kind) - NUMERIC_KINDS))
def test_only_a_numeric_type_has_a_range(k: Kind):
    with pytest.raises(TypeError, match="is not numeric"):
        ColumnType(k).fits(0)
    with pytest.raises(TypeError, match="is not an integer type"):
        integer_bound(k)


def _cell_value(k: Kind, rnd: random.Random):
    """A value as the fold holds it: a uuid as its lower-case text."""
    if k is K.TIMESTAMP:
        return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=rnd.randint(-9, 9))
    if k is K.DATE:
        return date(1970, 1, 1) + timedelta(days=rnd.randint(-9, 9))
    return random_value(k.value, rnd)


@pytest.mark.parametrize("k", list(Kind))
def test_a_kind_orders_as_is_when_its_values_order_as_their_bytes(k: Kind):
    """docs/rules.md#cell-rules, rule 4: the kinds marked ``orders_as_is`` compare as
    values exactly as their serialized bytes do; every other kind has two values that do
    not (so ``resolve.cells.order`` needs an order key for it)."""
    rnd, ct = random.Random(k.value), _type(k)
    values = [_cell_value(k, rnd) for _ in range(200)]
    if k is K.DECIMAL:
        values = [Decimal(v) for v in values]
    same = sorted(values) == sorted(values, key=lambda v: cellfold.serialize(v, ct))
    assert same is KINDS[k].orders_as_is


def test_the_configuration_page_shows_the_column_types():
    """Edit the table in ``pipeline/core/kinds.py``, then paste ``kinds_table()`` between
    the page's markers."""
    page = (REPO / "docs" / "configuration.md").read_text()
    shown = page.split("<!-- column-types:begin -->\n")[1].split("<!-- column-types:end -->")[0]
    assert shown == kinds_table()
