"""How one table of ``cdr.yaml`` becomes a :class:`~pipeline.core.config.Table`: its
columns' names and types, its constraints, policy and resolvers, each setting checked
against the others (docs/configuration.md, docs/rules.md).

:mod:`pipeline.core.config_load` reads the whole file and checks what spans its tables;
both add each mistake to a :class:`Problems` with its path in the file, so that loading
reports them all at once.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from pipeline.core.columns import RESERVED, RESERVED_PREFIXES
from pipeline.core.config import OTHER_GROUP, Column, ForeignKey, History, Table
from pipeline.core.config_file import (
    ColumnModel,
    ConfigModel,
    CustomResolverModel,
    DefaultsModel,
    TableModel,
)
from pipeline.core.kinds import (
    MERGE_KINDS,
    NUMERIC_KINDS,
    ORDER_BY_KINDS,
    ColumnType,
    coerce_value,
    parse_column_type,
)
from pipeline.core.policy import (
    ALLOWED,
    PRESETS,
    ConflictType,
    Detection,
    Granularity,
    MergeFn,
    Preset,
    Resolver,
    Scope,
    allowed_resolvers,
)


class Problems:
    """Every mistake found in the file, each as ``path: message``."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, path: str, message: str) -> None:
        self.items.append(f"{path}: {message}")


def resolve_table(name: str, t: TableModel, m: ConfigModel, p: Problems) -> Table | None:
    """Table ``name`` of the file, its settings checked; None when its columns or key are
    too broken to build it (every problem found is in ``p``)."""
    defaults, tables, priority = m.defaults, m.tables, m.priority
    at = f"tables.{name}"
    sources = published_names(at, t, p)  # published name -> exported name
    t = t.model_copy(update={"columns": {n: _type_text(t.columns[s]) for n, s in sources.items()}})
    first = len(p.items)
    columns: list[Column] = []
    for col, text in t.columns.items():
        try:
            source = sources[col] if sources[col] != col else ""
            columns.append(Column(col, parse_column_type(str(text)), source))
        except ValueError as e:
            p.add(f"{at}.columns.{sources[col]}", str(e))
    ctypes = {c.name: c.type for c in columns}
    _check_constraints(at, t, ctypes, tables, p)
    col_defaults = _column_defaults(at, t, ctypes, p)
    preset = t.policy or defaults.policy
    rule = PRESETS[preset]
    resolvers, custom = _resolvers(at, t, defaults, p)
    groups = _column_groups(at, t, preset, p)
    if ConflictType.UPDATE_DIFFER in custom and groups:
        p.add(
            f"{at}.resolvers.update_differ",
            "a custom resolver cannot decide update_differ group by group (column_groups)",
        )
    _name_them_as_published(p, first, {s: n for n, s in sources.items() if s != n})
    if len(columns) != len(t.columns) or not t.key:
        return None
    return Table(
        name=name,
        columns=tuple(columns),
        key=tuple(t.key),
        not_null=frozenset(t.not_null) | frozenset(t.key),
        unique=tuple(tuple(u) for u in t.unique),
        foreign_keys=tuple(
            ForeignKey(tuple(fk.columns), fk.references, tuple(tables[fk.references].key))
            for fk in t.foreign_keys
            if fk.references in tables
        ),
        delta=frozenset(t.delta),
        defaults=col_defaults,
        preset=preset,
        resolvers=resolvers,
        tie_break=t.tie_break or defaults.tie_break or rule.tie_break,
        detection=t.detection or defaults.detection or Detection.ORIGIN,
        scope=t.scope,
        granularity=rule.granularity,
        priority=tuple(priority or ()),
        order_by=t.order_by,
        column_groups=groups,
        history=_history(at, t, p),
        ignore_nulls=_ignore_nulls(at, t, m.ignore_null_updates, rule.granularity, p),
        merge=_merge(at, t, ctypes, rule.granularity, p),
        custom=custom,
    )


def _type_text(given: str | ColumnModel) -> str:
    return given if isinstance(given, str) else given.type


#: docs/configuration.md#column-names: a name the published tables hold as it is (Spark,
#: Delta without column mapping, Parquet, and the readers of docs/outputs.md): a letter or
#: an underscore, then letters, digits, underscores and dollar signs
_HOLDABLE = re.compile(r"^[^\W\d][\w$]*$")


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a column of the published tables as it is (None: it can)."""
    folded = name.casefold()
    if folded in {r.casefold() for r in RESERVED}:
        return f"the published tables keep their own {name!r} beside a table's columns"
    if folded.startswith(RESERVED_PREFIXES):
        return f"names starting with {' or '.join(RESERVED_PREFIXES)} are the pipeline's own"
    if not _HOLDABLE.match(name):
        odd = sorted({ch for ch in name if not (ch.isalnum() or ch in "_$")})
        if not name:
            return "an empty name"
        if odd:
            shown = ", ".join("a space" if ch == " " else repr(ch) for ch in odd)
            return f"it holds {shown}, which the published tables' names cannot"
        return "it starts with a digit"
    return None


def suggested_name(name: str, taken: set[str]) -> str:
    """A name the published tables can hold for column ``name``, none of ``taken``
    (compared without case): lower case, other characters as ``_``."""
    base = re.sub(r"[^\w$]+", "_", name.casefold()).strip("_") or "column"
    if base[0].isdigit():
        base = f"c_{base}"
    base = base.lstrip("_") if name_problem(base) else base
    base = base if base and not name_problem(base) else f"col_{base}".rstrip("_")
    out, n = base, 2
    while out.casefold() in taken or name_problem(out):
        out, n = f"{base}_{n}", n + 1
    return out


def published_names(at: str, t: TableModel, p: Problems) -> dict[str, str]:
    """Each column's published name -> its exported name
    (docs/configuration.md#column-names): the name the config gives it, or its ``as``. A
    name the tables cannot hold as
    it is, or equal to another but for case, is refused naming the column, why, and the
    ``as`` that would hold it."""
    out: dict[str, str] = {}
    seen: dict[str, str] = {}  # folded published name -> the column that took it
    exported = {s.casefold(): s for s in t.columns}
    for source, given in t.columns.items():
        alias = given.as_ if isinstance(given, ColumnModel) else None
        name = alias if alias is not None else source
        where = f"{at}.columns.{source}" + (".as" if alias is not None else "")
        why = name_problem(name)
        if why is None and name.casefold() in seen:
            why = f"it equals column {seen[name.casefold()]!r} but for case"
        if why is None and alias is not None and exported.get(name.casefold(), source) != source:
            why = f"another column is exported as {exported[name.casefold()]!r}"
        if why is not None:
            taken = set(seen) | set(exported) | {r.casefold() for r in RESERVED}
            hint = suggested_name(name, taken)
            key = source if _HOLDABLE.match(source) else json.dumps(source)
            p.add(
                where,
                f"{name!r} cannot name a column of the published tables: {why}; give it a "
                f"name they hold: {key}: {{type: {_type_text(given)}, as: {hint}}}",
            )
        seen[name.casefold()] = source
        out[name] = source
    return out


def _name_them_as_published(p: Problems, first: int, renamed: Mapping[str, str]) -> None:
    """The settings of a table name its columns as published: a problem since ``first``
    that names a column by its exported name says which name to use."""
    for i in range(first, len(p.items)):
        for source, name in renamed.items():
            if f"no column {source!r} in" in p.items[i]:
                p.items[i] += f" (the column exported as {source!r} is published as {name!r})"


def _check_constraints(
    at: str,
    t: TableModel,
    ctypes: Mapping[str, ColumnType],
    tables: Mapping[str, TableModel],
    p: Problems,
) -> None:
    """The key, ``not_null``, ``unique``, ``delta`` and foreign-key columns of table ``at``
    name its columns; a delta column is numeric; a foreign key matches its parent's key."""

    def check_cols(path: str, cols: list[str]) -> None:
        for i, c in enumerate(cols):
            if c not in t.columns:
                p.add(f"{path}[{i}]", f"no column {c!r} in {at}.columns")

    if not t.key:
        p.add(f"{at}.key", "a table needs a key: conflict detection matches rows by key")
    check_cols(f"{at}.key", t.key)
    if len(set(t.key)) != len(t.key):
        p.add(f"{at}.key", "a column is listed twice")
    check_cols(f"{at}.not_null", t.not_null)
    check_cols(f"{at}.delta", t.delta)
    for i, u in enumerate(t.unique):
        if not u:
            p.add(f"{at}.unique[{i}]", "an empty unique constraint")
        check_cols(f"{at}.unique[{i}]", u)
    for d in t.delta:
        if d in t.key:
            p.add(f"{at}.delta", f"key column {d!r} cannot be a delta column")
        elif d in ctypes and ctypes[d].kind not in NUMERIC_KINDS:
            p.add(f"{at}.delta", f"delta column {d!r} must be numeric, not {ctypes[d]}")
    _check_order_by(at, t, ctypes, p)
    for i, fk in enumerate(t.foreign_keys):
        fat = f"{at}.foreign_keys[{i}]"
        check_cols(f"{fat}.columns", fk.columns)
        parent = tables.get(fk.references)
        if parent is None:
            p.add(f"{fat}.references", f"no table {fk.references!r}")
        elif len(parent.key) != len(fk.columns):
            p.add(
                f"{fat}.columns",
                f"{len(fk.columns)} column(s) cannot reference the {len(parent.key)}-column "
                f"key of {fk.references!r}",
            )


def _check_order_by(at: str, t: TableModel, ctypes: Mapping[str, ColumnType], p: Problems) -> None:
    """docs/rules.md#order-by-a-column: ``order_by`` names a column of an orderable type, on
    a row table."""
    c = t.order_by
    if c is None:
        return
    allowed = ", ".join(k.value for k in ORDER_BY_KINDS)
    if c not in t.columns:
        p.add(f"{at}.order_by", f"no column {c!r} in {at}.columns")
    elif c in ctypes and ctypes[c].kind not in ORDER_BY_KINDS:
        p.add(f"{at}.order_by", f"column {c!r} is {ctypes[c]}; order_by needs one of: {allowed}")


def _history(at: str, t: TableModel, p: Problems) -> History | None:
    """docs/outputs.md#history: ``history: true``, or ``history: {track: [value columns]}``."""
    h = t.history
    if h is None:
        return None
    if h.track is None:
        return History()
    where = f"{at}.history.track"
    if not h.track:
        p.add(where, "an empty list (leave track out to track every column)")
    _check_value_columns(where, at, t, h.track, "a key change always opens a version", p)
    return History(frozenset(h.track))


def _check_value_columns(
    where: str, at: str, t: TableModel, cols: list[str], why_not_key: str, p: Problems
) -> None:
    """Each of ``cols`` (listed at ``where``) is a value column of table ``at``, once."""
    for i, c in enumerate(cols):
        if c not in t.columns:
            p.add(f"{where}[{i}]", f"no column {c!r} in {at}.columns")
        elif c in t.key:
            p.add(f"{where}[{i}]", f"key column {c!r}: {why_not_key}")
        elif cols.index(c) != i:
            p.add(f"{where}[{i}]", f"column {c!r} is listed twice")


def _ignore_nulls(
    at: str, t: TableModel, top: bool | list[str], granularity: Granularity, p: Problems
) -> frozenset[str]:
    """docs/rules.md#ignore-null-updates: the table's own ``ignore_null_updates`` (``true``,
    ``false`` or its value columns), else the top-level one: ``true`` is every value column
    of every row table, a list names the columns wherever a row table has them (a name
    no table has is refused by :func:`_check_top_level_nulls`). A cell table writes a null
    as a cell: it takes no top-level setting and refuses its own."""
    value_columns = [c for c in t.columns if c not in t.key]
    own = t.ignore_null_updates
    if granularity is Granularity.CELL:
        if own:
            p.add(f"{at}.ignore_null_updates", "not allowed on a cell-granularity table")
        return frozenset()
    if own is None:
        if top is True:
            return frozenset(value_columns)
        return frozenset(c for c in top or () if c in value_columns)
    if own is True:
        return frozenset(value_columns)
    if own is False:
        return frozenset()
    where = f"{at}.ignore_null_updates"
    if not own:
        p.add(where, "an empty list (false, or leave it out, ignores no null)")
    _check_value_columns(where, at, t, own, "an UPDATE's key is never unchanged", p)
    return frozenset(c for c in own if c in value_columns)


def _merge(
    at: str,
    t: TableModel,
    ctypes: Mapping[str, ColumnType],
    granularity: Granularity,
    p: Problems,
) -> dict[str, MergeFn]:
    """docs/rules.md#merge-functions: ``merge: {column: max | min}`` on value columns of an
    ordered type (numeric, date, timestamp) of a row table. A column whose value another rule
    decides is refused: the key, ``order_by`` (it decides which version wins), a ``delta``
    column (it adds), a ``unique`` or foreign-key column (a merged value could collide or
    point nowhere)."""
    if not t.merge:
        return {}
    where = f"{at}.merge"
    if granularity is Granularity.CELL:
        p.add(where, "not allowed on a cell-granularity table (each cell has its own timestamp)")
        return {}
    unique = {c for u in t.unique for c in u}
    foreign = {c for fk in t.foreign_keys for c in fk.columns}
    fns = ", ".join(f.value for f in MergeFn)
    kinds = ", ".join(k.value for k in MERGE_KINDS)
    out: dict[str, MergeFn] = {}
    for c, fn in t.merge.items():
        at_c = f"{where}.{c}"
        if fn not in {f.value for f in MergeFn}:
            p.add(at_c, f"merge function {fn!r}: one of {fns}")
            continue
        if c not in t.columns:
            p.add(at_c, f"no column {c!r} in {at}.columns")
            continue
        taken = [
            (c in t.key, "a key column"),
            (c == t.order_by, "the order_by column (it decides which version wins)"),
            (c in t.delta, "a delta column (its changes add up)"),
            (c in unique, "a unique column (a merged value could collide)"),
            (c in foreign, "a foreign-key column (a merged value could reference no row)"),
        ]
        why = next((w for hit, w in taken if hit), None)
        if why is not None:
            p.add(at_c, f"column {c!r} is {why}; it cannot be merged")
        elif c in ctypes and ctypes[c].kind not in MERGE_KINDS:
            p.add(at_c, f"column {c!r} is {ctypes[c]}; merge needs one of: {kinds}")
        else:
            out[c] = MergeFn(fn)
    return out


def _column_groups(
    at: str, t: TableModel, preset: Preset, p: Problems
) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """docs/rules.md#column-groups: ``column_groups`` of a postgres row table: named groups of value
    columns, each column in one group at most; the others form :data:`OTHER_GROUP`."""
    if not t.column_groups:
        return ()
    where = f"{at}.column_groups"
    if preset is not Preset.POSTGRES:
        p.add(where, f"only on a postgres table, not {preset.value}")
    seen: dict[str, str] = {}
    for g, cols in t.column_groups.items():
        if not re.match(r"^[A-Za-z][A-Za-z0-9_]*$", g):
            p.add(f"{where}.{g}", "a group name is a letter, then letters, digits and _")
        if not cols:
            p.add(f"{where}.{g}", "an empty group")
        for c in cols:
            if c not in t.columns:
                p.add(f"{where}.{g}", f"no column {c!r} in {at}.columns")
            elif c in t.key:
                p.add(f"{where}.{g}", f"key column {c!r} cannot be in a group")
            elif c in seen:
                p.add(f"{where}.{g}", f"column {c!r} is already in group {seen[c]!r}")
            else:
                seen[c] = g
    groups = [(g, tuple(cols)) for g, cols in t.column_groups.items()]
    rest = tuple(c for c in t.columns if c not in t.key and c not in seen)
    return tuple(groups + ([(OTHER_GROUP, rest)] if rest else []))


def _column_defaults(
    at: str, t: TableModel, ctypes: Mapping[str, ColumnType], p: Problems
) -> dict[str, Any]:
    """The table's ``defaults``, each coerced to its column's type."""
    col_defaults: dict[str, Any] = {}
    for col, value in t.defaults.items():
        if col not in ctypes:
            p.add(f"{at}.defaults.{col}", f"no column {col!r} in {at}.columns")
            continue
        try:
            col_defaults[col] = coerce_value(ctypes[col], value)
        except (ValueError, TypeError) as e:
            p.add(f"{at}.defaults.{col}", f"{e} (column type {ctypes[col]})")
    return col_defaults


#: docs/rules.md#custom-resolvers: a dotted module path, a colon, a function name
_FUNCTION_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")


def _resolvers(
    at: str, t: TableModel, defaults: DefaultsModel, p: Problems
) -> tuple[dict[ConflictType, Resolver], dict[ConflictType, str]]:
    """The table's resolver per conflict type: its policy's, then ``defaults.resolvers``,
    then its own ``resolvers`` (row tables only), each one allowed for its conflict type;
    and the ``module:function`` of each custom one (docs/rules.md#custom-resolvers: only
    its syntax is checked here, the run imports it)."""
    preset = t.policy or defaults.policy
    rule = PRESETS[preset]
    if rule.granularity is Granularity.CELL:
        for field, present in (
            ("unique", bool(t.unique)),
            ("delta", bool(t.delta)),
            ("resolvers", t.resolvers is not None),
            ("order_by", t.order_by is not None),
        ):
            if present:
                p.add(f"{at}.{field}", f"not allowed on a {preset.value} (cell-granularity) table")
    if t.scope is Scope.TRANSACTION and preset is not Preset.DELETE_WINS:
        p.add(f"{at}.scope", "scope 'transaction' needs policy 'delete_wins'")
    resolvers = dict(rule.resolvers)
    custom: dict[ConflictType, str] = {}
    if rule.granularity is Granularity.ROW:
        layered = [("defaults.resolvers", defaults.resolvers)]
        if t.resolvers is not None:
            layered.append((f"{at}.resolvers", t.resolvers))
        for path, overrides in layered:
            for ctype, setting in overrides.items():
                where = f"{path}.{ctype.value}"
                res = Resolver.PYTHON if isinstance(setting, CustomResolverModel) else setting
                if res not in ALLOWED[ctype]:
                    p.add(
                        where,
                        f"resolver {res.value!r} is not allowed for {ctype.value}; "
                        f"allowed: {', '.join(allowed_resolvers(ctype))}",
                    )
                elif not isinstance(setting, CustomResolverModel):
                    if res is Resolver.PYTHON:
                        p.add(where, 'a custom resolver is {python: "module:function"}')
                    resolvers[ctype] = res
                    custom.pop(ctype, None)
                elif preset is Preset.DELETE_WINS:
                    p.add(where, "a custom resolver is not allowed under policy delete_wins")
                elif not _FUNCTION_PATH.match(setting.python):
                    p.add(
                        f"{where}.python",
                        f"{setting.python!r} is not module:function (e.g. acme.cdr:prefer_paid)",
                    )
                else:
                    resolvers[ctype] = res
                    custom[ctype] = setting.python
    return resolvers, custom
