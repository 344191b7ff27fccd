"""One config builder for the tests and the benchmarks: the content of ``cdr.yaml``
(docs/configuration.md) as the dict ``pipeline.core.config_load.parse_config`` reads, with
defaults for what a test does not care about.

    config()                                   # pub and sub, one table t (id int, v string)
    config(table(COLUMNS, policy="scylla"), replicas=("A", "B", "C"), on_divergence="warn")
    config({"products": table(...), "orders": table(...)}, replicas=replicas(pub=7301, sub=7302))
    write(tmp / "cdr.yaml", CONFIG, store=tmp / "store")   # for `cdr run --config`

Each call returns new dicts: a test may change what it got. The benchmarks import it with
the repository's root on ``sys.path`` (they run as ``python bench/x.py``)."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

#: a table's columns when a test needs no others: its key and one value
ID_V = {"id": "int", "v": "string"}


def replicas(*ids: str, **system_ids: int) -> list[dict[str, Any]]:
    """The ``replicas`` list: ``replicas("pub", "sub")`` numbers the system ids 1, 2, ... in
    the order given; ``replicas(pub=7301, sub=7302)`` gives them (the tie-break and the
    ``tie_rank`` order follow the system ids)."""
    if ids and system_ids:
        raise TypeError("replicas: ids, or ids with their system ids, not both")
    if system_ids:
        return [{"id": r, "system_id": s} for r, s in system_ids.items()]
    return [{"id": r, "system_id": i} for i, r in enumerate(ids, 1)]


def table(
    columns: Mapping[str, str] = ID_V, key: Iterable[str] = ("id",), **settings: Any
) -> dict[str, Any]:
    """One table: its ``key`` (``id`` unless given) and ``columns`` (name -> type, in the
    snapshot's order; ``id int, v string`` unless given), then any other setting of a
    table (``policy``, ``resolvers``, ``delta``, ``unique``, ``foreign_keys``, ...)."""
    return {"key": list(key), "columns": dict(columns), **copy.deepcopy(settings)}


#: common table shapes: ``items`` (the generator's and the benchmarks'), and a parent
#: and child joined by a foreign key (:func:`products`, :func:`orders`)
ITEMS = {"id": "bigint", "name": "string", "qty": "int"}


def products(**settings: Any) -> dict[str, Any]:
    """The parent table: ``products`` keyed by ``product_no``, with a ``name``."""
    return table({"product_no": "int", "name": "string"}, ["product_no"], **settings)


def orders(order_id: str = "int", **settings: Any) -> dict[str, Any]:
    """The child table: ``orders`` keyed by ``order_id`` (of type ``order_id``), with a
    ``qty`` and a ``product_no`` that references ``products``."""
    columns = {"order_id": order_id, "product_no": "int", "qty": "int"}
    fk = [{"columns": ["product_no"], "references": "products"}]
    return table(columns, ["order_id"], **settings, foreign_keys=fk)


def config(
    tables: Mapping[str, Any] | None = None,
    *,
    replicas: Sequence[str] | Sequence[Mapping[str, Any]] = ("pub", "sub"),
    store: str | Path | None = None,
    **settings: Any,
) -> dict[str, Any]:
    """A whole config.

    - ``tables``: name -> table (see :func:`table`), in the config's order; one table
      (a mapping with ``columns``) is table ``t``; none: ``t`` of :func:`table`'s defaults.
    - ``replicas``: their ids (system ids 1, 2, ... in order), or the ``replicas`` list.
    - ``store``: a URI, or a folder (its ``file://`` URI); none unless given.
    - ``settings``: any other key of the file (``on_divergence="warn"``, ``cdc={...}``,
      ``priority=[...]``, ``gc_grace_seconds=...``)."""
    if tables is None:
        tables = {"t": table()}
    elif "columns" in tables:
        tables = {"t": tables}
    out: dict[str, Any] = {} if store is None else {"store": uri(store)}
    out["replicas"] = _replica_list(replicas)
    out.update(copy.deepcopy(settings))
    out["tables"] = copy.deepcopy(dict(tables))
    return out


def _replica_list(given: Sequence[str] | Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    if all(isinstance(r, str) for r in given):
        return replicas(*given)  # type: ignore[arg-type]
    return [dict(r) for r in given]  # type: ignore[arg-type]


def uri(store: str | Path) -> str:
    """A store as the config names it: a folder is its ``file://`` URI."""
    return store.as_uri() if isinstance(store, Path) else store


def write(path: Path, cfg: Mapping[str, Any], **settings: Any) -> Path:
    """``cfg``, with ``settings`` over its top-level keys (``store=`` a folder or a URI),
    as YAML at ``path``; returns ``path``."""
    data = {**cfg, **settings}
    if data.get("store") is not None:
        data["store"] = uri(data["store"])
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path
