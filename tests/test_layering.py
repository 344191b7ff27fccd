"""The import direction of the package (STYLE.md "a pure core"): the rules import neither
Spark nor I/O, and nothing in ``pipeline/`` imports Airflow. Read from the source (every
``import``, at the top of a module or inside a function), so a lazy import counts too."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "pipeline"
#: the rules of the spec, in plain Python: the fold, the policy tables, the config
PURE = ("policy", "config", "errors", "rowfold", "cellfold", "jsonvalues", "layout", "streams")
#: what the rules may not reach: Spark, the object store and the Delta tables, Airflow
IO = ("pyspark", "boto3", "botocore", "deltalake", "airflow", "great_expectations")
IO_MODULES = ("pipeline.store", "pipeline.lake", "pipeline.spark")


def _module(name: str) -> Path:
    sub = name.removeprefix("pipeline").lstrip(".").replace(".", "/") or "__init__"
    path = PACKAGE / f"{sub}.py"
    return path if path.exists() else PACKAGE / sub / "__init__.py"


@cache
def direct_imports(name: str) -> frozenset[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(_module(name).read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return frozenset(found)


def imports(name: str) -> set[str]:
    """Every module ``name`` imports, with the package's own imports followed."""
    seen, todo = {name}, [name]
    found: set[str] = set()
    while todo:
        for m in direct_imports(todo.pop()):
            found.add(m)
            if m.startswith("pipeline.") and _module(m).exists() and m not in seen:
                seen.add(m)
                todo.append(m)
    return found


def _reaches(name: str, forbidden: tuple[str, ...]) -> list[str]:
    return sorted(m for m in imports(name) if m.split(".")[0] in forbidden or m in forbidden)


@pytest.mark.parametrize("module", PURE)
def test_the_rules_import_neither_spark_nor_io(module: str):
    assert _reaches(f"pipeline.{module}", IO + IO_MODULES) == []


def test_nothing_in_the_package_imports_airflow():
    modules = [
        "pipeline." + ".".join(p.relative_to(PACKAGE).with_suffix("").parts)
        for p in PACKAGE.rglob("*.py")
    ]
    assert len(modules) > 30
    assert {m: _reaches(m, ("airflow",)) for m in modules if _reaches(m, ("airflow",))} == {}


def test_the_check_sees_an_import_inside_a_function():
    """The walk must find a lazy import, or the two tests above could not fail."""
    assert "pyspark.sql" in imports("pipeline.cli")  # cli imports pipeline.spark in a branch
    assert "deltalake" in imports("pipeline.runs_table")  # through pipeline.lake
    assert _reaches("pipeline.stages", IO_MODULES)
