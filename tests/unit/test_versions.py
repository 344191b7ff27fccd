"""The install is what the lock says, without Spark: pandas below 3 (PySpark 4 does not
support pandas 3). (pyspark against the JVM and the lock: tests/spark/test_versions.py.)"""

from __future__ import annotations

import pandas


def test_pandas_below_3():
    assert int(pandas.__version__.split(".")[0]) < 3
