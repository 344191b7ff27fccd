"""The shape of the code, read from its source.

- The import direction (STYLE.md "a pure core"): the rules import neither Spark nor I/O,
  and nothing in ``pipeline/`` imports Airflow. Every ``import`` counts, at the top of a
  module or inside a function.
- Function length: none over 60 lines, but for the functions listed in :data:`LONG`
  (the engine rebuild's debt), which may not grow and leave the list once split.
  (Complexity is ruff's: C901 and the PLR rules in ``pyproject.toml``.)"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

from tests.helpers import REPO

ROOT = REPO
PACKAGE = ROOT / "pipeline"
#: the rules of the spec, in plain Python: the guards, the folds, the policy tables, the config
PURE = (
    "policy",
    "config",
    "errors",
    "guards",
    "rowfold",
    "cellfold",
    "jsonvalues",
    "layout",
    "streams",
)
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


MAX_LINES = 60
#: functions longer than MAX_LINES today, with their length: a ratchet (empty now; a
#: function that must be longer is listed here with its length and the reason)
LONG: dict[str, int] = {}


def function_lengths(path: Path) -> dict[str, int]:
    """Every function of a module by its qualified name (``Class.method``), with its lines."""
    out: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = prefix + child.name
                out[name] = (child.end_lineno or child.lineno) - child.lineno + 1
                visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text()), "")
    return out


def test_no_function_is_longer_than_60_lines_but_the_listed_debt():
    lengths = {
        f"{path.relative_to(ROOT)}:{name}": n
        for folder in ("pipeline", "dags", "plugins")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for name, n in function_lengths(path).items()
    }
    assert len(lengths) > 300
    too_long = {f: n for f, n in lengths.items() if n > LONG.get(f, MAX_LINES)}
    assert too_long == {}, "split these functions (or, if listed, do not let them grow)"
    paid = {f: lengths.get(f) for f in LONG if lengths.get(f, 0) <= MAX_LINES}
    assert paid == {}, "these are short now (or gone): remove them from LONG"
