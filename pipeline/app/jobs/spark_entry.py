"""``spark-submit pipeline/app/jobs/spark_entry.py resolve --config cdr.yaml --date D``: runs one
``cdr`` command in the Spark driver that spark-submit started (master and resources come
from spark-submit)."""

import sys

from pipeline.app.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
