"""docker-compose.yaml: valid for a real Compose implementation (Docker is not available
on the test machines, so ``docker-compose config`` validates it without starting
anything), its secrets from the environment, written by ``make compose-env``. (What
the file holds: tests/unit/test_compose.py.)"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import REPO

COMPOSE = REPO / "docker-compose.yaml"


#: what `make compose-env` writes to .env (random there)
SECRETS = {
    "CDR_S3_ACCESS_KEY": "k",
    "CDR_S3_SECRET_KEY": "s" * 20,
    "CDR_MINIO_ROOT_USER": "r",
    "CDR_MINIO_ROOT_PASSWORD": "q" * 20,
    "CDR_DB_PASSWORD": "d" * 48,
    "CDR_JWT_SECRET": "j" * 40,
    "CDR_FERNET_KEY": "f" * 43 + "=",
    "CDR_ADMIN_PASSWORD": "p" * 16,
}


def _compose_config(path: Path, env: dict[str, str] = SECRETS) -> subprocess.CompletedProcess:
    exe = shutil.which("docker-compose")
    assert exe, "docker-compose is missing: `make compose-tool` installs Debian's"
    clean = {k: v for k, v in os.environ.items() if k not in SECRETS}
    return subprocess.run(
        [exe, "-f", str(path), "--project-directory", str(path.parent), "config", "-q"],
        capture_output=True,
        text=True,
        check=False,
        env={**clean, **env},
    )


def test_compose_validates_the_file(tmp_path):
    copy = tmp_path / "docker-compose.yaml"  # a folder without a .env
    copy.write_text(COMPOSE.read_text())
    out = _compose_config(copy)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("missing", sorted(SECRETS))
def test_the_stack_needs_its_secrets_from_the_environment(tmp_path, missing):
    """No secret is in the file: without one (no .env), Compose stops and says what to do."""
    copy = tmp_path / "docker-compose.yaml"
    copy.write_text(COMPOSE.read_text())
    out = _compose_config(copy, {k: v for k, v in SECRETS.items() if k != missing})
    assert out.returncode != 0 and missing in out.stderr and "make compose-env" in out.stderr


def test_make_compose_env_writes_every_secret_the_stack_needs(tmp_path):
    """``make compose-env`` in a folder without .env writes each secret Compose asks for
    (random, readable by its owner only), and Compose accepts the file as it is."""
    out = subprocess.run(
        ["make", "-s", "-C", str(tmp_path), "-f", str(REPO / "Makefile"), "compose-env"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "password CDR_ADMIN_PASSWORD" in out.stdout
    env = tmp_path / ".env"
    assert env.stat().st_mode & 0o077 == 0
    values = dict(line.split("=", 1) for line in env.read_text().splitlines())
    assert set(values) == set(SECRETS) == set(re.findall(r"\$\{(\w+):\?", COMPOSE.read_text()))
    assert len(set(values.values())) == len(values) and all(len(v) >= 12 for v in values.values())
    from cryptography.fernet import Fernet

    Fernet(values["CDR_FERNET_KEY"])  # a key Airflow can use
    (tmp_path / "docker-compose.yaml").write_text(COMPOSE.read_text())
    result = _compose_config(tmp_path / "docker-compose.yaml", {})
    assert result.returncode == 0, result.stderr
    again = subprocess.run(
        ["make", "-s", "-C", str(tmp_path), "-f", str(REPO / "Makefile"), "compose-env"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert (
        "kept" in again.stdout
        and dict(line.split("=", 1) for line in env.read_text().splitlines()) == values
    )
    # an .env written before a secret was added gets it (an empty one too), and keeps the
    # others; its database was created with the password 'airflow': that, and how to change
    older = {k: v for k, v in values.items() if k not in ("CDR_DB_PASSWORD", "CDR_MINIO_ROOT_USER")}
    env.write_text("".join(f"{k}={v}\n" for k, v in older.items()) + "CDR_MINIO_ROOT_USER=\n")
    out = subprocess.run(
        ["make", "-s", "-C", str(tmp_path), "-f", str(REPO / "Makefile"), "compose-env"],
        check=True,
        capture_output=True,
        text=True,
    )
    more = dict(line.split("=", 1) for line in env.read_text().splitlines())
    assert set(more) == set(values) and more["CDR_DB_PASSWORD"] == "airflow"
    assert "ALTER ROLE airflow PASSWORD" in out.stdout
    assert len(more["CDR_MINIO_ROOT_USER"]) >= 12
    assert {k: more[k] for k in older} == older


@pytest.mark.parametrize(
    "old, new, message",
    [
        ("condition: service_healthy", "condition: service_happy", "service_happy"),
        ("    restart: always\n", "    restart: always\n    replicas: two\n", "replicas"),
    ],
)
def test_compose_refuses_a_broken_file(tmp_path, old, new, message):
    broken = tmp_path / "docker-compose.yaml"
    broken.write_text(COMPOSE.read_text().replace(old, new, 1))
    out = _compose_config(broken)
    assert out.returncode != 0 and message in out.stderr, out.stderr
