"""The run's output files are put in the store by Spark tasks at the end of the resolve
stage (pipeline.uploads), and publish only commits them (issue 15, "I/O on the
executors"): on S3 no output file is uploaded by the driver, a failed run's logs are
copied by the store into its own tables, and a retried publish commits nothing twice."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

import pytest

from pipeline import layout
from pipeline.cli import main
from pipeline.config import load_config
from pipeline.context import RunContext
from pipeline.lake import Lake, add_actions
from pipeline.store import S3Store
from pipeline.uploads import UPLOADS, upload_outputs
from tests.helpers import configs
from tests.helpers import published as P
from tests.helpers import scenarios as S
from tests.helpers.sparkjobs import tasks_per_stage


def _on_s3(s3_store, s: dict, tmp: Path, cdc: bool = False) -> list[str]:
    folder = tmp / "layout"
    folder.mkdir()
    S.layout_store(s, folder)
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        s3_store.upload(f, f.relative_to(folder).as_posix())
    configs.write(
        tmp / "cdr.yaml", s["config"], store=s3_store.uri, **({"cdc": S.CDC} if cdc else {})
    )
    args = ["--config", str(tmp / "cdr.yaml"), "--date", s["date"], "--now", s["now"]]
    return [*args, "--work-dir", str(tmp / "work"), "--run-id", "night"]


def _no_driver_uploads_of_outputs(monkeypatch) -> list[str]:
    """Uploads the driver makes (the tasks run in Spark's Python workers, which the patch
    does not reach); an output file among them fails the test."""
    seen: list[str] = []
    real = S3Store.upload

    def spy(self, src, key):
        seen.append(key)
        meta = key.startswith(("published/runs/", "published/reports/"))
        assert meta or not key.startswith("published/"), f"the driver uploaded {key}"
        real(self, src, key)

    monkeypatch.setattr(S3Store, "upload", spy)
    return seen


def test_publish_commits_the_files_the_tasks_uploaded(s3_store, tmp_path: Path, spark, monkeypatch):
    s = json.loads((S.SCENARIOS / "future_timestamp.json").read_text())
    argv = _on_s3(s3_store, s, tmp_path, cdc=True)
    seen = _no_driver_uploads_of_outputs(monkeypatch)
    assert main(["ingest", *argv, "--no-data-docs"]) == 0
    assert main(["resolve", *argv]) == 0
    uploads = json.loads(next(tmp_path.glob("work/run=night/resolved/uploads.json")).read_text())
    t = next(iter(s["config"]["tables"]))
    for kind in ("state", "conflicts", "quarantine", "snapshot"):
        assert uploads[f"{t}/{kind}"], kind
    keys = {u["key"] for files in uploads.values() for u in files}
    staging = layout.staging_dir("night")
    assert all(k.startswith(f"{staging}/") for k in keys)
    assert keys <= set(s3_store.list(staging))  # in the store before publish
    assert not s3_store.list(layout.table_dir(t))  # and nothing in the tables' folders
    assert main(["validate", *argv]) == 0
    assert main(["publish", *argv]) == 0
    assert any(k.startswith("published/runs/") for k in seen)  # the spy saw the driver
    tables = P.all_tables(s3_store)
    lake = Lake(s3_store)
    committed = {a["path"] for path in tables for a in add_actions(lake.table(path))}
    assert committed and committed <= {u["rel"] for files in uploads.values() for u in files}
    assert not s3_store.list(staging)  # copied into the tables, then removed
    assert main(["publish", *argv]) == 0  # a retry: published already, nothing again
    assert P.all_tables(s3_store) == tables


def test_a_failed_runs_logs_are_copied_by_the_store(s3_store, tmp_path: Path, spark, monkeypatch):
    """Its logs go to its own tables; nothing of it lands in a published table's folder."""
    s = json.loads((S.SCENARIOS / "divergence_skip_fails.json").read_text())
    argv = _on_s3(s3_store, s, tmp_path)
    _no_driver_uploads_of_outputs(monkeypatch)
    assert main(["run", *argv, "--no-data-docs"]) == 1
    t = next(iter(s["config"]["tables"]))
    failed = layout.failed_output("night", t, "divergence")
    rows = P.rows(s3_store, failed)
    assert rows and {r["replica"] for r in rows}  # the divergence the gate failed on
    assert not s3_store.list(layout.table_dir(t))  # nothing in the published tables' folders
    assert not s3_store.list(layout.staging_dir("night"))
    [run] = P.runs(s3_store)
    assert run["status"] == "failed"


@pytest.mark.parametrize("kind", ["state"])
def test_an_upload_gone_before_publish_stops_it_naming_the_file(
    s3_store, tmp_path: Path, spark, kind: str, capsys
):
    """A file the resolve stage uploaded that is gone at publish (a vacuum that ran while
    the run outlived its lease) stops the publish, naming it: no version lists a file that
    is not there."""
    s = json.loads((S.SCENARIOS / "future_timestamp.json").read_text())
    argv = _on_s3(s3_store, s, tmp_path)
    assert main(["ingest", *argv, "--no-data-docs"]) == 0
    for stage in ("resolve", "validate"):
        assert main([stage, *argv]) == 0
    uploads = json.loads(next(tmp_path.glob("work/run=night/resolved/uploads.json")).read_text())
    t = next(iter(s["config"]["tables"]))
    gone = uploads[f"{t}/{kind}"][0]["key"]
    s3_store.delete([gone])
    capsys.readouterr()
    assert main(["publish", *argv]) == 1
    assert f"{gone}: the file the resolve stage uploaded" in capsys.readouterr().err
    assert P.runs(s3_store) == []
    assert layout.table_path(t, kind) not in P.all_tables(s3_store)


def test_a_run_resolved_without_uploads_is_published_from_its_work_folder(
    s3_store, tmp_path: Path, spark
):
    """A run resolved by a version that did not upload its outputs (no
    ``resolved/uploads.json``) is still published whole: publish puts the files itself."""
    s = json.loads((S.SCENARIOS / "future_timestamp.json").read_text())
    argv = _on_s3(s3_store, s, tmp_path)
    assert main(["ingest", *argv, "--no-data-docs"]) == 0
    for stage in ("resolve", "validate"):
        assert main([stage, *argv]) == 0
    uploads = next(tmp_path.glob("work/run=night/resolved/uploads.json"))
    staged = {u["rel"] for files in json.loads(uploads.read_text()).values() for u in files}
    uploads.unlink()
    assert main(["publish", *argv]) == 0
    t = next(iter(s["config"]["tables"]))
    rows = sorted(P.snapshot(s3_store, t), key=lambda r: r["id"])
    assert rows == s["expect"]["snapshot"][t]  # the scenario's hand-written result
    lake = Lake(s3_store)
    committed = {a["path"] for a in add_actions(lake.table(layout.table_path(t, "state")))}
    assert committed and not committed & staged  # its own uploads, not the staged files
    assert [r["status"] for r in P.runs(s3_store)] == ["published"]


def test_a_small_runs_files_share_one_task_per_core(s3_store, tmp_path: Path, spark):
    """The uploads of a small run's files (a few KB each) take one task per core; a large
    run's one task per file. The same files either way."""
    s = json.loads((S.SCENARIOS / "future_timestamp.json").read_text())
    argv = _on_s3(s3_store, s, tmp_path, cdc=True)
    assert main(["ingest", *argv, "--no-data-docs"]) == 0
    assert main(["resolve", *argv]) == 0
    ctx = RunContext.load(tmp_path / "work", date.fromisoformat(s["date"]))
    config = ctx.config(load_config(tmp_path / "cdr.yaml"))
    cores = spark.sparkContext.defaultParallelism
    files = {}
    for small in (True, False):
        tasks = tasks_per_stage(spark, lambda s=small: upload_outputs(spark, config, ctx, s))
        body = json.loads((ctx.resolved / UPLOADS).read_text())
        files[small] = {
            f: [(u["size"], u["rows"], u["stats"]) for u in us] for f, us in body.items()
        }
        n = sum(len(us) for us in body.values())
        assert n > cores and tasks == ([cores] if small else [n]), (small, tasks)
    assert files[True] == files[False]
