#!/usr/bin/env bash
# airflow-init: migrate Airflow's database, write the admin's password (from .env) where
# the simple auth manager reads it, then create the store's bucket in the S3 server
# (idempotent). Runs once per `docker compose up`.
set -euo pipefail
airflow db migrate
umask 077  # the passwords file is the admin's alone
python -c 'import json, os, sys; json.dump({"admin": os.environ["CDR_ADMIN_PASSWORD"]}, sys.stdout)' \
  > "$AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"
echo "Airflow: log in as admin with the password CDR_ADMIN_PASSWORD of .env"
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
