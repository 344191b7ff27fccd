"""Acceptance scenarios (shared/scenarios/*.json): lay one out as a ``file://`` store the
way its README says, run it through ``cdr run``, and read back what was published.

Exports are written as JSONL, or as canonical Parquet (``fmt="parquet"``: objects as JSON
strings, the base snapshot as typed columns). Published values are compared with the
expected ones exactly, typed by the table's schema: ``"1"`` is not ``1``, and a decimal
keeps its scale."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.storage.context import parse_rfc3339, to_micros
from tests.helpers import GOLDEN, REPO, configs
from tests.helpers import published as P
from tests.helpers.cdc_consumer import Consumer
from tests.helpers.reports import date_report, log_rows

SCENARIOS = Path(os.environ.get("CDR_SCENARIOS", REPO.parent / "shared" / "scenarios"))
#: the project's own scenarios (``GOLDEN``), same shape, for rules the shared set does not
#: exercise


def scenario_files() -> list[Path]:
    """The shared scenarios, then the golden ones. Under CI the shared set must be there:
    a missing folder fails the suite instead of shrinking it to the golden files."""
    shared = sorted(SCENARIOS.glob("*.json")) if SCENARIOS.is_dir() else []
    if not shared and os.environ.get("CI") == "true":
        raise RuntimeError(
            f"CI=true but no shared scenarios in {SCENARIOS} (set CDR_SCENARIOS to their folder)"
        )
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


#: fields of the canonical record that hold objects (JSON strings in a Parquet export)
OBJECTS = ("key", "new_key", "after", "before")


def _column(values: list[Any]) -> pa.Array:
    """One Parquet column: the values' own type, or their text when types are mixed."""
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return pa.array([None if v is None else str(v) for v in values], pa.string())


def write_parquet(
    folder: Path, records: list[dict[str, Any]], manifest: dict[str, Any], objects: bool
) -> None:
    """A Parquet export (``objects``: the canonical record's objects as JSON strings) or a
    Parquet base snapshot (typed columns)."""
    folder.mkdir(parents=True, exist_ok=True)
    names = list(dict.fromkeys(k for r in records for k in r))
    cols = {}
    for n in names:
        values = [r.get(n) for r in records]
        if objects and n in OBJECTS:
            cols[n] = pa.array([None if v is None else json.dumps(v) for v in values], pa.string())
        else:
            cols[n] = _column(values)
    buf = io.BytesIO()
    pq.write_table(pa.table(cols) if names else pa.table({"op": pa.array([], pa.string())}), buf)
    data = buf.getvalue()
    name = "part-0000.parquet"
    (folder / name).write_bytes(data)
    files = [{"path": name, "rows": len(records), "sha256": hashlib.sha256(data).hexdigest()}]
    (folder / "_manifest.json").write_text(
        json.dumps({**manifest, "format": "parquet", "files": files})
    )


def parquet_ready(s: dict[str, Any]) -> bool:
    """Whether every record of the scenario can be a Parquet row (a record that is not a
    JSON object, or a field that is an object in one record and a scalar in another,
    stays JSONL)."""
    runs = [s["exports"], *(h["exports"] for h in s.get("history", []))]
    records = [e for ex in runs for tables in ex.values() for evs in tables.values() for e in evs]
    return all(
        isinstance(e, dict) and all(isinstance(e.get(k), dict | None) for k in OBJECTS)
        for e in records
    )


def write_exports(
    root: Path,
    date: str,
    exports: dict[str, dict[str, list[dict]]],
    gz: bool = False,
    fmt: str = "jsonl",
) -> None:
    for replica, tables in exports.items():
        for table, events in tables.items():
            folder = root / f"exports/replica={replica}/table={table}/dt={date}"
            manifest = {"replica": replica, "table": table, "dt": date}
            if fmt == "parquet":
                write_parquet(folder, events, manifest, objects=True)
            else:
                write_jsonl(folder, events, manifest, gz)


def write_snapshots(root: Path, date: str, snapshots: dict[str, dict[str, list[dict]]]) -> None:
    """A night's replica snapshots (``{replica: {table: [rows]}}``, docs/rules.md#convergence):
    each replica's full copy of a table, as JSON lines (a row may lack a column its
    replica's table lacks)."""
    for replica, tables in snapshots.items():
        for table, rows in tables.items():
            folder = root / f"exports/replica={replica}/table={table}/snapshot/dt={date}"
            write_jsonl(folder, rows, {"replica": replica, "table": table, "dt": date})


def layout_store(s: dict[str, Any], root: Path, gz: bool = False, fmt: str = "jsonl") -> None:
    for table, rows in (s.get("prior_state") or {}).items():
        if fmt == "parquet":
            write_parquet(root / f"base/table={table}", rows, {"table": table}, objects=False)
        else:
            write_jsonl(root / f"base/table={table}", rows, {"table": table}, gz)
    for night in [*s.get("history", []), s]:
        write_exports(root, night["date"], night["exports"], gz, fmt)
        write_snapshots(root, night["date"], night.get("snapshots") or {})


def config_file(s: dict[str, Any], root: Path, path: Path) -> Path:
    return configs.write(path, s["config"], store=root)


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


def snapshot_rows(store: Any, table: str) -> list[dict[str, Any]]:
    """The rows of a table's current snapshot in any store (``pipeline.storage.store``), sorted."""
    rows = P.snapshot(store, table)
    return sorted(rows, key=lambda r: json.dumps(r, sort_keys=True, default=str))


def cdr_run_snapshots(store: Any, day: str, tmp: Path, tables: tuple[str, ...]) -> dict[str, list]:
    """What ``cdr run`` publishes for ``day`` from the same bytes: the base snapshots and
    that date's exports of an S3 ``store`` copied to a new bucket, run with the demo
    config (the Airflow tests compare the DAG's snapshots with it)."""
    import boto3

    from pipeline.app.cli import main
    from pipeline.app.demo import DEMO_CONFIG
    from pipeline.storage.store import open_store

    bucket = f"{store.bucket}-cli"
    boto3.client("s3").create_bucket(Bucket=bucket)
    copy = open_store(f"s3://{bucket}/prod")
    for key in store.list("base") + store.list("exports"):
        if key.startswith("base/") or f"/dt={day}/" in key:
            copy.write_bytes(key, store.read_bytes(key))
    cfg = configs.write(tmp / "cli.yaml", DEMO_CONFIG, store=copy.uri)
    args = ["run", "--config", str(cfg), "--date", day, "--no-data-docs"]
    assert main([*args, "--work-dir", str(tmp / "cli-work")]) == 0
    return {t: snapshot_rows(copy, t) for t in tables}


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
    report = date_report(root, d)
    for t, spec in s["config"]["tables"].items():
        if P.snapshot_date(root, t) == d:
            out["snapshot"][t] = P.snapshot(root, t)
        if spec.get("history"):
            out.setdefault("history", {})[t] = history_rows(root, t)
        if report is None:
            continue
        conf = log_rows(root, report, t, "conflicts")
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
        q = log_rows(root, report, t, "quarantine")
        if q:
            out["quarantine"][t] = [{"event_id": r["event_id"], "reason": r["reason"]} for r in q]
        for r in log_rows(root, report, t, "divergence"):
            causes = json.loads(r["evidence"])["causes"] if r.get("evidence") else []
            out.setdefault("causes", {}).setdefault(t, {}).setdefault(r["replica"], []).append(
                {"key": json.loads(r["key"]), "source": r["source"], "causes": causes}
            )
            if r["source"] == "perspective":
                out["divergent_keys"].setdefault(t, {}).setdefault(r["replica"], []).append(
                    json.loads(r["key"])
                )
    if report is not None:
        out["status"] = str(report.status)
        for t, ts in report.tables.items():
            out.setdefault("clock_skew", {})[t] = ts.clock_skew
            out.setdefault("arrived_late", {})[t] = dict(ts.arrived_late)
            out.setdefault("repaired", {})[t] = ts.repaired
            if ts.orphans:
                orphan_rows = log_rows(root, report, t, "orphans")
                out["orphans"][t] = [json.loads(r["key"]) for r in orphan_rows]
    return out


def history_rows(root: Path, table: str) -> list[dict[str, Any]]:
    """A table's history (docs/outputs.md#history) as a golden file writes it: instants as
    RFC 3339 text, ``dt`` as a date's text; ``_run_id`` checked (this run's, or an
    earlier night's) and left out, since it is made at run time."""
    out = []
    for r in P.rows(root, f"published/{table}/history"):
        assert r.pop("_run_id"), r
        for c in ("_valid_from", "_valid_to", "_ts"):
            v = r[c]
            r[c] = (
                None if v is None else v.strftime("%Y-%m-%dT%H:%M:%S.%fZ").replace(".000000Z", "Z")
            )
        r["dt"] = r["dt"].isoformat()
        out.append(r)
    return out


def _canon(v: Any) -> Any:
    """A value with its type, so that equal means equal type and equal text: a decimal
    keeps its scale, ``"1"`` differs from ``1``, ``True`` from ``1``."""
    from datetime import date, datetime
    from decimal import Decimal

    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, Decimal):
        return ["decimal", str(v)]
    if isinstance(v, datetime | date):
        return [type(v).__name__, v.isoformat()]
    if isinstance(v, bytes):
        return ["bytes", v.hex()]
    if isinstance(v, float):
        return ["float", repr(v)]
    if isinstance(v, int):
        return ["int", v]
    if isinstance(v, str):
        return ["str", v]
    return ["other", repr(v)]


def typed(row: dict[str, Any], table: dict[str, Any]) -> dict[str, Any]:
    """An expected row (JSON values) as the pipeline publishes it: each column as its
    configured type (docs/adapters.md), ``_ts`` an integer; a value that does not fit its type
    is kept as it is, so that it cannot match."""
    from pipeline.core.kinds import Kind, coerce_value, parse_column_type

    out = {}
    for k, v in row.items():
        out[k] = v
        if k not in table["columns"]:
            continue
        ctype = parse_column_type(table["columns"][k])
        if ctype.kind in (Kind.STRING, Kind.UUID) and not isinstance(v, str):
            continue  # coerce_value would make text of anything
        with contextlib.suppress(ValueError, TypeError):  # kept as is: it cannot match
            out[k] = coerce_value(ctype, v)
    return out


def _row_key(r: dict[str, Any]) -> str:
    return json.dumps({k: _canon(v) for k, v in sorted(r.items())}, sort_keys=True)


def multiset(rows: list[dict[str, Any]], table: dict[str, Any] | None = None) -> Counter[str]:
    """Rows as a multiset; with ``table``, typed by its schema first (see :func:`typed`)."""
    return Counter(_row_key(typed(r, table) if table else r) for r in rows)


def _conflict_rows(rows: list[dict[str, Any]], table: dict[str, Any]) -> Counter[str]:
    return Counter(_row_key({**r, "key": _row_key(typed(r["key"], table))}) for r in rows)


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
            if multiset(rows) != multiset(want, tables[t]):
                diffs.append(f"snapshot {t}: got {rows}, want {want}")
    for t, want_h in ({} if exp.get("fails") else exp.get("history", {})).items():
        got_h = got.get("history", {}).get(t, [])
        if multiset(got_h) != multiset(want_h, tables[t]):
            diffs.append(f"history {t}: got {sorted(got_h, key=_row_key)}, want {want_h}")
    for t, want_s in exp.get("clock_skew", {}).items():  # clock skew: where a scenario names it
        if got.get("clock_skew", {}).get(t) != want_s:
            diffs.append(f"clock_skew {t}: got {got.get('clock_skew', {}).get(t)}, want {want_s}")
    diffs += _seen_again(exp, got)
    for t in tables:
        spec = tables[t]
        if "causes" in exp:  # docs/rules.md#divergence-causes: where a scenario names them
            want_k = _cause_rows(exp["causes"].get(t, {}))
            got_k = _cause_rows(got.get("causes", {}).get(t, {}))
            if want_k != got_k:
                diffs.append(f"causes {t}: got {dict(got_k)}, want {dict(want_k)}")
        want_c = _conflict_rows(exp.get("conflicts", {}).get(t, []), spec)
        got_c = _conflict_rows(got["conflicts"].get(t, []), spec)
        if exp.get("fails"):
            if want_c - got_c:
                diffs.append(f"conflicts {t}: missing {dict(want_c - got_c)}")
        elif want_c != got_c:
            diffs.append(f"conflicts {t}: got {dict(got_c)}, want {dict(want_c)}")
        want_q = multiset(exp.get("quarantine", {}).get(t, []))
        got_q = multiset(got["quarantine"].get(t, []))
        if want_q != got_q:
            diffs.append(f"quarantine {t}: got {dict(got_q)}, want {dict(want_q)}")
        want_d = {
            r: multiset(ks, spec) for r, ks in exp.get("divergent_keys", {}).get(t, {}).items()
        }
        got_d = {r: multiset(ks, spec) for r, ks in got["divergent_keys"].get(t, {}).items()}
        if want_d != got_d:
            diffs.append(f"divergent_keys {t}: got {got_d}, want {want_d}")
        want_o = multiset(exp.get("orphans", {}).get(t, []), spec)
        got_o = multiset(got["orphans"].get(t, []), spec)
        if want_o != got_o:
            diffs.append(f"orphans {t}: got {dict(got_o)}, want {dict(want_o)}")
    return diffs


def _cause_rows(by_replica: dict[str, list[dict[str, Any]]]) -> Counter[str]:
    """Divergence rows as (replica, source, key, causes), comparable as a multiset."""
    return Counter(
        json.dumps([rep, r["source"], r["key"], r["causes"]], sort_keys=True)
        for rep, rows in by_replica.items()
        for r in rows
    )


def _seen_again(exp: dict[str, Any], got: dict[str, Any]) -> list[str]:
    """The copies a night counts apart (docs/rules.md#divergence-causes, docs/operations.md#repair),
    where a scenario names them: ``arrived_late`` per table and replica, ``repaired`` per
    table."""
    diffs = []
    for what in ("arrived_late", "repaired"):
        for t, want in exp.get(what, {}).items():
            if got.get(what, {}).get(t) != want:
                diffs.append(f"{what} {t}: got {got.get(what, {}).get(t)}, want {want}")
    return diffs


# ------------------------------------------------------------------- running them


def run_scenario(
    s: dict, tmp: Path, gz: bool = False, cli=None, fmt: str = "jsonl", docs: bool = False
) -> tuple[dict, bool]:
    """Lay the scenario out under ``tmp/store`` and ``cdr run`` its dates in order;
    ``docs`` builds the Data Docs (the scenario tests do not look at them)."""
    from pipeline.app.cli import main

    store = tmp / "store"
    store.mkdir()
    layout_store(s, store, gz=gz, fmt=fmt)
    cfg = config_file(s, store, tmp / "cdr.yaml")
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
        if missing_exports(s, r["exports"]):
            args.append("--allow-missing-exports")  # the scenario's replica exported nothing
        if not docs:
            args.append("--no-data-docs")
        failed = (cli or main)(args) != 0
    return published(store, s), failed


def scenario_format(path: Path, s: dict) -> str:
    """One scenario in four (of those whose records fit Parquet rows) is exported as
    canonical Parquet, with a Parquet base snapshot; the others as JSONL."""
    ready = [p for p in scenario_files() if parquet_ready(json.loads(p.read_text()))]
    return "parquet" if path in ready[::4] and parquet_ready(s) else "jsonl"


#: scenarios whose runs other tests read (the validation tests): run once, with the
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
        consumer.seed([typed(r, spec) for r in (s.get("prior_state") or {}).get(t, [])])
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
