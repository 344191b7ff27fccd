"""docs/operations.md#reruns-and-backfills: a rerun or backfill of a date reaches the nights
after it. A date with later published dates runs with them (``cdr run --then-later``) or
is refused naming them; a night whose state was built on a run since replaced is refused
naming the dates to run again. After the late export of an earlier date and its backfill
with the dates after it, the store holds what it would have held had the export been on
time, and the history keeps its invariants."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from pipeline.app.cli import main
from pipeline.core import layout
from tests.helpers import configs
from tests.helpers import published as P
from tests.helpers import two_paths as TP

DAYS = ["2026-11-20", "2026-11-21", "2026-11-22", "2026-11-23", "2026-11-24"]
D1, D2, D3, D4, D5 = DAYS
CONFIG = configs.config(
    configs.table({"id": "int", "v": "string"}, history=True),
    replicas=("r1", "r2"),
    on_divergence="warn",
)


def _ev(origin: str, d: str, n: int, k: int, v: str, op: str = "UPDATE") -> dict[str, Any]:
    after = {"id": k, "v": v} if op == "INSERT" else {"v": v}
    return {"op": op, "key": {"id": k}, "after": after, "ts": f"{d}T{n:02d}:00:00Z",
            "origin": origin, "event_id": f"{origin}-{d}-{n}"}  # fmt: skip


#: each night: r1's events (every replica has them), and on D2 r2's own, which reach the
#: store late: key 7 no later night touches, key 1 D3 updates again
R1 = {d: [_ev("r1", d, i + 1, i, f"{d}-r1") for i in range(3)] for d in DAYS}
LATE = [_ev("r2", D2, 5, 7, "late-7", "INSERT"), _ev("r2", D2, 4, 1, "late-1")]


def _exports(d: str, with_late: bool) -> dict[str, dict[str, list[dict[str, Any]]]]:
    r2 = [*R1[d], *(LATE if d == D2 and with_late else [])]
    return {r: {"t": [{**e, "seq": i} for i, e in enumerate(evs, 1)]}
            for r, evs in (("r1", R1[d]), ("r2", r2))}  # fmt: skip


def _store(root: Path, late_on_time: bool) -> Path:
    nights = {d: _exports(d, late_on_time) for d in DAYS}
    if not late_on_time:
        nights[D2] = {"r1": nights[D2]["r1"]}  # r2's export of D2 comes late
    return TP._layout(root, TP.History(CONFIG, {}, nights))


def _run(cfg: Path, d: str, work: Path, *more: str) -> int:
    args = ["run", "--config", str(cfg), "--date", d, "--now", TP._now(d), "--no-data-docs"]
    return main([*args, "--allow-missing-exports", "--work-dir", str(work), *more])


def _comparable(store: Any) -> dict[str, Counter[str]]:
    """Every published table but the runs' own and the backfills' states."""
    run_ids = tuple(r["run_id"] for r in P.runs(store))
    return {
        k: v
        for k, v in P.all_tables(store, run_ids).items()
        if not k.startswith((layout.BACKFILLS, f"{layout.PUBLISHED}/_failed"))
    }


@pytest.fixture(scope="module")
def on_time(tmp_path_factory, spark) -> Any:
    """The five nights with r2's D2 export on time: what the backfilled store must equal."""
    from pipeline.storage.store import open_store

    root = tmp_path_factory.mktemp("on-time")
    cfg = _store(root / "store", late_on_time=True)
    for d in DAYS:
        assert _run(cfg, d, root / "work") == 0
    return open_store((root / "store").as_uri())


def test_a_late_export_backfilled_with_the_dates_after_it_is_never_lost(tmp_path, on_time, capfd):
    from pipeline.storage.store import open_store

    cfg = _store(tmp_path / "store", late_on_time=False)
    store = open_store((tmp_path / "store").as_uri())
    work = tmp_path / "work"
    for d in DAYS[:4]:
        assert _run(cfg, d, work) == 0
    TP._layout_night(tmp_path / "store", D2, _exports(D2, True))  # r2's export arrives
    capfd.readouterr()
    assert _run(cfg, D5, work) != 0  # the late export: rerun D2 and the dates after it
    assert "rerun 2026-11-21 and the dates after it" in capfd.readouterr().err
    assert _run(cfg, D2, work) != 0  # alone: D3 and D4 were built on it
    err = capfd.readouterr().err
    assert "cannot run 2026-11-21 alone: 2026-11-22, 2026-11-23 were published" in err
    assert "`cdr run --date 2026-11-21 --then-later`" in err
    # D2 alone as one date of a backfill that stopped there (an Airflow backfill of D2
    # only, a --then-later killed after its first date): the next night is refused
    assert _run(cfg, D2, work, "--backfill") == 0
    assert _run(cfg, D5, work) != 0
    err = capfd.readouterr().err
    assert "table 't' would start from the state of 2026-11-23" in err
    assert "built on an earlier run of 2026-11-21" in err
    assert "`cdr run --date 2026-11-22 --then-later`" in err
    assert _run(cfg, D3, work, "--then-later") == 0
    assert [r["dt"].isoformat() for r in P.runs(store)][-2:] == [D3, D4]
    assert _run(cfg, D5, work) == 0
    got = {r["id"]: r["v"] for r in P.snapshot(store, "t")}
    assert got[7] == "late-7" and got[1] == f"{D5}-r1"
    assert _comparable(store) == _comparable(on_time)
    history = P.rows(store, layout.table_path("t", layout.HISTORY))
    assert TP.history_problems(history, ("id",)) == []
