"""The input contract's JSON Schemas (pipeline/ingest/schemas, docs/exports.md) against the
parser they describe (pipeline/rules/guards.py): a record a table's schema accepts is
never ``malformed``; one it refuses is, and the quarantine's detail names the field the
schema's error names. Also: the repository's schema files are the code's, and they
validate what ``cdr generate`` writes and the fixtures' manifests."""

from __future__ import annotations

import base64
import gzip
import json
import re
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError, best_match

from pipeline.app.cli import main
from pipeline.app.generate import GenerateOptions, generate
from pipeline.core.config import Config, Table
from pipeline.core.config_load import parse_config
from pipeline.core.kinds import Kind
from pipeline.ingest import schemas
from pipeline.rules.guards import MAX_TTL, Typer, TypingSpec
from pipeline.storage.store import open_store
from tests.helpers import REPO, configs

NOW = 1_795_000_000_000_000  # 2026-11-18, µs
TS = 1_794_900_000_000_000

COLUMNS = {
    "id": "bigint",
    "region": "string",
    "qty": "int",
    "price": "decimal(10,2)",
    "ratio": "double",
    "born": "date",
    "seen": "timestamp",
    "blob": "binary",
    "uid": "uuid",
    "ok": "boolean",
}
CONFIG = configs.config(
    {
        "mixed": configs.table(COLUMNS, ["id", "region"], not_null=["qty"]),
        "cells": configs.table({"k": "int", "v": "string", "n": "bigint"}, ["k"], policy="scylla"),
    },
    store="file:///unused",
)


def _dumps(record: dict[str, Any]) -> str:
    """A record as a JSONL line, its Decimals written with every digit."""
    text = json.dumps(record, default=lambda d: f"@@{d}@@")
    return re.sub(r'"@@([-+0-9.Ee]+)@@"', r"\1", text)


def _loads(text: str) -> Any:
    """JSON with its numbers exact (a 12.0 is no integer, as the readers see it)."""
    return json.loads(text, parse_float=Decimal)


@pytest.fixture(scope="module")
def config() -> Config:
    return parse_config(CONFIG)


_VALIDATORS: dict[str, Draft202012Validator] = {}


def _validator(config: Config, table: str) -> Draft202012Validator:
    if table in _VALIDATORS:
        return _VALIDATORS[table]
    schema = _loads(schemas.dumps(schemas.table_schemas(config, [table])[table]))
    Draft202012Validator.check_schema(schema)
    return _VALIDATORS.setdefault(table, Draft202012Validator(schema))


def schema_path(error: ValidationError) -> str:
    """The field a schema's error names, in the parser's wording: ``after.price``; a
    missing field is named by itself (``ts``, ``after.seen``), but a key's or new key's
    missing column by the object (the parser says ``key has columns [...]``)."""
    path = [str(p) for p in error.absolute_path]
    if error.validator == "required" and path[-1:] not in (["key"], ["new_key"]):
        path.append(re.match(r"'(.+?)' is a required property", error.message).group(1))  # type: ignore[union-attr]
    return ".".join(path)


def names(detail: str, path: str) -> bool:
    """Whether a quarantine's detail names the field ``path`` (not a longer one)."""
    return re.search(rf"(?<![\w.]){re.escape(path)}(?![\w.])", detail) is not None


# ---------------------------------------------------------------------- values, drawn

_INT = 2**31
_LONG = 2**63
_FIRST, _LAST = datetime(1, 1, 2, tzinfo=UTC), datetime(9999, 12, 30, tzinfo=UTC)


def _as_text(values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A value, or its text in a JSON string."""
    return values.flatmap(lambda v: st.sampled_from([v, str(v)]))


def _micros(t: datetime) -> int:
    return (t - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


def _rfc3339(t: datetime, offset_minutes: int, sep: str) -> str:
    local = t + timedelta(minutes=offset_minutes)
    sign = "+" if offset_minutes >= 0 else "-"
    off = f"{sign}{abs(offset_minutes) // 60:02d}:{abs(offset_minutes) % 60:02d}"
    return local.replace(tzinfo=None).isoformat(sep) + ("Z" if offset_minutes == 0 else off)


_TIMES = st.datetimes(_FIRST.replace(tzinfo=None), _LAST.replace(tzinfo=None)).map(
    lambda t: t.replace(tzinfo=UTC)
)
GOOD: dict[Kind, st.SearchStrategy[Any]] = {
    Kind.INT: _as_text(st.integers(-_INT, _INT - 1)) | st.just(" +0012 "),
    Kind.BIGINT: _as_text(st.integers(-_LONG, _LONG - 1)) | st.just("-000"),
    Kind.STRING: st.text() | st.integers() | st.booleans(),
    Kind.BOOLEAN: st.booleans() | st.sampled_from(["true", "false"]),
    Kind.DOUBLE: _as_text(st.floats(allow_nan=False, allow_infinity=False))
    | st.sampled_from(["NaN", "-Infinity", "inf", "1e2", ".5"]),
    Kind.DECIMAL: _as_text(st.decimals("-99999999.99", "99999999.99", places=2))
    | st.sampled_from([Decimal("1E+2"), "0.005", Decimal("99999999.994")]),
    Kind.DATE: st.dates(date(1, 1, 1), date(9999, 12, 31)).map(date.isoformat),
    Kind.TIMESTAMP: _TIMES.map(_micros).flatmap(lambda v: st.sampled_from([v, str(v)]))
    | st.builds(_rfc3339, _TIMES, st.integers(-18 * 60, 18 * 60), st.sampled_from("Tt ")),
    Kind.BINARY: st.binary().map(lambda b: base64.b64encode(b).decode())
    | st.binary(min_size=1).map(lambda b: base64.b64encode(b).decode().rstrip("=")),
    Kind.UUID: st.uuids().flatmap(lambda u: st.sampled_from([str(u), str(u).upper()])),
}
BAD: dict[Kind, list[Any]] = {
    Kind.INT: [_INT, -_INT - 1, str(_INT), "12.5", Decimal("12.0"), True, "abc", {"a": 1}, "1_0"],
    Kind.BIGINT: [_LONG, str(-_LONG - 1), Decimal("1.5"), False, "", [1]],
    Kind.STRING: [],
    Kind.BOOLEAN: ["TRUE", 1, "yes", {}],
    Kind.DOUBLE: ["abc", True, {"x": 1}, "1_0", "--1", "+-inf", ""],
    Kind.DECIMAL: [Decimal("1E+8"), Decimal("99999999.995"), "abc", True, "NaN", "1e2x"],
    Kind.DATE: [
        "2026-02-30",
        "2026-1-01",
        20260101,
        "2026-01-01T00:00:00Z",
        "0000-01-01",
        "2026-01-01\n",
    ],
    Kind.TIMESTAMP: [
        "2026-11-21T10:00:00",
        "2026-11-21T24:00:00Z",
        "2026-11-21T10:00:00+19:00",
        "2026-11-21T10:00:00Z\n",
        Decimal("1.5"),
        True,
        2**62,
        " 12",
    ],
    Kind.BINARY: ["YQ=", "a", "!!!!", {}, -1, Decimal("1.5")],
    Kind.UUID: ["123e4567", 5, "123e4567-e89b-12d3-a456-426614174000\n", True],
}


def _row(draw: st.DrawFn, table: Table, columns: list[str]) -> dict[str, Any]:
    """Values for some of ``columns``: drawn well, or null where a column may be."""
    out = {}
    for c in columns:
        col = table.column(c)
        if c in table.not_null or draw(st.integers(0, 4)) == 0:
            out[col.exported] = draw(GOOD[col.type.kind])
        elif draw(st.booleans()):
            out[col.exported] = None
    return out


@st.composite
def good_records(draw: st.DrawFn, table: Table) -> dict[str, Any]:
    """A record the table's schema describes: every field well formed."""
    cell = table.granularity.value == "cell"
    op = draw(st.sampled_from(["INSERT", "UPDATE", "DELETE", "TRUNCATE", "READ"]))
    ts = draw(st.sampled_from([TS, str(TS), "2026-11-17T10:00:00.123456+02:00"]))
    r: dict[str, Any] = {"op": op, "ts": ts, "origin": draw(st.sampled_from(["pub", "sub"]))}
    r |= {"event_id": draw(st.text(min_size=1)), "seq": draw(st.integers(0, 10**6))}
    key = {table.exported(c): draw(GOOD[table.column(c).type.kind]) for c in table.key}
    if op != "TRUNCATE" or draw(st.booleans()):
        r["key"] = key
    target = key
    if op == "UPDATE" and not cell and draw(st.booleans()):
        target = r["new_key"] = {
            table.exported(c): draw(GOOD[table.column(c).type.kind]) for c in table.key
        }
    values = [c for c in table.column_names if c not in table.key]
    if op in ("INSERT", "READ", "UPDATE") and (op != "UPDATE" or draw(st.booleans())):
        after = _row(draw, table, values)
        if op != "UPDATE":
            after |= {table.exported(c): 1 for c in table.not_null if c in values}
        r["after"] = after | (target if draw(st.booleans()) else {})
    if draw(st.booleans()):
        r["before"] = _row(draw, table, list(table.column_names))
    if cell and draw(st.booleans()):
        r["ttl"] = draw(st.integers(1, MAX_TTL))
        if draw(st.booleans()):
            r["expiry"] = draw(st.integers(0, 10**12 - 1))
    if draw(st.booleans()):
        r["note"] = "a field the record format does not have: not read"
    return r


def _bad_value(draw: st.DrawFn, table: Table) -> tuple[str, Any]:
    col = draw(st.sampled_from([c for c in table.columns if BAD[c.type.kind]]))
    return col.exported, draw(st.sampled_from(BAD[col.type.kind]))


def _mutate(draw: st.DrawFn, table: Table, r: dict[str, Any]) -> None:
    """One thing wrong (or, where the parser lets it be, right all the same)."""
    cell = table.granularity.value == "cell"
    what = draw(st.sampled_from(["drop", "field", "key", "new_key", "after", "image", "cell"]))
    if what == "drop":
        del r[draw(st.sampled_from(["op", "ts", "origin", "event_id", "seq"]))]
    elif what == "field":
        bad = {
            "op": ["UPSERT", "insert", 5, None],
            "ts": ["2026-11-21T10:00:00", "yesterday", Decimal("1.5"), True, "", " 1", "1\n"],
            "seq": ["x", Decimal("1.5"), 2**63, None, " 1.0"],
            "event_id": ["", None],
            "origin": ["nobody", None, ""],
            "pos": ["x", Decimal("2.5"), 12, None],
        }
        field = draw(st.sampled_from(sorted(bad)))
        r[field] = draw(st.sampled_from(bad[field]))
    elif what == "key" and "key" in r:
        key, c = r["key"], table.exported(draw(st.sampled_from(table.key)))
        how = draw(st.sampled_from(["drop", "extra", "null", "bad", "whole"]))
        if how == "drop":
            del key[c]
        elif how == "extra":
            key["zzz"] = 1
        elif how == "null":
            key[c] = None
        elif how == "bad":
            key[c] = draw(st.sampled_from(BAD[table.column(c).type.kind] or [None]))
        else:
            r["key"] = draw(st.sampled_from([5, [1], None, "x"]))
    elif what == "new_key" and (cell or r.get("op") != "UPDATE"):  # a key that cannot change
        r["new_key"] = dict(r.get("key") or {})
    elif what == "after":
        how = draw(st.sampled_from(["drop", "null", "not_null", "extra", "whole"]))
        if how in ("drop", "null"):
            r.pop("after", None) if how == "drop" else r.update(after=None)
        elif how == "not_null" and table.not_null:
            r.setdefault("after", {})
            r["after"] = (r["after"] or {}) | {table.exported(min(table.not_null)): None}
        elif how == "extra":
            r["after"] = (r.get("after") or {}) | {"extra_col": 1}
        else:
            r["after"] = draw(st.sampled_from([5, [1], "x", True]))
    elif what == "image":
        image = draw(st.sampled_from(["after", "before"]))
        c, v = _bad_value(draw, table)
        r[image] = (r.get(image) or {}) | {c: v}
    elif what == "cell" and cell:
        how = draw(st.sampled_from(["ttl", "expiry"]))
        if how == "ttl":
            r["ttl"] = draw(st.sampled_from(["-1", MAX_TTL + 1, Decimal("1.5"), "abc", "0" * 13]))
        else:
            r.pop("ttl", None)
            r["expiry"] = draw(st.integers(0, 10**6))


@st.composite
def records(draw: st.DrawFn, table: Table) -> dict[str, Any]:
    r = draw(good_records(table))
    if draw(st.integers(0, 3)):
        _mutate(draw, table, r)
    return r


def _agree(config: Config, table: str, record: dict[str, Any]) -> None:
    line = _dumps(record)
    typed = Typer(TypingSpec.of(config, config.tables[table], NOW)).line(line, "sub")
    malformed = typed["reason"] == "malformed"
    error = best_match(_validator(config, table).iter_errors(_loads(line)))
    if error is None:
        assert not malformed, f"the schema accepts {line}, the parser: {typed['detail']}"
        return
    assert malformed, f"the schema refuses {line} ({error.message}), the parser takes it"
    path = schema_path(error)
    assert names(typed["detail"], path), (
        f"{line}: the schema names {path!r} ({error.message}), the parser: {typed['detail']}"
    )


@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_a_row_tables_schema_and_the_parser_agree(config: Config, data: st.DataObject) -> None:
    _agree(config, "mixed", data.draw(records(config.tables["mixed"])))


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_a_cell_tables_schema_and_the_parser_agree(config: Config, data: st.DataObject) -> None:
    _agree(config, "cells", data.draw(records(config.tables["cells"])))


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_a_well_formed_record_is_accepted(config: Config, data: st.DataObject) -> None:
    """The drawn records are not all refused: the good ones are good by both."""
    for t in ("mixed", "cells"):
        record = data.draw(good_records(config.tables[t]))
        assert best_match(_validator(config, t).iter_errors(_loads(_dumps(record)))) is None
        _agree(config, t, record)


@pytest.mark.parametrize(("kind", "value"), [(k, v) for k, vs in BAD.items() for v in vs], ids=repr)
def test_every_bad_value_is_refused_by_both(config: Config, kind: Kind, value: Any) -> None:
    table = config.tables["mixed"]
    col = next(c for c in table.columns if c.type.kind is kind)
    record = {"op": "INSERT", "key": {"id": 1, "region": "eu"}, "after": {col.name: value}}
    record |= {"ts": TS, "origin": "pub", "event_id": "e1", "seq": 1}
    error = best_match(_validator(config, "mixed").iter_errors(_loads(_dumps(record))))
    assert error is not None and schema_path(error) == f"after.{col.name}"
    _agree(config, "mixed", record)


# ---------------------------------------------------------------------- what the parser fixed


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("ts", "0001-01-01T00:00:00+01:00"),  # raised OverflowError out of the typing
        ("ts", "9999-12-31T23:59:59-01:00"),
        ("ts", "2026-11-17T10:00:00Z\n"),  # was read: a trailing newline
        ("after.seen", "0001-01-01T00:00:00+01:00"),
        ("after.uid", "123e4567-e89b-12d3-a456-426614174000\n"),  # was kept with its newline
    ],
)
def test_a_time_out_of_range_or_a_trailing_newline_is_malformed(
    config: Config, field: str, value: str
) -> None:
    record: dict[str, Any] = {"op": "INSERT", "key": {"id": 1, "region": "eu"}, "after": {}}
    record |= {"ts": TS, "origin": "pub", "event_id": "e1", "seq": 1}
    if field == "ts":
        record["ts"] = value
    else:
        record["after"][field.split(".")[1]] = value
    typed = Typer(TypingSpec.of(config, config.tables["mixed"], NOW)).line(_dumps(record), "sub")
    assert typed["reason"] == "malformed" and names(typed["detail"], field), typed["detail"]


# ---------------------------------------------------------------------- the files


def test_the_repositorys_schema_files_are_the_codes() -> None:
    for name, text in schemas.rendered().items():
        kept = (schemas.HERE / name).read_text()
        assert kept == text, f"{name} is stale: run python -m pipeline.ingest.schemas"
        Draft202012Validator.check_schema(_loads(kept))


def test_every_column_type_says_how_its_values_are_written() -> None:
    assert set(schemas.VALUE_SCHEMAS) == set(Kind)
    with pytest.raises(ValueError, match="no entry for uuid"):
        schemas.every_kind("x", {k: v for k, v in schemas.VALUE_SCHEMAS.items() if k != "uuid"})


def _kept(name: str) -> Draft202012Validator:
    return Draft202012Validator(_loads((schemas.HERE / name).read_text()))


def _manifests(root: Path) -> list[Path]:
    return sorted(root.rglob("_manifest.json"))


def test_the_schemas_take_what_cdr_generate_writes(tmp_path: Path) -> None:
    cfg = configs.config(
        {"products": configs.products(), "orders": configs.orders()}, store=tmp_path / "store"
    )
    config = parse_config(cfg)
    generate(config, open_store(config.store), date(2026, 11, 21), GenerateOptions(events=300))
    record, manifest = _kept(schemas.RECORD_FILE), _kept(schemas.MANIFEST_FILE)
    tables = {t: _validator_of(config, t) for t in config.tables}
    found = _manifests(tmp_path / "store" / "exports")
    assert found
    for path in found:
        data = _loads(path.read_text())
        assert best_match(manifest.iter_errors(data)) is None, path
        for f in data["files"]:
            for line in _lines(path.parent / f["path"]):
                assert best_match(record.iter_errors(_loads(line))) is None, line
                assert best_match(tables[data["table"]].iter_errors(_loads(line))) is None, line


def _validator_of(config: Config, table: str) -> Draft202012Validator:
    return Draft202012Validator(_loads(schemas.dumps(schemas.table_schemas(config)[table])))


def _lines(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return [line for line in f if line.strip()]


def test_the_manifest_schema_takes_the_fixtures_manifests() -> None:
    manifest = _kept(schemas.MANIFEST_FILE)
    found = _manifests(REPO / "tests" / "fixtures")
    assert found
    for path in found:
        assert best_match(manifest.iter_errors(_loads(path.read_text()))) is None, path


@pytest.mark.parametrize(
    "broken",
    [
        {"files": []},
        {"format": "csv", "files": []},
        {"format": "jsonl", "files": [{"path": "../x", "rows": 1, "sha256": "0" * 64}]},
        {"format": "jsonl", "files": [{"path": "a", "rows": -1, "sha256": "0" * 64}]},
        {"format": "jsonl", "files": [{"path": "a", "rows": 1, "sha256": "0" * 63}]},
        {"format": "jsonl", "options": {"origins": {}}, "files": []},
        {"format": "dms", "files": []},
    ],
)
def test_the_manifest_schema_refuses_what_the_reader_refuses(broken: dict[str, Any]) -> None:
    assert best_match(_kept(schemas.MANIFEST_FILE).iter_errors(broken)) is not None


# ---------------------------------------------------------------------- cdr schema


def test_cdr_schema_prints_one_table_and_writes_several(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = configs.write(tmp_path / "cdr.yaml", {k: v for k, v in CONFIG.items() if k != "store"})
    assert main(["schema", "--config", str(path), "--table", "mixed"]) == 0
    printed = _loads(capsys.readouterr().out)
    assert printed["properties"]["origin"]["enum"] == ["pub", "sub"]
    assert printed["allOf"][0]["then"]["properties"]["key"]["required"] == ["id", "region"]
    assert main(["schema", "--config", str(path), "--out", str(tmp_path / "out")]) == 0
    written = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert written == ["cells.schema.json", "mixed.schema.json"]
    assert main(["schema", "--config", str(path), "--table", "nope"]) == 2
    assert "no table 'nope'" in capsys.readouterr().err
