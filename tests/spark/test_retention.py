"""Delta logs outlive every retained run (docs/operations.md#retention):
every published table carries the config's ``retention_days`` as its log retention, so
checkpoints and log clean-up, long after the runs, never remove a version a retained
``runs`` row names, and a backfill from the oldest retained date still works. On
``file://``, where log files can be backdated: delta-spark removes log files older than
the table's log retention (30 days by default) once a checkpoint follows them."""

from __future__ import annotations

import os
import time
from datetime import date
from pathlib import Path

from deltalake import DeltaTable

from pipeline.app.cli import main
from pipeline.app.generate import GenerateOptions, generate
from pipeline.core.config_load import parse_config
from pipeline.publish.vacuum import table_paths
from pipeline.storage.lake_retention import RETENTION_PROPERTIES
from pipeline.storage.store import FileStore
from tests.helpers import configs
from tests.helpers import published as P

D1, D2 = date(2026, 11, 20), date(2026, 11, 21)
#: the test's checkpoints come every 2 commits (delta-spark's default is 10: the test
#: needs two checkpoints, not their number of commits)
INTERVAL = 2
CONFIG = configs.config(
    {"items": configs.table({"id": "bigint", "qty": "int"})},
    replicas=("r1", "r2"),
    retention_days=60,
    on_divergence="warn",
)


def _age(log: Path, days: int) -> None:
    """The log's files made ``days`` older, a second apart in their order (as written: a
    Delta clean-up takes a file no later than the one before it for a commit of the same
    moment, and finds no checkpoint among files of one time)."""
    old = time.time() - days * 86400
    for i, f in enumerate(sorted(log.iterdir())):
        os.utime(f, (old + i, old + i))


def _forty_days_of_commits(spark, uri: str) -> None:
    """A checkpoint's worth of commits after the table's own (delta-spark's: property
    changes), all of them 40 days old by their files' time, then one more commit: its
    checkpoint's clean-up removes every log file older than the table's log retention
    that the checkpoint makes unnecessary."""

    def alter(props: str) -> None:
        spark.sql(f"ALTER TABLE delta.`file://{uri}` SET TBLPROPERTIES ({props})")

    alter(f"'delta.checkpointInterval' = '{INTERVAL}'")
    for i in range(INTERVAL + 1):
        alter(f"'cdr.test.tick' = '{i}'")
    _age(Path(uri) / "_delta_log", 40)
    for i in range(INTERVAL):  # to the next checkpoint, which cleans up
        alter(f"'cdr.test.tock' = '{i}'")


def _loads(uri: str, version: int) -> bool:
    try:
        P.query(DeltaTable(uri, version=version))
        return True
    except Exception:
        return False


def test_every_retained_version_loads_after_forty_days_of_checkpoints(tmp_path: Path, spark):
    root = tmp_path / "store"
    store = FileStore(root)
    cfg = configs.write(tmp_path / "cdr.yaml", CONFIG, store=root)
    config = parse_config({**CONFIG, "store": root.as_uri()})
    run = ["run", "--config", str(cfg), "--no-data-docs"]
    for i, dt in enumerate((D1, D2)):
        generate(config, store, dt, GenerateOptions(events=60, base_rows=10 * (i == 0), seed=i))
        assert main([*run, "--date", dt.isoformat(), "--work-dir", str(tmp_path / f"w{i}")]) == 0

    # a table the project did not write: the default retention, the same 40 days
    control = str(tmp_path / "control")
    spark.createDataFrame([(1,)], "id long").write.format("delta").save(f"file://{control}")
    _forty_days_of_commits(spark, control)
    assert not _loads(control, 0)  # the clean-up ran: version 0's log is gone

    paths = table_paths(store)
    for path in paths:
        props = DeltaTable(str(root / path)).metadata().configuration
        assert {k: props.get(k) for k in RETENTION_PROPERTIES} == dict.fromkeys(
            RETENTION_PROPERTIES, "interval 60 days"
        ), path
        _forty_days_of_commits(spark, str(root / path))
    runs = P.runs(store)
    named = [(path, v) for r in runs for path, v in r["versions"].items()]
    assert len(runs) == 2 and len({p for p, _ in named}) >= 8
    assert [(p, v) for p, v in named if not _loads(str(root / p), v)] == []

    # a backfill from the oldest retained date: D2 again, from D1's state at its version
    assert main([*run, "--date", D2.isoformat(), "--work-dir", str(tmp_path / "again")]) == 0
    assert [r["status"] for r in P.runs(store)] == ["published"] * 3
