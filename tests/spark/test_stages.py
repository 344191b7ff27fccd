"""The stages of one run, run as separate commands (as the DAG runs them), agree on what
they publish (issue 14, item 4): a config edited between stages is refused, and so is a
verdict reached on an earlier resolve of the run (a stale verdict); and the session the
stages share."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

import pytest
import yaml

from pipeline.app.cli import main
from pipeline.core.errors import StageError
from pipeline.storage.context import RunContext
from pipeline.storage.workpath import WorkPath
from tests.helpers import published as P
from tests.helpers import scenarios as S
from tests.helpers.snapshots import SUB, D, setup


def test_stage_commands_refuse_an_edited_config_and_a_stale_verdict(tmp_path: Path, spark, capsys):
    cfg = setup(tmp_path, "warn", SUB)
    store = tmp_path / "store"
    argv = ["--config", str(cfg), "--date", D, "--work-dir", str(tmp_path / "work")]
    for stage in ("ingest", "resolve", "validate"):
        assert main([stage, *argv, "--no-data-docs"] if stage == "ingest" else [stage, *argv]) == 0
    original = cfg.read_text()
    edited = yaml.safe_load(original)
    edited["tables"]["t"]["columns"]["v"] = "bigint"
    cfg.write_text(yaml.safe_dump(edited, sort_keys=False))
    assert main(["publish", *argv]) == 1
    assert "the config changed since the run of 2026-11-21" in capsys.readouterr().err
    cfg.write_text(original)
    assert main(["resolve", *argv]) == 0  # a new resolve after the validation
    assert main(["publish", *argv]) == 1
    assert "are for another resolve" in capsys.readouterr().err
    assert P.snapshot_date(store, "t") is None and P.runs(store) == []  # nothing published
    assert (store / "published/_lock").exists()  # the run holds the store throughout
    assert main(["validate", *argv]) == 0
    assert main(["publish", *argv]) == 0
    assert P.snapshot_date(store, "t") == D and [r["status"] for r in P.runs(store)] == [
        "published"
    ]
    assert not (store / "published/_lock").exists()  # published: the store is free
    versions = sorted(p.name for p in (store / "published/t/state/_delta_log").iterdir())
    assert main(["publish", *argv]) == 0  # a retry after it went through: nothing again
    assert len(P.runs(store)) == 1 and not (store / "published/_lock").exists()
    assert sorted(p.name for p in (store / "published/t/state/_delta_log").iterdir()) == versions


def test_validate_judges_without_spark_what_the_resolve_measured(
    tmp_path: Path, spark, monkeypatch
):
    """The DAG's validate task starts no JVM: ``cdr resolve`` measures what the suites
    need (one Spark query), and ``cdr validate`` judges it with Great Expectations alone.
    A run resolved without its measures is measured first, with a Spark session."""
    import pipeline.spark.session
    from pipeline.validate.stage import MEASURES

    cfg = setup(tmp_path, "warn", SUB)
    argv = ["--config", str(cfg), "--date", D, "--work-dir", str(tmp_path / "work")]
    assert main(["ingest", *argv, "--no-data-docs"]) == 0
    assert main(["resolve", *argv]) == 0
    sessions: list[str] = []

    def session(*args, **kwargs):
        sessions.append("started")
        return spark

    monkeypatch.setattr(pipeline.spark.session, "get_spark", session)
    assert main(["validate", *argv]) == 0
    assert sessions == []
    ctx = RunContext.load(tmp_path / "work", date.fromisoformat(D))
    (ctx.resolved / MEASURES).unlink()  # resolved before measures were part of it
    assert main(["validate", *argv]) == 0
    assert sessions == ["started"]
    assert main(["publish", *argv]) == 0
    assert P.snapshot_date(tmp_path / "store", "t") == D


def test_a_run_id_that_was_published_is_refused(tmp_path: Path, spark, capsys):
    """A new run under a finished run's id would be taken for it (its runs row, its
    commits, its report): ingest refuses it and leaves the store free; nothing moves."""
    cfg = setup(tmp_path, "warn", SUB)
    store = tmp_path / "store"
    argv = ["--config", str(cfg), "--date", D, "--work-dir", str(tmp_path / "work")]
    assert main(["run", *argv, "--run-id", "night-1", "--no-data-docs"]) == 0
    log = store / "published/t/snapshot/_delta_log"
    before = sorted(p.name for p in log.iterdir())
    capsys.readouterr()
    assert main(["run", *argv, "--run-id", "night-1", "--no-data-docs"]) == 1
    err = capsys.readouterr().err
    assert "run id night-1 has run already (published, 2026-11-21" in err, err
    assert sorted(p.name for p in log.iterdir()) == before
    assert [r["run_id"] for r in P.runs(store)] == ["night-1"]
    assert not (store / "published/_lock").exists()
    assert main(["run", *argv, "--run-id", "night-2", "--no-data-docs"]) == 0


def test_a_failed_rerun_leaves_the_published_run_of_its_date(tmp_path: Path, spark, capsys):
    """A rerun of a published date that fails its gate writes only its own report and
    logs (``reports/dt=D/run=<id>/``, ``_failed/run=<id>/``) and its ``runs`` row (new
    files of that table only): every file the published run wrote, its tables and the
    date's report among them, stays as it was."""
    cfg = setup(tmp_path, "warn", SUB)  # sub's snapshot differs: a warning, published
    store = tmp_path / "store/published"
    argv = ["--config", str(cfg), "--date", D, "--work-dir", str(tmp_path / "work")]
    assert main(["run", *argv, "--run-id", "good", "--no-data-docs"]) == 0

    def files() -> dict[str, bytes]:
        return {str(p.relative_to(store)): p.read_bytes() for p in store.rglob("*") if p.is_file()}

    before = files()
    assert any(k.startswith("t/divergence/dt=") for k in before)
    spec = yaml.safe_load(cfg.read_text())
    cfg.write_text(yaml.safe_dump({**spec, "on_divergence": "fail"}))
    capsys.readouterr()
    assert main(["run", *argv, "--run-id", "bad", "--no-data-docs"]) == 1
    after = files()
    own = {k for k in after if k.startswith(("_failed/run=bad/", f"reports/dt={D}/run=bad/"))}
    own |= {k for k in after if k.startswith("runs/") and k not in before}
    assert {k: v for k, v in after.items() if k not in own} == before
    assert [(r["run_id"], r["status"]) for r in P.runs(store.parent)] == [
        ("good", "published"),
        ("bad", "failed"),
    ]
    assert any(k.startswith("_failed/run=bad/t/divergence/") for k in own)
    failed = json.loads(after[f"reports/dt={D}/run=bad/run_report.json"])
    assert failed["status"] == "failed" and failed["run_id"] == "bad"
    assert json.loads(after[f"reports/dt={D}/run_report.json"])["run_id"] == "good"
    assert not (store / "_lock").exists()


def test_get_spark_imports_the_preloaded_modules_and_survives_a_broken_one(spark):
    """The modules a validating process needs are imported while the JVM starts; one
    that cannot be imported is left to the caller's own import, which names it."""
    import sys

    from pipeline.spark.session import get_spark

    sys.modules.pop("xml.dom.minidom", None)
    assert get_spark(preload=("no_such_module_of_cdr", "xml.dom.minidom")) is spark
    assert "xml.dom.minidom" not in sys.modules  # the loader stopped at the broken one
    assert get_spark(preload=("xml.dom.minidom",)) is spark
    assert "xml.dom.minidom" in sys.modules


def test_read_output_takes_the_schema_spark_stored_without_a_job(spark, tmp_path: Path):
    """The run's own outputs are read with the schema Spark wrote in their footers: the
    same schema as Spark's inference, and no Spark job to get it. A folder that Spark did
    not write is inferred as usual."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.storage.outputs import read_output

    schema = "k bigint, v decimal(10,2), at timestamp, m map<string,int>, s struct<a:binary>"
    spark.createDataFrame([], schema).write.parquet(str(tmp_path / "out"))
    sc = spark.sparkContext
    sc.setJobGroup("read_output", "read_output")
    try:
        got = read_output(spark, WorkPath.of(tmp_path / "out"))
        assert sc.statusTracker().getJobIdsForGroup("read_output") == []
        assert got.schema == spark.read.parquet(str(tmp_path / "out")).schema
        assert len(sc.statusTracker().getJobIdsForGroup("read_output")) == 1  # the check can fail
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    (tmp_path / "arrow").mkdir()
    pq.write_table(pa.table({"k": [1, 2]}), tmp_path / "arrow" / "part-0.parquet")
    assert read_output(spark, WorkPath.of(tmp_path / "arrow")).collect() == [(1,), (2,)]


def test_small_runs_interpret_their_plans_and_large_ones_compile(spark, monkeypatch):
    from pipeline.ingest.inputs import StagedExport, StagedTable
    from pipeline.spark.session import CODEGEN_MIN_RECORDS, fit_codegen, sized

    def mode() -> tuple[str, str]:
        conf = spark.conf
        return conf.get("spark.sql.codegen.wholeStage"), conf.get("spark.sql.codegen.factoryMode")

    monkeypatch.delenv("CDR_CODEGEN", raising=False)
    default = mode()
    with sized(spark, 3) as compiled:  # one stage's settings; the session's come back
        assert not compiled and mode() == ("false", "NO_CODEGEN")
    assert mode() == default == ("true", "FALLBACK")
    # a small run's shuffles: as many partitions as the master's cores, unless set
    partitions = "spark.sql.shuffle.partitions"
    session = spark.conf.get(partitions)
    cores = str(spark.sparkContext.defaultParallelism)
    monkeypatch.delenv("CDR_SHUFFLE_PARTITIONS")
    spark.conf.set(partitions, "64")
    try:
        with sized(spark, 3):
            assert spark.conf.get(partitions) == cores
        assert spark.conf.get(partitions) == "64"
        with sized(spark, CODEGEN_MIN_RECORDS):
            assert spark.conf.get(partitions) == "64"
        monkeypatch.setenv("CDR_SHUFFLE_PARTITIONS", "64")
        with sized(spark, 3):
            assert spark.conf.get(partitions) == "64"
    finally:
        spark.conf.set(partitions, session)
    try:
        assert not fit_codegen(spark, CODEGEN_MIN_RECORDS - 1)
        assert mode() == ("false", "NO_CODEGEN")
        assert fit_codegen(spark, CODEGEN_MIN_RECORDS)
        assert mode() == ("true", "FALLBACK")
        monkeypatch.setenv("CDR_CODEGEN", "off")
        assert not fit_codegen(spark, 10 * CODEGEN_MIN_RECORDS)
        assert mode() == ("false", "NO_CODEGEN")
        monkeypatch.setenv("CDR_CODEGEN", "on")
        assert fit_codegen(spark, 0)
        assert mode() == ("true", "FALLBACK")
        monkeypatch.setenv("CDR_CODEGEN", "fast")
        with pytest.raises(StageError, match=r"CDR_CODEGEN='fast': use one of auto, on, off"):
            fit_codegen(spark, 0)
    finally:
        monkeypatch.delenv("CDR_CODEGEN")
        spark.conf.set("spark.sql.codegen.wholeStage", default[0])
        spark.conf.set("spark.sql.codegen.factoryMode", default[1])
    # what sizes a run: its export records, the state it starts from, the full copies
    staged = StagedTable(
        {r: StagedExport(r, "jsonl", n, []) for r, n in (("a", 5), ("b", 7))},
        base_rows=11,
        prior={"dt": "2026-11-20", "run_id": "r", "state_rows": 13},
        snapshots={"a": 17},
    )
    assert staged.records == 5 + 7 + 11 + 13 + 17


def test_the_session_records_no_python_call_sites(spark):
    """PySpark's DataFrame debugging costs four Py4J round trips per Column function: off."""
    from pyspark.errors.utils import is_debugging_enabled

    assert spark.conf.get("spark.python.sql.dataFrameDebugging.enabled") == "false"
    assert not is_debugging_enabled()


def test_one_writer_per_store_and_a_run_re_enters_its_own_lease(tmp_path: Path, spark, capsys):
    """The lease is taken at ingest (a stopped run's ``runs`` row needs Spark: delta-spark
    writes it). Another run, of the same date or another,
    is refused naming the holder; the holder's retry re-enters; finish releases; a dry run
    needs no lease; ``cdr unlock`` breaks a live one only with ``--force``."""
    cfg = setup(tmp_path, "warn", SUB)
    S.write_exports(tmp_path / "store", "2026-11-22", {"pub": {"t": []}})  # a date with inputs
    lock = tmp_path / "store/published/_lock"
    argv = ["--config", str(cfg), "--work-dir", str(tmp_path / "work")]
    a, b = ["--date", D, "--run-id", "night-a"], ["--date", D, "--run-id", "night-b"]
    assert main(["ingest", *argv, *a]) == 0 and json.loads(lock.read_text())["run_id"] == "night-a"
    capsys.readouterr()
    for other in (b, ["--date", "2026-11-22", "--run-id", "night-c"]):
        assert main(["ingest", *argv, *other]) == 1
        assert "is being written by run night-a on" in capsys.readouterr().err
    assert main(["ingest", *argv, *a]) == 0  # an Airflow retry of the same run
    dry = ["--date", D, "--run-id", "look", "--dry-run"]
    assert main(["ingest", *argv, *dry]) == 0  # writes nothing to the store: no lease
    assert json.loads(lock.read_text())["run_id"] == "night-a"
    work = tmp_path / "work"
    assert {p.name for p in work.iterdir()} == {"run=night-a", "run=look"}  # one each
    assert main(["finish", *argv, *a]) == 0 and not lock.exists()
    # a run that stopped before publish is in the runs table, as failed
    assert [(r["run_id"], r["status"]) for r in P.runs(tmp_path / "store")] == [
        ("night-a", "failed")
    ]
    assert main(["ingest", *argv, *b]) == 0 and json.loads(lock.read_text())["run_id"] == "night-b"
    # the date's earlier real run is over (b holds the lease): its folder goes; the dry
    # run's stays until the next dry run of the date
    assert {p.name for p in work.iterdir()} == {"run=night-b", "run=look"}
    assert main(["ingest", *argv, "--date", D, "--run-id", "look-2", "--dry-run"]) == 0
    assert {p.name for p in work.iterdir()} == {"run=night-b", "run=look-2"}
    capsys.readouterr()
    assert main(["unlock", "--config", str(cfg)]) == 1 and lock.exists()  # live: kept
    assert "`cdr unlock --force` breaks it" in capsys.readouterr().err
    assert main(["unlock", "--config", str(cfg), "--force"]) == 0 and not lock.exists()
    assert "unlocked" in capsys.readouterr().out


def test_a_local_frame_holds_its_rows_in_its_plan(spark):
    """Rows the driver holds reach Spark in the plan itself (no Python task serves them),
    with their types; no rows too."""
    from datetime import date
    from decimal import Decimal

    from pyspark.sql.types import StructType

    from pipeline.spark.session import local_frame

    ddl = "name string, n long, d date, amount decimal(10,2), raw binary"
    rows = [("a", 1, date(2026, 11, 21), Decimal("1.50"), b"\x00"), ("b", None, None, None, None)]
    for given in (rows, []):
        df = local_frame(spark, given, ddl)
        assert "LocalTableScan" in df._jdf.queryExecution().executedPlan().toString()
        assert [tuple(r) for r in df.collect()] == [tuple(r) for r in given]
        assert df.schema == StructType.fromDDL(ddl)


def test_write_output_records_the_schema_and_rows_and_readers_take_them(
    spark, tmp_path: Path, monkeypatch
):
    """``write_output`` records beside the files the schema and the rows it wrote (an
    append adds its rows); ``read_output`` then opens no file of the folder on the driver
    (a footer that cannot be read is never read)."""
    import pyarrow as pa

    from pipeline.storage import workpath
    from pipeline.storage.outputs import OUTPUT_INFO, output_info, read_output, write_output

    out = WorkPath.of(tmp_path / "out")
    df = spark.createDataFrame([(1, "a"), (2, None)], "k bigint, v string")
    assert write_output(df, out) == 2
    assert output_info(out) == (df.schema, 2)
    assert write_output(df.limit(1), out, mode="append") == 1
    assert output_info(out) == (df.schema, 3)
    for f in out.parquet_files():  # footers no reader may open
        f.write_bytes(b"not parquet")
    with monkeypatch.context() as m:
        m.setattr(workpath, "metadata", lambda p: pytest.fail(f"footer of {p} read"))
        assert read_output(spark, out).schema == df.schema
    (tmp_path / "out" / OUTPUT_INFO).unlink()
    with pytest.raises(pa.ArrowInvalid):  # without the record the footers are read
        read_output(spark, out)


def test_no_footer_of_an_output_with_its_record_is_read_on_the_driver(
    tmp_path: Path, spark, monkeypatch
):
    """A whole run (a golden scenario with disputes, a repeated copy, a record without an
    event id): the fold's outputs, the ledger and the snapshot are published from what
    was recorded beside them, and no reader opens a footer of a folder with that record."""
    from pipeline.publish import commit as published
    from pipeline.storage import workpath
    from pipeline.storage.outputs import OUTPUT_INFO
    from tests.helpers import GOLDEN

    opened: list[str] = []
    recorded: dict[str, bool] = {}
    footer, read_record = workpath.metadata, published.output_record

    def metadata(p: WorkPath) -> object:
        if (p.parent / OUTPUT_INFO).is_file():
            opened.append(str(p))
        return footer(p)

    empty: set[str] = set()  # outputs recorded with no rows, of which no file was written

    def spy(folder: WorkPath) -> object:  # the publish's read of each output's record
        name, info = f"{folder.parent.name}/{folder.name}", read_record(folder)
        recorded[name] = info is not None
        if info is not None and info[1] == 0 and not folder.parquet_files():
            empty.add(name)
        return info

    monkeypatch.setattr(workpath, "metadata", metadata)
    monkeypatch.setattr(published, "output_record", spy)
    s = json.loads((GOLDEN / "differing_copies.json").read_text())
    got, failed = S.run_scenario(s, tmp_path)
    assert not failed and got["status"] == "published", got
    assert opened == []
    made = {"t/state_pre", "t/snapshot", "t/ledger", "t/conflicts", "t/quarantine"}
    made.add("resolved/conflict_stats")  # the driver's few rows, recorded whole
    assert {k for k in made if recorded.get(k)} == made, recorded
    # an output with no rows is its record alone, and its table is there, empty that date
    logs = {f"t/{k}" for k in ("conflicts", "quarantine", "divergence")}
    assert empty & logs, empty
    store = tmp_path / "store"
    for name in empty & logs:
        assert P.table(store, f"published/{name}") is not None, name
        assert P.rows(store, f"published/{name}", s["date"]) == [], name


def test_a_recorded_output_whose_files_are_gone_is_never_published_empty(
    tmp_path: Path, spark
) -> None:
    """An output whose record counts rows but whose folder holds no file of them stops
    the publish naming the folder; one recorded with no rows creates its table empty."""
    from pyspark.sql import types as T

    from pipeline.publish.commit import Committer
    from pipeline.storage.lake import Lake
    from pipeline.storage.outputs import note_output
    from pipeline.storage.store import open_store

    resolved = WorkPath.of(tmp_path / "resolved")
    schema = T.StructType([T.StructField("event_id", T.StringType())])
    note_output(resolved / "t" / "conflicts", schema, 3)
    note_output(resolved / "t" / "divergence", schema, 0)
    lake = Lake(open_store((tmp_path / "store").as_uri()), spark=spark)
    committer = Committer(lake, resolved, {"run_id": "r1"})
    with pytest.raises(StageError, match="3 row\\(s\\) recorded, but no file"):
        committer.commit("t/conflicts", "published/t/conflicts", date.fromisoformat(D))
    assert committer.commit("t/divergence", "published/t/divergence", date.fromisoformat(D)) == 0
    assert P.table(tmp_path / "store", "published/t/divergence") == []


def test_a_commit_whose_log_counts_other_rows_than_the_run_wrote_is_undone(
    tmp_path: Path, spark
) -> None:
    """After each commit the publish counts the committed partition's rows from the Delta
    log; a count other than the output's recorded rows restores the version before in a
    new commit and stops the publish (no runs row names the version)."""
    from pyspark.sql import types as T

    from pipeline.publish.commit import Committer
    from pipeline.storage.lake import Lake
    from pipeline.storage.outputs import note_output
    from pipeline.storage.store import open_store

    resolved = WorkPath.of(tmp_path / "resolved")
    schema = T.StructType([T.StructField("event_id", T.StringType())])
    folder, path, dt = resolved / "t" / "conflicts", "published/t/conflicts", date.fromisoformat(D)
    lake = Lake(open_store((tmp_path / "store").as_uri()), spark=spark)
    lake.commit(path, spark.createDataFrame([("before",)], schema), {"run_id": "r0"}, dt=dt)
    spark.createDataFrame([("a",), ("b",)], schema).write.parquet(str(folder))
    note_output(folder, schema, 2)
    committer = Committer(lake, resolved, {"run_id": "r1"})
    assert committer.commit("t/conflicts", path, dt) == 1
    assert sorted(r["event_id"] for r in P.table(tmp_path / "store", path) or []) == ["a", "b"]
    note_output(folder, schema, 3)  # the run says 3: the files hold 2
    again = Committer(lake, resolved, {"run_id": "r2"})
    said = r"version 2 holds 2 rows by its Delta log, but the run counted 3 \(version 1 restored"
    with pytest.raises(StageError, match=said + " as version 3"):
        again.commit("t/conflicts", path, dt)
    assert sorted(r["event_id"] for r in P.table(tmp_path / "store", path) or []) == ["a", "b"]
    restored = P.commit_meta(lake.history(path, 1)[0])
    assert (restored["run_id"], restored["operation"]) == ("r2", "restored version 1")
    # a table the refused commit created: the run's retry finds it its own and stops again
    new, new_path = resolved / "t" / "divergence", "published/t/divergence"
    spark.createDataFrame([("x",)], schema).write.parquet(str(new))
    note_output(new, schema, 2)
    for _ in range(2):
        with pytest.raises(StageError, match=r"holds 1 rows .* counted 2 \(a new table"):
            again.commit("t/divergence", new_path, dt)
