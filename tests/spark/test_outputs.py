"""What a run starts from and what a backfill may move (docs/outputs.md#backfills),
through ``cdr run`` on a ``file://`` store, read back with ``deltalake``: a deleted or
damaged state file stops the next run naming it; a table new to the config starts from
``base/`` and the report says so; a backfill never moves the snapshot back, and while it
holds the store the next date's run is refused. (Runs started at once in their own
processes: tests/e2e/test_outputs.py.)"""

from __future__ import annotations

from pathlib import Path

from pipeline.app.cli import main
from tests.helpers import configs
from tests.helpers import published as P
from tests.helpers import scenarios as S
from tests.helpers.reports import date_report

D1, D2, D3 = "2026-11-20", "2026-11-21", "2026-11-22"
HOUR = 3_600_000_000
DAY = 24 * HOUR
START = {d: 1_795_132_800_000_000 + i * DAY for i, d in enumerate((D1, D2, D3))}  # 00:00Z
COLUMNS = {"id": "int", "v": "string"}


def _config(tmp: Path, tables: tuple[str, ...]) -> Path:
    cfg = configs.config({t: configs.table(COLUMNS) for t in tables}, store=tmp / "store")
    return configs.write(tmp / f"cdr-{len(tables)}.yaml", cfg)


def _exports(tmp: Path, d: str, tables: tuple[str, ...]) -> None:
    """One insert of key ``d``'s day number per table, exported by both replicas."""
    k = int(d[-2:])
    event = {
        "op": "INSERT",
        "key": {"id": k},
        "after": {"id": k, "v": f"{d}"},
        "ts": START[d] + HOUR,
        "origin": "pub",
        "event_id": f"pub-{d}",
        "seq": 0,
    }
    S.write_exports(tmp / "store", d, {r: {t: [event] for t in tables} for r in ("pub", "sub")})


def _run(cfg: Path, tmp: Path, d: str, *extra: str) -> int:
    argv = ["run", "--config", str(cfg), "--date", d, "--work-dir", str(tmp / "work")]
    return main([*argv, "--no-data-docs", *extra])


def _state_file(store: Path, d: str) -> Path:
    """The file of ``d``'s state (the state table as ``d``'s run left it) that holds its
    one row."""
    import pyarrow.parquet as pq

    files = (store / "published/t/state").glob("*.parquet")
    (f,) = [f for f in files if pq.read_metadata(f).num_rows]
    return f


def test_a_deleted_or_damaged_prior_state_file_stops_the_run(tmp_path: Path, spark, capsys):
    cfg = _config(tmp_path, ("t",))
    _exports(tmp_path, D1, ("t",))
    _exports(tmp_path, D2, ("t",))
    assert _run(cfg, tmp_path, D1) == 0
    f = _state_file(tmp_path / "store", D1)
    good = f.read_bytes()
    capsys.readouterr()
    f.unlink()
    assert _run(cfg, tmp_path, D2) == 1
    err = capsys.readouterr().err
    assert f"published/t/state/{f.name}: missing (1 rows)" in err, err
    f.write_bytes(good[: len(good) // 2])
    assert _run(cfg, tmp_path, D2) == 1
    assert f"{f.name}: not the file the Delta log names" in capsys.readouterr().err
    f.write_bytes(good)
    assert _run(cfg, tmp_path, D2) == 0  # restored: the run goes on from it
    assert sorted(r["id"] for r in P.snapshot(tmp_path / "store", "t")) == [20, 21]
    assert [r["status"] for r in P.runs(tmp_path / "store")] == [
        "published",
        "failed",
        "failed",
        "published",
    ]


def test_a_table_new_to_the_config_starts_from_base_and_says_so(tmp_path: Path, spark):
    _exports(tmp_path, D1, ("t",))
    assert _run(_config(tmp_path, ("t",)), tmp_path, D1) == 0
    S.write_jsonl(tmp_path / "store/base/table=u", [{"id": 1, "v": "base"}], {"table": "u"})
    _exports(tmp_path, D2, ("t", "u"))
    assert _run(_config(tmp_path, ("t", "u")), tmp_path, D2) == 0
    report = date_report(tmp_path / "store", D2)
    assert report is not None
    tables = report.tables
    assert tables["t"].start.startswith(f"the state of {D1} (run ")
    assert tables["u"].start == "base/ (1 rows): no published run had this table"
    assert sorted(r["id"] for r in P.snapshot(tmp_path / "store", "u")) == [1, 21]


def test_a_backfill_never_moves_the_snapshot_back(tmp_path: Path, spark, capsys):
    cfg = _config(tmp_path, ("t",))
    store = tmp_path / "store"
    _exports(tmp_path, D1, ("t",))
    _exports(tmp_path, D2, ("t",))
    assert _run(cfg, tmp_path, D1) == 0 and _run(cfg, tmp_path, D2) == 0
    after_d2 = P.snapshot(store, "t")
    # the backfill of D1 holds the store: the next date's run is refused, naming it
    argv = ["--config", str(cfg), "--date", D1, "--work-dir", str(tmp_path / "work")]
    assert main(["ingest", *argv, "--run-id", "backfill", "--no-data-docs", "--backfill"]) == 0
    capsys.readouterr()
    assert _run(cfg, tmp_path, D2, "--run-id", "next") == 1
    assert "is being written by run backfill on" in capsys.readouterr().err
    for stage in ("resolve", "validate", "publish"):
        assert main([stage, *argv, "--run-id", "backfill"]) == 0
    assert P.snapshot_date(store, "t") == D2 and P.snapshot(store, "t") == after_d2
    (row,) = [r for r in P.runs(store) if r["run_id"] == "backfill"]
    assert "published/t/snapshot" not in row["versions"]  # committed its state and logs only
    assert "published/t/state" not in row["versions"]  # its state is a table of its own
    assert "published/_backfills/run=backfill/t/state" in row["versions"]
    assert _run(cfg, tmp_path, D2, "--run-id", "next") == 0  # now free; D2 from the new D1
    assert P.snapshot_date(store, "t") == D2
