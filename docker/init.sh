#!/usr/bin/env bash
# airflow-init: migrate Airflow's database, then create the store's bucket in the S3
# server (idempotent). Runs once per `docker compose up`.
set -euo pipefail
airflow db migrate
python - <<'PY'
import os
from urllib.parse import urlparse

import boto3
from botocore.exceptions import ClientError

from pipeline.config import load_config

bucket = urlparse(load_config(os.environ["CDR_CONFIG"]).store).netloc
s3 = boto3.client("s3")
try:
    s3.head_bucket(Bucket=bucket)
    print(f"bucket {bucket} exists")
except ClientError:
    s3.create_bucket(Bucket=bucket)
    print(f"bucket {bucket} created")
PY
