"""Ingest on a file store, without Spark: manifests, path escapes, formats and the prior
state it starts from (docs/adapters.md). Ingest reads the manifests; the files
are fetched by ``fetch.fetch`` in Spark tasks (tests/spark/test_ingest.py, on the S3
server on loopback)."""

from __future__ import annotations

import gzip
import hashlib
import json
from datetime import date

import pytest

from pipeline.core.errors import ExportError
from pipeline.ingest.exports import ingest
from pipeline.ingest.manifests import safe_relpath
from pipeline.storage.context import RunContext
from tests.helpers.fold_helpers import make_config

D = date(2026, 11, 21)


def put_export(
    store, replica, table, lines, *, gz=False, manifest_extra=None, files=None, name=None
):
    folder = f"exports/replica={replica}/table={table}/dt={D}"
    data = "".join(lines).encode()
    if gz:
        data = gzip.compress(data)
    name = name or ("part-0.jsonl.gz" if gz else "part-0.jsonl")
    store.write_bytes(f"{folder}/{name}", data)
    rows = sum(1 for ln in lines if ln.strip())
    entry = {"path": name, "rows": rows, "sha256": hashlib.sha256(data).hexdigest()}
    manifest = {
        "replica": replica,
        "table": table,
        "dt": D.isoformat(),
        "format": "jsonl",
        "files": files if files is not None else [entry],
        **(manifest_extra or {}),
    }
    store.write_bytes(f"{folder}/_manifest.json", json.dumps(manifest).encode())
    return folder, entry


def rec(eid, origin="pub", seq=1):
    return (
        json.dumps(
            {
                "op": "INSERT",
                "key": {"id": 1},
                "after": {"id": 1, "v": "a", "n": 1},
                "ts": "2026-11-21T01:00:00Z",
                "origin": origin,
                "event_id": eid,
                "seq": seq,
            }
        )
        + "\n"
    )


def put_prior(store, dt: str, rows: int, recorded: int | None = None, files: int = 1) -> dict:
    """A published state of ``rows`` rows for table ``t`` and its date's pointer."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.core import layout

    run = f"run-{dt}"
    state = f"published/t/state/run={run}"
    for i in range(files):
        buf = io.BytesIO()
        pq.write_table(pa.table({"id": list(range(i * rows, (i + 1) * rows))}), buf)
        store.write_bytes(f"{state}/part-{i}.parquet", buf.getvalue())
    published = files * rows if recorded is None else recorded
    pointer = {"run_id": run, "dt": dt, "state": state, "rows": rows, "state_rows": published}
    store.write_bytes(
        f"{layout.legacy_pointers_dir('t')}/dt={dt}.json", json.dumps(pointer).encode()
    )
    return pointer


def started_from(pointer: dict, rows: int) -> dict:
    """What ingest records of the prior it started from (``StagedTable.prior``)."""
    return {"dt": pointer["dt"], "run_id": pointer["run_id"], "state_rows": rows}


@pytest.fixture
def ctx(tmp_path):
    return RunContext.create(tmp_path / "work", D, 0, "r1")


def test_a_date_with_exports_that_no_run_published_stops_the_next_one(file_store, ctx):
    """The state of 2026-11-18 is the last published; 2026-11-19 has exports but never
    published (a failed gate, a subset run): a run of 2026-11-21 would skip its events."""
    from pipeline.core import layout

    put_export(file_store, "pub", "t", [rec("pub-1")])
    put_export(file_store, "sub", "t", [rec("pub-1")])
    pointer = put_prior(file_store, "2026-11-18", rows=2)
    late = layout.export_dir("sub", "t", date(2026, 11, 19))
    file_store.write_bytes(f"{late}/_manifest.json", b"{}")
    with pytest.raises(ExportError) as e:
        ingest(make_config(), file_store, ctx, allow_missing=False)
    assert "table 't' was last published for 2026-11-18, but 2026-11-19 has exports" in str(e.value)
    assert "2026-11-20" not in str(e.value)
    file_store.delete_prefix(late)  # without that export, the run starts from 2026-11-18
    got = ingest(make_config(), file_store, ctx, allow_missing=False)["t"].prior
    assert got == started_from(pointer, 2)


@pytest.mark.parametrize(
    "path",
    ["../other/part.jsonl", "/etc/passwd", "s3://other-bucket/x", "a/../../b", "..", "C:\\x"],
)
def test_paths_escaping_the_export_folder_are_refused(path):
    with pytest.raises(ExportError, match="escapes the export folder"):
        safe_relpath(path, "m")


def test_unknown_format_is_refused(file_store, ctx):
    put_export(file_store, "pub", "t", [rec("pub-1")], manifest_extra={"format": "csv"})
    with pytest.raises(ExportError, match="format 'csv' is not one of"):
        ingest(make_config(), file_store, ctx, allow_missing=True)


def _exports(store):
    put_export(store, "pub", "t", [rec("pub-1")])
    put_export(store, "sub", "t", [rec("pub-1")])


def test_a_truncated_prior_state_file_is_named(file_store, ctx):
    from pipeline.core.errors import PriorStateError

    _exports(file_store)
    pointer = put_prior(file_store, "2026-11-20", rows=3, files=2)
    key = f"{pointer['state']}/part-1.parquet"
    file_store.write_bytes(key, file_store.read_bytes(key)[:-20])
    with pytest.raises(PriorStateError, match=r"part-1\.parquet is unreadable"):
        ingest(make_config(), file_store, ctx, allow_missing=False)


def test_a_prior_state_short_of_its_recorded_rows_stops_the_run(file_store, ctx):
    """A partial copy: one of two files missing, every file readable."""
    from pipeline.core.errors import PriorStateError

    _exports(file_store)
    put_prior(file_store, "2026-11-20", rows=3, files=1, recorded=6)
    with pytest.raises(PriorStateError, match=r"has 3 rows in 1 file\(s\) .* published 6"):
        ingest(make_config(), file_store, ctx, allow_missing=False)


def test_a_pointer_published_before_state_rows_is_read_without_the_count(file_store, ctx):
    _exports(file_store)
    pointer = put_prior(file_store, "2026-11-20", rows=3)
    del pointer["state_rows"]
    from pipeline.core import layout

    file_store.write_bytes(
        f"{layout.legacy_pointers_dir('t')}/dt=2026-11-20.json", json.dumps(pointer).encode()
    )
    got = ingest(make_config(), file_store, ctx, allow_missing=False)["t"].prior
    assert got == started_from(pointer, 3)
