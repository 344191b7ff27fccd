"""The cell rules of docs/rules.md#cell-rules (``pipeline.rules.cellfold``), without Spark.

- one test per rule of the reconciliation order, each in both argument orders (the
  comparator must be antisymmetric);
- the serialization that decides rule 4, against byte strings written out by hand from
  the Cassandra native protocol;
- hypothesis: merging writes is commutative, associative and idempotent, and the
  canonical fold (which also writes the conflict log) ends in the state that merging
  every write in any order gives;
- TTL, the row marker, tombstones and their purge after gc_grace_seconds.
"""

from __future__ import annotations

import random
from datetime import UTC, date, datetime
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.config_load import parse_config
from pipeline.core.kinds import ColumnType, Kind
from pipeline.rules.cellfold import (
    RULES,
    SHADOWED,
    TIE,
    Cell,
    CellEvent,
    CellFold,
    CellRow,
    Tombstone,
    cell_order,
    merge_all,
    merge_rows,
    purge,
    read_row,
    serialize,
    shadow,
)
from tests.helpers import configs
from tests.helpers.fold_helpers import NOW

TEXT = ColumnType(Kind.STRING)
INT = ColumnType(Kind.INT)
T = 1_795_255_200_000_000  # 2026-11-21T10:00:00Z
NOW_S = NOW // 1_000_000


def _both_orders(winner: Cell, loser: Cell, ct: ColumnType | None, rule: str) -> None:
    assert cell_order(winner, loser, ct) == (1, rule)
    assert cell_order(loser, winner, ct) == (-1, rule)


def test_rule1_higher_ts_wins_whatever_else():
    _both_orders(Cell(T + 1, "a"), Cell(T, "z", ttl=10, expiry=NOW_S + 99), TEXT, RULES.ts)
    _both_orders(Cell(T + 1, "a"), Cell(T, dead=True, deleted_at=NOW), TEXT, RULES.ts)


def test_rule2_dead_beats_live_at_equal_ts():
    _both_orders(Cell(T, dead=True, deleted_at=NOW), Cell(T, "zzz"), TEXT, RULES.dead)


def test_rule2_an_expired_cell_still_compares_as_live():
    expired = Cell(T, "zzz", ttl=1, expiry=T // 1_000_000 + 1)
    assert expired.expired(NOW_S)
    _both_orders(Cell(T, dead=True, deleted_at=NOW), expired, TEXT, RULES.dead)


def test_rule2_later_deletion_time_between_dead_cells():
    _both_orders(
        Cell(T, dead=True, deleted_at=NOW),
        Cell(T, dead=True, deleted_at=NOW - 1),
        TEXT,
        RULES.deletion,
    )


def test_rule3_expiring_beats_non_expiring():
    _both_orders(Cell(T, "aaa", ttl=60, expiry=NOW_S + 60), Cell(T, "zzz"), TEXT, RULES.expiring)


def test_rule3_later_expiry_wins():
    _both_orders(
        Cell(T, "aaa", ttl=60, expiry=NOW_S + 61),
        Cell(T, "zzz", ttl=60, expiry=NOW_S + 60),
        TEXT,
        RULES.expiry,
    )


def test_rule3_equal_expiry_later_write_time_wins():
    # expiry given by the source: equal expiry, the smaller ttl was written later
    _both_orders(
        Cell(T, "aaa", ttl=50, expiry=NOW_S + 60),
        Cell(T, "zzz", ttl=60, expiry=NOW_S + 60),
        TEXT,
        RULES.write_time,
    )


@pytest.mark.parametrize(
    ("ct", "big", "small"),
    [
        (TEXT, "b", "a"),
        (TEXT, "ab", "a"),  # a shorter prefix is smaller
        (TEXT, "é", "z"),  # UTF-8 c3 a9 > 7a
        (INT, -1, 1),  # ff ff ff ff > 00 00 00 01
        (ColumnType(Kind.BIGINT), -5, 2**40),
        (ColumnType(Kind.DOUBLE), -0.5, 1e300),  # the sign bit first
        (ColumnType(Kind.DECIMAL, 10, 2), Decimal("1.00"), Decimal("1000.00")),  # 64 > 01 86 a0
        (ColumnType(Kind.BOOLEAN), True, False),
        (ColumnType(Kind.BINARY), b"\x80", b"\x7f\xff"),
    ],
)
def test_rule4_bigger_serialized_value_wins(ct, big, small):
    _both_orders(Cell(T, big), Cell(T, small), ct, RULES.value)


def test_full_tie_is_decided_by_the_canonical_order():
    a = Cell(T, "x", origin="A", event_id="A-1", rank=0, is_event=True)
    b = Cell(T, "x", origin="B", event_id="B-1", rank=1, is_event=True)
    _both_orders(b, a, TEXT, TIE)
    assert cell_order(a, a, TEXT) == (0, TIE)


@pytest.mark.parametrize(
    ("value", "ct", "hex_"),
    [
        (-1, INT, "ffffffff"),
        (1, INT, "00000001"),
        (-2, ColumnType(Kind.BIGINT), "fffffffffffffffe"),
        (True, ColumnType(Kind.BOOLEAN), "01"),
        (1.0, ColumnType(Kind.DOUBLE), "3ff0000000000000"),
        (Decimal("1.50"), ColumnType(Kind.DECIMAL, 10, 2), "00000002" + "0096"),
        (Decimal("-1.28"), ColumnType(Kind.DECIMAL, 10, 2), "00000002" + "80"),
        (Decimal("0"), ColumnType(Kind.DECIMAL, 10, 0), "00000000" + "00"),
        ("é", TEXT, "c3a9"),
        (date(1970, 1, 2), ColumnType(Kind.DATE), "80000001"),
        (
            datetime(1970, 1, 1, 0, 0, 1, 999, tzinfo=UTC),
            ColumnType(Kind.TIMESTAMP),
            "00000000000003e8",
        ),
        (
            "00112233-4455-6677-8899-aabbccddeeff",
            ColumnType(Kind.UUID),
            "00112233445566778899aabbccddeeff",
        ),
    ],
)
def test_serialize_is_cassandras_binary_form(value, ct, hex_):
    assert serialize(value, ct).hex() == hex_


# ---------------------------------------------------------------------- merge properties

COLS = ("s", "n")
TYPES = {"s": TEXT, "n": INT}
TS = st.sampled_from([T - 2, T - 1, T])  # few timestamps: ties are the interesting part


@st.composite
def cells(draw: st.DrawFn) -> Cell:
    ts = draw(TS)
    kind = draw(st.sampled_from(["live", "ttl", "dead"]))
    rank = draw(st.integers(0, 1))
    origin = "AB"[rank]  # an event id names one write of one origin, as in every export
    meta = {
        "origin": origin,
        "event_id": f"{origin}-{draw(st.sampled_from([1, 2, 3]))}",
        "rank": rank,
        "is_event": True,
    }
    if kind == "dead":
        return Cell(ts, None, True, draw(st.sampled_from([NOW - 1, NOW])), **meta)
    value = draw(st.sampled_from([-1, 0, 7]))
    if kind == "ttl":
        ttl = draw(st.sampled_from([10, 20]))
        return Cell(ts, value, ttl=ttl, expiry=draw(st.sampled_from([NOW_S, NOW_S + 10])), **meta)
    return Cell(ts, value, **meta)


@st.composite
def rows(draw: st.DrawFn) -> CellRow:
    row = CellRow()
    for c in COLS:
        if draw(st.booleans()):
            cell = draw(cells())
            row.cells[c] = (
                cell
                if c == "n" or cell.dead
                else Cell(**{**_fields(cell), "value": str(cell.value)})
            )
    if draw(st.booleans()):
        row.marker = Cell(draw(TS), ttl=None)
    if draw(st.booleans()):
        row.tomb = Tombstone(draw(TS), draw(st.sampled_from([NOW - 1, NOW])), "A", "d1", 0, True)
    return shadow(row, None)


def _fields(c: Cell) -> dict:
    return {f: getattr(c, f) for f in Cell.__slots__}


def _same(a: CellRow, b: CellRow) -> bool:
    return (a.cells, a.marker, a.tomb) == (b.cells, b.marker, b.tomb)


@settings(max_examples=300, deadline=None)
@given(rows(), rows())
def test_merge_is_commutative(a, b):
    assert _same(merge_rows(a, b, TYPES), merge_rows(b, a, TYPES))


@settings(max_examples=300, deadline=None)
@given(rows(), rows(), rows())
def test_merge_is_associative(a, b, c):
    left = merge_rows(merge_rows(a, b, TYPES), c, TYPES)
    right = merge_rows(a, merge_rows(b, c, TYPES), TYPES)
    assert _same(left, right)


@settings(max_examples=300, deadline=None)
@given(rows())
def test_merge_is_idempotent(a):
    assert _same(merge_rows(a, a, TYPES), a)


def _table():
    table = configs.table({"k": "int", "s": "string", "n": "int"}, ["k"], policy="scylla")
    cfg = parse_config(configs.config(table, replicas=("A", "B")))
    return cfg.tables["t"]


@st.composite
def events(draw: st.DrawFn) -> list[CellEvent]:
    out = []
    for i in range(draw(st.integers(1, 12))):
        origin = draw(st.sampled_from(["A", "B"]))
        op = draw(st.sampled_from(["INSERT", "UPDATE", "UPDATE", "DELETE", "TRUNCATE"]))
        after = {}
        if op in ("INSERT", "UPDATE"):
            for c in COLS:
                if draw(st.booleans()):
                    v = draw(st.sampled_from([None, -1, 3]))
                    after[c] = v if c == "n" or v is None else str(v)
        key = None if op == "TRUNCATE" else (draw(st.integers(1, 3)),)
        ttl = draw(st.sampled_from([None, None, 10, 3600 * 20]))
        out.append(
            CellEvent(
                f"{origin}-{i}", op, key, draw(TS), origin, 0 if origin == "A" else 1, after, ttl
            )
        )
    return out


@settings(max_examples=300, deadline=None)
@given(events(), st.randoms())
def test_canonical_fold_equals_the_merge_in_any_order(evs, rnd):
    """docs/rules.md#convergence: whatever order a replica applied the
    events in, it reaches the state of the canonical fold."""
    table = _table()
    fold = CellFold(table, NOW).run(evs)
    shuffled = list(evs)
    rnd.shuffle(shuffled)
    merged, tt = merge_all(table, NOW, {}, shuffled)
    assert fold.table_tomb == tt
    assert {k: (r.cells, r.marker, r.tomb) for k, r in fold.state().items()} == {
        k: (r.cells, r.marker, r.tomb) for k, r in merged.items()
    }
    # every event is applied or discarded, and only a conflict can discard it
    assert set(fold.fates) == {e.event_id for e in evs}
    discarded = {e for e, f in fold.fates.items() if f == "discarded"}
    assert discarded <= {c.event_id for c in fold.conflicts}


# ---------------------------------------------------------------------- TTL, marker, tombstones


def test_ttl_row_marker_and_tombstones():
    table = _table()
    h = 3_600_000_000
    evs = [
        CellEvent("A-1", "UPDATE", (1,), T, "A", 0, {"n": 9}, ttl=3600),  # expired at NOW
        CellEvent("A-2", "INSERT", (1,), T - h, "A", 0, {"s": "x"}),
        CellEvent("A-3", "INSERT", (3,), T, "A", 0, {"s": "t3"}, ttl=3600),  # all expired: gone
        CellEvent("B-1", "INSERT", (4,), T, "B", 1, {}),  # the key only: live with nulls
        CellEvent("B-2", "UPDATE", (5,), T, "B", 1, {"s": "t5"}),
        CellEvent("B-3", "UPDATE", (5,), T + h, "B", 1, {"s": None}),  # no marker: gone
    ]
    fold = CellFold(table, NOW).run(evs)
    snap = fold.snapshot()
    assert snap == {
        (1,): {"s": "x", "_ts": T - h, "_origin": "A"},
        (4,): {"_ts": T, "_origin": "B"},
    }
    assert fold.conflicts == []
    # the state keeps the expired cell (compared as written) and the cell tombstone
    assert fold.rows[(1,)].cells["n"].value == 9
    assert fold.rows[(5,)].cells["s"].dead


def test_delete_shadows_equal_ts_and_a_newer_cell_survives():
    table = _table()
    evs = [
        CellEvent("A-1", "DELETE", (1,), T, "A", 0),
        CellEvent("B-1", "UPDATE", (1,), T, "B", 1, {"s": "same ts"}),
        CellEvent("B-2", "UPDATE", (1,), T + 1, "B", 1, {"n": 1}),
    ]
    fold = CellFold(table, NOW).run(evs)
    assert fold.snapshot() == {(1,): {"n": 1, "_ts": T + 1, "_origin": "B"}}
    (c,) = fold.conflicts
    assert (c.event_id, c.conflict_type, c.outcome) == ("B-1", "update_differ", "discarded")
    assert c.cells == (("s", False, SHADOWED),)
    assert fold.fates == {"A-1": "applied", "B-1": "discarded", "B-2": "applied"}


def test_late_delete_meets_newer_cells_and_stands():
    table = _table()
    prior = {(1,): CellRow({"s": Cell(T + 5, "new", origin="B")}, Cell(T - 5, origin="A"))}
    fold = CellFold(table, NOW, prior).run([CellEvent("A-9", "DELETE", (1,), T, "A", 0)])
    (c,) = fold.conflicts
    assert (c.conflict_type, c.outcome, c.local_ts) == ("delete_differ", "applied", T + 5)
    # the marker (older) is shadowed, the newer cell survives and keeps the row live
    assert fold.snapshot() == {(1,): {"s": "new", "_ts": T + 5, "_origin": "B"}}


def test_purge_after_gc_grace():
    grace = 10 * 86400
    day = 86_400_000_000
    rows = {
        (1,): CellRow(tomb=Tombstone(T, NOW - grace * 1_000_000, "A", "d")),  # exactly: kept
        (2,): CellRow(tomb=Tombstone(T, NOW - grace * 1_000_000 - 1, "A", "d")),  # purged
        (3,): CellRow({"s": Cell(T - 20 * day, "x", ttl=60, expiry=(T - 20 * day) // 10**6 + 60)}),
        (4,): CellRow(
            {"s": Cell(T - 20 * day, "x", ttl=10**8, expiry=(T - 20 * day) // 10**6 + 10**8)}
        ),
        (5,): CellRow({"s": Cell(T, None, True, NOW - 11 * day)}, Cell(T)),
    }
    out, tt = purge(rows, Tombstone(T, NOW - 11 * day), NOW, grace)
    assert set(out) == {(1,), (4,), (5,)}  # 3: expired 20 days ago, counted from its write
    assert out[(5,)].cells == {} and out[(5,)].marker is not None
    assert tt is None


def test_read_row_needs_a_live_cell_or_marker():
    assert read_row(CellRow({"s": Cell(T, None, True, NOW)}), NOW_S) is None
    assert read_row(CellRow(marker=Cell(T, ttl=1, expiry=NOW_S)), NOW_S) is None
    assert read_row(CellRow(marker=Cell(T)), NOW_S) == {"_ts": T, "_origin": None}


def test_random_histories_never_resurrect_shadowed_cells():
    table = _table()
    rnd = random.Random(4)
    for _ in range(200):
        evs = [
            CellEvent(
                f"A-{i}",
                rnd.choice(["UPDATE", "DELETE"]),
                (1,),
                T + rnd.randint(0, 3),
                "A",
                0,
                {"n": i},
            )
            for i in range(6)
        ]
        fold = CellFold(table, NOW).run(evs)
        deletes = [e.ts for e in evs if e.op == "DELETE"]
        snap = fold.snapshot().get((1,))
        if snap is not None and deletes:
            assert snap["_ts"] > max(deletes)


def test_equal_timestamps_can_mix_two_writes():
    """The README's example: each column is decided on its own, so the row mixes A's and
    B's writes (docs/rules.md#cell-rules)."""
    evs = [
        CellEvent("A-1", "UPDATE", (1,), T, "A", 0, {"s": "a", "n": -1}),
        CellEvent("B-1", "UPDATE", (1,), T, "B", 1, {"s": "b", "n": 1}),
    ]
    fold = CellFold(_table(), NOW).run(evs)
    assert fold.snapshot()[(1,)] == {"s": "b", "n": -1, "_ts": T, "_origin": "B"}
    (c,) = fold.conflicts  # B's writes met A's at the same ts: one won, one lost
    assert (c.event_id, c.outcome) == ("B-1", "applied")
    assert dict((s, won) for s, won, _ in c.cells) == {"s": True, "n": False}
