"""Acceptance scenarios (shared/scenarios/*.json): lay one out as a ``file://`` store the
way its README says, run it through ``cdr run``, and read back what was published."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parent.parent
SCENARIOS = Path(os.environ.get("CDR_SCENARIOS", REPO.parent / "shared" / "scenarios"))
#: the project's own scenarios, same shape, for rules the shared set does not exercise
GOLDEN = REPO / "tests" / "golden"


def scenario_files() -> list[Path]:
    shared = sorted(SCENARIOS.glob("*.json")) if SCENARIOS.is_dir() else []
    return shared + sorted(GOLDEN.glob("*.json"))


def write_jsonl(
    folder: Path, records: list[dict[str, Any]], manifest: dict[str, Any], gz: bool = False
) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r) + "\n" for r in records).encode()
    name = "part-0000.jsonl.gz" if gz else "part-0000.jsonl"
    data = gzip.compress(text, mtime=0) if gz else text
    (folder / name).write_bytes(data)
    files = [{"path": name, "rows": len(records), "sha256": hashlib.sha256(data).hexdigest()}]
    (folder / "_manifest.json").write_text(
        json.dumps({**manifest, "format": "jsonl", "files": files})
    )


def write_exports(
    root: Path, date: str, exports: dict[str, dict[str, list[dict]]], gz: bool = False
) -> None:
    for replica, tables in exports.items():
        for table, events in tables.items():
            folder = root / f"exports/replica={replica}/table={table}/dt={date}"
            write_jsonl(folder, events, {"replica": replica, "table": table, "dt": date}, gz)


def layout_store(s: dict[str, Any], root: Path, gz: bool = False) -> None:
    for table, rows in (s.get("prior_state") or {}).items():
        write_jsonl(root / f"base/table={table}", rows, {"table": table}, gz)
    for h in s.get("history", []):
        write_exports(root, h["date"], h["exports"], gz)
    write_exports(root, s["date"], s["exports"], gz)


def config_file(s: dict[str, Any], root: Path, path: Path) -> Path:
    import yaml

    cfg = dict(s["config"])
    cfg["store"] = root.as_uri()
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def missing_exports(s: dict[str, Any], exports: dict[str, Any]) -> bool:
    reps = [r["id"] for r in s["config"]["replicas"]]
    return any(t not in exports.get(r, {}) for r in reps for t in s["config"]["tables"])


def read_parquet_dir(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    rows: list[dict[str, Any]] = []
    for f in sorted(path.rglob("*.parquet")):
        rows += pq.read_table(f).to_pylist()
    return rows


def published(root: Path, s: dict[str, Any]) -> dict[str, Any]:
    """What the run published, in the shape of a scenario's ``expect``."""
    d = s["date"]
    out: dict[str, Any] = {
        "snapshot": {},
        "conflicts": {},
        "quarantine": {},
        "divergent_keys": {},
        "orphans": {},
    }
    for t in s["config"]["tables"]:
        latest = root / f"published/{t}/_latest.json"
        if latest.exists():
            p = json.loads(latest.read_text())
            if p["dt"] == d:
                out["snapshot"][t] = read_parquet_dir(root / p["snapshot"])
        base = root / f"published/{t}"
        conf = read_parquet_dir(base / f"conflicts/dt={d}")
        if conf:
            out["conflicts"][t] = [
                {
                    "key": json.loads(c["key"]),
                    "conflict_type": c["conflict_type"],
                    "resolver": c["resolver"],
                    "outcome": c["outcome"],
                }
                for c in conf
            ]
        q = read_parquet_dir(base / f"quarantine/dt={d}")
        if q:
            out["quarantine"][t] = [{"event_id": r["event_id"], "reason": r["reason"]} for r in q]
        for r in read_parquet_dir(base / f"divergence/dt={d}"):
            out["divergent_keys"].setdefault(t, {}).setdefault(r["replica"], []).append(
                json.loads(r["key"])
            )
    report = root / f"published/reports/dt={d}/run_report.json"
    if report.exists():
        rep = json.loads(report.read_text())
        out["status"] = rep["status"]
        for t, ts in rep["tables"].items():
            if ts.get("orphans"):
                orphan_rows = read_parquet_dir(root / f"published/{t}/orphans/dt={d}")
                out["orphans"][t] = [json.loads(r["key"]) for r in orphan_rows]
    return out


def _norm(v: Any) -> Any:
    from decimal import Decimal

    if isinstance(v, Decimal):
        return float(v)
    if isinstance(v, str):
        try:
            return float(Decimal(v)) if v.replace(".", "", 1).lstrip("-").isdigit() else v
        except Exception:
            return v
    if isinstance(v, float) and v.is_integer():
        return v
    return v


def _row_key(r: dict[str, Any]) -> str:
    return json.dumps({k: _norm(v) for k, v in sorted(r.items())}, sort_keys=True, default=str)


def multiset(rows: list[dict[str, Any]]) -> Counter[str]:
    return Counter(_row_key(r) for r in rows)


def differences(s: dict[str, Any], got: dict[str, Any], failed: bool) -> list[str]:
    """Where the published result differs from ``expect`` (empty when it matches)."""
    exp = s["expect"]
    diffs = []
    if bool(exp.get("fails")) != failed:
        diffs.append(f"fails: expected {exp.get('fails')}, run failed={failed}")
    tables = s["config"]["tables"]
    if not exp.get("fails") and exp.get("snapshot") is not None:
        for t in tables:
            want = exp["snapshot"].get(t, [])
            rows = got["snapshot"].get(t, [])
            if t in exp["snapshot"] and tables[t].get("policy") == "scylla":
                rows = [{k: v for k, v in r.items() if k != "_origin"} for r in rows]
            if multiset(rows) != multiset(want):
                diffs.append(f"snapshot {t}: got {rows}, want {want}")
    for t in tables:
        want_c = multiset(exp.get("conflicts", {}).get(t, []))
        got_c = multiset(got["conflicts"].get(t, []))
        if exp.get("fails"):
            if want_c - got_c:
                diffs.append(f"conflicts {t}: missing {dict(want_c - got_c)}")
        elif want_c != got_c:
            diffs.append(f"conflicts {t}: got {dict(got_c)}, want {dict(want_c)}")
        want_q = multiset(exp.get("quarantine", {}).get(t, []))
        got_q = multiset(got["quarantine"].get(t, []))
        if want_q != got_q:
            diffs.append(f"quarantine {t}: got {dict(got_q)}, want {dict(want_q)}")
        want_d = {r: multiset(ks) for r, ks in exp.get("divergent_keys", {}).get(t, {}).items()}
        got_d = {r: multiset(ks) for r, ks in got["divergent_keys"].get(t, {}).items()}
        if want_d != got_d:
            diffs.append(f"divergent_keys {t}: got {got_d}, want {want_d}")
        want_o = multiset(exp.get("orphans", {}).get(t, []))
        got_o = multiset(got["orphans"].get(t, []))
        if want_o != got_o:
            diffs.append(f"orphans {t}: got {dict(got_o)}, want {dict(want_o)}")
    return diffs
