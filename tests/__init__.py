"""The test suite, by what each test needs (pyproject's pytest section, ``make test``):

- ``unit/``: no Spark, no services (``make test-fast``);
- ``spark/``: the shared Spark session, and the S3 server on loopback;
- ``e2e/``: whole runs in their own processes, scenarios, a standalone cluster, real
  PostgreSQL servers, a browser, Compose, the wheel;
- ``airflow/``: Airflow, in this process or as services;
- ``helpers/``: what they share (``helpers.configs`` builds every config)."""
