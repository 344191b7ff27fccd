"""``make compose-env``: the stack's secrets in ``.env`` (readable by its owner only):
each one the file lacks is written, random; those it has are kept, so that an ``.env``
written before a secret was added gets the new one and keeps the others.

One exception: a stack started before the database password came from ``.env`` has a
database whose password is ``airflow`` (PostgreSQL's image sets it only when it creates
its volume), so an older ``.env`` gets that, with how to change it."""

from __future__ import annotations

import base64
import os
import secrets
import sys
from collections.abc import Callable
from pathlib import Path

#: every secret docker-compose.yaml asks for, and how a new one is made
SECRETS: dict[str, Callable[[], str]] = {
    "CDR_S3_ACCESS_KEY": lambda: f"cdr-{secrets.token_hex(4)}",  # the pipeline's MinIO user
    "CDR_S3_SECRET_KEY": lambda: secrets.token_urlsafe(30),
    "CDR_MINIO_ROOT_USER": lambda: f"root-{secrets.token_hex(4)}",  # minio-init's only
    "CDR_MINIO_ROOT_PASSWORD": lambda: secrets.token_urlsafe(30),
    "CDR_DB_PASSWORD": lambda: secrets.token_hex(24),  # in a URL: hex
    "CDR_JWT_SECRET": lambda: secrets.token_urlsafe(48),
    "CDR_FERNET_KEY": lambda: base64.urlsafe_b64encode(secrets.token_bytes(32)).decode(),
    "CDR_ADMIN_PASSWORD": lambda: secrets.token_urlsafe(12),
}


#: the database password of a stack started before it came from .env
OLD_DB_PASSWORD = "airflow"
ROTATE = """\
note: the database keeps its password 'airflow' (set when its volume was created). To
change it: docker compose exec postgres psql -U airflow -c "ALTER ROLE airflow PASSWORD '<new>'"
then put <new> as CDR_DB_PASSWORD in .env and run docker compose up -d"""


def main(path: Path) -> None:
    lines = path.read_text().splitlines() if path.exists() else []
    have = {line.split("=", 1)[0] for line in lines if "=" in line and line.split("=", 1)[1]}
    lines = [line for line in lines if line.split("=", 1)[0] in have or "=" not in line]
    upgrade = bool(have) and "CDR_DB_PASSWORD" not in have
    made = {
        k: (OLD_DB_PASSWORD if upgrade and k == "CDR_DB_PASSWORD" else make())
        for k, make in SECRETS.items()
    }
    new = [f"{k}={made[k]}" for k in SECRETS if k not in have]
    if not new:
        print(f"{path} has every secret: kept")
        return
    os.umask(0o077)
    path.write_text("".join(f"{line}\n" for line in [*lines, *new]))
    path.chmod(0o600)
    names = ", ".join(n.split("=", 1)[0] for n in new)
    print(f"wrote {names} to {path} (the Airflow login: admin, password CDR_ADMIN_PASSWORD)")
    if upgrade:
        print(ROTATE)


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else ".env"))
