#!/bin/sh
# minio-init: with MinIO's root keys (this container's alone), create the store's bucket
# and the pipeline's user, whose policy allows that bucket and nothing else. Idempotent:
# runs once per `docker compose up`.
set -eu
mc alias set root http://minio:9000 "$MINIO_ROOT_USER" "$MINIO_ROOT_PASSWORD" >/dev/null
mc mb --ignore-existing "root/$CDR_BUCKET"
cat > /tmp/cdr-store.json <<POLICY
{
  "Version": "2012-10-17",
  "Statement": [
    {"Effect": "Allow", "Action": ["s3:ListBucket", "s3:GetBucketLocation"],
     "Resource": ["arn:aws:s3:::$CDR_BUCKET"]},
    {"Effect": "Allow",
     "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload",
                "s3:ListMultipartUploadParts"],
     "Resource": ["arn:aws:s3:::$CDR_BUCKET/*"]}
  ]
}
POLICY
mc admin policy create root cdr-store /tmp/cdr-store.json
mc admin user add root "$CDR_S3_ACCESS_KEY" "$CDR_S3_SECRET_KEY"
if ! mc admin policy attach root cdr-store --user "$CDR_S3_ACCESS_KEY" >/dev/null 2>&1; then
  mc admin user info root "$CDR_S3_ACCESS_KEY" | grep -q cdr-store   # attached before
fi
echo "bucket $CDR_BUCKET and its user $CDR_S3_ACCESS_KEY are ready"
