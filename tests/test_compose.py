"""docker-compose.yaml: valid for a real Compose implementation (Docker is not available
on the test machines, so ``docker-compose config`` validates it without starting
anything), and every service, volume and connection the README names is there."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.helpers import REPO

COMPOSE = REPO / "docker-compose.yaml"


#: what `make compose-env` writes to .env (random there)
SECRETS = {
    "CDR_S3_ACCESS_KEY": "k",
    "CDR_S3_SECRET_KEY": "s" * 20,
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
    assert "password CDR_ADMIN_PASSWORD in .env" in out.stdout
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


def test_the_stack_listens_on_loopback_and_asks_for_a_login():
    services = _compose()["services"]
    ports = [p for s in services.values() for p in s.get("ports", [])]
    assert ports and all(p.startswith("127.0.0.1:") for p in ports), ports
    env = services["airflow-apiserver"]["environment"]
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS"] == "false"
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"] == "admin:admin"
    for key in (
        "AIRFLOW__API_AUTH__JWT_SECRET",
        "AIRFLOW__CORE__FERNET_KEY",
        "AWS_SECRET_ACCESS_KEY",
    ):
        assert env[key].startswith("${"), key
    # airflow-init writes the admin's password from .env into the file the api-server reads
    passwords = env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"]
    init = services["airflow-init"]
    assert init["environment"]["CDR_ADMIN_PASSWORD"].startswith("${CDR_ADMIN_PASSWORD:?")
    mounts = {v.split(":")[1]: v.split(":")[0] for v in init["volumes"]}
    assert mounts == {
        v.split(":")[1]: v.split(":")[0] for v in services["airflow-apiserver"]["volumes"]
    }
    assert str(Path(passwords).parent) in mounts
    script = (REPO / "docker" / "init.sh").read_text()
    assert "SIMPLE_AUTH_MANAGER_PASSWORDS_FILE" in script and "umask 077" in script


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


def _compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def _readme_section() -> str:
    text = (REPO / "README.md").read_text()
    start = text.index("## The whole stack with docker-compose")
    end = text.index("\n## ", start + 3)
    return text[start:end]


def test_every_service_volume_and_connection_the_readme_names_is_there():
    compose = _compose()
    section = _readme_section()
    services = set(re.findall(r"^\| service \| `([\w-]+)`", section, re.M))
    volumes = set(re.findall(r"^\| volume \| `([\w-]+)`", section, re.M))
    connections = set(re.findall(r"^\| connection \| `(\w+)`", section, re.M))
    assert services == set(compose["services"]), services ^ set(compose["services"])
    assert volumes == set(compose["volumes"])
    assert connections == {"aws_default", "spark_default"}
    env = compose["services"]["airflow-scheduler"]["environment"]
    aws = json.loads(env["AIRFLOW_CONN_AWS_DEFAULT"])
    spark = json.loads(env["AIRFLOW_CONN_SPARK_DEFAULT"])
    assert aws["extra"]["endpoint_url"] == "http://minio:9000" and "minio" in compose["services"]
    assert spark["host"] == "spark://spark-master" and spark["port"] == 7077


def test_the_stack_runs_every_airflow_service_on_postgres():
    services = _compose()["services"]
    commands = {name: s.get("command") for name, s in services.items()}
    for cmd in ("api-server", "scheduler", "dag-processor", "triggerer"):
        assert cmd in commands.values(), cmd
    for name, s in services.items():
        if name.startswith("airflow-"):
            conn = s["environment"]["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
            assert conn.startswith("postgresql") and "@postgres:" in conn
            assert {"postgres", "minio"} <= set(s["depends_on"])
            if name != "airflow-init":
                assert s["depends_on"]["airflow-init"]["condition"] == (
                    "service_completed_successfully"
                )
    image = services["minio"]["image"]
    assert re.search(r":RELEASE\.\d{4}-\d{2}-\d{2}T", image), "pin MinIO's release"
    # the run's work folder is shared by the tasks (scheduler) and the Spark executors
    for name in ("airflow-scheduler", "spark-worker"):
        assert "cdr-work:/opt/cdr-work" in services[name]["volumes"]
    # the image holds the installed wheel (docker/Dockerfile): no service mounts the source
    for name, s in services.items():
        assert not any(v.startswith(".:") for v in s.get("volumes", [])), name


def test_the_stacks_config_is_the_demos_with_the_stacks_bucket():
    from pipeline.config import load_config
    from pipeline.demo import DEMO_CONFIG

    data = yaml.safe_load((REPO / "docker" / "cdr.yaml").read_text())
    assert {k: v for k, v in data.items() if k in DEMO_CONFIG and k != "store"} == {
        k: v for k, v in DEMO_CONFIG.items() if k != "store"
    }
    config = load_config(REPO / "docker" / "cdr.yaml")
    assert config.store == "s3://replica-exports/prod" and config.schedule == "0 2 * * *"


def test_the_image_installs_the_projects_wheel_with_the_lock():
    """No Docker here to build it: the Dockerfile builds the wheel from the repository's
    files (its suites included) and installs it with the lock, not in editable mode."""
    text = (REPO / "docker" / "Dockerfile").read_text()
    assert "COPY --chown=airflow:0 expectations ./expectations" in text
    assert "pip wheel --no-cache-dir --no-deps" in text
    assert '-c /opt/cdr/constraints.txt "$(ls /opt/cdr/dist/replica_cdr-*.whl)[airflow]"' in text
    assert " -e " not in text
