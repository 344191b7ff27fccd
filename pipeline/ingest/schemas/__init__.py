"""The input contract as JSON Schemas (draft 2020-12; docs/exports.md): the canonical event
record (:func:`record_schema`), the same typed by one table's columns (``cdr schema``),
and an export's ``_manifest.json`` (:func:`manifest_schema`).

The schemas say what the guards' reader (``pipeline.rules.guards``, ``.readers``) accepts:
a record a table's schema accepts is never ``malformed``, one it refuses is, naming the
field the schema's error names (``tests/unit/test_schemas.py``). How each column type is
written is :data:`VALUE_SCHEMAS`, a row per :class:`Kind`. The JSON files beside this
module (``record.schema.json``, ``manifest.schema.json``) are rendered from it
(``python -m pipeline.ingest.schemas``; a test compares them)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from pipeline.core.config import Config, Table
from pipeline.core.errors import ConfigError
from pipeline.core.kinds import ColumnType, Kind, every_kind, integer_bound
from pipeline.core.policy import Granularity
from pipeline.ingest.adapters.options import OPTIONS
from pipeline.ingest.manifests import FORMATS
from pipeline.rules.guards import MAX_TTL, OPS, READ, ROW_OPS

Schema = dict[str, Any]

DRAFT = "https://json-schema.org/draft/2020-12/schema"
#: where the rendered schemas are kept (and shipped: pyproject.toml's package-data)
HERE = Path(__file__).parent
RECORD_FILE, MANIFEST_FILE = "record.schema.json", "manifest.schema.json"

#: the blanks Python's ``re.ASCII`` ``\\s`` matches, which the integer readers allow
_WS = "[ \\t\\n\\r\\f\\v]*"
#: a pattern's end: ``$`` and not before a final newline (Python's ``$`` takes one, ECMA's not)
_END = "$(?!\\n)"


def _upto(n: int) -> str:
    """A regex of the decimal digits, without leading zeros, of the numbers 1..n."""
    s = str(n)
    alts = ["[1-9]" + (f"[0-9]{{{n - 1}}}" if n > 1 else "") for n in range(1, len(s))]
    for i, ch in enumerate(s):
        lo, hi = (1 if i == 0 else 0), int(ch) - 1
        if hi >= lo:
            rest = len(s) - i - 1
            alts.append(f"{s[:i]}[{lo}-{hi}]" + (f"[0-9]{{{rest}}}" if rest else ""))
    alts.append(s)
    return "(?:" + "|".join(alts) + ")"


def integer_text(lo: int, hi: int, blanks: bool = True) -> str:
    """A regex of an integer's text in ``[lo, hi]`` (``lo <= 0 < hi``) as the readers take
    it: a sign, leading zeros, and (``blanks``) blanks around it."""
    ws = _WS if blanks else ""
    plus = "\\+?" if blanks else ""
    neg = f"|-0*{_upto(-lo)}?" if lo < 0 else ""
    return f"^(?={ws}[+-]?[0-9]){ws}(?:{plus}0*{_upto(hi)}?{neg}){ws}{_END}"


def _integer(lo: int, hi: int, blanks: bool = True) -> Schema:
    return {
        "anyOf": [
            {"type": "integer", "minimum": lo, "maximum": hi},
            {"type": "string", "pattern": integer_text(lo, hi, blanks)},
        ]
    }


_NUMBER_TEXT = f"^{_WS}[+-]?([0-9]+\\.?[0-9]*|\\.[0-9]+)([eE][+-]?[0-9]+)?{_WS}{_END}"
_DOUBLE_WORD = f"^{_WS}[+-]?([nN][aA][nN]|[iI][nN][fF]([iI][nN][iI][tT][yY])?){_WS}{_END}"
#: a day of the calendar (the years 0001 to 9999; February 29 in leap years only)
_DAY = (
    "((?!0000)[0-9]{4}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12]"
    "[0-9]|30)|02-(0[1-9]|1[0-9]|2[0-8]))|([0-9]{2}(0[48]|[2468][048]|[13579][26])|([02468]"
    "[048]|[13579][26])00)-02-29)"
)
_RFC3339 = (
    f"^{_DAY}[Tt ]([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{{1,9}})?"
    f"([Zz]|[+-](0[0-9]|1[0-8]):[0-5][0-9]){_END}"
)
_B64 = "[A-Za-z0-9+/]"
_BASE64 = f"^({_B64}{{4}})*({_B64}{{2}}(==)?|{_B64}{{3}}=?)?{_END}"
_UUID = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}" + _END
#: a manifest's file path (``manifests.safe_relpath``): not absolute, no backslash, no
#: scheme or drive, no ``..`` segment
_RELATIVE = "^(?![/\\\\])(?!.*\\\\)(?![^/]*:)(?!(.*/)?\\.\\.(/|$)).*[^\\s]"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: the µs since the epoch a timestamp column holds: the years 1 to 9999
_FIRST_US = int((datetime.min.replace(tzinfo=UTC) - _EPOCH).total_seconds()) * 1_000_000
_LAST_US = int((datetime.max.replace(tzinfo=UTC) - _EPOCH).total_seconds()) * 1_000_000 + 999_999
_LONG = integer_bound(Kind.BIGINT)


def rfc3339() -> Schema:
    """RFC 3339 with its UTC offset, as ``ts`` and a timestamp column take it."""
    return {"type": "string", "pattern": _RFC3339}


def _decimal(ct: ColumnType) -> Schema:
    # the reader rounds half up to the scale, then refuses 10**(p - s) and more: the
    # numbers that round below it are those below it by more than half a unit of the scale
    edge = Decimal(10) ** (ct.precision - ct.scale) - Decimal(5).scaleb(-ct.scale - 1)
    return {
        "anyOf": [
            {"type": "number", "exclusiveMinimum": -edge, "exclusiveMaximum": edge},
            {
                "type": "string",
                "pattern": _NUMBER_TEXT,
                "description": f"its digits; more than {ct.precision - ct.scale} before "
                "the point (after rounding half up to the scale) are refused by the reader",
            },
        ],
        "description": f"{ct}: a number or its digits in a string (rounded half up to "
        f"{ct.scale} decimal places)",
    }


def _simple(schema: Schema) -> Callable[[ColumnType], Schema]:
    return lambda ct: schema


#: how a value of each column type is written (not null), as ``pipeline.rules.readers``
#: reads it (docs/exports.md#column-values)
VALUE_SCHEMAS: Mapping[Kind, Callable[[ColumnType], Schema]] = every_kind(
    "schemas.VALUE_SCHEMAS",
    {
        Kind.INT: _simple(
            _integer(-integer_bound(Kind.INT), integer_bound(Kind.INT) - 1)
            | {"description": "int: a 32-bit integer, or its digits in a string"}
        ),
        Kind.BIGINT: _simple(
            _integer(-_LONG, _LONG - 1)
            | {"description": "bigint: a 64-bit integer, or its digits in a string"}
        ),
        Kind.STRING: _simple(
            {"description": "string: text (a number, boolean, object or array: its JSON text)"}
        ),
        Kind.BOOLEAN: _simple({"anyOf": [{"type": "boolean"}, {"enum": ["true", "false"]}]}),
        Kind.DOUBLE: _simple(
            {
                "anyOf": [
                    {"type": "number"},
                    {"type": "string", "pattern": _NUMBER_TEXT},
                    {"type": "string", "pattern": _DOUBLE_WORD},
                ],
                "description": "double: a number, or its text (also NaN, Infinity)",
            }
        ),
        Kind.DECIMAL: _decimal,
        Kind.DATE: _simple(
            {"type": "string", "pattern": f"^{_DAY}{_END}"}
            | {"description": "date: ISO 8601, YYYY-MM-DD"}
        ),
        Kind.TIMESTAMP: _simple(
            {
                "anyOf": [*_integer(_FIRST_US, _LAST_US, blanks=False)["anyOf"], rfc3339()],
                "description": "timestamp: µs since the epoch (a number or its digits), "
                "or RFC 3339 with a UTC offset",
            }
        ),
        Kind.BINARY: _simple(
            {"type": "string", "pattern": _BASE64, "description": "binary: base64"}
        ),
        Kind.UUID: _simple(
            {"type": "string", "pattern": _UUID, "description": "uuid: 8-4-4-4-12 hex digits"}
        ),
    },
)


def value_schema(ct: ColumnType, nullable: bool = True) -> Schema:
    """How a column's value is written: :data:`VALUE_SCHEMAS`, or null (``nullable``)."""
    value = VALUE_SCHEMAS[ct.kind](ct)
    if not nullable:
        return {"allOf": [{"not": {"type": "null"}}, value]}
    return {"anyOf": [{"type": "null"}, value]}


# ---------------------------------------------------------------------- the record


def _when_op(ops: tuple[str, ...], then: Schema, negate: bool = False) -> Schema:
    """``then`` for the records whose ``op`` is (``negate``: is not) one of ``ops``."""
    is_one: Schema = {"enum": list(ops)}
    return {
        "if": {"required": ["op"], "properties": {"op": {"not": is_one} if negate else is_one}},
        "then": then,
    }


def _record_fields() -> dict[str, Schema]:
    long = _integer(-_LONG, _LONG - 1)
    return {
        "op": {"enum": list(OPS), "description": f"{READ}: a snapshot's read (docs/adapters.md)"},
        "key": {"description": "key column -> value; for UPDATE and DELETE the key before"},
        "new_key": {"type": ["object", "null"], "description": "an UPDATE that changes the key"},
        "after": {"type": ["object", "null"], "description": "column -> new value"},
        "before": {"type": ["object", "null"], "description": "column -> old value"},
        "ts": {
            "anyOf": [*_integer(-_LONG, _LONG - 1, blanks=False)["anyOf"], rfc3339()],
            "description": "commit time on the origin: µs since the epoch, or RFC 3339 "
            "with a UTC offset",
        },
        "origin": {"type": "string", "description": "the replica where the change was made"},
        "event_id": {
            "type": ["string", "number"],
            "minLength": 1,
            "description": "unique per origin change, the same in every export",
        },
        "txid": {"description": "the origin's transaction id (optional; kept as its text)"},
        "seq": long | {"description": "position in this export's apply order"},
        "pos": {"anyOf": [{"type": "null"}, long], "description": "an adapter's position"},
        "ttl": _seconds(MAX_TTL) | {"description": "cell tables: the TTL, whole seconds"},
        "expiry": _seconds(10**12 - 1)
        | {"description": "cell tables: when the TTL cell expires, seconds since the epoch"},
        "_malformed": {"type": "null", "description": "reserved: an adapter's unread record"},
    }


def _seconds(most: int) -> Schema:
    """Whole seconds, as ``readers.whole_seconds`` takes them (12 digits at most)."""
    text = integer_text(0, most, blanks=False) if most < 10**12 - 1 else "^[0-9]{1,12}" + _END
    return {
        "anyOf": [
            {"type": "null"},
            {"type": "integer", "minimum": 0, "maximum": most},
            {"type": "string", "pattern": text, "maxLength": 12},
        ]
    }


def _record_rules(key: Schema, new_key: Schema, cell: bool = False) -> list[Schema]:
    """What a record holds by its op (``Typer._keys_problem``, ``_images_problem``): an
    INSERT's after, but in a cell table (its cells may all be null: tombstones)."""
    keyed = (*ROW_OPS, READ)
    obj: Schema = {"type": "object"}
    rules = [
        _when_op(keyed, {"required": ["key"], "properties": {"key": key}}),
        _when_op(("UPDATE",), {"properties": {"new_key": {"type": "null"}}}, negate=True),
        _when_op(("UPDATE",), {"properties": {"new_key": new_key}}),
    ]
    if not cell:
        rules.append(
            _when_op(("INSERT", READ), {"required": ["after"], "properties": {"after": obj}})
        )
    return rules


def record_schema(config: Config | None = None, table: Table | None = None) -> Schema:
    """The canonical event record (docs/exports.md), or one ``table``'s of ``config``: its key,
    new key and images typed by the table's columns, its origin one of the replicas."""
    fields = _record_fields()
    obj: Schema = {"type": "object"}
    rules = _record_rules(obj, {"type": ["object", "null"]})
    schema: Schema = {
        "$schema": DRAFT,
        "$id": "urn:replica-cdr:schema:record",
        "title": "A canonical event record (one line of a jsonl export)",
        "type": "object",
        "required": ["op", "ts", "origin", "event_id", "seq"],  # key: by op (rules)
        "properties": fields,
        "allOf": rules,
    }
    if config is not None and table is not None:
        _typed(schema, config, table)
    return schema


def _key(table: Table, nullable: bool) -> Schema:
    """A key (or new key) object: exactly the key columns, none null."""
    return {
        "type": ["object", "null"] if nullable else "object",
        "properties": {
            table.exported(c): value_schema(table.column(c).type, nullable=False) for c in table.key
        },
        "required": [table.exported(c) for c in table.key],
        "additionalProperties": False,
    }


def _image(table: Table) -> Schema:
    """A row image's members typed by their columns (null is no value)."""
    return {
        "type": ["object", "null"],
        "properties": {c.exported: value_schema(c.type) for c in table.columns},
    }


def _not_null(table: Table, columns: list[str]) -> Schema:
    after = {table.exported(c): {"not": {"type": "null"}} for c in columns}
    return {"properties": {"after": {"properties": after}}}


def _column_rules(table: Table) -> list[Schema]:
    """NOT NULL and delta columns (an UPDATE's ignore_nulls columns aside), ``order_by``."""
    ruled = sorted(table.not_null | table.delta)
    rules = [_when_op(("INSERT", READ), _not_null(table, ruled))]
    rules.append(
        _when_op(("UPDATE",), _not_null(table, [c for c in ruled if c not in table.ignore_nulls]))
    )
    if table.order_by is not None:
        col = table.exported(table.order_by)
        has: Schema = {"required": [col], "properties": {col: {"not": {"type": "null"}}}}
        for ops, image in ((("INSERT", "UPDATE", READ), "after"), (("DELETE",), "before")):
            rules.append(_when_op(ops, {"required": [image], "properties": {image: has}}))
    return rules


def _cell_rules(schema: Schema, table: Table) -> None:
    """A cell table: no new key, no column it does not have, an expiry only with a ttl."""
    fields = schema["properties"]
    names = {"enum": [c.exported for c in table.columns]}
    fields["new_key"] = {"type": "null", "description": "a cell table's key never changes"}
    for image in ("after", "before"):
        fields[image] = fields[image] | {"propertyNames": names}
    positive: Schema = {
        "anyOf": [{"type": "integer", "minimum": 1}, {"type": "string", "pattern": "[1-9]"}]
    }
    schema["allOf"].append(
        {
            "if": {"not": {"required": ["ttl"], "properties": {"ttl": positive}}},
            "then": {"properties": {"expiry": {"type": "null"}}},
        }
    )


def _typed(schema: Schema, config: Config, table: Table) -> None:
    """The record of ``table``: its key, images and origin typed; its column rules."""
    fields = schema["properties"]
    schema["$id"] = f"urn:replica-cdr:schema:record:{table.name}"
    schema["title"] = f"A canonical event record of table {table.name}"
    fields["origin"] = {
        "enum": list(config.replica_ids),
        "description": "the replica where the change was made (a configured replica)",
    }
    cell = table.granularity is Granularity.CELL
    fields["before"] = _image(table)
    image = _image(table)
    schema["allOf"] = _record_rules(_key(table, False), _key(table, True), cell)
    schema["allOf"].append(_when_op(("DELETE",), {"properties": {"after": image}}, negate=True))
    schema["allOf"] += _column_rules(table)
    if cell:
        _cell_rules(schema, table)
    else:
        for f in ("ttl", "expiry"):
            fields[f] = {"description": "not read: the table is not of cell granularity"}


def table_schemas(config: Config, tables: list[str] | None = None) -> dict[str, Schema]:
    """Each table's record schema (all of the config's tables unless named)."""
    names = tables or list(config.tables)
    unknown = [t for t in names if t not in config.tables]
    if unknown:
        raise ConfigError(
            "--table", [f"no table {t!r} (the tables: {', '.join(config.tables)})" for t in unknown]
        )
    return {t: record_schema(config, config.tables[t]) for t in names}


# ---------------------------------------------------------------------- the manifest


def _options() -> Schema:
    """Each format's ``options`` (``adapters.options.OPTIONS``), by the manifest's format."""
    json_types = {str: "string", bool: "boolean", dict: "object", list: "array", int: "integer"}
    rules = []
    for fmt, allowed in OPTIONS.items():
        props = {k: {"type": json_types[t]} for k, t in allowed.items()}  # type: ignore[index]
        then: Schema = {
            "properties": {
                "options": {
                    "type": ["object", "null"],
                    "properties": props,
                    "additionalProperties": False,
                }
            }
        }
        if fmt == "dms":
            then["required"] = ["options"]
            then["properties"]["options"]["required"] = ["timestamp_column"]
        rules.append({"if": {"properties": {"format": {"const": fmt}}}, "then": then})
    return {"allOf": rules}


def manifest_schema() -> Schema:
    """An export's ``_manifest.json`` (``pipeline.ingest.manifests.read_manifest``)."""
    return {
        "$schema": DRAFT,
        "$id": "urn:replica-cdr:schema:manifest",
        "title": "An export's _manifest.json",
        "type": "object",
        "required": ["format", "files"],
        "properties": {
            "replica": {"type": "string", "description": "the folder's replica= (checked)"},
            "table": {"type": "string", "description": "the folder's table= (checked)"},
            "dt": {"type": "string", "format": "date", "description": "the folder's dt= (checked)"},
            "format": {"enum": list(FORMATS)},
            "options": {"type": ["object", "null"], "description": "the format's options"},
            "files": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["path", "rows", "sha256"],
                    "properties": {
                        "path": {
                            "type": "string",
                            "pattern": _RELATIVE,
                            "description": "relative to the manifest's folder, inside it",
                        },
                        "rows": {"type": "integer", "minimum": 0},
                        "sha256": {"type": "string", "pattern": "^[0-9a-fA-F]{64}" + _END},
                    },
                },
            },
            "watermark": {
                "type": "string",
                "description": "informational: when the export was cut (RFC 3339); "
                "kept in the run's staged inputs, never checked nor used",
            },
        },
        **_options(),
    }


# ---------------------------------------------------------------------- as files


def dumps(schema: Schema) -> str:
    """A schema as JSON text, its decimal bounds written with every digit."""
    text = json.dumps(schema, indent=2, ensure_ascii=False, default=lambda d: f"@@{d}@@")
    return re.sub(r'"@@([-+0-9.Ee]+)@@"', r"\1", text) + "\n"


def rendered() -> dict[str, str]:
    """The repository's schema files, as this module renders them."""
    return {RECORD_FILE: dumps(record_schema()), MANIFEST_FILE: dumps(manifest_schema())}


def write_files() -> list[str]:
    """Render the repository's schema files again (``python -m pipeline.ingest.schemas``)."""
    for name, text in rendered().items():
        (HERE / name).write_text(text)
    return sorted(rendered())
