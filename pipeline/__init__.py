"""Conflict detection and resolution for active-active replicas.

The package is the pure core of the product: it never imports Airflow. Stages are plain
functions (``pipeline.stages``); the rules are pure Python (``pipeline.guards``,
``pipeline.rowfold``, ``pipeline.cellfold``); Spark work is DataFrame-in, DataFrame-out
(``pipeline.engine``, ``pipeline.cells``); storage sits behind ``pipeline.store``.
"""

__version__ = "0.1.0"
