"""``cdr init --from-postgres`` on a real PostgreSQL 15 server on loopback
(docs/configuration.md#starting-from-a-postgresql-schema-cdr-init), as a new user runs it:
a schema of their own (customers with a unique email, a balance and REPLICA IDENTITY
FULL; orders with a foreign key to customers, a numeric amount, a jsonb note and a
bytea payload), the command as a process, then the file it wrote loaded by
``load_config``: keys, types, unique constraints, foreign keys, and the comments on each
table's REPLICA IDENTITY. Then what it refuses: a table without a primary key, a column
of a type the config cannot hold, a file that exists. No Spark.

One server for the module; each test works in a database of its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.core.config_load import load_config
from tests.helpers import REPO
from tests.helpers import pg_replicas as pgr

SCHEMA = """
create type tier as enum ('basic', 'gold');
create table customers(id bigint primary key, email text not null unique,
                       balance numeric(12,2) not null default 0, name varchar(80),
                       created timestamptz not null default now(), tier tier);
alter table customers replica identity full;
create table orders(id bigint primary key, customer_id bigint not null references customers,
                    amount numeric(10,2), note jsonb, payload bytea);
create unique index orders_lower_note on orders ((lower(note->>'ref')));
"""


@pytest.fixture(scope="module")
def server() -> Iterator[pgr.Server]:
    if pgr.missing(wal2json=False):
        (pytest.fail if os.environ.get("CI") else pytest.skip)(
            f"{pgr.missing(wal2json=False)} is missing: run `make postgres` as root"
        )
    with pgr.one_server("init") as s:
        yield s


@pytest.fixture
def db(server: pgr.Server) -> Iterator[str]:
    """A database of the test's own, with the new user's schema: its DSN."""
    name = f"t_{uuid.uuid4().hex[:8]}"
    server.sql(f"create database {name}", db="postgres")
    server.sql(SCHEMA, db=name)
    yield server.dsn.replace("dbname=app", f"dbname={name}")
    server.sql(f"drop database {name}", db="postgres")


def cdr_init(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipeline.app.cli", "init", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=60,
        check=False,
    )


def test_init_writes_a_config_that_loads(db: str, tmp_path: Path):
    out = tmp_path / "cdr.yaml"
    done = cdr_init("--from-postgres", db, "--out", str(out), "--replicas", "pg1,pg2,pg3",
                    "--store", "file:///srv/cdr")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "wrote" in done.stdout and "customers, orders" in done.stdout
    config = load_config(out)
    assert [(r.id, r.system_id) for r in config.replicas] == [("pg1", 1), ("pg2", 2), ("pg3", 3)]
    assert config.store == "file:///srv/cdr"
    customers, orders = config.tables["customers"], config.tables["orders"]
    assert customers.key == ("id",) and orders.key == ("id",)
    assert {c.name: str(c.type) for c in customers.columns} == {
        "id": "bigint",
        "email": "string",
        "balance": "decimal(12,2)",
        "name": "string",
        "created": "timestamp",
        "tier": "string",
    }
    assert {c.name: str(c.type) for c in orders.columns} == {
        "id": "bigint",
        "customer_id": "bigint",
        "amount": "decimal(10,2)",
        "note": "string",
        "payload": "binary",
    }
    assert customers.unique == (("email",),)
    assert customers.not_null >= {"email", "balance", "created"}
    assert [(fk.columns, fk.references) for fk in orders.foreign_keys] == [
        (("customer_id",), "customers")
    ]
    text = out.read_text()
    assert "public.customers: REPLICA IDENTITY FULL" in text
    assert "# delta: [balance]" in text
    assert "tier: string   # tier (enum tier: its label)" in text
    assert "public.orders: REPLICA IDENTITY DEFAULT" in text
    assert "ALTER TABLE public.orders REPLICA IDENTITY FULL" in text
    assert "unique index orders_lower_note is on an expression" in text


def test_placeholders_without_replicas_and_store(db: str, tmp_path: Path):
    """Without ``--replicas`` and ``--store`` the file names placeholder replicas and leaves
    the store in a comment: it loads once a store is given."""
    out = tmp_path / "cdr.yaml"
    done = cdr_init("--from-postgres", db, "--out", str(out), "--tables", "customers")
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    assert "# store: s3://BUCKET/PREFIX" in text and "placeholders" in text
    config = load_config(out, store="file:///srv/cdr")
    assert list(config.tables) == ["customers"]
    assert config.replica_ids == ("replica1", "replica2")


def test_a_foreign_key_to_a_table_left_out_is_a_comment(db: str, tmp_path: Path):
    out = tmp_path / "cdr.yaml"
    done = cdr_init("--from-postgres", db, "--out", str(out), "--tables", "orders")
    assert done.returncode == 0, done.stderr
    assert load_config(out, store="file:///x").tables["orders"].foreign_keys == ()
    assert "-> public.customers(id): that table is not in this file" in out.read_text()


def test_tables_repeated_or_comma_separated(db: str, tmp_path: Path):
    out = tmp_path / "cdr.yaml"
    done = cdr_init("--from-postgres", db, "--out", str(out), "--tables", "orders",
                    "--tables", "customers")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert list(load_config(out, store="file:///x").tables) == ["orders", "customers"]


def test_an_existing_file_is_kept_unless_forced(db: str, tmp_path: Path):
    out = tmp_path / "cdr.yaml"
    out.write_text("mine\n")
    done = cdr_init("--from-postgres", db, "--out", str(out))
    assert done.returncode == 2
    assert "exists: name another file, or --force to replace it" in done.stderr
    assert out.read_text() == "mine\n"
    assert cdr_init("--from-postgres", db, "--out", str(out), "--force").returncode == 0
    assert "tables:" in out.read_text()


def test_a_table_without_a_primary_key_is_refused(server: pgr.Server, db: str, tmp_path: Path):
    dbname = db.rsplit("=", 1)[1]
    server.sql("create table events(at timestamptz, what text)", db=dbname)
    out = tmp_path / "cdr.yaml"
    done = cdr_init("--from-postgres", db, "--out", str(out))
    assert done.returncode == 2
    assert "public.events has no primary key, and no REPLICA IDENTITY USING INDEX" in done.stderr
    assert "leave it out with --tables" in done.stderr
    assert not out.exists()
    # its replica identity index is a key
    server.sql("alter table events alter at set not null; create unique index events_at "
               "on events(at); alter table events replica identity using index events_at",
               db=dbname)  # fmt: skip
    assert cdr_init("--from-postgres", db, "--out", str(out)).returncode == 0
    assert load_config(out, store="file:///x").tables["events"].key == ("at",)
    assert "no primary key: the REPLICA IDENTITY index events_at" in out.read_text()


def test_a_column_of_a_type_the_config_cannot_hold(server: pgr.Server, db: str, tmp_path: Path):
    dbname = db.rsplit("=", 1)[1]
    server.sql("alter table orders add column tags int[], add column wait interval", db=dbname)
    out = tmp_path / "cdr.yaml"
    done = cdr_init("--from-postgres", db, "--out", str(out))
    assert done.returncode == 2
    assert "public.orders.tags: 'integer[]': no array type" in done.stderr
    assert "public.orders.wait: 'interval': no interval type" in done.stderr
    assert "--skip-unsupported leaves it out" in done.stderr
    assert not out.exists()
    done = cdr_init("--from-postgres", db, "--out", str(out), "--skip-unsupported")
    assert done.returncode == 0, done.stderr
    orders = load_config(out, store="file:///x").tables["orders"]
    assert "tags" not in orders.column_names and "wait" not in orders.column_names
    text = out.read_text()
    assert "# tags: left out: 'integer[]': no array type" in text
    assert "resolvers: {source_column_extra: ignore}" in text


def test_an_unreachable_server_and_a_missing_table(db: str, tmp_path: Path):
    out = tmp_path / "cdr.yaml"
    done = cdr_init("--from-postgres", db, "--out", str(out), "--tables", "customers,nope")
    assert done.returncode == 2
    assert "no table 'nope' in schema 'public' (its tables: customers, orders)" in done.stderr
    done = cdr_init("--from-postgres", "host=127.0.0.1 port=1 dbname=x connect_timeout=2",
                    "--out", str(out))  # fmt: skip
    assert done.returncode == 2 and "cannot read the schema" in done.stderr
