"""Ingest against a real S3 HTTP server on loopback: manifests, checksums, row counts,
path escapes, truncated files, missing exports (docs/adapters.md). Ingest reads
the manifests; the files are fetched, checked and staged by ``fetch.fetch`` in Spark
tasks (the resolve stage's first job). On a file store without Spark:
tests/unit/test_ingest.py."""

from __future__ import annotations

import gzip
import hashlib
import json
from datetime import date

import pytest

from pipeline.core.errors import ExportError
from pipeline.ingest.exports import ingest
from pipeline.ingest.fetch import fetch
from pipeline.ingest.inputs import load_inputs
from pipeline.storage.context import RunContext
from tests.helpers.fold_helpers import make_config
from tests.helpers.sparkjobs import tasks_per_stage
from tests.unit.test_ingest import _exports, put_export, put_prior, rec, started_from

D = date(2026, 11, 21)


@pytest.fixture
def ctx(tmp_path):
    return RunContext.create(tmp_path / "work", D, 0, "r1")


def ingest_and_fetch(store, ctx, spark):
    staged = ingest(make_config(), store, ctx, allow_missing=False)
    fetch(spark, make_config(), ctx)
    return staged


def test_ingest_from_s3_stages_every_export(s3_store, ctx, spark):
    put_export(s3_store, "pub", "t", [rec("pub-1"), "\n", rec("pub-2", seq=2)], gz=True)
    put_export(s3_store, "sub", "t", [rec("pub-1")])
    staged = ingest_and_fetch(s3_store, ctx, spark)
    assert {r: e.rows for r, e in staged["t"].exports.items()} == {"pub": 2, "sub": 1}
    assert load_inputs(ctx)["t"].exports["pub"].rows == 2
    assert list((ctx.staged / "t" / "replica=pub" / "copies").glob("*.parquet"))
    # no copy for the driver to settle (no TRUNCATE, every id given, no key change)
    assert {r: e.specials for r, e in load_inputs(ctx)["t"].exports.items()} == {
        "pub": 0,
        "sub": 0,
    }


def test_the_files_are_fetched_in_spark_tasks_not_by_the_driver(s3_store, ctx, spark, monkeypatch):
    """A Spark task per file downloads, checks and stages it (boto3 in the task): the
    driver reads the manifests only. A download in the driver's process fails this test;
    the tasks run in Spark's Python workers, which the patch does not reach."""
    from pipeline.storage.store import S3Store

    def no_download(self, key, dest):
        raise AssertionError(f"the driver downloaded {key}")

    monkeypatch.setattr(S3Store, "download", no_download)
    put_export(s3_store, "pub", "t", [rec("pub-1"), rec("pub-2", seq=2)])
    put_export(s3_store, "sub", "t", [rec("pub-1")])
    ingest(make_config(), s3_store, ctx, allow_missing=False)
    assert tasks_per_stage(spark, lambda: fetch(spark, make_config(), ctx)) == [2]  # per file
    staged = sorted(ctx.staged.glob("t/replica=*/copies/*.parquet"))
    assert [p.parent.parent.name for p in staged] == ["replica=pub", "replica=sub"]
    # a retry of the resolve stage: staged already, no job
    assert tasks_per_stage(spark, lambda: fetch(spark, make_config(), ctx)) == []


def test_missing_export_names_the_replica_unless_allowed(s3_store, ctx):
    put_export(s3_store, "pub", "t", [rec("pub-1")])
    with pytest.raises(ExportError, match="replica 'sub' table 't'"):
        ingest(make_config(), s3_store, ctx, allow_missing=False)
    staged = ingest(make_config(), s3_store, ctx, allow_missing=True)
    assert staged["t"].missing == ["sub"]


def test_files_without_a_manifest_are_an_error(s3_store, ctx):
    put_export(s3_store, "pub", "t", [rec("pub-1")])
    s3_store.write_bytes(f"exports/replica=sub/table=t/dt={D}/part-0.jsonl", rec("x").encode())
    with pytest.raises(
        ExportError,
        match=r"replica=sub/table=t/dt=2026-11-21: holds files but "
        r"no _manifest.json",
    ):
        ingest(make_config(), s3_store, ctx, allow_missing=True)


def test_checksum_mismatch_names_the_file(s3_store, ctx, spark):
    folder, entry = put_export(s3_store, "pub", "t", [rec("pub-1")])
    put_export(s3_store, "sub", "t", [rec("pub-1")])
    s3_store.write_bytes(f"{folder}/{entry['path']}", rec("pub-9").encode())
    with pytest.raises(
        ExportError,
        match=r"replica=pub/table=t/dt=2026-11-21/part-0.jsonl: "
        r"sha256 mismatch",
    ):
        ingest_and_fetch(s3_store, ctx, spark)


def test_row_count_mismatch_names_the_file(s3_store, ctx, spark):
    folder, entry = put_export(s3_store, "pub", "t", [rec("pub-1")])
    entry["rows"] = 5
    manifest = json.loads(s3_store.read_bytes(f"{folder}/_manifest.json"))
    manifest["files"] = [entry]
    s3_store.write_bytes(f"{folder}/_manifest.json", json.dumps(manifest).encode())
    put_export(s3_store, "sub", "t", [rec("pub-1")])
    with pytest.raises(ExportError, match=r"part-0.jsonl: 1 rows, but the manifest says 5"):
        ingest_and_fetch(s3_store, ctx, spark)


def test_truncated_gzip_names_the_file(s3_store, ctx, spark):
    data = gzip.compress(("".join(rec(f"pub-{i}", seq=i) for i in range(200))).encode())
    cut = data[: len(data) // 2]
    folder = f"exports/replica=pub/table=t/dt={D}"
    s3_store.write_bytes(f"{folder}/part-0.jsonl.gz", cut)
    s3_store.write_bytes(
        f"{folder}/_manifest.json",
        json.dumps(
            {
                "replica": "pub",
                "table": "t",
                "dt": D.isoformat(),
                "format": "jsonl",
                "files": [
                    {
                        "path": "part-0.jsonl.gz",
                        "rows": 200,
                        "sha256": hashlib.sha256(cut).hexdigest(),
                    }
                ],
            }
        ).encode(),
    )
    put_export(s3_store, "sub", "t", [rec("pub-1")])
    with pytest.raises(ExportError, match=r"part-0.jsonl.gz: cannot be read to its end"):
        ingest_and_fetch(s3_store, ctx, spark)


def test_path_escape_in_a_manifest_fails_the_ingest(s3_store, ctx):
    put_export(
        s3_store,
        "pub",
        "t",
        [rec("pub-1")],
        files=[{"path": "../../replica=sub/x.jsonl", "rows": 1, "sha256": "0" * 64}],
    )
    put_export(s3_store, "sub", "t", [rec("pub-1")])
    with pytest.raises(ExportError, match="escapes the export folder"):
        ingest(make_config(), s3_store, ctx, allow_missing=False)


def test_manifest_for_another_replica_is_refused(s3_store, ctx):
    put_export(s3_store, "pub", "t", [rec("pub-1")], manifest_extra={"replica": "sub"})
    put_export(s3_store, "sub", "t", [rec("pub-1")])
    with pytest.raises(ExportError, match="replica is 'sub', expected 'pub'"):
        ingest(make_config(), s3_store, ctx, allow_missing=False)


def test_a_prior_state_is_staged_whole_and_checked(s3_store, ctx):
    _exports(s3_store)
    pointer = put_prior(s3_store, "2026-11-20", rows=3, files=2)
    got = ingest(make_config(), s3_store, ctx, allow_missing=False)["t"].prior
    assert got == started_from(pointer, 6)
    assert [p.name for p in (ctx.staged / "t/prior").glob("*")] == [
        "part-0.parquet",
        "part-1.parquet",
    ]


def test_a_prior_state_that_is_gone_stops_the_run(s3_store, ctx):
    """A retention rule removed the state the last pointer names: not an empty start."""
    from pipeline.core.errors import PriorStateError

    _exports(s3_store)
    pointer = put_prior(s3_store, "2026-11-20", rows=3)
    s3_store.delete_prefix(pointer["state"])
    with pytest.raises(PriorStateError) as e:
        ingest(make_config(), s3_store, ctx, allow_missing=False)
    msg = str(e.value)
    assert (
        "table 't': the prior state of 2026-11-20 (run run-2026-11-20, earlier layout) has no "
        "files" in msg
    )
    assert "published/t/state/run=run-2026-11-20" in msg and "rerun 2026-11-20" in msg


SPECIAL_KINDS = {
    "plain": {},
    "truncate": {"op": "TRUNCATE", "key": None, "after": None},
    "no event id": {"event_id": None},
    "key change": {"op": "UPDATE", "new_key": {"id": 2}},
}


@pytest.mark.parametrize("kind", SPECIAL_KINDS)
def test_the_typing_counts_what_split_special_brings_to_the_driver(kind, spark, tmp_path):
    """The fetch's typing counts the copies ``split_special`` brings (the same rule in
    pyarrow): none for a plain copy, and then the run skips that job safely; one for a
    TRUNCATE, a record without an event id or a key change, which the job finds."""
    from pipeline.core.config_load import parse_config
    from pipeline.ingest.copies import CopyWriter
    from pipeline.resolve.shuffle import split_special
    from pipeline.rules.guards import TypingSpec
    from pipeline.spark.frames import copy_schema
    from tests.helpers import configs

    config = parse_config(configs.config({"t": configs.table()}))
    table = config.tables["t"]
    record = {
        "op": "INSERT",
        "key": {"id": 1},
        "after": {"id": 1, "v": "a"},
        "ts": 1795305600000000,
        "origin": "pub",
        "event_id": "pub-1",
        "seq": 1,
    }
    record = {k: v for k, v in {**record, **SPECIAL_KINDS[kind]}.items() if v is not None}
    path = tmp_path / "copies.parquet"
    with CopyWriter(path, TypingSpec.of(config, table, 1795305600000000), "pub", "f") as out:
        out.lines([(1, json.dumps(record).encode())])
    copies = spark.read.schema(copy_schema(table)).parquet(str(path))
    _, found = split_special(copies)
    brought = len(found.truncates) + len(found.fates) + len(found.moved)
    assert out.specials == (0 if kind == "plain" else 1)
    assert (out.specials > 0) == (brought > 0)
