"""``cdr run`` with a wrong store or a wrong date, in its own process: it stops before it
writes anything (docs/operations.md#nothing-is-written-before-the-inputs-are-found): no
store folder, no lease, no ``runs`` row, no work folder, no Spark, in about a second (the
issue measured 11 s and a folder, a lease and a failed ``runs`` row). On a file store
and on the S3 server on loopback (a bucket with no ``exports/``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import boto3

from tests.helpers import configs

ROOT = Path(__file__).resolve().parents[2]
#: generous: the run stops in about a second; a Spark start alone takes several
SECONDS = 20


def _cdr(*args: str) -> tuple[int, str, float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    started = time.monotonic()
    p = subprocess.run(
        [sys.executable, "-m", "pipeline.app.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    return p.returncode, p.stderr, time.monotonic() - started


def _setup(tmp_path: Path) -> tuple[Path, Path]:
    store = tmp_path / "store"
    cfg = configs.write(tmp_path / "cdr.yaml", configs.config(store=store))
    rc, err, _ = _cdr("generate", "--config", str(cfg), "--date", "2026-11-20", "--events", "50")
    assert rc == 0, err
    return cfg, store


def test_a_wrong_file_store_writes_nothing(tmp_path):
    cfg, _ = _setup(tmp_path)
    wrong = tmp_path / "wrong" / "path"
    work = tmp_path / "work"
    rc, err, seconds = _cdr(
        "run", "--config", str(cfg), "--date", "2026-11-20", "--store", wrong.as_uri(),
        "--work-dir", str(work),
    )  # fmt: skip
    assert rc == 1
    assert f"no exports under {wrong.as_uri()}/exports/ — is `store` right?" in err
    assert not (tmp_path / "wrong").exists() and not work.exists()
    assert "pyspark" not in err and seconds < SECONDS, (seconds, err)
    print(f"a wrong file store: {seconds:.1f} s")


def test_a_wrong_date_writes_nothing_and_names_the_dates_there_are(tmp_path):
    cfg, store = _setup(tmp_path)
    work = tmp_path / "work"
    rc, err, seconds = _cdr(
        "run", "--config", str(cfg), "--date", "2026-11-21", "--work-dir", str(work),
        "--allow-missing-exports",
    )  # fmt: skip
    assert rc == 1
    assert "no manifest for 2026-11-21 under" in err
    assert "the dates that have manifests: 2026-11-20: is --date right?" in err
    assert not (store / "published").exists() and not work.exists()
    assert seconds < SECONDS, (seconds, err)
    print(f"a wrong date: {seconds:.1f} s")


def test_an_s3_bucket_without_exports_writes_nothing(tmp_path, s3_endpoint):
    bucket = f"cdr-test-{uuid.uuid4().hex[:10]}"
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=bucket)
    cfg, _ = _setup(tmp_path)
    rc, err, seconds = _cdr(
        "run", "--config", str(cfg), "--date", "2026-11-20", "--store", f"s3://{bucket}/prod",
        "--work-dir", str(tmp_path / "work"),
    )  # fmt: skip
    assert rc == 1
    assert f"no exports under s3://{bucket}/prod/exports/ — is `store` right?" in err
    assert s3.list_objects_v2(Bucket=bucket).get("KeyCount") == 0
    assert seconds < SECONDS, (seconds, err)
    print(f"an S3 bucket without exports: {seconds:.1f} s")
