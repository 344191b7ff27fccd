"""The install is what the lock says: pip's pyspark-client (pulled by the Spark provider)
must not have replaced pyspark's Python files, and Python UDFs must work (a mixed install
still runs plain SQL but fails in mapInArrow)."""

from __future__ import annotations

import pyarrow as pa
import pyspark

from tests.helpers import REPO

LOCK = REPO / "constraints.txt"


def locked(name: str) -> str:
    for line in LOCK.read_text().splitlines():
        if line.lower().startswith(f"{name.lower()}=="):
            return line.split("==")[1]
    raise AssertionError(f"{name} not in constraints.txt")


def test_pyspark_python_matches_the_jvm_and_the_lock(spark):
    assert pyspark.__version__ == spark.version == locked("pyspark")


def test_map_in_arrow_runs_python_workers(spark):
    def double(batches):
        for b in batches:
            yield pa.RecordBatch.from_pydict({"x": [v * 2 for v in b.column(0).to_pylist()]})

    out = spark.range(5).mapInArrow(double, "x long").collect()
    assert sorted(r.x for r in out) == [0, 2, 4, 6, 8]


def test_great_expectations_validates_a_spark_dataframe(spark, tmp_path):
    """GX is installed without its [spark] extra (it caps pyspark below 4.2): it still
    runs on pyspark 4.3."""
    from pipeline.validate.suites import Project

    df = spark.createDataFrame([(1,), (2,)], "id int")
    query = "SELECT * FROM {batch} WHERE id IS NULL"
    suite = {
        "name": "probe",
        "expectations": [
            {
                "type": "unexpected_rows_expectation",
                "severity": "critical",
                "kwargs": {"unexpected_rows_query": query, "description": "no null id"},
                "meta": {"check": "not_null"},
            }
        ],
    }
    checks = Project(tmp_path, tmp_path / "docs").validate(df, suite)
    assert [(c.success, c.observed) for c in checks] == [(True, 0)]
