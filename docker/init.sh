#!/usr/bin/env bash
# airflow-init: migrate Airflow's database, write the admin's password (from .env) where
# the simple auth manager reads it, then check that the pipeline's S3 user reaches the
# store's bucket (minio-init created both). Runs once per `docker compose up`.
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

from pipeline import load_config

bucket = urlparse(load_config(os.environ["CDR_CONFIG"]).store).netloc
try:
    boto3.client("s3").head_bucket(Bucket=bucket)
except ClientError as e:
    raise SystemExit(f"the pipeline's S3 user cannot reach bucket {bucket}: {e}") from None
print(f"bucket {bucket}: reachable with the pipeline's keys")
PY
