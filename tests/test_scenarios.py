"""Every acceptance scenario of shared/scenarios/ through ``cdr run`` on a ``file://``
store laid out as the scenarios' README says (base snapshot, history runs, exports with
manifests), compared with its ``expect``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.context import parse_rfc3339, to_micros
from tests.helpers import published as P
from tests.helpers import scenarios as S
from tests.helpers.cdc_consumer import Consumer

PENDING: dict[str, str] = {}  # scenario name prefix -> why it is expected to fail


def _params():
    out = []
    for f in S.scenario_files():
        marks = [
            pytest.mark.xfail(reason=why, strict=True)
            for prefix, why in PENDING.items()
            if f.stem.startswith(prefix)
        ]
        out.append(pytest.param(f, id=f.stem, marks=marks))
    return out


def run_scenario(
    s: dict, tmp: Path, gz: bool = False, cli=None, fmt: str = "jsonl", docs: bool = False
) -> tuple[dict, bool]:
    """Lay the scenario out under ``tmp/store`` and ``cdr run`` its dates in order;
    ``docs`` builds the Data Docs (the scenario tests do not look at them)."""
    store = tmp / "store"
    store.mkdir()
    S.layout_store(s, store, gz=gz, fmt=fmt)
    cfg = S.config_file(s, store, tmp / "cdr.yaml")
    runs = [*s.get("history", []), {"date": s["date"], "now": s["now"], "exports": s["exports"]}]
    failed = False
    for r in runs:
        args = [
            "run",
            "--config",
            str(cfg),
            "--date",
            r["date"],
            "--now",
            r["now"],
            "--work-dir",
            str(tmp / "work"),
        ]
        if S.missing_exports(s, r["exports"]):
            args.append("--allow-missing-exports")  # the scenario's replica exported nothing
        if not docs:
            args.append("--no-data-docs")
        failed = (cli or main)(args) != 0
    return S.published(store, s), failed


def scenario_format(path: Path, s: dict) -> str:
    """One scenario in four (of those whose records fit Parquet rows) is exported as
    canonical Parquet, with a Parquet base snapshot; the others as JSONL."""
    ready = [p for p in S.scenario_files() if S.parquet_ready(json.loads(p.read_text()))]
    return "parquet" if path in ready[::4] and S.parquet_ready(s) else "jsonl"


#: scenarios whose runs other tests read (tests/test_validation.py): run once, with the
#: Data Docs where those tests open them
SHARED_RUNS: dict[str, dict] = {}
DOCS = {"pg_fk_update_parent_fail"}


def scenario_run(path: Path, tmp_path_factory) -> dict:
    """The published result of one scenario, run once per session."""
    if path.stem not in SHARED_RUNS:
        s = json.loads(path.read_text())
        s["config"].setdefault("cdc", CDC)
        tmp = tmp_path_factory.mktemp(path.stem)
        fmt = scenario_format(path, s)
        got, failed = run_scenario(s, tmp, fmt=fmt, docs=path.stem in DOCS)
        SHARED_RUNS[path.stem] = {"s": s, "got": got, "failed": failed, "root": tmp, "fmt": fmt}
    return SHARED_RUNS[path.stem]


#: every scenario also publishes its CDC log, which must replay to its snapshots
CDC = {"enabled": True, "vnodes": 4, "shards": 2, "preimage": True, "postimage": True}


def cdc_replay_problems(s: dict, root: Path) -> list[str]:
    """Replay each table's log, run after run, from the base snapshot (cdc_consumer:
    pre- and post-images checked on the way) and compare with each published snapshot,
    read at the version the run's ``runs`` row names (Delta time travel)."""
    runs = [*s.get("history", []), {"date": s["date"], "now": s["now"]}]
    problems = []
    for t, spec in s["config"]["tables"].items():
        columns = list(spec["columns"])
        consumer = Consumer(spec["key"], columns)
        consumer.seed([S.typed(r, spec) for r in (s.get("prior_state") or {}).get(t, [])])
        for r in runs:
            published = P.run_rows(root, r["date"])
            if not published:
                continue  # a failed run publishes nothing
            try:
                consumer.apply_log(P.cdc_log(root, t, r["date"]))
            except AssertionError as e:
                problems.append(f"{t} {r['date']}: {e}")
                break
            snap = P.as_of(root, f"published/{t}/snapshot", published[-1])
            want = {tuple(x[k] for k in spec["key"]): {c: x[c] for c in columns} for x in snap}
            got = consumer.view(to_micros(parse_rfc3339(r["now"])))
            if got != want:
                problems.append(f"{t} {r['date']}: the log replays to {got}, snapshot {want}")
    return problems


@pytest.mark.skipif(not S.scenario_files(), reason="shared/scenarios not found")
@pytest.mark.parametrize("path", _params())
def test_scenario(path: Path, tmp_path_factory, spark):
    ran = scenario_run(path, tmp_path_factory)
    s, got, failed, root = ran["s"], ran["got"], ran["failed"], ran["root"]
    assert S.differences(s, got, failed) == []
    if s["expect"].get("fails"):
        assert got.get("status") == "failed"
        assert got["snapshot"] == {}  # nothing of a failed run is in the snapshot
        for t in s["config"]["tables"]:  # nor in the CDC log
            assert P.cdc_log(root / "store", t, s["date"]) == []
        (row,) = P.run_rows(root / "store", s["date"], "failed")
        assert row["versions"] and all("/_failed/" in p for p in row["versions"])
    assert cdc_replay_problems(s, root / "store") == []


def test_one_scenario_in_four_runs_on_parquet_exports():
    paths = S.scenario_files()
    formats = [scenario_format(p, json.loads(p.read_text())) for p in paths]
    assert formats.count("parquet") >= len(paths) // 5, formats


def test_scenario_through_the_console_script_with_gzip(tmp_path: Path):
    """The installed ``cdr`` command, in its own process, on gzipped exports."""
    path = S.SCENARIOS / "pg_update_deleted_apply_or_skip.json"
    if not path.exists():
        pytest.skip("shared/scenarios not found")
    s = json.loads(path.read_text())
    cdr = Path(sys.executable).with_name("cdr")

    def cli(args):
        env = {**os.environ, "CDR_SHUFFLE_PARTITIONS": "2"}
        p = subprocess.run([str(cdr), *args], capture_output=True, text=True, env=env)
        assert "Traceback" not in p.stderr, p.stderr
        return p.returncode

    got, failed = run_scenario(s, tmp_path, gz=True, cli=cli)
    assert S.differences(s, got, failed) == []


def test_a_missing_scenario_folder_fails_under_ci(tmp_path: Path, monkeypatch):
    """Outside CI a checkout without shared/scenarios runs the golden files only; under
    CI=true it is an error, so that the suite cannot shrink unnoticed."""
    monkeypatch.setattr(S, "SCENARIOS", tmp_path / "missing")
    monkeypatch.delenv("CI", raising=False)
    assert S.scenario_files() == sorted(S.GOLDEN.glob("*.json"))
    monkeypatch.setenv("CI", "true")
    with pytest.raises(RuntimeError, match="no shared scenarios"):
        S.scenario_files()


def test_the_comparison_is_exact_and_typed_by_the_schema():
    """A published value matches an expected one only with the column's type and text:
    ``"1"`` is not ``1``, ``1.10`` keeps its scale, a string column's ``"007"`` stays text."""
    from decimal import Decimal

    table = {"columns": {"id": "bigint", "amount": "decimal(10,2)", "code": "string"}}
    expected = [{"id": 1, "amount": "1.10", "code": "007"}]
    assert S.multiset([{"id": 1, "amount": Decimal("1.10"), "code": "007"}]) == S.multiset(
        expected, table
    )
    for wrong in (
        {"id": "1", "amount": Decimal("1.10"), "code": "007"},  # text where a bigint is
        {"id": 1, "amount": Decimal("1.1"), "code": "007"},  # the scale lost
        {"id": 1, "amount": 1.1, "code": "007"},  # a float where a decimal is
        {"id": 1, "amount": Decimal("1.10"), "code": 7},  # a number where text is
    ):
        assert S.multiset([wrong]) != S.multiset(expected, table), wrong
