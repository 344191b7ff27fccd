"""The shape of the code, read from its source.

- The import direction: every module is in a folder of :data:`LAYERS` and imports only
  from its own folder and the folders before it, no module imports itself back (no
  cycle), the core and the rules import neither Spark nor I/O, and nothing in
  ``pipeline/`` imports Airflow. Every ``import`` counts: at the top of a module, inside a
  function, under ``TYPE_CHECKING``.
- Function length: none over 60 lines, but for the functions listed in :data:`LONG`
  (the engine rebuild's debt), which may not grow and leave the list once split.
  (Complexity is ruff's: C901 and the PLR rules in ``pyproject.toml``.)"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

from tests.helpers import REPO

ROOT = REPO
PACKAGE = ROOT / "pipeline"
#: the folders of ``pipeline/`` in the order of a run's dependencies: a module imports
#: from its own folder or from folders before it, never after (CONTRIBUTING.md "The
#: dependency rule"); the public face (``__init__``) and ``stages`` stand above them all
LAYERS = (
    "core",
    "rules",
    "spark",
    "storage",
    "ingest",
    "resolve",
    "changes",
    "validate",
    "publish",
    "stages",
    "app",
)
#: what may import nothing but ``core`` and the standard library's and pyarrow's: no
#: Spark, no store, no Delta table, no Airflow
PURE = ("core", "rules")
#: what the rules may not reach: Spark, the object store and the Delta tables, Airflow
IO = ("pyspark", "boto3", "botocore", "deltalake", "airflow", "great_expectations")


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


def modules() -> list[str]:
    names = (".".join(("pipeline", *p.relative_to(PACKAGE).with_suffix("").parts)) for p in
             PACKAGE.rglob("*.py"))  # fmt: skip
    return sorted(n.removesuffix(".__init__") for n in names)


def layer(module: str) -> str:
    """The folder of a module (``stages`` for the spine, ``app`` for the face)."""
    parts = module.split(".")
    if len(parts) == 1:
        return "app"  # pipeline/__init__.py: the face, above everything it shows
    return parts[1]


def own_imports(module: str) -> set[str]:
    """The package's modules ``module`` imports, at its top, in a function or under
    ``TYPE_CHECKING`` alike."""
    return {
        m
        for m in direct_imports(module)
        if m.startswith("pipeline.") and _module(m).exists() and m != module
    }


def test_every_module_has_a_folder_of_the_order():
    loose = [m for m in modules() if layer(m) not in LAYERS]
    assert loose == [], "a module outside the folders: place it (CONTRIBUTING.md)"
    assert {layer(m) for m in modules()} >= set(LAYERS) - {"stages"}


def test_imports_go_down_the_order_only():
    upward = {
        f"{m} -> {i}"
        for m in modules()
        for i in own_imports(m)
        if LAYERS.index(layer(i)) > LAYERS.index(layer(m))
    }
    assert sorted(upward) == []


def test_no_module_imports_itself_back():
    graph = {m: own_imports(m) for m in modules()}
    cycles = []
    for start in graph:  # a path from a module's imports back to it is a cycle
        seen, todo = set(), list(graph[start])
        while todo:
            m = todo.pop()
            if m == start:
                cycles.append(f"{start} -> ... -> {start}")
                break
            if m not in seen and m in graph:
                seen.add(m)
                todo.extend(graph[m])
    assert cycles == []


@pytest.mark.parametrize("folder", PURE)
def test_the_core_and_the_rules_import_neither_spark_nor_io(folder: str):
    mine = [m for m in modules() if layer(m) == folder]
    assert mine
    for m in mine:
        reached = sorted(x for x in imports(m) if x.split(".")[0] in IO)
        assert reached == [], m
        assert {layer(i) for i in own_imports(m)} <= set(PURE), m


def test_the_order_check_sees_an_import_inside_a_function(tmp_path, monkeypatch):
    """An upward import inside a function, or under TYPE_CHECKING, is seen: the checks
    above could fail."""
    assert "pipeline.spark.session" in own_imports("pipeline.app.cli_run")  # inside a function
    assert "pipeline.storage.lake" in own_imports("pipeline.ingest.inplace")  # TYPE_CHECKING


def test_nothing_in_the_package_imports_airflow():
    modules = [
        "pipeline." + ".".join(p.relative_to(PACKAGE).with_suffix("").parts)
        for p in PACKAGE.rglob("*.py")
    ]
    assert len(modules) > 30
    assert {m: _reaches(m, ("airflow",)) for m in modules if _reaches(m, ("airflow",))} == {}


def test_the_check_sees_an_import_inside_a_function():
    """The walk must find a lazy import, or the two tests above could not fail."""
    assert "pyspark.sql" in imports("pipeline.app.cli")  # a branch imports the session
    assert "deltalake" in imports("pipeline.storage.runs_table")  # through storage.lake


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


def test_the_dags_and_the_plugin_import_only_the_face():
    """``dags/`` and ``plugins/`` take every name of the package from ``pipeline``
    itself (its ``__all__``), never from a module inside it."""
    import pipeline

    inside = []
    for path in sorted([*(ROOT / "dags").glob("*.py"), *(ROOT / "plugins").glob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pipeline"):
                if node.module != "pipeline":
                    inside.append(f"{path.name}: {node.module}")
                else:
                    missing = [a.name for a in node.names if a.name not in pipeline.__all__]
                    inside += [f"{path.name}: {name} is not in the face" for name in missing]
            elif isinstance(node, ast.Import) and any(
                a.name.startswith("pipeline.") for a in node.names
            ):
                inside.append(f"{path.name}: import {node.names[0].name}")
    assert inside == []


def test_the_face_is_light_and_every_name_of_it_is_there():
    """``import pipeline`` and the names a DAG takes at its parse load neither Spark nor
    Great Expectations; every name of ``__all__`` resolves."""
    import subprocess
    import sys

    code = (
        "import sys, pipeline\n"
        "pipeline.load_config, pipeline.ENTRY, pipeline.WHATIF_NAME, pipeline.layout\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('pyspark', 'great_expectations')]\n"
        "assert not heavy, heavy\n"
        "[getattr(pipeline, n) for n in pipeline.__all__]\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr


# ---------------------------------------------------------------------- sizes

MAX_FILE_LINES = 600
MAX_CLASS_LINES = 400
#: the comment that keeps a file or a class whole over its limit, with the reason after it
#: on the same line (a file: anywhere in it; a class: inside it)
WHOLE = "# kept whole: "


def _says_why(lines: list[str]) -> bool:
    return any(ln.strip().startswith(WHOLE) and len(ln.strip()) > len(WHOLE) + 10 for ln in lines)


def oversized(text: str) -> list[str]:
    """A module over :data:`MAX_FILE_LINES` lines, or a class of it over
    :data:`MAX_CLASS_LINES`, that does not say why it must be one (:data:`WHOLE`)."""
    lines = text.splitlines()
    out = []
    if len(lines) > MAX_FILE_LINES and not _says_why(lines):
        out.append(f"{len(lines)} lines")
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef):
            body = lines[node.lineno - 1 : node.end_lineno]
            if len(body) > MAX_CLASS_LINES and not _says_why(body):
                out.append(f"class {node.name}: {len(body)} lines")
    return out


def test_no_file_over_600_lines_and_no_class_over_400_without_its_reason():
    found = {
        str(path.relative_to(ROOT)): too_big
        for folder in ("pipeline", "dags", "plugins")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if (too_big := oversized(path.read_text()))
    }
    assert found == {}, f"split these along their seams, or say why ({WHOLE!r}...)"


def test_the_size_check_sees_a_big_file_and_a_big_class():
    small = "x = 1\n"
    big_class = "class C:\n" + "    x = 1\n" * MAX_CLASS_LINES
    assert oversized(small) == []
    assert oversized(big_class) == [f"class C: {MAX_CLASS_LINES + 1} lines"]
    assert oversized(small * (MAX_FILE_LINES + 1)) == [f"{MAX_FILE_LINES + 1} lines"]
    kept = f"class C:\n    {WHOLE}one state machine, its steps share it\n" + "    x = 1\n" * 400
    assert oversized(kept) == []


# ---------------------------------------------------------------------- deferred imports

#: what an import inside a function may defer without a word: a heavy or optional library
#: (Spark, Great Expectations, a cloud or database client, pydantic and YAML: a second of
#: start-up, or a package a run may not need). Anything else waits only with its reason,
#: ``# deferred: <why>`` on the import (CONTRIBUTING.md "Imports")
HEAVY = frozenset(
    {
        "airflow",
        "boto3",
        "botocore",
        "cassandra",
        "delta",
        "deltalake",
        "duckdb",
        "great_expectations",
        "moto",
        "opentelemetry",
        "pandas",
        "polars",
        "psycopg",
        "py4j",
        "pydantic",
        "pyspark",
        "yaml",
    }
)
DEFERRED = "# deferred: "


def _imported(node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    return [f"{'.' * node.level}{node.module or ''}"]


def unexplained_deferrals(text: str) -> list[str]:
    """The imports inside functions that neither defer a :data:`HEAVY` library nor say
    why they wait (:data:`DEFERRED`), and those the module imports at its top already."""
    tree = ast.parse(text)
    lines = text.splitlines()
    top = {(ast.unparse(n)) for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)}
    out = set()
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(fn):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            said = ast.unparse(node)
            if said in top:
                out.add(f"line {node.lineno}: {said} (imported at the top already)")
            elif all(m.split(".")[0] in HEAVY for m in _imported(node)):
                continue
            elif not any(DEFERRED in ln for ln in lines[node.lineno - 1 : node.end_lineno]):
                out.add(f"line {node.lineno}: {said}")
    return sorted(out)


def test_every_deferred_import_says_why():
    found = {
        str(path.relative_to(ROOT)): bad
        for folder in ("pipeline", "dags", "plugins")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if (bad := unexplained_deferrals(path.read_text()))
    }
    assert found == {}, f"import these at the top, or say why they wait ({DEFERRED!r}...)"


def test_the_deferral_check_sees_an_import_without_its_reason():
    code = (
        "import json\n"
        "def f():\n"
        "    import json\n"
        "    from pyspark.sql import functions\n"
        "    from pipeline.core import layout\n"
        "    from pipeline.spark import session  # deferred: the CLI's start stays light\n"
    )
    assert unexplained_deferrals(code) == [
        "line 3: import json (imported at the top already)",
        "line 5: from pipeline.core import layout",
    ]


# ---------------------------------------------------------------------- docstrings


def first_sentence(doc: str) -> str:
    """A docstring's first sentence, its whitespace folded."""
    text = " ".join(doc.split())
    end = re.search(r"[.!?](\s|$)", text)
    return text[: end.end()].strip() if end else text


def copied_docstrings(docs: dict[str, str]) -> dict[str, list[str]]:
    """The first sentences that more than one module's docstring has, with the modules."""
    by_sentence: dict[str, list[str]] = {}
    for name, doc in sorted(docs.items()):
        by_sentence.setdefault(first_sentence(doc), []).append(name)
    return {s: names for s, names in by_sentence.items() if len(names) > 1}


def test_no_module_docstring_is_copied_from_another():
    docs = {
        str(path.relative_to(ROOT)): doc
        for folder in ("pipeline", "dags", "plugins")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if (doc := ast.get_docstring(ast.parse(path.read_text())))
    }
    assert len(docs) > 100
    assert copied_docstrings(docs) == {}, "each module says what it is, in its own words"


def test_the_copy_check_sees_a_copied_first_sentence():
    docs = {"a.py": "The one session. Built late.", "b.py": "The one\n  session. Other."}
    assert copied_docstrings(docs) == {"The one session.": ["a.py", "b.py"]}
    assert copied_docstrings({"a.py": "One.", "b.py": "Two."}) == {}
