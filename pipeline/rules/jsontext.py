"""Strict JSON text, as the guards read a record: numbers kept as the digits they were
written with, a name given twice or a lone UTF-16 surrogate refused, each scalar taken as
its text (:func:`text_of`) for a column's type to read (``pipeline.rules.readers``). And
the lines that are no text: too long (:class:`LongLine`) or not UTF-8 (:func:`not_utf8`),
said for their quarantine row."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any


class JsonNumber(str):
    """A JSON number, kept as the text it was written with."""

    __slots__ = ()


class NotJson(ValueError):
    """A text that is not the JSON the guards read, and why (the quarantine's detail)."""


#: a JSON escape of a UTF-16 surrogate (a pair of them is one character)
_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object's members; a name given twice is refused (JSON parsers disagree on
    which one counts: the last here, the first or an error elsewhere)."""
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set[str] = set()
        twice = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise NotJson(f"duplicate key {json.dumps(twice)[:200]}")  # ASCII: any name is text
    return d


def parse_json(text: str) -> Any:
    """JSON with numbers kept as their text (:class:`JsonNumber`); ``NaN`` and
    ``Infinity`` are not JSON, nor is an object that names a member twice
    (:class:`NotJson`, which names it) or a value nested deeper than Python's parser
    goes. Raises ValueError."""
    try:
        v = json.loads(
            text,
            parse_int=JsonNumber,
            parse_float=JsonNumber,
            parse_constant=_no_constant,
            object_pairs_hook=_members,
        )
    except RecursionError:
        raise NotJson("nested too deep") from None
    if _SURROGATE.search(text):  # an escaped half of a UTF-16 pair, alone, is no text
        try:
            json.dumps(v, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise NotJson("a string holds a lone UTF-16 surrogate (\\ud800-\\udfff)") from None
    return v


def _compact(v: Any) -> str:
    if isinstance(v, JsonNumber):
        return str(v)
    if isinstance(v, dict):
        return "{" + ",".join(f"{json.dumps(k)}:{_compact(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ",".join(_compact(x) for x in v) + "]"
    return json.dumps(v, ensure_ascii=False)


def text_of(v: Any) -> str | None:
    """A JSON value as text: a string's content, a number's digits, ``true``/``false``,
    an object or array as compact JSON; None for null."""
    if v is None:
        return None
    if isinstance(v, str):
        return str(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    return _compact(v)


@dataclass(frozen=True)
class NotAnObject:
    """An object field that holds something else (a number, an array, a text that is not
    a JSON object: ``why``, when the text says)."""

    why: str = ""


NOT_AN_OBJECT = NotAnObject()
TextMap = dict[str, str | None]


def object_of(v: Any) -> TextMap | NotAnObject | None:
    """An object field as a map of its members' texts; a string that holds a JSON object
    counts as that object (Parquet exports may give objects as JSON text); None when the
    field is absent or null."""
    if v is None:
        return None
    if isinstance(v, str) and not isinstance(v, JsonNumber):
        try:
            v = parse_json(v)
        except NotJson as e:
            return NotAnObject(str(e))
        except ValueError:
            return NOT_AN_OBJECT
    if not isinstance(v, dict):
        return NOT_AN_OBJECT
    return {k: text_of(x) for k, x in v.items()}


# ---------------------------------------------------------------------- lines that are no text


class LongLine(bytes):
    """The first bytes of a line longer than ``max_record_bytes``, and its ``length``: the
    rest of it was skipped as it was read (``pipeline.ingest.staging.line_chunks``)."""

    length: int


#: the bytes of a long line kept for its quarantine row
LONG_LINE_KEPT = 1024


def long_line(head: LongLine, limit: int | None) -> str:
    """Why a long line is no record."""
    return (
        f"{head.length} bytes, over max_record_bytes ({limit}); "
        f"its first {len(head)} bytes are kept"
    )


def not_utf8(e: UnicodeDecodeError) -> str:
    """Where bytes stop being UTF-8, for a message."""
    return f"byte 0x{e.object[e.start]:02x} at offset {e.start}"
