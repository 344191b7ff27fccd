"""Custom resolvers (docs/rules.md#custom-resolvers): the user's function, imported by its
``module:function`` path where the fold runs (the driver and every executor), called on a
conflict between two rows, and its answer checked against the table.

The function is called as ``f(local, remote, context)``: ``local`` and ``remote`` are
``{"row": {...}, "ts": µs, "origin": id, "event_id": str | None}``, ``context`` is
``{"table", "conflict_type", "key"}``. It answers ``"local"``, ``"remote"`` or
``{"row": {...}}``."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from decimal import Decimal
from functools import cache
from typing import Any, Literal

from pipeline.core.config import Table
from pipeline.core.errors import CdrError
from pipeline.core.kinds import ColumnType, Kind
from pipeline.core.summary import TableSummary
from pipeline.rules.readers import reader

Side = Literal["local", "remote", "row"]
#: a uuid's text as the guards read it: checked, lower case
_uuid = reader(ColumnType(Kind.UUID))


class ResolverMissing(CdrError):
    """The function cannot be imported: the run stops naming it (it is not the event's
    fault, so nothing is quarantined)."""


class FoldFailed(CdrError):
    """The Spark tasks that fold a table with a custom resolver failed (after Spark's
    retries): the run stops naming the function, whose memory or crash it may be."""

    def __init__(self, table: Table, cause: BaseException):
        names = ", ".join(sorted({f"python:{p}" for p in table.custom.values()}))
        first = (str(cause).strip().splitlines() or [""])[0][:200]
        super().__init__(
            f"table {table.name}: the fold failed with the custom resolver {names} in its "
            f"tasks ({type(cause).__name__}: {first})"
        )


class ResolverError(Exception):
    """The function raised, or answered what it may not: the converged fold quarantines
    the remote event (``resolver_error``); a replica's perspective keeps the local
    version."""


@cache
def load(path: str) -> Callable[..., Any]:
    """The function of ``module:function``, imported once per process."""
    module, _, name = path.partition(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ResolverMissing(f"custom resolver python:{path} cannot be imported: {e}") from e
    except Exception as e:  # its module raised on import (a SyntaxError, its own error)
        where = f" ({e.filename} line {e.lineno})" if isinstance(e, SyntaxError) else ""
        raise ResolverMissing(
            f"custom resolver python:{path} cannot be imported: importing {module} raised "
            f"{type(e).__name__}{where}: {e}; fix the module, or the table's resolver setting"
        ) from e
    if not callable(fn):
        raise ResolverMissing(f"custom resolver python:{path} is not a function")
    return fn


def version(row: Mapping[str, Any], ts: int, origin: str | None, event_id: str | None) -> dict:
    """One side of the call."""
    return {"row": dict(row), "ts": ts, "origin": origin, "event_id": event_id}


def answer(
    table: Table, path: str, local: dict, remote: dict, context: dict
) -> tuple[Side, dict[str, Any] | None]:
    """The function's answer: ``("local", None)``, ``("remote", None)`` or ``("row", row)``
    with the row's value columns checked against the table (the key columns left out: the
    conflict keeps its key). Raises :class:`ResolverError` with what went wrong."""
    fn = load(path)
    try:
        got = fn(local, remote, context)
    except Exception as e:  # the user's code: anything it raises is its error
        raise ResolverError(f"python:{path} raised {type(e).__name__}: {e}") from e
    if isinstance(got, str) and got in ("local", "remote"):
        return got, None  # type: ignore[return-value]
    if isinstance(got, dict) and set(got) == {"row"} and isinstance(got["row"], dict):
        try:
            return "row", checked(table, got["row"])
        except RowMisfit as err:
            raise ResolverError(f"python:{path} answered a row that does not fit: {err}") from err
    shown = repr(got)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    raise ResolverError(
        f"python:{path} answered {shown}: not 'local', 'remote' or {{'row': {{...}}}}"
    )


class RowMisfit(ValueError):
    """A row (a custom resolver's answer, a decision's ``--row``) does not fit the table:
    what is wrong with each column."""


def checked(table: Table, row: Mapping[str, Any]) -> dict[str, Any]:
    """A row's value columns, each of its column's type and range; a NOT NULL column is
    not null (the key columns left out: the conflict keeps its key)."""
    problems = []
    out: dict[str, Any] = {}
    for c, v in row.items():
        if not isinstance(c, str) or c not in table.column_names:
            problems.append(f"no column {c!r}")
            continue
        if c in table.key:
            continue
        kind = table.column(c).type
        if v is None:
            if c in table.not_null:
                problems.append(f"column {c!r} is NOT NULL")
            out[c] = v
            continue
        ok = kind.admits(v)
        if ok and kind.kind is Kind.UUID:
            v = _uuid(v)  # as the guards read one: checked, lower case
            ok = v is not None
        if not ok:
            problems.append(f"column {c!r} is {kind}, not {row[c]!r}")
            continue
        if kind.kind is Kind.DECIMAL:
            v = Decimal(v)
        out[c] = float(v) if kind.kind is Kind.DOUBLE else v
    if problems:
        raise RowMisfit("; ".join(problems))
    return out


def asymmetric_warnings(tables: Mapping[str, TableSummary]) -> list[str]:
    """A warning per table and custom resolver that answered another row with the sides
    swapped: the replicas converge only if the function gives the same row whichever side
    is local."""
    return [
        f"table {t}: {fn} answered another row with the sides swapped in {n} conflict(s): "
        "replicas converge only if it gives the same row whichever side is local"
        for t, s in tables.items()
        for fn, n in sorted(s.asymmetric.items())
    ]
