"""``cdr repair`` (docs/operations.md#repair) on real databases, with hostile values.

One night: replica A writes quotes, backslashes and dollar quotes, emoji, a 1 MB string,
NaN and both infinities in a double column, and NUL bytes in a binary one, over rows that
replica R holds as they were; R's export lacks A's changes, and R's full copy is the old
rows. The snapshot comparison reports every row of R (``missing_events``), and R's repair
is applied:

- to a PostgreSQL 15 server holding R's rows (``bytea``, since PostgreSQL ``text`` cannot
  hold NUL): every value reads back as the converged one; the server's changes, exported
  by wal2json the next night, come back as ``repaired`` and leave the snapshot as it was;
- to a single-node Apache Cassandra holding R's rows, one of them written again after the
  report: the others read back as the converged rows, that one keeps its later write and
  is named as skipped (a dry run named it first, and wrote nothing)."""

from __future__ import annotations

import base64
import json
import math
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from pipeline.app.cli import main
from pipeline.storage.store import open_store
from tests.helpers import cassandra_node, configs
from tests.helpers import pg_replicas as pgr
from tests.helpers import published as P
from tests.helpers import scenarios as S
from tests.helpers import sources as src
from tests.helpers.cli import cdr_json

pytestmark = [pytest.mark.slow]

D, D2 = "2026-11-21", "2026-11-22"
NOW, NOW2 = "2026-11-22T00:00:00Z", "2026-11-23T00:00:00Z"
PRIOR_TS = 1_795_176_000_000_000  # 2026-11-20T12:00:00Z
NUL = b"\x00\x01\x00'\\\x00"
#: what A writes tonight: (op, id, after)
HOSTILE: list[tuple[str, int, dict[str, Any] | None]] = [
    ("UPDATE", 1, {"s": 'it\'s "quoted"; -- not a comment\nDROP TABLE h;'}),
    ("UPDATE", 2, {"s": "back\\slash \\x00 \\\\ $$ $cdr$ E'\\n'", "d": "Infinity"}),
    ("UPDATE", 3, {"s": "😀 中文 é ß \u2028 \U0001f9ea", "d": "-Infinity"}),
    ("UPDATE", 4, {"s": "".join(f"{i:07d}'\\" for i in range(116_509))}),  # 1 MB and more
    ("UPDATE", 5, {"d": "NaN"}),
    ("UPDATE", 6, {"b": base64.b64encode(NUL).decode()}),
    (
        "INSERT",
        7,
        {"id": 7, "s": "a new row's text", "d": 0.1, "b": base64.b64encode(NUL).decode()},
    ),
    ("DELETE", 8, None),
    ("UPDATE", 9, {"s": "a NUL \u0000 inside"}),  # PostgreSQL text cannot hold it
]
KEYS = range(1, 10)
TABLE = configs.table({"id": "int", "s": "string", "d": "double", "b": "binary"})


def _old(i: int) -> dict[str, Any]:
    return {"id": i, "s": f"plain {i}", "d": 1.5, "b": base64.b64encode(b"plain").decode()}


def _events() -> list[dict[str, Any]]:
    out = []
    for n, (op, i, after) in enumerate(HOSTILE, 1):
        ev: dict[str, Any] = {"op": op, "key": {"id": i}, "ts": f"{D}T{n:02d}:00:00Z"}
        ev |= {"origin": "A", "event_id": f"A-{n:03d}", "seq": n}
        if after is not None:
            ev["after"] = after
        out.append(ev)
    return out


@pytest.fixture(scope="module")
def night(tmp_path_factory) -> dict[str, Any]:
    """The night published: the store, its config file, the work folder."""
    tmp = tmp_path_factory.mktemp("repair")
    store = tmp / "store"
    scenario = {
        "prior_state": {"h": [{**_old(i), "_ts": PRIOR_TS, "_origin": "A"} for i in KEYS]},
        "date": D,
        "exports": {"A": {"h": _events()}, "R": {"h": []}},
        "snapshots": {"R": {"h": [_old(i) for i in KEYS]}},
    }
    store.mkdir()
    S.layout_store(scenario, store)
    cfg = configs.config({"h": TABLE}, replicas=("A", "R"), on_divergence="warn")
    path = configs.write(tmp / "cdr.yaml", cfg, store=store)
    work = ["--work-dir", str(tmp / "work"), "--no-data-docs"]
    assert main(["run", "--config", str(path), "--date", D, "--now", NOW, *work]) == 0
    div = P.log(store, "h", "divergence", D)
    assert sorted(json.loads(r["key"])["id"] for r in div if r["replica"] == "R") == list(KEYS)
    assert {r["cause"] for r in div} == {"missing_events"}
    return {"store": store, "config": path, "work": work}


def _converged(store: Path) -> dict[int, tuple[str, float, bytes]]:
    return {r["id"]: (r["s"], r["d"], r["b"]) for r in P.snapshot(store, "h")}


def _same(a: dict[int, tuple], b: dict[int, tuple]) -> bool:
    def norm(row: tuple) -> tuple:
        return tuple("NaN" if isinstance(v, float) and math.isnan(v) else v for v in row)

    return {k: norm(v) for k, v in a.items()} == {k: norm(v) for k, v in b.items()}


def test_converged_rows_hold_the_hostile_values(night):
    got = _converged(night["store"])
    assert math.isnan(got[5][1]) and got[2][1] == math.inf and got[3][1] == -math.inf
    assert got[6][2] == NUL and len(got[4][0]) > 1 << 20 and 8 not in got


@pytest.fixture(scope="module")
def postgres():
    if pgr.missing():
        (pytest.fail if os.environ.get("CI") else pytest.skip)(f"{pgr.missing()} is missing")
    with pgr.Cluster(("pgr",)) as cluster:
        yield cluster.servers["pgr"]


def test_postgres_repair_writes_every_hostile_value_and_reads_back_as_a_repair(night, postgres):
    import psycopg

    server: pgr.Server = postgres
    server.sql("create table h(id int primary key, s text, d float8, b bytea);")
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        for i in KEYS:
            o = _old(i)
            conn.execute(
                "insert into h values (%s, %s, %s, %s)",
                (i, o["s"], o["d"], base64.b64decode(o["b"])),
            )
    server.sql("select pg_create_logical_replication_slot('cdr_h', 'wal2json')")
    conf = ["--config", str(night["config"]), "--date", D, "--replica", "R"]
    rc, out = cdr_json("repair", *conf, "--dialect", "postgres", "--apply", "--dsn", server.dsn)
    assert rc == 0 and out["applied"] and out["rows"] == 8 and out["skipped"] == [], out
    assert [r["row"] for r in out["left_out"]] == ['h {"id":9}'], out  # the NUL: named
    assert "NUL" in out["left_out"][0]["why"]
    with psycopg.connect(server.dsn) as conn:
        held = {r[0]: (r[1], r[2], bytes(r[3])) for r in conn.execute("select * from h")}
    want = _converged(night["store"])
    assert held.pop(9) == (_old(9)["s"], 1.5, b"plain") and want.pop(9)[0].endswith("inside")
    assert _same(held, want)

    # the next night: the server's changes, the repair's among them, exported by wal2json
    before = _converged(night["store"])
    lines = server.wal2json("h")
    origins = server.origins()
    made = [json.loads(x) for x in lines if json.loads(x)["action"] in "IUD"]
    assert len(made) == 8 and {origins[str(c["origin"])] for c in made} == {"cdr_repair"}
    store = open_store(night["store"].as_uri())
    src.put_export(store, "R", "h", D2, "wal2json", {"slot.json": src.lines(lines)},
                   {"origins": origins})  # fmt: skip
    args = ["--config", str(night["config"]), "--date", D2, "--now", NOW2, *night["work"]]
    assert main(["run", *args, "--allow-missing-exports"]) == 0
    report = P.report(night["store"], D2)
    assert report is not None and report.published
    h = report.tables["h"]
    assert (h.repaired, h.replicas["R"]["repaired"], h.distinct_events) == (8, 8, 0)
    assert sum(h.quarantined.values()) == 0 and P.log(night["store"], "h", "divergence", D2) == []
    assert _same(_converged(night["store"]), before)


def test_cql_repair_writes_at_the_converged_timestamp_and_skips_a_later_write(night):
    if cassandra_node.missing():
        (pytest.fail if os.environ.get("CI") else pytest.skip)(
            f"{cassandra_node.missing()} is missing"
        )
    later = int(datetime.now(UTC).timestamp() * 1e6)  # after every converged _ts
    with cassandra_node.node() as (session, hosts):
        one = "{'class': 'SimpleStrategy', 'replication_factor': 1}"
        session.execute(f"CREATE KEYSPACE app WITH replication = {one}")
        session.execute("CREATE TABLE app.h (id int PRIMARY KEY, s text, d double, b blob)")
        put = session.prepare(
            "INSERT INTO app.h (id, s, d, b) VALUES (?, ?, ?, ?) USING TIMESTAMP ?"
        )
        for i in KEYS:
            o = _old(i)
            session.execute(put, (i, o["s"], o["d"], base64.b64decode(o["b"]), PRIOR_TS))
        session.execute(put, (1, "written after the report", 2.5, b"", later))
        conf = ["--config", str(night["config"]), "--date", D, "--replica", "R"]
        cql = [*conf, "--dialect", "cql", "--keyspace", "app", "--apply", "--dsn", hosts]
        rc, dry = cdr_json("repair", *cql, "--dry-run")
        assert rc == 0 and not dry["applied"]
        assert dry["skipped"] == [{"row": 'h {"id":1}', "why": "it changed since the report"}]
        rc, out = cdr_json("repair", *cql)
        assert rc == 0 and out["applied"] and out["rows"] == 9, out  # CQL text holds a NUL
        assert [s["row"] for s in out["skipped"]] == ['h {"id":1}']
        held = {
            r.id: (r.s, r.d, bytes(r.b or b""))
            for r in session.execute("SELECT id, s, d, b FROM app.h")
        }
        rows = session.execute("SELECT id, WRITETIME(s) AS w FROM app.h WHERE id = 7")
    want = _converged(night["store"])
    assert held.pop(1) == ("written after the report", 2.5, b"")  # kept: the later write
    want.pop(1)
    assert _same(held, want)
    assert rows.one().w == int(datetime(2026, 11, 21, 7, tzinfo=UTC).timestamp() * 1e6)
