"""Nights published down both paths (docs/outputs.md#a-night-costs-the-night): each date
of a history run with ``cdr run`` into one store as the product chooses (a night after
the newest published one is merged in place), and into another store with every date
forced down the whole-table path; what each path published, table by table and date by
date, for the differential tests (``tests/spark/test_two_paths.py``).

A history is a config, the base rows of each table, and its nights: ``{date: {replica:
{table: [canonical records]}}}``, run in date order."""

from __future__ import annotations

import itertools
import os
import random
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import pytest

from pipeline.app.cli import main
from pipeline.ingest import inplace
from tests.helpers import configs
from tests.helpers import published as P
from tests.helpers import scenarios as S

PATHS = ("in_place", "whole")


@dataclass(frozen=True)
class History:
    config: dict[str, Any]
    base: Mapping[str, list[dict[str, Any]]] = field(default_factory=dict)
    nights: Mapping[str, Mapping[str, Mapping[str, list[dict[str, Any]]]]] = field(
        default_factory=dict
    )


@dataclass
class Published:
    """What one path published after each date: every table's rows (run ids written as
    ``<run>``), the runs rows' counts, and each date's exit code and ``cdr verify``."""

    after: dict[str, dict[str, Counter[str]]] = field(default_factory=dict)
    counts: dict[str, Any] = field(default_factory=dict)
    exits: dict[str, int] = field(default_factory=dict)
    verified: dict[str, int] = field(default_factory=dict)
    store: Any = None


def _now(d: str) -> str:
    return f"{date.fromisoformat(d) + timedelta(days=1)}T00:00:00Z"


def _layout(root: Path, history: History) -> Path:
    root.mkdir(parents=True)
    for t, rows in history.base.items():
        S.write_jsonl(root / f"base/table={t}", rows, {"table": t})
    for d, exports in history.nights.items():
        _layout_night(root, d, exports)
    return configs.write(root.parent / f"{root.name}.yaml", history.config, store=root)


def _layout_night(root: Path, d: str, exports: Mapping[str, Mapping[str, list[dict]]]) -> None:
    """One night's exports (``{replica: {table: [records]}}``) in the store at ``root``."""
    S.write_exports(root, d, {r: dict(tables) for r, tables in exports.items()})


def _run(cfg: Path, d: str, work: Path, *more: str) -> int:
    args = ["run", "--config", str(cfg), "--date", d, "--now", _now(d), "--no-data-docs"]
    return main([*args, "--allow-missing-exports", "--work-dir", str(work), *more])


def _verify(cfg: Path, d: str) -> int:
    return main(["verify", "--config", str(cfg), "--date", d])


def _snapshot(store: Any) -> dict[str, Counter[str]]:
    """Every published table, run ids written as ``<run>`` in its rows and its path (a
    failed run's logs are under ``_failed/run=<id>``)."""
    run_ids = tuple(r["run_id"] for r in P.runs(store))
    out: dict[str, Counter[str]] = {}
    for path, rows in P.all_tables(store, run_ids).items():
        for run_id in run_ids:
            path = path.replace(run_id, "<run>")
        out[path] = out.get(path, Counter()) + rows
    return out


def publish(history: History, root: Path, path: str, verify: bool = True) -> Published:
    """The history's nights run into a new store under ``root`` down ``path``
    (:data:`PATHS`); a date that fails stops nothing (its exit code is kept)."""
    cfg = _layout(root / path, history)
    return _go_on(history, root, path, cfg, sorted(history.nights), verify)


#: the key of :attr:`Published.after` for what a rerun with the dates after it published
RERUN = "rerun"


def publish_both(history: History, root: Path, rerun: str | None = None) -> dict[str, Published]:
    """The history down both paths (:func:`publish`). The first date takes the whole-table
    path on both (nothing is published before it): it runs once, and the second path
    starts from a copy of the first's store. With ``rerun``, that date then runs again
    on both, with the dates after it (``--then-later``): its tables are :data:`RERUN`'s."""
    import shutil

    days = sorted(history.nights)
    cfg = _layout(root / PATHS[0], history)
    first = _go_on(history, root, PATHS[0], cfg, days[:1], verify=False)
    shutil.copytree(root / PATHS[0], root / PATHS[1])
    cfg2 = configs.write(root / f"{PATHS[1]}.yaml", history.config, store=root / PATHS[1])
    got = {}
    for path, c in ((PATHS[0], cfg), (PATHS[1], cfg2)):
        pub = _go_on(history, root, path, c, days[1:], verify=True, before=first)
        if EVERY_DATE and first.exits[days[0]] == 0:
            pub.verified[days[0]] = _verify(c, days[0])
        if rerun is not None:
            pub.exits[RERUN] = _run(c, rerun, root / f"work-{path}", "--then-later")
            pub.after[RERUN] = _snapshot(pub.store)
        got[path] = pub
    return got


def histories(store: Any) -> dict[str, list[dict[str, Any]]]:
    """Every published history table's rows, by its path."""
    keys = {k.split("/_delta_log/")[0] for k in store.list("published") if "/_delta_log/" in k}
    return {p: P.rows(store, p) for p in sorted(keys) if p.endswith("/history")}


def _go_on(
    history: History,
    root: Path,
    path: str,
    cfg: Path,
    days: list[str],
    verify: bool,
    before: Published | None = None,
) -> Published:
    """``days`` run in order into the store of ``cfg`` down ``path``, after what ``before``
    published."""
    from pipeline.storage.store import open_store

    got = Published(store=open_store((root / path).as_uri()))
    if before is not None:
        got.after, got.counts = dict(before.after), dict(before.counts)
        got.exits = dict(before.exits)
    with pytest.MonkeyPatch.context() as mp:
        if path == "whole":
            mp.setattr(inplace, "plan", lambda *a: inplace.Plan(None, "the whole-table path"))
        for d in days:
            got.exits[d] = _run(cfg, d, root / f"work-{path}")
            got.after[d] = _snapshot(got.store)
            got.counts[d] = [
                {t: _comparable(c) for t, c in r["counts"].get("tables", {}).items()}
                for r in P.runs(got.store)
                if r["status"] == "published"
            ]
    if verify:
        for d in days if EVERY_DATE else days[-1:]:
            if got.exits[d] == 0:
                got.verified[d] = _verify(cfg, d)
    return got


#: ``cdr verify`` of every date (``make test-deep``), else of the last date only
EVERY_DATE = bool(os.environ.get("CDR_DEEP"))


def _comparable(counts: dict[str, Any]) -> dict[str, Any]:
    """A table's counts in a runs row without what differs by path by design: the
    seconds, and what the run started from (which says how, and names a run id)."""
    return {k: v for k, v in counts.items() if k not in ("start", "seconds", "prior_run_id")}


def differences(a: Published, b: Published) -> list[str]:
    """Where two paths published other rows, date by date, table by table."""
    out = []
    for d in a.after:
        if a.exits[d] != b.exits.get(d):
            out.append(f"{d}: exit {a.exits[d]} against {b.exits.get(d)}")
        for t in sorted(set(a.after[d]) | set(b.after.get(d, {}))):
            x, y = a.after[d].get(t, Counter()), b.after.get(d, {}).get(t, Counter())
            if x != y:
                only_a = sorted((x - y).elements())[:3]
                only_b = sorted((y - x).elements())[:3]
                out.append(f"{d} {t}: only in the first {only_a}; only in the second {only_b}")
    for d in a.counts:
        for i, (x, y) in enumerate(zip(a.counts[d], b.counts.get(d, []), strict=False)):
            for t in sorted(set(x) | set(y)):
                got, want = x.get(t, {}), y.get(t, {})
                for k in sorted(set(got) | set(want)):
                    if got.get(k) != want.get(k):
                        out.append(f"{d}: run {i} {t}.{k}: {got.get(k)} against {want.get(k)}")
    return out


# ---------------------------------------------------------------------- generated histories

REPLICAS = ("r1", "r2")
#: the keys the events name (the base holds the first half)
KEYS = 8


def _resolvers(rnd: random.Random, policy: str, custom: bool) -> dict[str, Any]:
    """A resolver for some conflict types, from what each allows (``policy.ALLOWED``):
    ``error`` seldom (a night it stops publishes nothing, on both paths alike), a custom
    resolver where a type takes one and ``custom`` asks for it."""
    from pipeline.core.policy import ALLOWED, ROW_TYPES, ConflictType, Resolver

    out: dict[str, Any] = {}
    for t in ConflictType:
        if rnd.random() < 0.4 or (policy == "delete_wins" and t in ROW_TYPES):
            continue
        allowed = sorted(ALLOWED[t] - {Resolver.PYTHON, Resolver.ERROR, Resolver.APPLY_OR_ERROR})
        if Resolver.ERROR in ALLOWED[t] and rnd.random() < 0.05:
            allowed = [Resolver.ERROR]
        out[t.value] = rnd.choice(allowed).value
        if custom and Resolver.PYTHON in ALLOWED[t] and rnd.random() < 0.5:
            out[t.value] = {"python": rnd.choice(CUSTOM)}
    return out


#: the custom resolvers a generated table may take (``tests/helpers/resolvers.py``)
CUSTOM = ("tests.helpers.resolvers:larger_n", "tests.helpers.resolvers:MERGED_ROW")


def _row_table(rnd: random.Random, policy: str, parent: bool) -> dict[str, Any]:
    columns = {"id": "int", "v": "string", "u": "string", "n": "bigint"}
    settings: dict[str, Any] = {"policy": policy, "not_null": []}
    if rnd.random() < 0.7:
        settings["unique"] = [["u"]]
    numeric = rnd.random()
    if numeric < 0.3:
        settings["delta"] = ["n"]
    elif numeric < 0.5:
        settings["merge"] = {"n": rnd.choice(["max", "min"])}
    if rnd.random() < 0.4:
        settings["defaults"] = {"u": "dflt", "v": "dv", "n": 0}
    if rnd.random() < 0.3:
        settings["detection"] = "before_image"
    if rnd.random() < 0.2:
        settings["ignore_null_updates"] = True
    if policy == "postgres" and rnd.random() < 0.25 and "delta" not in settings:
        settings["column_groups"] = {"text": ["v", "u"], "num": ["n"]}
    if rnd.random() < 0.4:
        settings["history"] = True if rnd.random() < 0.6 else {"track": ["v"]}
    if parent:
        columns["pid"] = "int"
        settings["foreign_keys"] = [{"columns": ["pid"], "references": "p"}]
    custom = policy == "postgres" and rnd.random() < 0.3 and "column_groups" not in settings
    settings["resolvers"] = _resolvers(rnd, policy, custom)
    if rnd.random() < 0.3:  # docs/configuration.md#column-names: as the database names them
        columns = {EXPORTED.get(c, c): {"type": t, "as": c} for c, t in columns.items()}
    return {"key": ["id"], "columns": columns, **settings}


#: names a database's columns may have that the published tables cannot hold, for the
#: columns of a generated table that are given an ``as``: the key, one reserved, one with
#: a space
EXPORTED = {"id": "ID", "u": "_ts", "v": "Order Note"}


def _published(table: dict[str, Any]) -> dict[str, str]:
    """The table's columns, published name -> exported name."""
    return {
        given.get("as", c) if isinstance(given, dict) else c: c
        for c, given in table["columns"].items()
    }


def _as_exported(record: dict[str, Any], table: dict[str, Any], row: bool = False) -> dict:
    """A record (or a base ``row``) naming its columns as the table's exports do."""
    names = _published(table)
    if row:  # a column exported as _ts takes the base row's own _ts (docs/configuration.md)
        taken = set(names.values()) - set(names)
        return {names.get(c, c): v for c, v in record.items() if c not in taken}
    out = dict(record)
    for part in ("key", "new_key", "after", "before"):
        if isinstance(out.get(part), dict):
            out[part] = {names.get(c, c): v for c, v in out[part].items()}
    return out


def _cell_table(rnd: random.Random) -> dict[str, Any]:
    settings: dict[str, Any] = {"policy": "scylla"}
    if rnd.random() < 0.4:
        settings["history"] = True
    return {"key": ["id"], "columns": {"id": "int", "v": "string", "w": "string"}, **settings}


def _ts(d: str, rnd: random.Random) -> str:
    return f"{d}T{rnd.choice([1, 2, 3, 5, 8, 13]):02d}:{rnd.choice([0, 30]):02d}:00Z"


def _event(rnd: random.Random, d: str, n: int, table: dict[str, Any], cell: bool) -> dict:
    """One event of table ``table`` on date ``d`` (``n``: its number in the night)."""
    k = rnd.randrange(KEYS)
    origin = rnd.choice(REPLICAS)
    op = rnd.choices(["INSERT", "UPDATE", "DELETE", "TRUNCATE"], [4, 6, 2, 0.15])[0]
    e: dict[str, Any] = {"op": op, "ts": _ts(d, rnd), "origin": origin,
                         "event_id": f"{origin}-{d}-{n:03d}"}  # fmt: skip
    if op == "TRUNCATE":
        return e
    e["key"] = {"id": k}
    cols = [c for c in _published(table) if c != "id"]
    values = {
        "v": rnd.choice(["a", "b", "c", None]),
        "w": rnd.choice(["x", "y", None]),
        "u": rnd.choice(["u0", "u1", "u2", "u9", "dflt", "merged", None]),
        "n": rnd.randint(0, 5),
        "pid": rnd.randint(0, 3),
    }
    if op == "INSERT":
        shown = cols if rnd.random() < 0.8 else rnd.sample(cols, max(1, len(cols) - 1))
        e["after"] = {"id": k, **{c: values[c] for c in shown}}
    elif op == "UPDATE":
        e["after"] = {c: values[c] for c in rnd.sample(cols, rnd.randint(1, len(cols)))}
        if rnd.random() < 0.5:
            before = {c: rnd.choice([values[c], None]) for c in cols}
            before["n"] = rnd.randint(0, 5)
            e["before"] = {"id": k, **{c: v for c, v in before.items() if c in cols}}
        if not cell and rnd.random() < 0.1:
            e["new_key"] = {"id": rnd.randrange(KEYS)}
            e["after"]["id"] = e["new_key"]["id"]
    elif rnd.random() < 0.4:  # a DELETE with its before image
        e["before"] = {"id": k, **{c: values[c] for c in cols}}
    if cell and op != "DELETE" and rnd.random() < 0.2:
        e["ttl"] = rnd.choice([3600, 86400, 200000])
    return e


def _exports(rnd: random.Random, events: list[dict[str, Any]]) -> dict[str, list[dict]]:
    """Each replica's export of ``events``: its own events, most of the others' (some go
    missing), in ts order with a swap now and then, ``seq`` numbered in that order."""
    out: dict[str, list[dict[str, Any]]] = {}
    for r in REPLICAS:
        held = [dict(e) for e in events if e["origin"] == r or rnd.random() < 0.85]
        held.sort(key=lambda e: e["ts"])
        for i in range(len(held) - 1):
            if rnd.random() < 0.1:
                held[i], held[i + 1] = held[i + 1], held[i]
        out[r] = [{**e, "seq": i} for i, e in enumerate(held, 1)]
    return out


def history(seed: int, nights: int = 3) -> History:
    """A history drawn from ``seed``: one table ``t`` of a random policy and settings (a
    parent ``p`` when it has a foreign key), its base rows, and ``nights`` nights from
    2026-11-20 on, each replica's export of each table."""
    rnd = random.Random(seed)
    policy = rnd.choices(["postgres", "delete_wins", "scylla"], [5, 2, 2])[0]
    cell = policy == "scylla"
    parent = not cell and rnd.random() < 0.25
    tables = {"t": _cell_table(rnd) if cell else _row_table(rnd, policy, parent)}
    if parent:
        tables = {"p": {"key": ["pid"], "columns": {"pid": "int", "name": "string"}}, **tables}
    settings: dict[str, Any] = {
        "on_divergence": "warn",
        "on_fk_violation": rnd.choice(["warn", "quarantine", "fail"]),
        "gc_grace_seconds": rnd.choice([86400, 129600, 864000]),
        "priority": list(REPLICAS),
    }
    config = configs.config(tables, replicas=REPLICAS, **settings)
    t = tables["t"]
    base_rows = []
    for i in range(KEYS // 2):
        row = {"id": i, "v": f"v{i}", "_ts": 1}
        row |= {"w": f"w{i}"} if cell else {"u": f"u{i}", "n": i}
        if parent:
            row["pid"] = i % 3
        base_rows.append(row)
    base = {"t": [_as_exported(r, t, row=True) for r in base_rows]}
    if parent:
        base["p"] = [{"pid": i, "name": f"p{i}", "_ts": 1} for i in range(3)]
    days = [str(date(2026, 11, 20) + timedelta(days=i)) for i in range(nights)]
    out: dict[str, dict[str, dict[str, list[dict[str, Any]]]]] = {}
    for d in days:
        events = [_event(rnd, d, n, t, cell) for n in range(rnd.randint(4, 12))]
        by_table = {"t": [_as_exported(e, t) for e in events]}
        if parent and rnd.random() < 0.5:
            gone = {"op": "DELETE", "key": {"pid": rnd.randrange(3)}, "ts": _ts(d, rnd)}
            by_table["p"] = [{**gone, "origin": "r1", "event_id": f"r1-{d}-p"}]
        exports: dict[str, dict[str, list[dict[str, Any]]]] = {r: {} for r in REPLICAS}
        for name, events in by_table.items():
            for r, records in _exports(rnd, events).items():
                exports[r][name] = records
        out[d] = exports
    return History(config, base, out)


def history_problems(rows: list[dict[str, Any]], key: tuple[str, ...]) -> list[str]:
    """docs/outputs.md#history's invariants, broken (none: an empty list): per key, the
    version numbers are distinct, exactly one version is current (``_valid_to`` null, and it
    is the last), and the intervals follow each other without overlap."""
    by_key: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        by_key.setdefault(tuple(r[c] for c in key), []).append(r)
    out = []
    for k, versions in sorted(by_key.items(), key=repr):
        numbers = [v["_version"] for v in versions]
        if len(set(numbers)) != len(numbers):
            out.append(f"{k}: versions {sorted(numbers)}")
            continue
        versions.sort(key=lambda v: v["_version"])
        current = [v["_version"] for v in versions if v["_valid_to"] is None]
        if current != [versions[-1]["_version"]]:
            out.append(f"{k}: current versions {current} of {numbers}")
        for a, b in itertools.pairwise(versions):
            if a["_valid_to"] is None or a["_valid_to"] > b["_valid_from"]:
                out.append(f"{k}: version {a['_version']} overlaps version {b['_version']}")
    return out
