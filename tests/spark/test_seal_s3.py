"""``cdr manifest`` on the S3 server on loopback (no Spark): Debezium's gzipped objects
under the time-based path, sealed with a conditional create and server-side copies;
sealing again is a no-op, a late object is refused and then added with a conditional
replace; ``read_manifest`` accepts what was written (docs/sealing.md)."""

from __future__ import annotations

import hashlib
from datetime import UTC, date, datetime

import pytest

from pipeline.core import layout
from pipeline.core.config_load import parse_config
from pipeline.core.errors import ExportError
from pipeline.ingest.manifests import read_manifest
from pipeline.ingest.seal import seal_export
from tests.helpers import configs
from tests.helpers.cdc_tools import put_debezium

D = date(2026, 11, 21)
NOW = datetime(2026, 11, 22, 2, tzinfo=UTC)


def test_sealing_debezium_objects_on_s3(s3_store):
    source = {"prefix": "cdc/pg1", "layout": "debezium-s3-time", "tables": {"t": "pg1.public.t"}}
    config = parse_config(
        configs.config(replicas=[{"id": "pg1", "system_id": 1, "source": source}])
    )
    folder = "cdc/pg1/pg1.public.t"
    a, a_bytes = put_debezium(s3_store, folder, datetime(2026, 11, 21, 5, tzinfo=UTC), 0, 0, 5)
    put_debezium(s3_store, folder, datetime(2026, 11, 22, 0, tzinfo=UTC), 0, 5, 1)
    assert seal_export(config, s3_store, "pg1", "t", D, NOW).status == "sealed"
    export = layout.export_dir("pg1", "t", D)
    expect = {"replica": "pg1", "table": "t", "dt": "2026-11-21"}
    m = read_manifest(s3_store, export, expect)
    assert m["files"] == [{"path": a, "rows": 5, "sha256": hashlib.sha256(a_bytes).hexdigest()}]
    assert s3_store.read_bytes(f"{export}/{a}") == a_bytes
    key = layout.export_manifest("pg1", "t", D)
    written = s3_store.read_bytes(key)
    assert seal_export(config, s3_store, "pg1", "t", D, NOW).status == "unchanged"
    late, _ = put_debezium(s3_store, folder, datetime(2026, 11, 21, 23, tzinfo=UTC), 1, 0, 2)
    with pytest.raises(ExportError, match="--late"):
        seal_export(config, s3_store, "pg1", "t", D, NOW)
    assert s3_store.read_bytes(key) == written
    got = seal_export(config, s3_store, "pg1", "t", D, NOW, late=True)
    assert got.status == "late" and got.rerun == ()
    m = read_manifest(s3_store, export, expect)
    assert [(f["path"], f["rows"]) for f in m["files"]] == [(a, 5), (late, 2)]
