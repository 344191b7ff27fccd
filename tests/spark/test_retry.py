"""docs/operations.md#a-quarantine-that-heals, the quarantine that heals, over four ``cdr
run``s and the
``cdr quarantine`` commands: an orphan healed by its parent two nights later, an update
applied once its INSERT arrives in a late export, a future event applied the next night,
an expiry, and a rerun of a date that had healed events."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.app.cli import main
from pipeline.core.summary import TableSummary
from tests.helpers import configs
from tests.helpers import published as P
from tests.helpers.scenarios import write_exports
from tests.unit.test_retry import CONFIG

D1, D2, D3, D4 = "2026-11-21", "2026-11-22", "2026-11-23", "2026-11-24"


def _e(op: str, eid: str, ts: str, origin: str, **after: int | str) -> dict:
    """An event of ``orders`` (or of ``products``, keyed by its product_no alone)."""
    name = "order_id" if "order_id" in after else "product_no"
    key = {name: after[name]}
    return {"op": op, "key": key, "ts": ts, "origin": origin, "event_id": eid, "after": after}


NIGHTS = {
    D1: {
        "A": {
            "products": [_e("INSERT", "p1", f"{D1}T10:00:00Z", "A", product_no=1, name="one")],
            "orders": [
                # an orphan: product 9 comes two nights later
                _e("INSERT", "o1", f"{D1}T11:00:00Z", "A", order_id=1, product_no=9, qty=1),
                # an orphan whose key is written again before a parent comes: expires
                _e("INSERT", "o7", f"{D1}T11:30:00Z", "A", order_id=7, product_no=8, qty=7),
                # the row this UPDATE needs comes in a late export
                _e("UPDATE", "o2u", f"{D1}T12:00:00Z", "A", order_id=2, qty=5),
            ],
        },
        "B": {
            "orders": [
                # B's clock is ahead: applied the next night
                _e("INSERT", "o3", f"{D2}T06:00:00Z", "B", order_id=3, product_no=1, qty=3),
                # never due within its two attempts: expires
                _e("INSERT", "o6", "2026-12-30T00:00:00Z", "B", order_id=6, product_no=1, qty=6),
            ]
        },
    },
    D2: {
        "A": {
            "orders": [
                _e("INSERT", "o2", f"{D1}T09:00:00Z", "A", order_id=2, product_no=1, qty=1),
                _e("INSERT", "o7b", f"{D2}T08:00:00Z", "A", order_id=7, product_no=1, qty=70),
            ]
        },
        # B's export sends o6 again, still in the future: quarantined by this night too
        "B": {
            "orders": [
                _e("INSERT", "o6", "2026-12-30T00:00:00Z", "B", order_id=6, product_no=1, qty=6)
            ]
        },
    },
    D3: {
        "A": {"products": [_e("INSERT", "p9", f"{D3}T10:00:00Z", "A", product_no=9, name="nine")]}
    },
    D4: {"A": {"orders": [_e("UPDATE", "o3u", f"{D4}T10:00:00Z", "A", order_id=3, qty=30)]}},
}


def _outcomes(store: Path, dt: str | None = None) -> dict[str, tuple]:
    rows = P.rows(store, "published/orders/quarantine_outcomes", dt)
    return {r["event_id"]: (r["status"], r["attempts"]) for r in rows}


def _stats(store: Path, dt: str, table: str = "orders") -> dict[tuple, int]:
    """``conflict_stats`` of the date for one table: (kind, type or reason or outcome,
    resolver, outcome) -> count."""
    out = {}
    for r in P.rows(store, "published/conflict_stats", dt):
        if r["table"] == table:
            first = (
                r["conflict_type"]
                or r["reason"]
                or (r["outcome"] if r["kind"] == "retried" else None)
            )
            rest = (r["resolver"], r["outcome"]) if r["kind"] == "conflicts" else (None, None)
            out[(r["kind"], first, *rest)] = r["count"]
    return out


def _orders(store: Path) -> dict[int, int | None]:
    return {r["order_id"]: r["qty"] for r in P.snapshot(store, "orders")}


def test_quarantine_heals_over_nights(tmp_path: Path, capsys):
    store = tmp_path / "store"
    cfg = configs.write(tmp_path / "cdr.yaml", CONFIG, store=store)
    for day, exports in NIGHTS.items():
        numbered = {
            rep: {t: [{**e, "seq": i} for i, e in enumerate(evs, 1)] for t, evs in tables.items()}
            for rep, tables in exports.items()
        }
        write_exports(store, day, numbered)

    def run(day: str, *extra: str) -> TableSummary:
        args = ["run", "--config", str(cfg), "--date", day, "--work-dir", str(tmp_path / "w")]
        assert main([*args, "--allow-missing-exports", "--no-data-docs", *extra]) == 0
        report = P.report(store, day)
        assert report is not None
        return report.tables.get("orders", TableSummary())

    night1 = run(D1)
    quarantined = {r["event_id"]: r["reason"] for r in P.log(store, "orders", "quarantine", D1)}
    assert quarantined == {
        "o1": "fk_violation",
        "o2u": "update_missing",
        "o3": "future_timestamp",
        "o6": "future_timestamp",
        "o7": "fk_violation",
    }
    conflicts = P.log(store, "orders", "conflicts", D1)
    assert [(c["conflict_type"], c["outcome"]) for c in conflicts] == [
        ("update_missing", "skipped")
    ]
    assert night1.quarantine_open == 5 and night1.retried == {}
    assert _orders(store) == {}
    assert _stats(store, D1) == {  # conflict stats
        ("events", None, None, None): 5,
        ("conflicts", "update_missing", "apply_or_skip", "skipped"): 1,
        ("quarantined", "fk_violation", None, None): 2,
        ("quarantined", "future_timestamp", None, None): 2,
        ("quarantined", "update_missing", None, None): 1,
    }

    night2 = run(D2)  # o2's INSERT arrives (stamped before the UPDATE); o3 is due; 7 written
    assert _orders(store) == {2: 5, 3: 3, 7: 70}
    assert _outcomes(store, D2) == {
        "o2u": ("resolved", 1),
        "o3": ("resolved", 1),
        "o7": ("expired", 1),  # its key was written since: it cannot come back
    }
    # o1 keeps its first row; o6's offered copy adds none, B's new copy of it does
    assert [r["event_id"] for r in P.log(store, "orders", "quarantine", D2)] == ["o6"]
    assert night2.retried == {"applied": 2, "expired": 1}
    assert night2.distinct_events == 3 and night2.applied == 2  # the night's own
    assert night2.quarantined == {"future_timestamp": 1}
    assert night2.quarantine_open == 2  # o1 and o6, once
    assert _stats(store, D2) == {
        ("events", None, None, None): 3,
        ("quarantined", "future_timestamp", None, None): 1,
        ("retried", "applied", None, None): 2,
        ("retried", "expired", None, None): 1,
    }

    night3 = run(D3)  # product 9 arrives: o1 goes back; o6's last attempt fails
    assert _orders(store) == {1: 1, 2: 5, 3: 3, 7: 70}
    assert _outcomes(store, D3) == {"o1": ("resolved", 2), "o6": ("expired", 2)}
    assert night3.retried == {"applied": 1, "expired": 1}
    assert night3.quarantine_open == 0 and night3.orphans == 0

    again = run(D3, "--run-id", "rerun-d3")  # replaces D3's outcomes, heals o1 once more
    assert again.retried == {"applied": 1, "expired": 1} and again.quarantine_open == 0
    assert _orders(store) == {1: 1, 2: 5, 3: 3, 7: 70}
    every = P.rows(store, "published/orders/quarantine_outcomes")
    assert sorted((r["event_id"], r["status"]) for r in every) == [
        ("o1", "resolved"),
        ("o2u", "resolved"),
        ("o3", "resolved"),
        ("o6", "expired"),
        ("o7", "expired"),
    ]
    assert {r["run_id"] for r in every if r["event_id"] in ("o1", "o6")} == {"rerun-d3"}
    assert {r["run_id"] for r in P.rows(store, "published/conflict_stats", D3)} == {"rerun-d3"}

    def cli(*args: str) -> dict:
        capsys.readouterr()
        assert main(["--log-format", "json", "quarantine", *args, "--config", str(cfg)]) == 0
        return json.loads(capsys.readouterr().out)

    listed = cli("list", "--table", "orders")["events"]
    assert [(r["event_id"], r["status"], r["attempts"]) for r in listed] == [
        ("o1", "resolved", 2),
        ("o2u", "resolved", 1),
        ("o3", "resolved", 1),
        ("o6", "expired", 2),
        ("o7", "expired", 1),
    ]
    assert cli("retry", "--table", "orders", "--event-id", "o6")["status"] == "reopened"
    again = ["quarantine", "retry", "--table", "orders", "--event-id", "o6", "--config", str(cfg)]
    assert main(again) == 1  # open already: the next run offers it; nothing written
    assert "o6 is open already: the next run offers it again" in capsys.readouterr().err
    assert [
        r["event_id"] for r in cli("list", "--table", "orders", "--status", "open")["events"]
    ] == ["o6"]
    night4 = run(D4)  # o6 offered again, still in the future: open, its own row kept
    assert night4.retried == {} and night4.quarantine_open == 1
    assert _orders(store) == {1: 1, 2: 5, 3: 30, 7: 70}
    assert cli("dismiss", "--table", "orders", "--event-id", "o6")["status"] == "dismissed"
    d4 = _stats(store, D4)
    assert d4 == {
        ("events", None, None, None): 1,
        ("conflicts", "update_differ", "latest_timestamp_wins", "applied"): 1,
    }
    run(D4, "--run-id", "d4-products", "--tables", "products")  # keeps the date's orders rows
    assert _stats(store, D4) == d4
    assert cli("list", "--table", "orders", "--status", "open")["events"] == []
    assert (
        main(
            ["quarantine", "dismiss", "--table", "orders", "--event-id", "o6", "--config", str(cfg)]
        )
        == 1
    )
    assert "dismissed already" in capsys.readouterr().err
