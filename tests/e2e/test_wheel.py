"""The project as a user installs it (issue 17): a wheel built from the repository,
installed outside it, runs a shared scenario end to end from a folder that holds no
source. (Tried before the suites were package data: validate stopped with
``FileNotFoundError: …/site-packages/expectations/snapshot.json``.)"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from pipeline.validate import datadocs
from tests.helpers import REPO
from tests.helpers import scenarios as S

#: a process that imports the installed ``pipeline`` (``sys.argv[1]`` is where it must
#: come from), says so, and runs the CLI on the rest of its arguments
_INSTALLED_CLI = """
import sys
import pipeline, pipeline.validate.suites
where = sys.argv[1]
assert pipeline.__file__.startswith(where), pipeline.__file__
suites = pipeline.validate.suites
assert str(suites.EXPECTATIONS_DIR).startswith(where), suites.EXPECTATIONS_DIR
print("cdr from", pipeline.__file__)
from pipeline.app.cli import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built from a copy of what docker/Dockerfile's first stage copies (a
    build in the repository would leave its build/ folder there)."""
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("dist")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    for name in ("pipeline", "expectations"):
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)],
        check=True,
        capture_output=True,
    )
    (path,) = out.glob("replica_cdr-*.whl")
    return path


def test_the_wheel_holds_every_module_and_the_package_data(wheel: Path):
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {p.relative_to(REPO).as_posix() for p in (REPO / "pipeline").rglob("*.py")}
    assert modules - names == set()
    suites = {f"pipeline/expectations/{p.name}" for p in (REPO / "expectations").glob("*.json")}
    assert suites and suites <= names
    assert "pipeline/spark/log4j2.properties" in names
    java = {p.relative_to(REPO).as_posix() for p in (REPO / "pipeline/spark/java").glob("*.java")}
    assert java and java <= names
    # the jars' lock, so that `cdr jars fetch` works where the wheel is installed
    lock = zipfile.ZipFile(wheel).read("pipeline/spark/jars.lock")
    assert lock == (REPO / "jars.lock").read_bytes()
    if datadocs.available():  # fetched by make (npm): the Data Docs' scripts go along
        assets = {f"pipeline/validate/assets/{f}" for f in datadocs.ASSETS.values()}
        assert assets <= names


def test_the_installed_wheel_runs_a_scenario_from_a_folder_without_source(
    wheel: Path, tmp_path: Path
):
    path = S.SCENARIOS / "pg_update_deleted_apply_or_skip.json"
    if not path.exists():
        pytest.skip("shared/scenarios not found")
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), wheel],
        check=True,
        capture_output=True,
    )
    elsewhere = tmp_path / "elsewhere"  # the run's folder: no source, no expectations/
    elsewhere.mkdir()
    outputs = []

    def cli(args: list[str]) -> int:
        env = {**os.environ, "PYTHONPATH": str(site), "CDR_SHUFFLE_PARTITIONS": "2"}
        env.pop("CDR_EXPECTATIONS_DIR", None)
        p = subprocess.run(
            [sys.executable, "-c", _INSTALLED_CLI, str(site), *args],
            cwd=elsewhere,
            env=env,
            capture_output=True,
            text=True,
        )
        assert "Traceback" not in p.stderr, p.stderr
        outputs.append(p.stdout)
        return p.returncode

    s = json.loads(path.read_text())
    got, failed = S.run_scenario(s, tmp_path, cli=cli, docs=True)
    assert S.differences(s, got, failed) == []
    assert all(f"cdr from {site}/pipeline/__init__.py" in o for o in outputs)
    assert list(elsewhere.iterdir()) == []
    if datadocs.available():  # the installed copy bundled its own assets into the pages
        jquery = next(f for f in datadocs.ASSETS.values() if f.startswith("jquery/"))
        bundled = list((tmp_path / "store").glob(f"**/data_docs/static/vendor/{jquery}"))
        assert bundled, "the Data Docs load their scripts from CDNs"
