"""Input ignored or quarantined in bulk is loud (docs/operations.md#a-loud-quarantine): an
export whose records the guards quarantine above ``quarantine_share.warn`` warns, one at
``quarantine_share.fail`` fails the night naming its file and first reason, and an export
folder of a replica the config does not name is a warning (or, with ``on_unknown_export:
fail``, the run stops)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.app.cli import main
from tests.helpers import configs
from tests.helpers import published as P
from tests.helpers import scenarios as S

DT = "2026-11-21"


def _event(i: int, origin: str = "pub", **kw) -> dict:
    e = {
        "op": "INSERT",
        "key": {"id": i},
        "after": {"id": i, "v": f"v{i}"},
        "ts": f"2026-11-21T10:00:{i:02d}Z",
        "origin": origin,
        "event_id": f"{origin}-{i}",
        "seq": i,
    }
    return {**e, **kw}


def _night(tmp_path: Path, bad: int, good: int = 20, **settings) -> int:
    """pub exports ``good`` records and ``bad`` with an unknown op; sub exports two."""
    store = tmp_path / "store"
    pub = [_event(i) for i in range(good)] + [_event(100 + i, op="UPSERT") for i in range(bad)]
    sub = [_event(50 + i, origin="sub") for i in range(2)]
    S.write_exports(store, DT, {"pub": {"t": pub}, "sub": {"t": sub}})
    configs.write(tmp_path / "cdr.yaml", configs.config(**settings), store=store)
    args = ["run", "--config", str(tmp_path / "cdr.yaml"), "--date", DT, "--no-data-docs"]
    return main([*args, "--work-dir", str(tmp_path / "work")])


def test_a_share_quarantined_above_warn_publishes_with_a_warning(tmp_path: Path, spark):
    assert _night(tmp_path, bad=3) == 0  # 3 of 23: 13%, above 5%, below 50%
    report = P.report(tmp_path / "store", DT)
    (said,) = [w for w in report.warnings if "quarantine_share_warn" in w]
    assert "part-0000.jsonl" in said and "unknown op 'UPSERT'" in said, said
    assert not [w for w in report.warnings if "replica=sub" in w]  # sub's share is 0
    assert len(P.log(tmp_path / "store", "t", "quarantine", DT)) == 3


def test_a_share_quarantined_at_fail_withholds_the_night(tmp_path: Path, spark):
    """Half of pub's records do not read: the night fails, nothing is published, and the
    message names the check, the file and the first reason."""
    assert _night(tmp_path, bad=20) == 1
    (run,) = P.runs(tmp_path / "store")
    assert run["status"] == "failed"
    assert P.snapshot_date(tmp_path / "store", "t") is None
    report = P.report(tmp_path / "store", DT, run["run_id"])
    said = " ".join(report.failures)
    assert "accounting.t/quarantine_share" in said, said
    assert "part-0000.jsonl" in said and "unknown op 'UPSERT'" in said, said


def test_the_shares_follow_the_config(tmp_path: Path, spark):
    """The same half, with ``fail: 0.9``: a warning, and the night publishes; an export
    under ``min_records`` (3 of 5 records) warns and never fails."""
    assert _night(tmp_path / "a", bad=20, quarantine_share={"fail": 0.9}) == 0
    report = P.report(tmp_path / "a/store", DT)
    assert any("quarantine_share_warn" in w for w in report.warnings)
    assert _night(tmp_path / "b", bad=3, good=2, quarantine_share={"min_records": 10}) == 0
    report = P.report(tmp_path / "b/store", DT)
    assert any("quarantine_share_warn" in w for w in report.warnings)
    assert not any("quarantine_share" in w for w in report.failures)


@pytest.mark.parametrize("on", ["warn", "fail"])
def test_an_export_folder_of_an_unknown_replica_is_named(tmp_path: Path, spark, capsys, on):
    store = tmp_path / "store"
    S.write_exports(store, DT, {"pup": {"t": [_event(1, origin="pup")]}})  # a typo of pub
    rc = _night(tmp_path, bad=0, on_unknown_export=on)
    folder = "exports/replica=pup/ holds exports of a replica the config does not name"
    if on == "warn":
        assert rc == 0
        report = P.report(store, DT)
        assert any(folder in w for w in report.warnings), report.warnings
        assert "pup" not in {r["replica"] for r in P.log(store, "t", "quarantine", DT)}
    else:
        assert rc == 1
        err = capsys.readouterr().err
        assert folder in err and "on_unknown_export: fail" in err, err
        assert P.runs(store) == [] or P.runs(store)[0]["status"] == "failed"
        assert P.snapshot_date(store, "t") is None
