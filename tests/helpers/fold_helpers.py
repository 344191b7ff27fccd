"""Small builders for the pure-Python fold tests: one table ``t`` (id int, v string,
n int) of pub and sub (``helpers.configs``), its fold spec, versions and events."""

from __future__ import annotations

from typing import Any

from pipeline.core.config import Config, Table
from pipeline.core.config_load import parse_config
from pipeline.rules.events import Event, FoldSpec, Version
from tests.helpers import configs

NOW = 1_795_305_600_000_000  # 2026-11-22T00:00:00Z
T0 = 1_795_219_200_000_000  # 2026-11-21T00:00:00Z
H = 3_600_000_000  # one hour in µs
REPLICAS = configs.replicas(pub=7301, sub=7302)
COLUMNS = {"id": "int", "v": "string", "n": "int"}


def make_config(table: dict[str, Any] | None = None, **top: Any) -> Config:
    """The config of table ``t`` with ``table``'s settings over its own; ``top``: the
    config's other keys (``replicas`` too)."""
    top.setdefault("replicas", REPLICAS)
    return parse_config(
        configs.config(configs.table(**{"columns": COLUMNS, **(table or {})}), **top)
    )


def spec(table: dict[str, Any] | None = None, **top: Any) -> FoldSpec:
    cfg = make_config(table, **top)
    return FoldSpec(cfg.tables["t"], NOW)


def ranks(table: Table) -> dict[str, int]:
    return make_config().tie_ranks(table.tie_break)


def live(
    key: int,
    v: str,
    ts: int,
    origin: str | None,
    n: int = 0,
    eid: str | None = None,
    rank: int | None = None,
) -> tuple[tuple[int], Version]:
    r = {"pub": 0, "sub": 1}.get(origin or "", -1) if rank is None else rank
    return (key,), Version({"id": key, "v": v, "n": n}, ts, origin, eid, r)


def tomb(key: int, ts: int, origin: str, at: int = NOW - H) -> tuple[tuple[int], Version]:
    return (key,), Version(
        {"id": key}, ts, origin, None, {"pub": 0, "sub": 1}[origin], deleted=True, deleted_at=at
    )


def ev(
    op: str,
    key: int | None,
    ts: int,
    origin: str,
    eid: str,
    after: dict | None = None,
    before: dict | None = None,
    new_key: int | None = None,
    rank: int | None = None,
    **kw: Any,
) -> Event:
    r = {"pub": 0, "sub": 1}[origin] if rank is None else rank
    return Event(
        eid,
        op,
        (key,) if key is not None else None,
        ts,
        origin,
        r,
        new_key=(new_key,) if new_key is not None else None,
        after=after or {},
        before=before or {},
        **kw,
    )
