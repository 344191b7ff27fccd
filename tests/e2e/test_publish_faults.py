"""A publish that fails at any one of its writes (issue 14, "Faults at every write of one
publish"): on S3, behind a loopback proxy that fails every PUT from the N-th on
(tests/helpers/faults.py), for N the first, the second, the last and seeded PUTs (every N
with ``CDR_FULL_FAULT_SWEEP=1``: through s3a a publish is many requests). The publish is
a rerun's, so that every dated table has a partition to replace. After each failure
every table reads, with ``deltalake``, as after the previous run or as after the new
one, never a mix; the ``runs`` table names the previous run only (or, after the last
commit, the new run with every table as after it), and the versions it names still give
the previous run's rows; and the retry of the same publish converges to the
uninterrupted result, the date's report copy included. The same holds for the publish
process SIGKILLed after its k-th commit (a few seeds), where no error handler runs."""

from __future__ import annotations

import json
import random
import re
import uuid
from collections import Counter
from pathlib import Path

import boto3
import pytest

from pipeline.app.cli import main
from pipeline.core import layout
from pipeline.storage.s3server import restore_env, use_endpoint
from pipeline.storage.store import open_store
from tests.helpers import configs
from tests.helpers import published as P
from tests.helpers import scenarios as S
from tests.helpers.faults import SEEDS, fault_points, faulty_proxy, killed_at

SCENARIO = "future_timestamp"  # conflicts and a quarantine


def _etags(bucket: str) -> dict[str, str]:
    pages = boto3.client("s3").get_paginator("list_objects_v2").paginate(Bucket=bucket)
    return {o["Key"]: o["ETag"] for page in pages for o in page.get("Contents", [])}


def _save(bucket: str) -> dict[str, tuple[str, bytes]]:
    s3 = boto3.client("s3")
    return {
        k: (etag, s3.get_object(Bucket=bucket, Key=k)["Body"].read())
        for k, etag in _etags(bucket).items()
    }


def _restore(bucket: str, saved: dict[str, tuple[str, bytes]]) -> None:
    """The bucket as saved: what a failed publish added goes, what it changed is put back."""
    s3 = boto3.client("s3")
    now = _etags(bucket)
    for k in set(now) - set(saved):
        s3.delete_object(Bucket=bucket, Key=k)
    for k, (etag, body) in saved.items():
        if now.get(k) != etag:
            s3.put_object(Bucket=bucket, Key=k, Body=body)


@pytest.mark.timeout(900)
def test_a_publish_failing_at_any_write_leaves_whole_runs(s3_endpoint, tmp_path: Path, spark):
    s = json.loads((S.SCENARIOS / f"{SCENARIO}.json").read_text())
    bucket = f"cdr-pubfault-{uuid.uuid4().hex[:8]}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    with faulty_proxy(s3_endpoint) as (endpoint, proxy):
        previous = use_endpoint(endpoint)
        try:
            store = open_store(f"s3://{bucket}/prod")
            folder = tmp_path / "layout"
            folder.mkdir()
            S.layout_store(s, folder)
            for f in sorted(p for p in folder.rglob("*") if p.is_file()):
                store.upload(f, f.relative_to(folder).as_posix())
            # a lease of an hour: no renewal of the heartbeat's falls inside a publish, so
            # that each publish makes the same PUTs (docs/operations.md#the-lease)
            lease = {"seconds": 3600}
            cfg = configs.write(tmp_path / "cdr.yaml", s["config"], store=store.uri, lease=lease)
            base = ["--config", str(cfg), "--work-dir", str(tmp_path / "work")]
            argv = [*base, "--date", s["date"], "--now", s["now"]]
            if S.missing_exports(s, s["exports"]):
                argv.append("--allow-missing-exports")
            assert main(["run", *argv, "--run-id", "first", "--no-data-docs"]) == 0
            argv.extend(["--run-id", "night"])  # the rerun whose publish fails
            assert main(["ingest", *argv, "--no-data-docs"]) == 0
            for stage in ("resolve", "validate"):
                assert main([stage, *argv]) == 0
            saved = _save(bucket)
            before, runs_before = P.all_tables(store), P.runs(store)
            (prev,) = runs_before

            proxy.arm(None)
            assert main(["publish", *argv]) == 0  # uninterrupted: how many PUTs, what result
            puts, after = proxy.puts, P.all_tables(store)
            assert puts >= 10 and after != before
            # the PUTs after the runs row's commit (its checksum file, the date's report
            # copy) find the run whole and visible when they fail
            made = [path for method, path, _ in proxy.requests() if method == "PUT"][-puts:]
            row_commit = re.compile(r"/published/runs/_delta_log/\d+\.json$")
            row_put = max(i for i, p in enumerate(made, 1) if row_commit.search(p))
            assert [r["run_id"] for r in P.runs(store)] == [prev["run_id"], "night"]

            def whole_runs(where: object, may_be_whole: bool) -> None:
                got = P.all_tables(store)
                for path in set(got) | set(after):
                    assert got.get(path) in (before.get(path), after[path]), (where, path)
                runs_now = P.runs(store)
                if runs_now != runs_before:  # failed after its last commit: whole, visible
                    assert [r["run_id"] for r in runs_now] == [prev["run_id"], "night"], where
                    assert got == after and may_be_whole, where
                    return
                for path in set(prev["versions"]) - {layout.RUNS}:  # the previous run's view
                    rows = Counter(
                        json.dumps(r, sort_keys=True, default=str)
                        for r in P.as_of(store, path, prev)
                    )
                    assert rows == before[path], (where, path)

            for seed in SEEDS:  # the publish process killed after its k-th commit
                _restore(bucket, saved)
                k = random.Random(seed).randint(1, len(after) // 2)
                killed_at(["publish", *argv], r"commit published/", k)
                whole_runs(f"killed after commit {k}", False)
            for k in fault_points(puts):
                _restore(bucket, saved)
                proxy.arm(k)
                assert main(["publish", *argv]) == 1, k
                proxy.arm(None)
                whole_runs(k, k > row_put)
            assert main(["publish", *argv]) == 0  # the retry of the last failure
            assert P.all_tables(store) == after
            copy = store.read_bytes(f"published/reports/dt={s['date']}/run_report.json")
            assert json.loads(copy)["run_id"] == "night"  # the date's report copy too
            assert [r["run_id"] for r in P.runs(store)] == [prev["run_id"], "night"]
        finally:
            restore_env(previous)
