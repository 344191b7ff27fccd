"""The adapters' manifest options (docs/adapters.md): each format's options are checked when the
manifest is read, naming the manifest; an export without the settings its ids need is
refused, naming the setting (docs/adapters.md). (The records themselves: tests/spark/.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.core.config_load import parse_config
from pipeline.core.errors import ExportError
from pipeline.ingest.adapters import SettingsCheck, check_dms_columns, check_requirements
from pipeline.ingest.manifests import read_manifest
from pipeline.ingest.staging import stage_jsonl
from pipeline.storage.store import open_store
from tests.helpers import configs
from tests.helpers import sources as src

DT = "2026-11-21"


@pytest.mark.parametrize(
    "fmt, options, message",
    [
        ("dms", {}, "needs options.timestamp_column"),
        ("dms", {"timestamp_column": "t", "header": False}, "needs options.columns"),
        ("wal2json", {"origin": {}}, "options ['origin'] are not options of wal2json"),
        ("wal2json", {"origins": {"x": "pg1"}}, "maps replication origin ids"),
        ("debezium", {"timestamp_column": "t"}, "(known: origins, transaction_metadata, unavail"),
        ("debezium", {"unavailable_value_placeholder": 1}, "must be a str"),
    ],
)
def test_manifest_options_are_checked(tmp_path: Path, fmt, options, message):
    store = open_store((tmp_path / "store").as_uri())
    src.put_export(store, "pg1", "items", DT, fmt, {"a.json": src.lines([{}])}, options)
    with pytest.raises(ExportError) as e:
        read_manifest(store, f"exports/replica=pg1/table=items/dt={DT}", {})
    assert message in str(e.value) and "_manifest.json" in str(e.value)


W2J = {"action": "B", "xid": 7, "timestamp": "2026-11-21 10:00:00+00", "origin": 0, "lsn": "0/1"}


@pytest.mark.parametrize("missing", ["xid", "timestamp", "origin", "lsn"])
def test_a_wal2json_export_without_an_include_option_is_refused_naming_it(tmp_path, missing):
    """Without ``include-origin`` a replicated change would look local (applied twice),
    without ``include-lsn`` it has no place in its transaction: refused at its first
    action, naming the file, the line and the option."""
    action = {k: v for k, v in W2J.items() if k != missing}
    data, _ = src.lines(["not json", action])
    (tmp_path / "slot.json").write_bytes(data)
    check = SettingsCheck("wal2json", {}, "store/slot.json")
    with pytest.raises(ExportError) as e:
        stage_jsonl(tmp_path / "slot.json", tmp_path / "out.parquet", "pg1", "slot.json",
                    None, None, True, check)  # fmt: skip
    option = {"xid": "include-xids", "timestamp": "include-timestamp"}.get(missing)
    assert str(e.value).startswith("store/slot.json:2: a wal2json action without what ")
    assert (option or f"include-{missing}") in str(e.value)
    ok = SettingsCheck("wal2json", {}, "x")
    ok.feed(1, src.json.dumps(W2J).encode())
    assert ok.done


def test_debezium_transaction_metadata_is_required_when_the_manifest_says_so():
    envelope = {"op": "c", "after": {"id": 1}, "source": {"ts_us": 1}, "transaction": None}
    check = SettingsCheck("debezium", {"transaction_metadata": True}, "topic.json")
    check.feed(1, b"null")  # a tombstone decides nothing
    with pytest.raises(ExportError, match=r"topic.json:2: .*provide.transaction.metadata=true"):
        check.feed(2, src.json.dumps(envelope).encode())
    assert SettingsCheck("debezium", {}, "topic.json").done  # not asked: nothing to see


def test_dms_columns_the_options_name_must_be_in_the_file():
    options = {"timestamp_column": "ts", "change_seq_column": "seq"}
    check_dms_columns(options, ["Op", "ts", "seq", "id"], "f.csv")
    with pytest.raises(ExportError, match=r"f.csv: options.change_seq_column names column 'seq'"):
        check_dms_columns(options, ["Op", "ts", "id"], "f.csv")


def test_scope_transaction_needs_a_dms_export_to_carry_transaction_ids():
    dw = configs.table({"id": "int"}, policy="delete_wins", scope="transaction")
    table = parse_config(configs.config(dw)).tables["t"]
    with pytest.raises(ExportError, match=r"m.json: table t has scope: transaction.*txid_column"):
        check_requirements("dms", {"timestamp_column": "ts"}, table, "m.json")
    check_requirements("dms", {"timestamp_column": "ts", "txid_column": "tx"}, table, "m.json")
    check_requirements("wal2json", {}, table, "m.json")  # its xid is in every action
