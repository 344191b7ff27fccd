"""docker-compose.yaml read as a file: the stack listens on loopback and asks for a login,
runs every Airflow service on PostgreSQL, its config is the demo's, its image installs
the wheel, and every service, volume and connection docs/deployment.md names is there.
(Validated by a real Compose implementation: tests/e2e/test_compose.py.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from tests.helpers import REPO

COMPOSE = REPO / "docker-compose.yaml"


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


def _compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def _readme_section() -> str:
    text = (REPO / "docs" / "deployment.md").read_text()
    start = text.index("## The whole stack with docker-compose")
    end = text.find("\n## ", start + 3)
    return text[start : end if end > 0 else None]


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
    from pipeline.app.demo import DEMO_CONFIG
    from pipeline.core.config_load import load_config

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


def test_each_service_gets_only_the_secrets_it_needs():
    """The Spark worker gets the S3 keys and none of Airflow's secrets (the master gets
    nothing); MinIO's root keys
    reach ``minio`` and ``minio-init`` alone, which creates the pipeline's own user (the
    S3 keys every other service uses) with a policy that allows the store's bucket only;
    the metadata database's password comes from .env, never a literal."""
    services = _compose()["services"]
    airflow_only = ("JWT", "FERNET", "SQL_ALCHEMY_CONN", "PASSWORD", "AIRFLOW_CONN")
    assert services["spark-master"]["environment"] == {}
    env = services["spark-worker"]["environment"]
    assert not [k for k in env if any(w in k for w in airflow_only)], env
    assert env["AWS_ACCESS_KEY_ID"].startswith("${CDR_S3_ACCESS_KEY:?")
    root = [n for n, s in services.items() if "CDR_MINIO_ROOT" in json.dumps(s)]
    assert sorted(root) == ["minio", "minio-init"], root
    init = services["minio-init"]
    assert init["depends_on"]["minio"]["condition"] == "service_healthy"
    from pipeline.core.config_load import load_config

    bucket = load_config(REPO / "docker" / "cdr.yaml").store.split("/")[2]
    assert init["environment"]["CDR_BUCKET"] == bucket
    script = (REPO / "docker" / "minio-init.sh").read_text()
    for step in ("mc mb --ignore-existing", "mc admin user add", "mc admin policy attach"):
        assert step in script, step
    assert '"arn:aws:s3:::$CDR_BUCKET/*"' in script and '"s3:*"' not in script
    for name, s in services.items():
        if name.startswith("airflow-"):
            env = s["environment"]
            conn = json.loads(env["AIRFLOW_CONN_AWS_DEFAULT"])
            assert conn["login"] == "${CDR_S3_ACCESS_KEY}", name
            assert s["depends_on"]["minio-init"]["condition"] == "service_completed_successfully"
            assert ":${CDR_DB_PASSWORD:?" in env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"], name
    pg = services["postgres"]["environment"]
    assert pg["POSTGRES_PASSWORD"].startswith("${CDR_DB_PASSWORD:?")
    assert "airflow:airflow@" not in COMPOSE.read_text()
