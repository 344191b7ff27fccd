"""Where a CDC tool writes a replica's changes, and which of its objects make a date's
export (docs/sealing.md): one table, :data:`LAYOUTS`, from which the config's checks,
``cdr manifest`` and the page's rules derive.

A date's export is every change the replica *applied* that day, not every change its
origin committed that day: a change made elsewhere at 23:59 and applied here at 00:01 is
the next date's. So each layout dates an object by when the tool wrote it (the tool's
write time follows the replica's apply time), and seals a date only when the tool shows it
has moved past it: every writer (a Kafka partition, DMS's task, the receiver's file) has
written an object of a later date; or ``grace_hours`` after the date ended; or by hand
(``cdr manifest --seal``). Pure: keys in, a plan out; the store is
:mod:`pipeline.ingest.seal`'s.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from enum import StrEnum
from typing import Any


class SourceLayout(StrEnum):
    DEBEZIUM_S3_TIME = "debezium-s3-time"
    DEBEZIUM_S3_FIELD = "debezium-s3-field"
    DMS = "dms"
    WAL2JSON = "wal2json"
    GLOB = "glob"


@dataclass(frozen=True, slots=True)
class Source:
    """A replica's ``source`` in cdr.yaml: the tool's objects under ``prefix`` (a folder of
    the store), one folder per table (``tables``: table -> its folder under the prefix; a
    table not named there: its own name)."""

    prefix: str
    layout: SourceLayout
    format: str  # the manifest's format
    options: Mapping[str, Any] = field(default_factory=dict)  # the manifest's options
    tables: Mapping[str, str] = field(default_factory=dict)
    pattern: str | None = None  # wal2json, glob: a glob with {date} (or {yyyy}, {mm}, {dd})
    field: str = "dt"  # debezium-s3-field: the partition field that holds the date
    grace_hours: float | None = None  # a quiet date is sealed this long after it ended

    def folder(self, table: str) -> str:
        """The table's folder of the store, where the tool writes its objects."""
        return "/".join(p for p in (self.prefix.strip("/"), self.tables.get(table, table)) if p)


@dataclass(frozen=True)
class Found:
    """One object of the tool, as its layout reads its key."""

    key: str  # relative to the table's folder
    day: date  # the date whose export it belongs to (the tool's write date)
    writer: str  # who wrote it ("partition 3"): each writer must move past a date
    order: tuple[Any, ...]  # its place in the writer's apply order


@dataclass(frozen=True)
class Plan:
    """What sealing ``dt`` finds: its objects in apply order, and whether it is sealed
    (``why``: the rule that sealed it, or what it still waits for)."""

    files: tuple[str, ...]
    sealed: bool
    why: str
    objects: int  # the tool's objects of the table, every date


_PLACEHOLDERS = {
    "{date}": r"(?P<date>\d{4}-\d{2}-\d{2})",
    "{yyyymmdd}": r"(?P<compact>\d{8})",
    "{yyyy}": r"(?P<yyyy>\d{4})",
    "{mm}": r"(?P<mm>\d{2})",
    "{dd}": r"(?P<dd>\d{2})",
}


def pattern_problem(pattern: str) -> str | None:
    """Why a glob of ``source.pattern`` cannot date an object (None: it can)."""
    names = set(re.findall(r"\{[a-z]+\}", pattern))
    unknown = names - set(_PLACEHOLDERS)
    if unknown:
        return f"unknown placeholder(s) {sorted(unknown)} (known: {', '.join(_PLACEHOLDERS)})"
    if not ({"{date}", "{yyyymmdd}"} & names or {"{yyyy}", "{mm}", "{dd}"} <= names):
        return "must hold {date}, {yyyymmdd} or all of {yyyy}, {mm}, {dd}: the date of a file"
    if pattern.startswith("/") or ".." in pattern.split("/"):
        return "is relative to the table's folder, without '..'"
    return None


def pattern_regex(pattern: str) -> re.Pattern[str]:
    """The glob as a regular expression (``**`` any folders, ``*`` and ``?`` within a
    name), each placeholder a named group."""
    out, i = "", 0
    while i < len(pattern):
        ph = next((p for p in _PLACEHOLDERS if pattern.startswith(p, i)), None)
        if ph is not None:
            out, i = out + _PLACEHOLDERS[ph], i + len(ph)
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(f"^{out}$")


def _day(y: str, m: str, d: str) -> date | None:
    try:
        return date(int(y), int(m), int(d))
    except ValueError:
        return None


#: Kafka Connect's S3 sink names each object ``<topic>+<partition>+<start offset>.<ext>``
_KAFKA_OBJECT = re.compile(r"^(?P<topic>.+)\+(?P<part>\d+)\+(?P<offset>\d+)\.[A-Za-z0-9.]+$")
_TIME_PATH = re.compile(r"(?:^|/)year=(\d{4})/month=(\d{1,2})/day=(\d{1,2})(?:/|$)")
#: DMS names a change file by when it wrote it: ``20261121-0930150000.csv``
_DMS_OBJECT = re.compile(r"^(\d{4})(\d{2})(\d{2})-(\d{6,})\.(?:csv|parquet)(?:\.gz)?$")


def _kafka(key: str, day: date | None) -> Found | None:
    m = _KAFKA_OBJECT.match(key.rsplit("/", 1)[-1])
    if m is None or day is None:
        return None
    part = int(m["part"])
    return Found(key, day, f"partition {part}", (part, int(m["offset"])))


def _debezium_time(key: str, source: Source) -> Found | None:
    m = _TIME_PATH.search(key)
    return _kafka(key, _day(*m.groups()) if m else None)


def _debezium_field(key: str, source: Source) -> Found | None:
    m = re.search(rf"(?:^|/){re.escape(source.field)}=(\d{{4}})-(\d{{2}})-(\d{{2}})(?:/|$)", key)
    return _kafka(key, _day(*m.groups()) if m else None)


def _dms(key: str, source: Source) -> Found | None:
    m = _DMS_OBJECT.match(key.rsplit("/", 1)[-1])  # LOAD*.csv, the full load: no change
    day = _day(m[1], m[2], m[3]) if m else None
    return Found(key, day, "DMS", (m[0],)) if m and day else None


def _by_pattern(writer: str) -> Callable[[str, Source], Found | None]:
    def parse(key: str, source: Source) -> Found | None:
        assert source.pattern is not None, "the config requires a pattern"
        m = pattern_regex(source.pattern).match(key)
        if m is None:
            return None
        g = m.groupdict()
        if g.get("date"):
            day = _day(*g["date"].split("-"))
        elif g.get("compact"):
            day = _day(g["compact"][:4], g["compact"][4:6], g["compact"][6:])
        else:
            day = _day(g["yyyy"], g["mm"], g["dd"])
        return Found(key, day, writer, (key,)) if day else None

    return parse


@dataclass(frozen=True)
class LayoutRule:
    """One layout: the format its manifest names (None: ``source.format``), how it reads
    an object's key, whether a writer's later object seals a date, and the page's words."""

    format: str | None
    parse: Callable[[str, Source], Found | None]
    seals_on_later: bool
    pattern: bool  # needs ``source.pattern``
    doc: str


LAYOUTS: dict[SourceLayout, LayoutRule] = {
    SourceLayout.DEBEZIUM_S3_TIME: LayoutRule(
        "debezium",
        _debezium_time,
        True,
        False,
        "Kafka Connect's S3 sink with the TimeBasedPartitioner on the wall clock: "
        "`.../year=YYYY/month=MM/day=DD[/hour=HH]/<topic>+<partition>+<offset>.json[.gz]`; "
        "an object is its path's date; sealed when every partition seen has written an "
        "object of a later date",
    ),
    SourceLayout.DEBEZIUM_S3_FIELD: LayoutRule(
        "debezium",
        _debezium_field,
        True,
        False,
        "Kafka Connect's S3 sink with the FieldPartitioner on a field the pipeline sets to "
        "the processing date: `.../<field>=YYYY-MM-DD/<topic>+<partition>+<offset>.json[.gz]`; "
        "sealed as debezium-s3-time",
    ),
    SourceLayout.DMS: LayoutRule(
        "dms",
        _dms,
        True,
        False,
        "AWS DMS's S3 target, CDC files "
        "`<schema>/<table>/[YYYY/MM/DD/]<YYYYMMDD-HHMMSS...>.csv` or `.parquet`; a file is "
        "the date in its name (when DMS wrote it), whatever its folder; `LOAD*` files (the "
        "full load) are left out; sealed when DMS has written a file of a later date",
    ),
    SourceLayout.WAL2JSON: LayoutRule(
        "wal2json",
        _by_pattern("pg_recvlogical"),
        True,
        True,
        "`pg_recvlogical` with wal2json, its output file switched at midnight UTC "
        "(SIGHUP) to a name that holds the date (`pattern`); sealed when a file of a later "
        "date exists",
    ),
    SourceLayout.GLOB: LayoutRule(
        None,
        _by_pattern("the tool"),
        False,
        True,
        "any tool: the files `pattern` matches, dated by its placeholders; sealed only by "
        "`grace_hours` or `cdr manifest --seal`",
    ),
}


def _hidden(key: str) -> bool:
    """A temporary or marker file (``.x.tmp``, ``_SUCCESS``): no tool's object."""
    return any(part.startswith((".", "_")) for part in key.split("/"))


def found_objects(source: Source, keys: Sequence[str]) -> list[Found]:
    """The tool's objects among ``keys`` (relative to the table's folder)."""
    parse = LAYOUTS[source.layout].parse
    return [f for k in keys if not _hidden(k) and (f := parse(k, source)) is not None]


def _grace_end(source: Source, dt: date) -> datetime | None:
    if source.grace_hours is None:
        return None
    midnight = datetime.combine(dt + timedelta(days=1), time(), UTC)
    return midnight + timedelta(hours=source.grace_hours)


def _waiting(found: list[Found], dt: date) -> list[str]:
    """Each writer that has written nothing after ``dt`` yet, with its last object."""
    out = []
    for w in sorted({f.writer for f in found}):
        mine = [f for f in found if f.writer == w]
        if not any(f.day > dt for f in mine):
            last = max(mine, key=lambda f: (f.day, f.order))
            out.append(f"{w} has written nothing after {dt} yet (its last object: {last.key})")
    return out


def plan(source: Source, keys: Sequence[str], dt: date, now: datetime, by_hand: bool) -> Plan:
    """The objects of ``dt`` among ``keys`` in apply order, and whether ``dt`` is sealed
    (docs/sealing.md). ``by_hand``: the operator seals it (``--seal``)."""
    rule = LAYOUTS[source.layout]
    found = found_objects(source, keys)
    mine = sorted((f for f in found if f.day == dt), key=lambda f: (f.writer, f.order))
    files = tuple(f.key for f in mine)
    waits = _waiting(found, dt) if rule.seals_on_later else []
    grace = _grace_end(source, dt)
    if by_hand:
        return Plan(files, True, "sealed by hand (--seal)", len(found))
    if rule.seals_on_later and found and not waits:
        return Plan(files, True, "every writer has written a later date", len(found))
    if grace is not None and now >= grace:
        why = f"grace_hours: {source.grace_hours} h after {dt} ended"
        return Plan(files, True, why, len(found))
    if not rule.seals_on_later:
        waits = [f"layout {source.layout} is sealed by hand (cdr manifest --seal) or grace_hours"]
    elif not found:
        waits = ["the tool has written no object yet"]
    after = f"; or at {grace:%Y-%m-%dT%H:%MZ} (grace_hours)" if grace else ""
    return Plan(files, False, "; ".join(waits) + after, len(found))
