"""Hostile and broken export files, through ``cdr run`` (issue 16): each gives a clear
reason naming the file (and the line, for a record), and nothing else is lost: a bad record
is quarantined and the run goes on; a bad file stops the run before anything is
published."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.app.cli import main
from pipeline.core.report import RunReport
from pipeline.storage.store import open_store
from tests.helpers import configs
from tests.helpers import published as P
from tests.helpers.sources import lines, put_export
from tests.unit.test_hostile import CONFIG

D = "2026-11-21"
FOLDER = f"exports/replica=pub/table=t/dt={D}"
NOT_UTF8 = b'{"replica": "pub", "table": "t", "format": "jsonl", "files": [], "x": "\xff"}'


def record(i: int, v: str = "a") -> dict:
    return {
        "op": "INSERT",
        "key": {"id": i},
        "after": {"id": i, "v": v},
        "ts": "2026-11-21T10:00:00Z",
        "origin": "pub",
        "event_id": f"pub-{i}",
        "seq": i,
    }


def cdr_run(tmp_path: Path, store: Path, **settings: object) -> int:
    """``cdr run`` of the date over ``store``, with ``CONFIG`` and ``settings``."""
    cfg = configs.write(tmp_path / "cdr.yaml", CONFIG, store=store, **settings)
    argv = ["run", "--config", str(cfg), "--date", D, "--work-dir", str(tmp_path / "work")]
    return main([*argv, "--no-data-docs"])


def debezium_lines(second: str) -> tuple[bytes, int]:
    """Three Debezium inserts of ``t`` (ids 1-3), the second with ``v = second``."""
    from tests.helpers.sources import Change, Debezium

    dbz = Debezium("t", ["id"], {"id": "int", "v": "string"}, schema=False)
    ts = 1795255200000000
    changes = [
        Change("t", "I", None, {"id": i, "v": v}, ts + i, 700 + i, 10 + i)
        for i, v in ((1, "a"), (2, second), (3, "c"))
    ]
    return lines(dbz.records(changes))


def nothing_published(store: Path) -> bool:
    return not (store / "published/t").exists()


def test_a_line_that_is_not_utf8_is_quarantined_naming_its_file_and_line(tmp_path: Path, spark):
    """Tried: the run applied it with U+FFFD in the published row. Its bytes are kept in
    the quarantine's event, escaped."""
    store = tmp_path / "store"
    good, n = lines([record(1), record(2, "caf@"), record(3)])
    data = good.replace(b"caf@", b"caf\xe9")  # Latin-1, not UTF-8
    put_export(open_store(store.as_uri()), "pub", "t", D, "jsonl", {"part-0.jsonl": (data, n)})
    assert cdr_run(tmp_path, store) == 0
    q = P.log(store, "t", "quarantine", D)
    assert [(r["reason"], r["event_id"]) for r in q] == [("malformed", None)]
    assert "part-0.jsonl line 2: not valid UTF-8" in q[0]["detail"]
    assert "caf\\xe9" in q[0]["event"]
    assert [r["id"] for r in P.snapshot(store, "t")] == [1, 3]


@pytest.mark.parametrize(
    "manifest, says",
    [
        (NOT_UTF8, "not UTF-8"),
        (b"replica: pub\n", "not valid JSON"),
    ],
    ids=["not-utf8", "not-json"],
)
def test_a_manifest_that_is_not_utf8_json_is_a_one_line_error_naming_it(
    tmp_path: Path, spark, capsys, manifest: bytes, says: str
):
    store = tmp_path / "store"
    (store / FOLDER).mkdir(parents=True)
    (store / FOLDER / "_manifest.json").write_bytes(manifest)
    assert cdr_run(tmp_path, store) == 1
    err = capsys.readouterr().err
    assert f"{FOLDER}/_manifest.json: {says}" in err
    assert "Traceback" not in err
    assert nothing_published(store)


@pytest.mark.parametrize("linked", ["file", "folder"])
def test_a_symlink_inside_a_file_export_is_refused_naming_it(tmp_path: Path, spark, capsys, linked):
    """Tried: it was followed and its rows published. A file (or a folder of files) of the
    export that is a symbolic link is refused like a path that escapes the folder."""
    store = tmp_path / "store"
    outside = tmp_path / "outside"
    outside.mkdir()
    data, n = lines([record(1)])
    (outside / "part-0.jsonl").write_bytes(data)
    name = "part-0.jsonl" if linked == "file" else "sub/part-0.jsonl"
    put_export(open_store(store.as_uri()), "pub", "t", D, "jsonl", {name: (data, n)})
    target = store / FOLDER / name
    if linked == "file":
        target.unlink()
        target.symlink_to(outside / "part-0.jsonl")
    else:
        target.unlink()
        target.parent.rmdir()
        target.parent.symlink_to(outside)
    assert cdr_run(tmp_path, store) == 1
    err = capsys.readouterr().err
    link = name if linked == "file" else "sub"
    assert f"{FOLDER}/{link} is a symbolic link: refused" in err
    assert nothing_published(store)


@pytest.mark.parametrize(
    "fmt, name, options",
    [
        ("jsonl", "part-0.jsonl", None),
        ("parquet", "part-0.parquet", None),
        ("debezium", "part-0.json", None),
        ("wal2json", "part-0.json", None),
        ("dms", "part-0.csv", {"timestamp_column": "commit_ts"}),
        ("dms", "part-0.parquet", {"timestamp_column": "commit_ts"}),
    ],
)
def test_a_zero_byte_file_listed_with_no_rows_is_an_empty_file(
    tmp_path: Path, spark, fmt, name, options
):
    """Tried: JSONL passed, Parquet and DMS CSV failed. A file of no bytes that its
    manifest lists with ``rows: 0`` holds no records, whatever the format; the export's
    other file is applied."""
    store = tmp_path / "store"
    s = open_store(store.as_uri())
    put_export(s, "pub", "t", D, fmt, {name: (b"", 0)}, options)
    data, n = lines([record(1)])
    put_export(s, "sub", "t", D, "jsonl", {"part-0.jsonl": (data, n)})
    assert cdr_run(tmp_path, store) == 0
    assert [r["id"] for r in P.snapshot(store, "t")] == [1]
    report = RunReport.from_json((store / f"published/reports/dt={D}/run_report.json").read_text())
    assert report.tables["t"].replicas["pub"]["records"] == 0


def test_a_parquet_file_that_is_cut_short_names_the_file(tmp_path: Path, spark, capsys):
    """Not a zero-byte file: bytes that are not Parquet stop the run, naming the file."""
    store = tmp_path / "store"
    buf = io.BytesIO()
    pq.write_table(pa.table({"x": [1, 2, 3]}), buf)
    cut = buf.getvalue()[:20]
    put_export(open_store(store.as_uri()), "pub", "t", D, "parquet", {"part-0.parquet": (cut, 3)})
    assert cdr_run(tmp_path, store) == 1
    assert "part-0.parquet" in capsys.readouterr().err
    assert nothing_published(store)


def test_a_line_over_max_record_bytes_is_quarantined_without_being_read_whole(
    tmp_path: Path, spark
):
    """A line longer than ``max_record_bytes`` is malformed: its first bytes are kept in
    the quarantine, the rest is skipped as it is read (the task holds at most the limit
    and one read chunk of it), and the lines after it are records as usual."""
    store = tmp_path / "store"
    huge = json.dumps(record(2, "x" * 3_000_000)).encode()  # longer than a read chunk
    data = b"\n".join([json.dumps(record(1)).encode(), huge, json.dumps(record(3)).encode()])
    put_export(open_store(store.as_uri()), "pub", "t", D, "jsonl", {"part-0.jsonl": (data, 3)})
    assert cdr_run(tmp_path, store, max_record_bytes=1000) == 0
    q = P.log(store, "t", "quarantine", D)
    assert [r["reason"] for r in q] == ["malformed"]
    assert f"part-0.jsonl line 2: {len(huge)} bytes, over max_record_bytes (1000)" in q[0]["detail"]
    assert q[0]["event"].startswith('{"op": "INSERT"') and len(q[0]["event"]) < 2000
    assert [r["id"] for r in P.snapshot(store, "t")] == [1, 3]


def test_a_debezium_line_that_is_not_utf8_is_quarantined_naming_its_line(tmp_path: Path, spark):
    """The adapters' formats too: the line is staged with its bytes escaped and the
    reason, and the adapter quarantines it (it was applied with U+FFFD)."""
    store = tmp_path / "store"
    good, n = debezium_lines("caf@")
    data = good.replace(b"caf@", b"caf\xe9")
    put_export(open_store(store.as_uri()), "pub", "t", D, "debezium", {"part-0.json": (data, n)})
    assert cdr_run(tmp_path, store) == 0
    q = P.log(store, "t", "quarantine", D)
    assert [r["reason"] for r in q] == ["malformed"]
    assert "part-0.json:2: not valid UTF-8 (byte 0xe9" in q[0]["detail"], q[0]["detail"]
    assert "caf\\xe9" in q[0]["event"]
    assert [r["id"] for r in P.snapshot(store, "t")] == [1, 3]


def test_a_dms_csv_record_that_is_not_utf8_is_quarantined_naming_its_line(tmp_path: Path, spark):
    """DMS CSV too: the record is quarantined with its bytes escaped; the file's other
    records are applied (it stopped the run as an unreadable CSV file)."""
    store = tmp_path / "store"
    data = (
        b"Op,commit_ts,id,v\n"
        b"I,2026-11-21 10:00:00.000001,1,a\n"
        b"I,2026-11-21 10:00:00.000002,2,caf\xe9\n"
        b"I,2026-11-21 10:00:00.000003,3,c\n"
    )
    s = open_store(store.as_uri())
    put_export(s, "pub", "t", D, "dms", {"LOAD.csv": (data, 3)}, {"timestamp_column": "commit_ts"})
    assert cdr_run(tmp_path, store) == 0
    q = P.log(store, "t", "quarantine", D)
    assert [r["reason"] for r in q] == ["malformed"]
    assert (
        "LOAD.csv:3: not a CSV record of this export: not valid UTF-8 (column v: byte 0xe9"
        in q[0]["detail"]
    )
    assert "caf\\xe9" in q[0]["event"]
    assert [r["id"] for r in P.snapshot(store, "t")] == [1, 3]


@pytest.mark.parametrize(
    "later_first, policy", [(False, "postgres"), (True, "postgres"), (True, "scylla")]
)
def test_copies_of_one_event_that_differ_in_one_export_the_highest_seq_stands(
    tmp_path: Path, spark, later_first: bool, policy: str
):
    """Two copies of one event in one replica's export, with different values: the copy
    with the highest ``seq`` of that export stands, wherever it is in the file (the choice
    was the sort's)."""
    store = tmp_path / "store"
    old = {**record(1, "old"), "seq": 1}
    new = {**record(1, "new"), "seq": 5}
    data, n = lines([new, old] if later_first else [old, new])
    put_export(open_store(store.as_uri()), "pub", "t", D, "jsonl", {"part-0.jsonl": (data, n)})
    assert cdr_run(tmp_path, store, tables={"t": configs.table(policy=policy)}) == 0
    assert [(r["id"], r["v"]) for r in P.snapshot(store, "t")] == [(1, "new")]
    report = RunReport.from_json((store / f"published/reports/dt={D}/run_report.json").read_text())
    pub = report.tables["t"].replicas["pub"]
    assert (pub["applied"], pub["duplicate"]) == (1, 1)
    # counted, and both versions kept for the operator, with their file and line
    assert report.tables["t"].differing_copies == 1
    kept = P.log(store, "t", "differing_copies", D)
    seen = {(r["seq"], r["standing"], json.loads(r["record"])["after"]["v"]) for r in kept}
    assert seen == {(5, True, "new"), (1, False, "old")}
    assert {(r["replica"], r["event_id"], r["file"]) for r in kept} == {
        ("pub", "pub-1", "part-0.jsonl")
    }
    assert sorted(r["line"] for r in kept) == [1, 2]


def test_identical_copies_of_one_event_are_only_duplicates(tmp_path: Path, spark):
    store = tmp_path / "store"
    data, n = lines([record(1), record(1), record(2)])
    put_export(open_store(store.as_uri()), "pub", "t", D, "jsonl", {"part-0.jsonl": (data, n)})
    assert cdr_run(tmp_path, store) == 0
    report = RunReport.from_json((store / f"published/reports/dt={D}/run_report.json").read_text())
    assert report.tables["t"].differing_copies == 0
    assert report.tables["t"].replicas["pub"]["duplicate"] == 1
    assert not (store / "published/t/differing_copies").exists()


def test_a_debezium_line_over_max_record_bytes_is_quarantined_naming_its_line(
    tmp_path: Path, spark
):
    """The adapters' lines have the limit too: staged with their first bytes and the
    reason, and quarantined by the adapter."""
    store = tmp_path / "store"
    data, n = debezium_lines("x" * 5000)
    put_export(open_store(store.as_uri()), "pub", "t", D, "debezium", {"part-0.json": (data, n)})
    assert cdr_run(tmp_path, store, max_record_bytes=1000) == 0
    q = P.log(store, "t", "quarantine", D)
    assert [r["reason"] for r in q] == ["malformed"]
    assert "part-0.json:2: " in q[0]["detail"] and "over max_record_bytes (1000)" in q[0]["detail"]
    assert len(q[0]["event"]) <= 1024
    assert [r["id"] for r in P.snapshot(store, "t")] == [1, 3]


BIG = 2**63 - 1


def update(n: int, origin: str, old: int, new: int, minute: int) -> dict:
    return {
        "op": "UPDATE",
        "key": {"id": 1},
        "before": {"bal": old},
        "after": {"bal": new, "v": f"by-{origin}-{n}"},
        "ts": f"2026-11-21T10:{minute:02d}:00Z",
        "origin": origin,
        "event_id": f"{origin}-{n}",
        "seq": n,
    }


def test_a_delta_past_the_columns_range_is_quarantined_naming_the_column(tmp_path: Path, spark):
    """Tried: a bigint balance pushed past 2^63-1 failed the whole run. The event whose
    delta would overflow is quarantined whole (its other columns are not written either),
    with a reason naming the column; the later events still apply."""
    store = tmp_path / "store"
    base = {**record(1), "after": {"id": 1, "v": "a", "bal": BIG - 10}}
    pub = [base, update(2, "pub", BIG - 10, BIG - 1, 2), update(3, "pub", BIG - 1, BIG - 4, 3)]
    sub = [update(1, "sub", BIG - 10, BIG - 5, 1)]
    s = open_store(store.as_uri())
    for rep, recs in (("pub", pub), ("sub", sub)):
        data, n = lines(recs)
        put_export(s, rep, "t", D, "jsonl", {"part-0.jsonl": (data, n)})
    table = configs.table({"id": "int", "v": "string", "bal": "bigint"}, delta=["bal"])
    assert cdr_run(tmp_path, store, tables={"t": table}) == 0
    q = P.log(store, "t", "quarantine", D)
    assert [(r["event_id"], r["reason"]) for r in q] == [("pub-2", "delta_overflow")]
    assert "part-0.jsonl line 2: the delta of column 'bal'" in q[0]["detail"]
    assert q[0]["detail"].endswith(f"would make it {BIG + 4}, past bigint")
    assert json.loads(q[0]["event"])["after"] == {"bal": BIG - 1, "v": "by-pub-2"}
    # +5 by sub, pub-2's +9 quarantined, pub-3's -3 applied (and its v)
    assert [(r["v"], r["bal"]) for r in P.snapshot(store, "t")] == [("by-pub-3", BIG - 8)]
    report = RunReport.from_json((store / f"published/reports/dt={D}/run_report.json").read_text())
    assert report.tables["t"].quarantined == {"delta_overflow": 1}


def run_on(tmp_path: Path, store: Path, dt: str, *flags: str) -> int:
    cfg = configs.write(tmp_path / "cdr.yaml", CONFIG, store=store)
    argv = ["run", "--config", str(cfg), "--date", dt, "--work-dir", str(tmp_path / "work")]
    return main([*argv, "--no-data-docs", *flags])


def put_day(store: Path, replica: str, dt: str, *ids: int, v: str = "a") -> None:
    recs = [
        {
            **record(i, v),
            "origin": replica,
            "event_id": f"{replica}-{dt}-{i}",
            "ts": f"{dt}T10:00:00Z",
        }
        for i in ids
    ]
    data, n = lines(recs)
    put_export(open_store(store.as_uri()), replica, "t", dt, "jsonl", {"part-0.jsonl": (data, n)})


@pytest.mark.parametrize("late", ["arrived", "changed"])
def test_an_export_that_arrives_or_changes_after_its_date_ran_stops_the_next_run(
    tmp_path: Path, spark, capsys, late: str
):
    """Tried: the next night ran on a state that misses (or contradicts) the late export,
    and said nothing. The next run compares the manifests of the dates it covers with what
    the published runs recorded, and names the replica, table and date to rerun; with
    ``--accept-late-exports`` it goes on, warns, and records the export as accepted."""
    store = tmp_path / "store"
    d1, d2, d3 = "2026-11-20", "2026-11-21", "2026-11-22"
    put_day(store, "pub", d1, 1)
    assert run_on(tmp_path, store, d1) == 0  # sub's export is missing, and allowed to be
    if late == "arrived":
        put_day(store, "sub", d1, 2)
    else:
        put_day(store, "pub", d1, 1, v="b")
    put_day(store, "pub", d2, 3)
    capsys.readouterr()
    assert run_on(tmp_path, store, d2) == 1
    err = capsys.readouterr().err
    who = "replica 'sub'" if late == "arrived" else "replica 'pub'"
    verb = "arrived" if late == "arrived" else "changed"
    assert f"{who}, table 't', {d1}: {verb} after its run" in err
    assert f"rerun {d1} and the dates after it" in err and "--accept-late-exports" in err
    assert P.last_run(store, d2) is None or P.last_run(store, d2)["status"] != "published"
    assert run_on(tmp_path, store, d2, "--accept-late-exports") == 0
    report = RunReport.from_json((store / f"published/reports/dt={d2}/run_report.json").read_text())
    assert any(f"{who}, table 't', {d1}: {verb} after its run" in w for w in report.warnings)
    put_day(store, "pub", d3, 4)
    assert run_on(tmp_path, store, d3) == 0  # accepted once, not asked again


def test_a_rerun_of_the_late_date_then_the_next_needs_no_flag(tmp_path: Path, spark):
    store = tmp_path / "store"
    d1, d2 = "2026-11-20", "2026-11-21"
    put_day(store, "pub", d1, 1)
    assert run_on(tmp_path, store, d1) == 0
    put_day(store, "sub", d1, 2)
    put_day(store, "pub", d2, 3)
    assert run_on(tmp_path, store, d1) == 0
    assert run_on(tmp_path, store, d2) == 0
    assert sorted(r["id"] for r in P.snapshot(store, "t")) == [1, 2, 3]


def test_hostile_records_are_quarantined_and_the_night_publishes(tmp_path: Path, spark):
    """docs/adapters.md: one export with a record of each hostile kind (a name given
    twice, an integer of 5,000 digits in the key, in ts and in seq, nesting 100,000 deep,
    a lone surrogate) between good ones: ``cdr run`` publishes, each hostile record is
    quarantined as malformed naming its problem, the good ones applied.
    (Before: Python's ValueError or RecursionError stopped every night.)"""
    store = tmp_path / "store"
    good = json.dumps(record(1))
    hostile = {
        "dup": json.dumps(record(2))[:-1] + ', "op": "DELETE"}',
        "huge-key": json.dumps(record(3)).replace('{"id": 3}', '{"id": 9' + "9" * 5000 + "}", 1),
        "huge-ts": json.dumps(record(4)).replace('"2026-11-21T10:00:00Z"', "9" * 5000),
        "huge-seq": json.dumps(record(5)).replace('"seq": 5', '"seq": ' + "9" * 5000),
        "deep": json.dumps(record(6))[:-1] + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}",
        "surrogate": json.dumps(record(7)).replace('"v": "a"', '"v": "\\ud800"'),
    }  # fmt: skip
    texts = [good, *hostile.values(), json.dumps(record(8))]
    data = "".join(t + "\n" for t in texts).encode()
    put_export(open_store(store.as_uri()), "pub", "t", D, "jsonl", {"part-0.jsonl": (data, 8)})
    assert cdr_run(tmp_path, store) == 0
    q = sorted(P.log(store, "t", "quarantine", D), key=lambda r: r["detail"])
    assert [r["reason"] for r in q] == ["malformed"] * len(hostile)
    details = " | ".join(r["detail"] for r in q)
    for said in (
        'duplicate key "op"',
        "nested too deep",
        "lone UTF-16 surrogate",
        "key.id",
        "ts '9999",
        "seq '9999",
    ):
        assert said in details, (said, details[:2000])
    assert [r["id"] for r in P.snapshot(store, "t")] == [1, 8]
