"""Every example of the pages (README, CONTRIBUTING, ``docs/``) runs (issue 49, item
6), on a store with a rerun (``tests/helpers/cdc_store.py``: a reader that listed a
table's folder would see a rerun's replaced rows too):

- a ``python`` or ``sql`` block is marked ``<!-- example: NAME -->`` and run: a page's
  Python blocks in order in one namespace (``STORE``, ``spark``), its SQL through DuckDB
  as written, ``INSTALL`` and ``LOAD`` included, offline (an empty extension folder but
  for what the pages' Python installed, no extension repository that answers), the
  store's path for ``s3://replica-exports/prod`` and ``...``;
  :data:`CHECKS` says what each must have found, and none may list a table's folder;
- a ``yaml`` block is a config, or a part of one, that the config's validation accepts;
- a ``json`` block with a ``format`` is a manifest whose options are accepted;
- a ``cdr`` command line of a plain block parses as the console script's command."""

from __future__ import annotations

import json
import re
import shlex
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pytest
import yaml
from deltalake import DeltaTable
from deltalake.exceptions import DeltaProtocolError

from pipeline.app.cli_args import build_parser
from pipeline.core.config_load import parse_config
from pipeline.ingest.adapters import check_options
from tests.helpers import REPO, configs
from tests.helpers import published as P
from tests.helpers.cdc_store import D2

PAGES = [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").glob("**/*.md"))]
_BLOCK = re.compile(r"(?:<!-- example: ([\w-]+) -->\n)?```(\w*)\n(.*?)```", re.S)
#: what reads a table's folder instead of its Delta log
_LISTS = re.compile(r"read\.parquet|read_parquet|parquet_scan|pq\.read_table|\.glob\(|dataset\(")


def _blocks(lang: str) -> list[tuple[str, str | None, str]]:
    """(page, marker, text) of every ``lang`` block of the pages."""
    return [
        (page.name, m.group(1), m.group(3))
        for page in PAGES
        for m in _BLOCK.finditer(page.read_text())
        if m.group(2) == lang
    ]


def _on(store: Path, text: str) -> str:
    for prefix in ("s3a://replica-exports/prod", "s3://replica-exports/prod", "..."):
        text = text.replace(prefix, str(store))
    return text


# --------------------------------------------------------------- what each example finds


def _duckdb(found: list[list[dict[str, Any]]], store: Path) -> None:
    snapshot, conflicts, runs = found
    assert len(snapshot) == len(P.snapshot(store, "accounts"))  # once each, after the rerun
    report = P.report(store, D2)
    assert report is not None
    want = report.tables["accounts"].conflicts
    assert sum(r["count_star()"] for r in conflicts) == sum(
        n for outcomes in want.values() for n in outcomes.values()
    )
    assert [r["run_id"] for r in runs] == [r["run_id"] for r in P.runs(store)]


def _duckdb_offline(ns: dict[str, Any], store: Path) -> None:
    """The extension the pages install, from its Python package, in DuckDB's extension
    folder (the test's own home)."""
    import duckdb

    found = duckdb.connect().sql(
        "SELECT installed, install_path FROM duckdb_extensions() WHERE extension_name = 'delta'"
    )
    ((installed, where),) = found.fetchall()
    assert installed and where.startswith(ns["HOME"]), where


SNAPSHOT = "published/accounts/snapshot"


def _merged(store: Path) -> tuple[int, list[int]]:
    """The version of the snapshot the time travel examples read (the first published
    run of D2, the one its rerun replaced) and the ids of its rows: a MERGE that updated
    and deleted rows, so the version's files carry deletion vectors. Asserted from the
    log, else the examples would prove nothing about them."""
    run = P.run_rows(store, D2)[0]
    version = run["versions"][SNAPSHOT]
    _merged_with_vectors(store, version)
    return version, sorted(r["id"] for r in P.as_of(store, SNAPSHOT, run))


def _merged_with_vectors(store: Path, version: int) -> None:
    table = DeltaTable(str(store / SNAPSHOT), version=version)
    assert "deletionVectors" in (table.protocol().reader_features or [])
    assert pa.table(table.deletion_vectors()).num_rows > 0, "no deletion vector at the version"
    commit = store / SNAPSHOT / "_delta_log" / f"{version:020}.json"
    (info,) = [a["commitInfo"] for a in map(json.loads, commit.open()) if "commitInfo" in a]
    assert info["operation"] == "MERGE"
    metrics = info["operationMetrics"]
    assert int(metrics["numTargetRowsUpdated"]) > 0 and int(metrics["numTargetRowsDeleted"]) > 0


def _ids(values: Any) -> list[int]:
    """The ids a reader read, sorted: a row an update replaced and its deletion vector
    hides would come twice, a deleted one once too many."""
    return sorted(int(i) for i in values)


def _deltalake(ns: dict[str, Any], store: Path) -> None:
    assert len(ns["df"]) == len(P.snapshot(store, "accounts"))
    version, ids = _merged(store)
    assert ns["version"] == ns["then"].version() == version
    assert _ids(ns["then_df"]["id"]) == ids


def _polars(ns: dict[str, Any], store: Path) -> None:
    assert ns["now_pl"].height == len(P.snapshot(store, "accounts"))
    assert _ids(ns["then_pl"]["id"]) == _merged(store)[1]


def _duckdb_version(found: list[list[dict[str, Any]]], store: Path) -> None:
    (rows,) = found
    assert _ids(r["id"] for r in rows) == _merged(store)[1]


def _delta_spark(ns: dict[str, Any], store: Path) -> None:
    assert ns["now"].count() == len(P.snapshot(store, "accounts"))
    assert _ids(r.id for r in ns["then"].select("id").collect()) == _merged(store)[1]


def _consumer(printed: list[list[str]], store: Path) -> None:
    assert len(printed) > 3
    times = [uuid.UUID(line[1]).time for line in printed]
    assert times == sorted(times)
    entries = [tuple(line[:3]) for line in printed]
    assert len(set(entries)) == len(entries)  # the rerun's replaced entries are not read


CHECKS: dict[str, Callable[[Any, Path], None]] = {
    "duckdb": _duckdb,
    "duckdb-offline": _duckdb_offline,  # runs before the SQL: the pages' Python first
    "duckdb-version": _duckdb_version,
    "deltalake": _deltalake,
    "polars": _polars,
    "delta-spark": _delta_spark,
    "cdc-consumer": _consumer,  # on what it printed
    "cdc-consumer-spark": _consumer,  # the same entries, shown by Spark
}


def test_every_python_and_sql_block_is_an_example_that_runs(
    two_days, spark, capsys, tmp_path, monkeypatch
):
    store = two_days["root"]
    monkeypatch.setenv("HOME", str(tmp_path))  # DuckDB's extension folder: ~/.duckdb, empty
    blocks = _blocks("python") + _blocks("sql")
    unmarked = [(page, text[:60]) for page, marker, text in blocks if marker is None]
    assert not unmarked, f"mark each with <!-- example: NAME --> and check it: {unmarked}"
    assert {m for _, m, _ in blocks} == set(CHECKS), "an example without a check, or one gone"
    spaces: dict[str, dict[str, Any]] = {}
    printed: dict[str | None, str] = {}
    for page, marker, text in blocks:
        assert marker is not None and not _LISTS.search(text), (page, marker, "lists a folder")
        code = _on(store, text)
        if "delta_scan" in code:  # DuckDB's
            CHECKS[marker](_sql(code, store), store)
            continue
        ns = spaces.setdefault(page, {"STORE": str(store), "spark": spark, "HOME": str(tmp_path)})
        exec(code, ns)
        printed[marker] = capsys.readouterr().out
        if not marker.startswith("cdc-consumer"):
            CHECKS[marker](ns, store)
    lines = [line.split() for line in printed["cdc-consumer"].splitlines()]
    _consumer(lines, store)
    assert lines[0][1] in printed["cdc-consumer-spark"]  # the same first entry, with Spark


#: where DuckDB would download an extension from: nothing answers (as offline)
_NO_REPOSITORY = "http://127.0.0.1:9"


def _sql(code: str, store: Path) -> list[list[dict[str, Any]]]:
    """Each query's rows, the statements run as written in one DuckDB connection with no
    extension repository that answers: an ``INSTALL`` that downloads fails, a ``LOAD``
    finds only what the pages' Python installed."""
    import duckdb

    repository = {"custom_extension_repository": _NO_REPOSITORY}
    con = duckdb.connect(config={**repository, "autoinstall_extension_repository": _NO_REPOSITORY})
    found = []
    try:
        for statement in [s.strip() for s in code.split(";") if s.strip()]:
            statement = "\n".join(line.split("--")[0] for line in statement.splitlines()).strip()
            if not statement:
                continue
            rel = con.sql(statement)
            if statement.split()[0].upper() in ("INSTALL", "LOAD", "SET"):
                continue
            assert rel is not None, statement
            found.append([dict(zip(rel.columns, r, strict=True)) for r in rel.fetchall()])
    finally:
        con.close()
    return found


def test_the_readers_the_docs_warn_about_refuse_the_tables(two_days):
    """docs/outputs.md#readers says delta-rs' pyarrow reader and Polars' pyarrow path
    fail on the tables: they do, at the version the examples read (deletion vectors
    present) and at the latest one (none in its files: the reader feature is enough)."""
    store = two_days["root"]
    page = (REPO / "docs" / "outputs.md").read_text()
    path = str(store / SNAPSHOT)
    latest = P.table_version(store, SNAPSHOT)
    with pytest.raises(AssertionError):  # the check of the examples' version tells them apart
        _merged_with_vectors(store, latest)
    for version in (_merged(store)[0], latest):
        table = DeltaTable(path, version=version)
        reads: dict[str, Callable[[], object]] = {
            "to_pandas()": table.to_pandas,
            "to_pyarrow_table()": table.to_pyarrow_table,
            "to_pyarrow_dataset()": table.to_pyarrow_dataset,
            "use_pyarrow=True": partial(pl.read_delta, path, version=version, use_pyarrow=True),
        }
        for name, read in reads.items():
            assert name in page, f"the page no longer warns about {name}"
            with pytest.raises(DeltaProtocolError, match="deletionVectors"):
                read()


def test_every_config_block_is_a_valid_config():
    base = configs.config(replicas=("pub", "sub"))
    for page, _, text in _blocks("yaml"):
        data = yaml.safe_load(text)
        whole = {**base, **data}  # a fragment takes the rest from the base
        parse_config(whole)  # raises, naming the path in the file, if it is not
        assert page


def _json_values(text: str) -> list[Any]:
    """A ``json`` block's value, or its lines' (a block of JSON lines: event records)."""
    try:
        return [json.loads(text)]
    except json.JSONDecodeError:
        return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_every_manifest_block_is_a_valid_manifest():
    manifests = [(page, m) for page, _, text in _blocks("json") for m in _json_values(text)]
    for page, m in manifests:
        if "format" in m:
            check_options(m["format"], m.get("options"), page)
    assert manifests


#: the placeholders of the command lines, and a value each may stand for
_SAMPLES = {"D": "2026-11-21", "N": "7", "ID": "run-1", "E": "e-1", "R": "0.1", "S": "1"}


@pytest.mark.parametrize("page", [p.name for p in PAGES])
def test_every_cdr_command_line_parses(page: str):
    """A ``cdr`` line of a plain block: its alternatives (``a|b``) one by one, its
    optional parts (``[...]``) in."""
    parser = build_parser()
    text = next(p for p in PAGES if p.name == page).read_text()
    lines = [
        line.split("#")[0].strip()
        for _, lang, block in _BLOCK.findall(text)
        if lang == ""
        for line in block.replace("\\\n", " ").splitlines()  # a line continued by a backslash
        if line.startswith("cdr ")
    ]
    for line in lines:
        line = re.sub(r"\[([^\]]*)\]", r"\1", line)
        words = [_SAMPLES.get(w, w) for w in shlex.split(line)[1:]]
        alternatives = [w.split("|") if "|" in w else [w] for w in words]
        for i, options in enumerate(alternatives):
            for choice in options:
                argv = [choice if j == i else a[0] for j, a in enumerate(alternatives)]
                try:
                    parser.parse_args(argv)
                except SystemExit:
                    pytest.fail(f"{page}: `{line}` does not parse ({argv})")
