"""Entry points for ``spark-submit``: they need neither Airflow nor this package's CLI
parsing beyond ``cdr``'s own, so the same job runs under spark-submit, under the DAG's
SparkSubmitOperator and by hand."""

from __future__ import annotations

from pathlib import Path

ENTRY = Path(__file__).with_name("spark_entry.py")
