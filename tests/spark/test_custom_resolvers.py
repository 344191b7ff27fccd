"""Custom resolvers (docs/rules.md#custom-resolvers) in a whole run: the Spark tasks import
the function, the conflict log names it, an error quarantines its event and the run
publishes, and an asymmetric function is counted and warned about in the run report."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers import published as P
from tests.helpers import scenarios as S
from tests.helpers.reports import date_report, log_rows

HELPERS = "tests.helpers.resolvers"
COLUMNS = {"id": "bigint", "v": "string"}


def _table(function: str) -> dict:
    return {"key": ["id"], "columns": COLUMNS, "resolvers": {"update_differ": {"python": function}}}


def _updates(table: str) -> list[dict]:
    """A's and B's UPDATE of key 1, and B's INSERT of key 2 (no conflict)."""
    return [
        {"op": "UPDATE", "key": {"id": 1}, "ts": "2026-11-21T09:00:00Z", "origin": "A",
         "event_id": f"{table}-A1", "after": {"v": "a"}},
        {"op": "UPDATE", "key": {"id": 1}, "ts": "2026-11-21T10:00:00Z", "origin": "B",
         "event_id": f"{table}-B1", "after": {"v": "b"}},
        {"op": "INSERT", "key": {"id": 2}, "ts": "2026-11-21T11:00:00Z", "origin": "B",
         "event_id": f"{table}-B2", "after": {"id": 2, "v": "two"}},
    ]  # fmt: skip


def test_a_run_with_custom_resolvers(tmp_path: Path):
    """Table ``odd`` resolves with ``always_remote`` (asymmetric), table ``bad`` with
    ``boom`` (raises). The base row of key 1 is A's, so B's UPDATE meets update_differ;
    replica B, which applies its own UPDATE first, then takes A's: the asymmetry makes the
    key diverge (``on_divergence: warn`` lets the run publish, the report says why)."""
    exports = {}
    for r in ("A", "B"):
        exports[r] = {}
        for t in ("odd", "bad"):
            evs = _updates(t) if r == "A" else [_updates(t)[i] for i in (1, 0, 2)]
            exports[r][t] = [dict(e, seq=i + 1) for i, e in enumerate(evs)]
    base = [{"id": 1, "v": "base", "_ts": 1795132800000000, "_origin": "A"}]
    s = {
        "config": {
            "replicas": [{"id": "A", "system_id": 1}, {"id": "B", "system_id": 2}],
            "on_divergence": "warn",
            "tables": {"odd": _table(f"{HELPERS}:always_remote"), "bad": _table(f"{HELPERS}:boom")},
        },
        "date": "2026-11-21",
        "now": "2026-11-22T00:00:00Z",
        "exports": exports,
        "prior_state": {"odd": base, "bad": base},
    }
    got, failed = S.run_scenario(s, tmp_path)
    assert not failed and got["status"] == "published"
    store = tmp_path / "store"
    report = date_report(store, s["date"])

    (c,) = log_rows(store, report, "odd", "conflicts")
    assert c["resolver"] == f"python:{HELPERS}:always_remote"
    assert c["outcome"] == "applied" and "(asymmetric: " in c["reason"]
    assert report.tables["odd"].asymmetric == {f"python:{HELPERS}:always_remote": 1}
    assert any("odd: python:" in w and "sides swapped in 1 conflict" in w for w in report.warnings)
    assert {r["id"]: r["v"] for r in P.snapshot(store, "odd")} == {1: "b", 2: "two"}
    assert got["divergent_keys"] == {"odd": {"B": [{"id": 1}]}}

    (q,) = log_rows(store, report, "bad", "quarantine")
    assert (q["event_id"], q["reason"]) == ("bad-B1", "resolver_error")
    assert "line " in q["detail"] and f"python:{HELPERS}:boom raised RuntimeError" in q["detail"]
    assert json.loads(q["event"])["after"] == {"v": "b"}
    assert log_rows(store, report, "bad", "conflicts") == []
    assert {r["id"]: r["v"] for r in P.snapshot(store, "bad")} == {1: "a", 2: "two"}
    assert report.tables["bad"].quarantined == {"resolver_error": 1}


def test_a_function_that_kills_its_worker_stops_the_run_naming_it(tmp_path: Path):
    """``crash`` exits its Python worker (as running out of memory does): the task fails,
    and the run stops naming the function; nothing is quarantined, nothing published."""
    from pipeline.app.cli import main

    exports = {"A": {"t": [dict(e, seq=i + 1) for i, e in enumerate(_updates("t"))]}}
    s = {
        "config": {
            "replicas": [{"id": "A", "system_id": 1}, {"id": "B", "system_id": 2}],
            "tables": {"t": _table(f"{HELPERS}:crash")},
        },
        "date": "2026-11-21",
        "now": "2026-11-22T00:00:00Z",
        "exports": {**exports, "B": {"t": []}},
        "prior_state": {"t": [{"id": 1, "v": "base", "_ts": 1795132800000000, "_origin": "B"}]},
    }
    errors: list[str] = []

    def cli(args: list[str]) -> int:
        import contextlib
        import io

        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc = main(args)
        errors.append(err.getvalue())
        return rc

    _, failed = S.run_scenario(s, tmp_path, cli=cli)
    assert failed
    assert f"table t: the fold failed with the custom resolver python:{HELPERS}:crash" in errors[-1]
    assert P.run_rows(tmp_path / "store", s["date"], "published") == []
