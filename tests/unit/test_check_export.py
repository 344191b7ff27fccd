"""``cdr check-export`` on a file store (docs/operations.md#checking-an-export): every
manifest of a date checked as the run checks it, with the run's messages (compared with
``fetch.fetch_file``'s own), without importing pyspark, in seconds."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.app.cli import main
from pipeline.core.config_load import load_config
from pipeline.ingest.check import check_date
from pipeline.ingest.fetch import fetch_file, plan_export
from pipeline.ingest.manifests import read_manifest
from pipeline.rules.guards import TypingSpec
from pipeline.storage.context import resolve_now
from pipeline.storage.store import open_store
from pipeline.storage.workpath import WorkPath
from tests.helpers import configs
from tests.helpers.cli import cdr_json
from tests.unit.test_ingest import D, put_export, rec

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def setup(tmp_path):
    """A store with both replicas' exports of ``D`` (3 records each) and its config."""
    root = tmp_path / "store"
    store = open_store(root.as_uri())
    for r in ("pub", "sub"):
        put_export(store, r, "t", [rec(f"{r}-{i}", origin=r, seq=i) for i in range(1, 4)], gz=True)
    cfg = configs.write(tmp_path / "cdr.yaml", configs.config(store=root))
    return store, cfg


def _text(*args: str) -> tuple[int, str]:
    """``cdr ARGS`` as a person reads it: its exit status and its standard output."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(list(args))
    return rc, out.getvalue()


def _args(cfg: Path, *more: str) -> list[str]:
    return ["check-export", "--config", str(cfg), "--date", D.isoformat(), *more]


def _folder(r: str) -> str:
    return f"exports/replica={r}/table=t/dt={D}"


def _manifest(store, r: str, **changes) -> None:
    key = f"{_folder(r)}/_manifest.json"
    m = json.loads(store.read_bytes(key))
    m["files"][0].update(changes)
    store.write_bytes(key, json.dumps(m).encode())


def _run_says(store, cfg: Path, r: str) -> str | None:
    """What the run's fetch says of the replica's first file."""
    config = load_config(cfg, None)
    m = read_manifest(store, _folder(r), {})
    dest = WorkPath.of(cfg.parent / "work")
    _, tasks = plan_export(store, _folder(r), m, dest, r, "t")
    spec = TypingSpec.of(config, config.tables["t"], resolve_now(D, None))
    return fetch_file(tasks[0], spec)[2]


def test_a_good_date_is_ok(setup):
    _, cfg = setup
    rc, out = cdr_json(*_args(cfg))
    assert rc == 0 and out["ok"]
    assert [(e["replica"], e["files"], e["rows"], e["ok"]) for e in out["exports"]] == [
        ("pub", 1, 3, True),
        ("sub", 1, 3, True),
    ]


def test_a_wrong_sha256_is_said_as_the_run_says_it(setup):
    store, cfg = setup
    _manifest(store, "sub", sha256="0" * 64)
    rc, out = cdr_json(*_args(cfg))
    assert rc == 1 and not out["ok"]
    problem = out["exports"][1]["problem"]
    assert "part-0.jsonl.gz: sha256 mismatch (manifest 000" in problem
    assert problem == _run_says(store, cfg, "sub")
    assert out["exports"][0]["ok"]


def test_a_wrong_line_count_is_said_as_the_run_says_it(setup):
    store, cfg = setup
    _manifest(store, "pub", rows=4)
    rc, out = cdr_json(*_args(cfg))
    assert rc == 1
    problem = out["exports"][0]["problem"]
    assert problem.endswith("part-0.jsonl.gz: 3 rows, but the manifest says 4")
    assert problem == _run_says(store, cfg, "pub")


def test_a_truncated_file_is_named(setup):
    store, cfg = setup
    data = gzip.compress(b"".join(rec(f"x{i}").encode() for i in range(50)))[:-20]
    put_export(store, "pub", "t", [], gz=True)  # a manifest entry for the bytes below
    key = f"{_folder('pub')}/part-0.jsonl.gz"
    store.write_bytes(key, data)
    _manifest(store, "pub", sha256=hashlib.sha256(data).hexdigest(), rows=50)
    rc, out = _text(*_args(cfg))
    assert rc == 1
    assert "part-0.jsonl.gz: cannot be read to its end" in out


def test_malformed_records_are_counted_with_the_first_reason(setup):
    store, cfg = setup
    lines = [rec("a"), "not json\n", rec("b"), "[1, 2]\n", "{oops\n"]
    put_export(store, "pub", "t", lines)
    rc, out = _text(*_args(cfg, "--records", "4"))
    assert rc == 0, out  # bad records do not stop a night: reported, not a problem
    assert "replica pub table t: ok, 1 file(s), 5 row(s); of the 4 record(s) read" in out
    assert "2 malformed (first: part-0.jsonl line 2: not a JSON object" in out


def test_a_missing_export_is_named_unless_allowed(setup, tmp_path):
    store, cfg = setup
    store.delete_prefix(_folder("sub"))
    rc, out = _text(*_args(cfg))
    assert rc == 1
    assert f"replica sub table t: missing: no {store.uri}/{_folder('sub')}/_manifest.json" in out
    allowed = configs.write(
        tmp_path / "allowed.yaml",
        configs.config(store=tmp_path / "store", allow_missing_exports=True),
    )
    rc, out = _text(*_args(allowed))
    assert rc == 0 and "replica sub table t: missing, allowed" in out


def test_files_without_a_manifest_and_an_escaping_path_are_refused(setup):
    store, cfg = setup
    store.delete([f"{_folder('sub')}/_manifest.json"])
    _manifest(store, "pub", path="../x.jsonl")
    rc, out = _text(*_args(cfg))
    assert rc == 1
    assert "file path '../x.jsonl' escapes the export folder" in out
    assert "holds files but no _manifest.json (replica 'sub', table 't')" in out


def test_a_replica_snapshot_is_checked(setup):
    store, cfg = setup
    folder = f"exports/replica=pub/table=t/snapshot/dt={D}"
    store.write_bytes(f"{folder}/part-0.jsonl", b'{"id": 1, "v": "a"}\n')
    manifest = {
        "format": "jsonl",
        "files": [{"path": "part-0.jsonl", "rows": 2, "sha256": "0" * 64}],
    }
    store.write_bytes(f"{folder}/_manifest.json", json.dumps(manifest).encode())
    checks = check_date(load_config(cfg, None), store, D)
    assert [c.kind for c in checks] == ["export", "export", "snapshot"]
    assert "sha256 mismatch" in (checks[2].problem or "")


def test_it_imports_no_pyspark_and_takes_seconds(setup):
    _, cfg = setup
    code = (
        "import sys; from pipeline.app.cli import main; "
        f"rc = main({_args(cfg)!r}); "
        "assert 'pyspark' not in sys.modules, 'pyspark imported'; sys.exit(rc)"
    )
    started = time.monotonic()
    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    seconds = time.monotonic() - started
    assert p.returncode == 0, p.stderr
    assert "2 manifest(s) checked" in p.stdout
    assert seconds < 20, seconds  # about a second; a Spark start alone takes several
