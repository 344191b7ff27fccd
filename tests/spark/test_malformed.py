"""Bad records are data: each goes to quarantine whole, with the reason of the first guard
that matched (docs/rules.md#conflict-types, docs/rules.md#what-is-quarantined), and nothing
else of the run is disturbed."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.app.cli import main
from pipeline.core.report import RunReport
from tests.helpers import configs
from tests.helpers import published as P

CONFIG = configs.config(
    configs.table(
        {"id": "int", "v": "string", "n": "int", "d": "date", "x": "decimal(5,2)"},
        not_null=["v"],
        delta=["n"],
    )
)
TS = "2026-11-21T10:00:00Z"


def good(i: int, **kw) -> dict:
    e = {
        "op": "INSERT",
        "key": {"id": i},
        "after": {"id": i, "v": "a", "n": 1, "d": "2026-01-01", "x": 1.5},
        "ts": TS,
        "origin": "pub",
        "event_id": f"pub-{i}",
        "seq": i,
    }
    e.update(kw)
    return e


BAD = {
    "not-json": ("{not json", "not a JSON object"),
    "no-id": (good(2, event_id=None), "no event_id"),
    "op": (good(3, op="UPSERT"), "unknown op 'UPSERT'"),
    "op-null": (good(16, op=None), "unknown op 'null'"),
    "seq-text": (good(17, seq="x7"), "seq 'x7' is not an integer"),
    "origin": (good(4, origin="elsewhere"), "origin 'elsewhere' is not a configured replica"),
    "ts-no-offset": (good(5, ts="2026-11-21T10:00:00"), "RFC 3339 with a UTC offset"),
    "no-key": ({k: v for k, v in good(6).items() if k != "key"}, "no key"),
    "key-null": (good(7, key={"id": None}), "key.id is null"),
    "key-extra": (good(8, key={"id": 8, "z": 1}), "key has columns [id, z]"),
    "key-type": (good(9, key={"id": "nine"}), "key.id: 'nine' is not int"),
    "value-type": (
        good(10, after={"id": 10, "v": "a", "n": 1, "d": "tomorrow", "x": 1}),
        "after.d: 'tomorrow' is not date",
    ),
    "not-null": (
        good(11, after={"id": 11, "v": None, "n": 1, "d": "2026-01-01", "x": 1}),
        "after.v is null in a NOT NULL column",
    ),
    "contradicts": (
        good(12, after={"id": 99, "v": "a", "n": 1, "d": "2026-01-01", "x": 1}),
        "after.id = '99' contradicts the key '12'",
    ),
    "new-key-insert": (good(13, new_key={"id": 14}), "new_key on 'INSERT'"),
    "overflow": (
        good(15, after={"id": 15, "v": "a", "n": 1, "d": "2026-01-01", "x": 12345.6}),
        "after.x: '12345.6' is not decimal(5,2)",
    ),
}


def test_malformed_records_are_quarantined_with_their_reason(tmp_path: Path, spark):
    store = tmp_path / "store"
    lines = [
        good(1),
        *[v[0] for v in BAD.values()],
        good(20, op="UPDATE", after={"n": 5}, ts="2026-11-21T11:00:00Z", seq=20),  # no old
        good(21, ts="2026-11-23T10:00:00Z", seq=21),  # future
        good(22, ts="2026-10-01T10:00:00Z", seq=22),
    ]  # stale
    folder = store / "exports/replica=pub/table=t/dt=2026-11-21"
    folder.mkdir(parents=True)
    text = "".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n" for ln in lines)
    (folder / "part-0.jsonl").write_text(text)
    import hashlib

    (folder / "_manifest.json").write_text(
        json.dumps(
            {
                "replica": "pub",
                "table": "t",
                "dt": "2026-11-21",
                "format": "jsonl",
                "files": [
                    {
                        "path": "part-0.jsonl",
                        "rows": len(lines),
                        "sha256": hashlib.sha256(text.encode()).hexdigest(),
                    }
                ],
            }
        )
    )
    # 19 of the 20 records are quarantined on purpose: the night fails on the share
    # unless told (docs/operations.md#a-loud-quarantine), and still warns
    configs.write(tmp_path / "cdr.yaml", CONFIG, store=store, quarantine_share={"fail": 1})
    rc = main(
        [
            "run",
            "--config",
            str(tmp_path / "cdr.yaml"),
            "--date",
            "2026-11-21",
            "--work-dir",
            str(tmp_path / "work"),
            "--allow-missing-exports",
            "--no-data-docs",
        ]
    )
    assert rc == 0
    q = P.log(store, "t", "quarantine", "2026-11-21")
    details = {r["detail"] for r in q}
    for name, (_rec, want) in BAD.items():
        assert any(want in d for d in details), (name, want, sorted(details))
    reasons = {(r["event_id"], r["reason"]) for r in q}
    assert ("pub-20", "delta_without_old_value") in reasons
    assert ("pub-21", "future_timestamp") in reasons
    assert ("pub-22", "stale_beyond_gc_grace") in reasons
    assert all(
        r["reason"] == "malformed" for r in q if r["event_id"] not in ("pub-20", "pub-21", "pub-22")
    )
    assert len(q) == len(lines) - 1  # every record but the good one, each kept whole
    written = [ln if isinstance(ln, str) else json.dumps(ln) for ln in lines]
    numbered = {text: n for n, text in enumerate(written, 1)}
    for r in q:  # each names its file and line (issue 49)
        assert r["detail"].startswith(f"part-0.jsonl line {numbered[r['event']]}: "), r
    assert {r["event"] for r in q} >= {"{not json"}
    snap = P.snapshot(store, "t")
    assert [r["id"] for r in snap] == [1]
    path = store / "published/reports/dt=2026-11-21/run_report.json"
    report = RunReport.from_json(path.read_text())
    assert any("quarantine_share_warn" in w for w in report.warnings)
    t = report.tables["t"]
    assert t.replicas["pub"]["records"] == len(lines)
    assert t.replicas["pub"]["applied"] + t.replicas["pub"]["quarantined"] == len(lines)


def test_a_base_row_that_does_not_fit_stops_the_run_naming_its_line(tmp_path: Path, spark, capsys):
    """The base snapshot is the operator's input, not replicated data: a row that does
    not fit the schema stops the run (docs/outputs.md), naming the file and line, and
    nothing is published."""
    from tests.helpers import scenarios as S

    store = tmp_path / "store"
    row = {"id": 1, "v": "a", "n": 1, "d": "2026-01-01", "x": 1.5}
    S.write_jsonl(store / "base/table=t", [row, {**row, "id": 2, "n": "two"}], {"table": "t"})
    S.write_exports(store, "2026-11-21", {"pub": {"t": [good(3)]}, "sub": {"t": []}})
    configs.write(tmp_path / "cdr.yaml", CONFIG, store=store)
    args = ["run", "--config", str(tmp_path / "cdr.yaml"), "--date", "2026-11-21"]
    rc = main([*args, "--work-dir", str(tmp_path / "work"), "--no-data-docs"])
    assert rc == 1
    err = capsys.readouterr().err
    assert "base/table=t/part-0000.jsonl, line 2: a row does not fit the table's schema" in err
    assert P.snapshot_date(store, "t") is None
