"""``cdr manifest`` (docs/sealing.md) on a folder store: each layout's objects as the tool
writes them, which of them a date's export holds and when the date is sealed; the
manifest (rows, sha256 of each copied file) as ``read_manifest`` reads it; idempotence,
the refusal of a manifest that lacks files, ``--late``, the waiting message; the config's
checks of a ``source``."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import pytest

from pipeline.app.cli import main
from pipeline.core import layout
from pipeline.core.config_load import parse_config
from pipeline.core.errors import ConfigError, ExportError
from pipeline.core.sources import LAYOUTS, pattern_regex
from pipeline.ingest.manifests import read_manifest
from pipeline.ingest.seal import rerun_advice, seal_export, waiting_for
from tests.helpers import configs
from tests.helpers.cdc_tools import put_debezium, put_dms, put_wal2json

D = date(2026, 11, 21)
NOW = datetime(2026, 11, 22, 2, 0, tzinfo=UTC)
FOLDER = "cdc/pg1/t"  # the sink's topics.dir, then the table's folder


def at(day: int, hour: int) -> datetime:
    return datetime(2026, 11, day, hour, tzinfo=UTC)


def cfg(source: dict[str, Any] | None, **settings: Any) -> Any:
    reps = [{"id": "pg1", "system_id": 1}, {"id": "pg2", "system_id": 2}]
    if source is not None:
        reps[0]["source"] = {"prefix": "cdc/pg1", **source}
    return parse_config(configs.config(replicas=reps, **settings))


DEBEZIUM = {"layout": "debezium-s3-time"}


def manifest_of(store: Any, replica: str = "pg1", dt: date = D) -> dict[str, Any]:
    folder = layout.export_dir(replica, "t", dt)
    return read_manifest(store, folder, {"replica": replica, "table": "t", "dt": dt.isoformat()})


def test_debezium_waits_for_every_partition_then_seals_by_the_path_date(file_store):
    config = cfg(DEBEZIUM)
    a, a_bytes = put_debezium(file_store, FOLDER, at(21, 3), 0, 0, 3)
    b, b_bytes = put_debezium(file_store, FOLDER, at(21, 22), 1, 0, 2)
    put_debezium(file_store, FOLDER, at(20, 9), 0, 100, 1)  # the day before: not D's
    put_debezium(file_store, FOLDER, at(22, 0), 0, 3, 1)  # partition 0 moved on
    got = seal_export(config, file_store, "pg1", "t", D, NOW)
    assert got.status == "waiting"
    assert got.why == (
        f"partition 1 has written nothing after 2026-11-21 yet (its last object: {b})"
    )
    assert not file_store.exists(layout.export_manifest("pg1", "t", D))
    put_debezium(file_store, FOLDER, at(22, 1), 1, 2, 1)
    got = seal_export(config, file_store, "pg1", "t", D, NOW)
    assert got.status == "sealed" and got.files == (a, b)  # partition, then offset order
    m = manifest_of(file_store)
    assert m["format"] == "debezium"
    assert m["files"] == [
        {"path": a, "rows": 3, "sha256": hashlib.sha256(a_bytes).hexdigest()},
        {"path": b, "rows": 2, "sha256": hashlib.sha256(b_bytes).hexdigest()},
    ]
    copied = file_store.read_bytes(f"{layout.export_dir('pg1', 't', D)}/{a}")
    assert copied == a_bytes


def test_sealing_again_is_a_no_op_and_a_late_object_is_refused_then_added(file_store):
    config = cfg(DEBEZIUM)
    a, _ = put_debezium(file_store, FOLDER, at(21, 3), 0, 0, 3)
    put_debezium(file_store, FOLDER, at(22, 0), 0, 3, 1)
    assert seal_export(config, file_store, "pg1", "t", D, NOW).status == "sealed"
    key = layout.export_manifest("pg1", "t", D)
    before = file_store.read_bytes(key)
    again = seal_export(config, file_store, "pg1", "t", D, NOW)
    assert again.status == "unchanged" and file_store.read_bytes(key) == before
    late, late_bytes = put_debezium(file_store, FOLDER, at(21, 23), 1, 0, 4)
    with pytest.raises(ExportError, match=r"sealed without 1 object\(s\) of 2026-11-21.*--late"):
        seal_export(config, file_store, "pg1", "t", D, NOW)
    assert file_store.read_bytes(key) == before
    got = seal_export(config, file_store, "pg1", "t", D, NOW, late=True)
    assert got.status == "late" and got.files == (late,)
    assert "has not been published yet" in got.line()
    files = manifest_of(file_store)["files"]
    assert [f["path"] for f in files] == [a, late]  # the listed file kept, first
    assert files[1] == {"path": late, "rows": 4, "sha256": hashlib.sha256(late_bytes).hexdigest()}
    assert json.loads(before)["files"][0] == files[0]


def test_a_manifest_written_otherwise_is_not_replaced(file_store):
    config = cfg(DEBEZIUM)
    put_debezium(file_store, FOLDER, at(21, 3), 0, 0, 3)
    put_debezium(file_store, FOLDER, at(22, 0), 0, 3, 1)
    key = layout.export_manifest("pg1", "t", D)
    file_store.write_bytes(key, json.dumps({"format": "debezium", "files": []}).encode())
    with pytest.raises(ExportError, match="--late"):
        seal_export(config, file_store, "pg1", "t", D, NOW)
    file_store.write_bytes(key, json.dumps({"format": "jsonl", "files": []}).encode())
    with pytest.raises(ExportError, match="it was not sealed from this source"):
        seal_export(config, file_store, "pg1", "t", D, NOW, late=True)


def test_a_quiet_date_is_sealed_empty_and_grace_seals_an_idle_partition(file_store):
    config = cfg({**DEBEZIUM, "grace_hours": 3})
    put_debezium(file_store, FOLDER, at(20, 3), 0, 0, 1)
    early = seal_export(config, file_store, "pg1", "t", D, NOW)
    assert early.status == "waiting" and early.why.endswith("or at 2026-11-22T03:00Z (grace_hours)")
    got = seal_export(config, file_store, "pg1", "t", D, datetime(2026, 11, 22, 3, tzinfo=UTC))
    assert got.status == "sealed" and got.files == ()
    assert manifest_of(file_store)["files"] == []


def test_nothing_under_the_prefix_names_the_setting(file_store):
    with pytest.raises(ExportError, match=r"under .*/cdc/pg1/t .*replicas\[0\]\.source\.prefix"):
        seal_export(cfg(DEBEZIUM), file_store, "pg1", "t", D, NOW)
    with pytest.raises(ExportError, match="replica 'pg2' has no source"):
        seal_export(cfg(DEBEZIUM), file_store, "pg2", "t", D, NOW)


def test_debezium_field_partitions(file_store):
    config = cfg({"layout": "debezium-s3-field", "field": "applied"})
    a, _ = put_debezium(file_store, FOLDER, at(21, 3), 0, 0, 2, path="applied=2026-11-21")
    put_debezium(file_store, FOLDER, at(22, 3), 0, 2, 2, path="applied=2026-11-22")
    put_debezium(file_store, FOLDER, at(21, 3), 0, 9, 2, path="dt=2026-11-21")  # another field
    got = seal_export(config, file_store, "pg1", "t", D, NOW)
    assert got.status == "sealed" and got.files == (a,)


DMS = {"layout": "dms", "options": {"timestamp_column": "commit_ts"}}


def test_dms_dates_a_file_by_when_dms_wrote_it(file_store):
    config = cfg(DMS)
    a = put_dms(file_store, FOLDER, at(21, 10), [("I", 1), ("U", 1), ("D", 1)])
    b = put_dms(file_store, FOLDER, at(21, 23), [("I", 2)])
    file_store.write_bytes(f"{FOLDER}/public/t/LOAD00000001.csv", b"id,v\n1,a\n")  # full load
    got = seal_export(config, file_store, "pg1", "t", D, NOW)
    assert got.status == "waiting" and got.why.startswith("DMS has written nothing after")
    # written after midnight into the folder of its transactions' commit date: the next date's
    after = put_dms(file_store, FOLDER, at(22, 0), [("I", 3)])
    file_store.copy(f"{FOLDER}/{after}", f"{FOLDER}/public/t/2026/11/21/{after.rsplit('/')[-1]}")
    file_store.delete([f"{FOLDER}/{after}"])
    got = seal_export(config, file_store, "pg1", "t", D, NOW)
    assert got.status == "sealed" and got.files == (a, b)
    m = manifest_of(file_store)
    assert m["format"] == "dms" and m["options"] == {"timestamp_column": "commit_ts"}
    assert [f["rows"] for f in m["files"]] == [3, 1]  # records, the header aside


def test_dms_options_are_checked_naming_the_setting(file_store):
    put_dms(file_store, FOLDER, at(21, 10), [("I", 1)])
    with pytest.raises(ExportError, match=r"replicas\[0\]\.source\.options.*timestamp_column"):
        seal_export(cfg({"layout": "dms"}), file_store, "pg1", "t", D, NOW)


WAL2JSON = {"layout": "wal2json", "pattern": "slot-{date}.json"}


def test_wal2json_is_sealed_when_the_receiver_moved_to_the_next_file(file_store):
    config = cfg(WAL2JSON)
    rel = put_wal2json(file_store, FOLDER, D, 7, [1, 2])
    got = seal_export(config, file_store, "pg1", "t", D, NOW)
    assert got.status == "waiting"
    assert (
        got.why
        == f"pg_recvlogical has written nothing after 2026-11-21 yet (its last object: {rel})"
    )
    put_wal2json(file_store, FOLDER, date(2026, 11, 22), 8, [3])
    assert seal_export(config, file_store, "pg1", "t", D, NOW).status == "sealed"
    (entry,) = manifest_of(file_store)["files"]
    assert entry["path"] == rel and entry["rows"] == 4  # B, two changes, C


GLOB = {"layout": "glob", "pattern": "**/changes-{yyyy}{mm}{dd}-*.jsonl", "format": "jsonl"}


def test_glob_is_sealed_by_hand_or_grace(file_store):
    config = cfg(GLOB)
    file_store.write_bytes(f"{FOLDER}/x/changes-20261121-1.jsonl", b'{"a": 1}\n\n{"a": 2}\n')
    file_store.write_bytes(f"{FOLDER}/x/changes-20261122-1.jsonl", b'{"a": 3}\n')
    file_store.write_bytes(f"{FOLDER}/x/.changes-20261121-2.jsonl.tmp", b"{}\n")  # in flight
    got = seal_export(config, file_store, "pg1", "t", D, NOW)
    assert got.status == "waiting" and "cdr manifest --seal" in got.why
    dry = seal_export(config, file_store, "pg1", "t", D, NOW, by_hand=True, dry_run=True)
    assert dry.status == "would seal" and not file_store.list("exports")
    got = seal_export(config, file_store, "pg1", "t", D, NOW, by_hand=True)
    assert got.files == ("x/changes-20261121-1.jsonl",)
    assert manifest_of(file_store)["files"][0]["rows"] == 2


def test_pattern_placeholders_and_globs():
    rx = pattern_regex("a/*/{date}.json*")
    assert rx.match("a/b/2026-11-21.json.gz")["date"] == "2026-11-21"
    assert not rx.match("a/b/c/2026-11-21.json")


def test_the_sensor_waits_on_the_tool_for_a_source_and_on_manifests_otherwise(file_store):
    config = cfg(DEBEZIUM)
    put_debezium(file_store, FOLDER, at(21, 3), 0, 0, 3)
    assert waiting_for(config, file_store, D, NOW) == [
        "pg1/t 2026-11-21: partition 0 has written nothing after 2026-11-21 yet (its last "
        f"object: {put_debezium(file_store, FOLDER, at(21, 3), 0, 0, 3)[0]})",
        layout.export_manifest("pg2", "t", D),
    ]
    put_debezium(file_store, FOLDER, at(22, 0), 0, 3, 1)
    assert waiting_for(config, file_store, D, NOW) == [layout.export_manifest("pg2", "t", D)]
    seal_export(config, file_store, "pg1", "t", D, NOW)
    file_store.write_bytes(layout.export_manifest("pg2", "t", D), b"{}")
    assert waiting_for(config, file_store, D, NOW) == []


def test_cdr_manifest_prints_each_export_and_exits_1_while_waiting(file_store, tmp_path, capsys):
    data = configs.config(
        replicas=[{"id": "pg1", "system_id": 1, "source": {"prefix": "cdc/pg1", **DEBEZIUM}}],
        store=file_store.uri,
    )
    path = configs.write(tmp_path / "cdr.yaml", data)
    put_debezium(file_store, FOLDER, at(21, 3), 0, 0, 3)
    args = ["manifest", "--config", str(path), "--date", "2026-11-21"]
    assert main(args) == 1
    assert (
        "pg1/t 2026-11-21: waiting (partition 0 has written nothing after"
        in capsys.readouterr().out
    )
    put_debezium(file_store, FOLDER, at(22, 0), 0, 3, 1)
    assert main(args) == 0
    assert "pg1/t 2026-11-21: sealed 1 file(s) (every writer" in capsys.readouterr().out
    assert main([*args, "--replica", "nope"]) == 1
    assert "replica 'nope' has no source" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        ({"layout": "kafka"}, "replicas[0].source.layout: Input should be"),
        ({"layout": "glob", "format": "jsonl"}, "replicas[0].source.pattern: layout glob needs"),
        ({"layout": "glob", "pattern": "{date}.json"}, "replicas[0].source.format: layout glob"),
        (
            {**DEBEZIUM, "format": "dms"},
            "replicas[0].source.format: layout debezium-s3-time writes",
        ),
        ({**DEBEZIUM, "pattern": "{date}"}, "replicas[0].source.pattern: layout debezium-s3-time"),
        ({**WAL2JSON, "pattern": "slot.json"}, "replicas[0].source.pattern: must hold {date}"),
        ({**WAL2JSON, "pattern": "{day}.json"}, "replicas[0].source.pattern: unknown placeholder"),
        (
            {**DEBEZIUM, "prefix": "s3://b/cdc"},
            "replicas[0].source.prefix: 's3://b/cdc' is a folder",
        ),
        ({**DEBEZIUM, "prefix": "a/../b"}, "replicas[0].source.prefix: 'a/../b' leaves"),
        ({**DEBEZIUM, "tables": {"u": "x"}}, "replicas[0].source.tables.u: no table 'u'"),
        ({**DEBEZIUM, "grace_hours": -1}, "replicas[0].source.grace_hours: Input should be"),
    ],
)
def test_a_bad_source_is_a_config_error_naming_its_path(source, problem):
    with pytest.raises(ConfigError) as e:
        cfg(source)
    assert any(p.startswith(problem) for p in e.value.problems), e.value.problems


def test_a_source_changes_no_digest_and_names_the_table_folder():
    plain, sourced = cfg(None), cfg({**DEBEZIUM, "tables": {"t": "topics/pg1.public.t/"}})
    assert plain.digest() == sourced.digest()
    assert sourced.sources["pg1"].folder("t") == "cdc/pg1/topics/pg1.public.t"


def test_the_page_states_each_layouts_rule_as_the_table_does():
    page = (Path(__file__).parents[2] / "docs" / "sealing.md").read_text()
    for name, rule in LAYOUTS.items():
        assert f"| `{name}` | `{rule.format or 'source.format'}` | {rule.doc} |" in page, name


def test_late_files_of_a_published_date_name_the_dates_to_rerun_in_the_late_flows_words():
    text = rerun_advice(D, (D, date(2026, 11, 22)))
    assert text == (
        "the state published since does not hold them: rerun 2026-11-21, 2026-11-22 in "
        "order (cdr run --date 2026-11-21 --then-later), or pass --accept-late-exports to "
        "the next run to go on without them"
    )
