"""The column types' table (``pipeline.core.kinds``, docs/configuration.md#column-types):
one row per kind; the sets the code used to spell out are derived from it unchanged;
every layer's mapping of the kinds (a Spark type, Cassandra's bytes, a reader...) has an
entry for each, and :func:`every_kind` refuses one that lacks a kind; the table's data
agrees with what the layers do."""

from __future__ import annotations

import pytest

from pipeline.core import config
from pipeline.core.config import ColumnType
from pipeline.core.kinds import (
    INTEGER_KINDS,
    KINDS,
    NUMERIC_KINDS,
    ORDER_BY_KINDS,
    Kind,
    KindRow,
    every_kind,
    integer_bound,
    kinds_table,
)
from tests.helpers import REPO

K = Kind


def test_the_table_has_one_row_per_kind_in_the_kinds_order():
    assert list(KINDS) == list(Kind)
    assert all(isinstance(row, KindRow) for row in KINDS.values())


def test_the_derived_sets_are_the_ones_the_code_spelled_out():
    """The literals as they were written before the table."""
    assert frozenset({K.INT, K.BIGINT, K.DOUBLE, K.DECIMAL}) == NUMERIC_KINDS
    assert ORDER_BY_KINDS == (K.TIMESTAMP, K.BIGINT, K.INT, K.DECIMAL)
    assert frozenset({K.INT, K.BIGINT}) == INTEGER_KINDS


#: every mapping of the kinds a layer keeps, with the kinds it covers
LAYERS = {
    "config._FITS": (config._FITS, NUMERIC_KINDS),
    "config._COERCE": (config._COERCE, set(Kind)),
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


@pytest.mark.parametrize("k", sorted(INTEGER_KINDS))
def test_an_integer_type_has_the_bits_of_its_range(k: Kind):
    ct, bound = ColumnType(k), integer_bound(k)
    assert bound == {K.INT: 2**31, K.BIGINT: 2**63}[k]
    assert ct.fits(-bound) and ct.fits(bound - 1)
    assert not ct.fits(-bound - 1) and not ct.fits(bound)


@pytest.mark.parametrize("k", sorted(set(Kind) - NUMERIC_KINDS))
def test_only_a_numeric_type_has_a_range(k: Kind):
    with pytest.raises(TypeError, match="is not numeric"):
        ColumnType(k).fits(0)
    with pytest.raises(TypeError, match="is not an integer type"):
        integer_bound(k)


def test_the_configuration_page_shows_the_column_types():
    """Edit the table in ``pipeline/core/kinds.py``, then paste ``kinds_table()`` between
    the page's markers."""
    page = (REPO / "docs" / "configuration.md").read_text()
    shown = page.split("<!-- column-types:begin -->\n")[1].split("<!-- column-types:end -->")[0]
    assert shown == kinds_table()
