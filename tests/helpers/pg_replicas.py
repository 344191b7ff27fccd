"""Real PostgreSQL 15 servers on loopback for the real-source test: three replicas of one
schema, each with an audit table (a trigger records every row change with its
transaction, whose commit time ``pg_xact_commit_timestamp`` gives), logical replication
slots decoded by wal2json, and the SQL that computes what the converged snapshot must be.

Debian's packages ``postgresql-15`` and ``postgresql-15-wal2json`` provide the servers
(``make postgres`` installs them). PostgreSQL refuses to run as root: under root the
servers run as the ``postgres`` user that the package creates."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

PG = Path("/usr/lib/postgresql/15")  # Debian's layout for PostgreSQL 15
TABLES = ("products", "orders", "accounts")
KEYS = {"products": "product_no", "orders": "order_id", "accounts": "id"}

SCHEMA = """
create table products(product_no int primary key, name text not null, price numeric(10,2),
                      note text);
-- a long note is stored out of line (TOAST), uncompressed: an UPDATE that does not change
-- it does not decode it (wal2json leaves it out, Debezium writes a placeholder)
alter table products alter column note set storage external;
create table orders(order_id int primary key,
                    product_no int not null references products, quantity int not null);
create table accounts(id bigint primary key, owner text not null unique, balance bigint not null);
-- the old row in every change of accounts: the delta column needs the old balance
alter table accounts replica identity full;
create table audit(seq bigserial primary key, xid bigint not null default txid_current(),
                   tbl text not null, op char(1) not null, old jsonb, new jsonb);
create function audit_row() returns trigger language plpgsql as $$
begin
  insert into audit(tbl, op, old, new) values (tg_table_name, left(tg_op, 1),
    case when tg_op <> 'INSERT' then to_jsonb(old) end,
    case when tg_op <> 'DELETE' then to_jsonb(new) end);
  return null;
end $$;
"""
TRIGGERS = "".join(
    f"create trigger audit_{t} after insert or update or delete on {t} "
    "for each row execute function audit_row();\n"
    for t in TABLES
)
WAL2JSON_OPTIONS = (
    "'format-version', '2', 'include-xids', '1', 'include-timestamp', '1', "
    "'include-origin', '1', 'include-lsn', '1'"
)


def missing(wal2json: bool = True) -> str | None:
    """What is missing to run the servers (``wal2json``: and decode their changes), or None."""
    if not (PG / "bin" / "initdb").exists():
        return "PostgreSQL 15 (Debian's postgresql-15)"
    if wal2json and not (PG / "lib" / "wal2json.so").exists():
        return "wal2json (Debian's postgresql-15-wal2json)"
    if shutil.which("psql") is None:
        return "psql (Debian's postgresql-client-15)"
    return None


def require() -> None:
    """The servers' packages, installed when missing (as root); else the test is skipped,
    or fails under CI."""
    import pytest  # deferred: only the fixtures need it

    if not missing():
        return
    if os.geteuid() == 0:
        install()
        return
    (pytest.fail if os.environ.get("CI") else pytest.skip)(
        f"{missing()} is missing: run `make postgres` as root"
    )


def install() -> None:
    """Debian's packages, as ``make postgres`` installs them."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "postgresql-15", "postgresql-15-wal2json"],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _knows_setting(name: str) -> bool:
    """Whether this PostgreSQL has the server setting ``name`` (minor releases add some)."""
    out = subprocess.run(
        [str(PG / "bin/postgres"), "--describe-config"], capture_output=True, text=True, check=False
    )
    return any(line.split("\t", 1)[0] == name for line in out.stdout.splitlines())


class Server:
    """One PostgreSQL server on loopback, in its own folder."""

    def __init__(self, name: str, root: Path) -> None:
        self.name, self.root, self.port = name, root / name, _free_port()
        self.root.mkdir(parents=True)
        self._as_owner = os.geteuid() == 0
        if self._as_owner:
            pw = pwd.getpwnam("postgres")
            os.chown(self.root, pw.pw_uid, pw.pw_gid)

    def _run(self, *args: str) -> None:
        cmd = ["runuser", "-u", "postgres", "--", *args] if self._as_owner else list(args)
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def start(self) -> None:
        data = str(self.root / "data")
        self._run(
            str(PG / "bin/initdb"), "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8",
            "--locale=C", "--no-sync",
        )  # fmt: skip
        settings = {
            "port": self.port,
            "listen_addresses": "127.0.0.1",
            "unix_socket_directories": str(self.root),
            "wal_level": "logical",
            "track_commit_timestamp": "on",
            "max_replication_slots": 10,
            "max_wal_senders": 10,
            "timezone": "UTC",
            # fast and unsafe, for a test; synchronous_commit stays on: logical decoding
            # reads up to the flushed WAL, and an export must hold every commit
            "fsync": "off",
            "full_page_writes": "off",
        }
        if _knows_setting("output_plugin_libraries"):  # 15.20 and later: allow wal2json
            settings["output_plugin_libraries"] = "pgoutput,test_decoding,wal2json"
        opts = " ".join(f"-c {k}={v}" for k, v in settings.items())
        self._run(
            str(PG / "bin/pg_ctl"), "-D", data, "-o", opts, "-l", str(self.root / "log"),
            "-w", "start",
        )  # fmt: skip
        self.sql("create database app", db="postgres")

    def stop(self) -> None:
        self._run(str(PG / "bin/pg_ctl"), "-D", str(self.root / "data"), "-m", "immediate", "stop")

    def sql(self, text: str, db: str = "app", check: bool = True) -> str:
        """Run ``text`` (statements in autocommit, or BEGIN/COMMIT blocks) with psql."""
        out = subprocess.run(
            ["psql", "-X", "-q", "-At", "-h", "127.0.0.1", "-p", str(self.port), "-U",
             "postgres", "-d", db, "-v", f"ON_ERROR_STOP={int(check)}", "-f", "-"],
            input=text, capture_output=True, text=True, check=False,
        )  # fmt: skip
        if check and out.returncode != 0:
            raise RuntimeError(f"{self.name}: psql failed: {out.stderr.strip()}")
        return out.stdout

    def rows(self, query: str) -> list[Any]:
        """The rows of a query that selects one JSON value per row."""
        # one row a line: split on newlines only (a value may hold U+2028, which
        # str.splitlines takes for a line break)
        return [json.loads(line) for line in self.sql(query).split("\n") if line]

    @property
    def dsn(self) -> str:
        """libpq's connection string of the application's database."""
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=app"

    def table_rows(self, table: str) -> list[dict[str, Any]]:
        """Every row of ``table`` as a JSON object (a replica's full copy)."""
        return self.rows(f"select row_to_json(x) from {table} x")

    def origins(self) -> dict[str, str]:
        """The replication origins by id, as a wal2json manifest's ``options.origins``
        names them (docs/operations.md#repair)."""
        rows = self.rows("select json_build_object('id', roident, 'name', roname) "
                         "from pg_replication_origin")  # fmt: skip
        return {str(r["id"]): r["name"] for r in rows}

    @property
    def system_id(self) -> int:
        return int(self.sql("select system_identifier from pg_control_system()").strip())

    def setup(self, base: str, slots: bool = True) -> None:
        """The schema, the base rows (before the audit triggers and the slots, so that
        they are in no export), then (``slots``) one wal2json slot per table."""
        self.sql(SCHEMA + base + TRIGGERS)
        for t in TABLES if slots else ():
            self.sql(f"select pg_create_logical_replication_slot('cdr_{t}', 'wal2json')")

    def wal2json(self, table: str) -> list[str]:
        """The table's changes as wal2json format 2 lines, consumed from its slot."""
        out = self.sql(
            f"select data from pg_logical_slot_get_changes('cdr_{table}', NULL, NULL, "
            f"{WAL2JSON_OPTIONS}, 'add-tables', 'public.{table}')"
        )
        return [line for line in out.split("\n") if line]

    def audit(self) -> list[dict[str, Any]]:
        """Every change the audit trigger recorded, with its commit time in µs."""
        return self.rows(
            "select json_build_object('seq', seq, 'xid', xid, 'tbl', tbl, 'op', op, "
            "'old', old, 'new', new, 'ts_us', (extract(epoch from "
            "pg_xact_commit_timestamp(xid::text::xid)) * 1000000)::bigint) "
            "from audit order by seq"
        )


@contextlib.contextmanager
def one_server(name: str = "pg") -> Iterator[Server]:
    """One server on loopback with an empty database ``app``, stopped and removed after."""
    root = Path(tempfile.mkdtemp(prefix="cdr-pg-"))
    os.chmod(root, 0o755)
    server = Server(name, root)
    try:
        server.start()
        yield server
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            server.stop()
        shutil.rmtree(root, ignore_errors=True)


class Cluster:
    """Three replicas of one schema, and a fourth server that computes the expectations
    from their audit tables, in SQL."""

    def __init__(self, names: tuple[str, ...] = ("pg1", "pg2", "pg3")) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="cdr-pg-"))
        os.chmod(self.root, 0o755)
        self.servers = {n: Server(n, self.root) for n in names}
        self.verify = Server("verify", self.root)

    def __enter__(self) -> Cluster:
        for s in [*self.servers.values(), self.verify]:
            s.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for s in [*self.servers.values(), self.verify]:
            with contextlib.suppress(subprocess.CalledProcessError):
                s.stop()
        shutil.rmtree(self.root, ignore_errors=True)


EXPECTED_SQL = """
with k as (
  select *, case tbl when 'products' then 'product_no' when 'orders' then 'order_id'
            else 'id' end as kc
  from changes
),
writes as (  -- each change as writes of keys: a row, or a deletion (row null)
  select tbl, new->>kc as key, ts_us, system_id, seq, op, new as row from k
  where op in ('B', 'I', 'U')
  union all
  select tbl, old->>kc, ts_us, system_id, seq, 'D', null from k
  where op = 'D' or (op = 'U' and old->>kc <> new->>kc)
),
latest as (  -- last writer wins: the last write of each key, in commit order
  select * from (
    select *, row_number() over (partition by tbl, key
                                 order by ts_us desc, system_id desc, seq desc) as rn
    from writes) w
  where rn = 1 and row is not null
),
absolute as (  -- accounts.balance: the last absolute value, then every later delta
  select * from (
    select *, row_number() over (partition by key
                                 order by ts_us desc, system_id desc, seq desc) as rn
    from writes where tbl = 'accounts' and op in ('B', 'I')) a
  where rn = 1
),
balances as (
  select a.key, (a.row->>'balance')::bigint + coalesce(sum(
           (c.new->>'balance')::bigint - (c.old->>'balance')::bigint)
           filter (where (c.ts_us, c.system_id, c.seq) > (a.ts_us, a.system_id, a.seq)), 0)
         as balance
  from absolute a left join changes c
    on c.tbl = 'accounts' and c.op = 'U' and c.new->>'id' = a.key
  group by a.key, a.row, a.ts_us
),
owners as (  -- owner is unique: of the live accounts that share one, the last written stands
  select * from (
    select l.*, row_number() over (partition by l.row->>'owner'
                                   order by ts_us desc, system_id desc, seq desc) as orn
    from latest l where tbl = 'accounts') o
  where orn = 1
)
select json_build_object('tbl', tbl, 'row', row, 'ts', ts_us) from latest
where tbl <> 'accounts'
union all
select json_build_object('tbl', 'accounts',
                         'row', o.row || jsonb_build_object('balance', b.balance),
                         'ts', o.ts_us)
from owners o join balances b on b.key = o.key
"""


def expected(
    verify: Server,
    changes: list[dict[str, Any]],
    tables: tuple[str, ...] = TABLES,
) -> dict[str, dict[Any, dict[str, Any]]]:
    """What the converged snapshot must be (last writer wins, delta balance, unique
    owner), computed in SQL over ``changes`` (audit rows with ``server``, ``system_id``;
    base rows have op ``B``, ts 0). Per table: key -> row with ``_ts``."""
    verify.sql(
        "drop table if exists changes; create table changes(server text, system_id numeric, "
        "seq bigint, tbl text, op text, old jsonb, new jsonb, ts_us bigint)"
    )
    rows = [c for c in changes if c["tbl"] in tables]
    copy = "copy changes from stdin;\n" + "".join(
        "\t".join(
            _copy_text(c[f])
            for f in ("server", "system_id", "seq", "tbl", "op", "old", "new", "ts_us")
        )
        + "\n"
        for c in rows
    )
    verify.sql(copy + "\\.\n")
    out: dict[str, dict[Any, dict[str, Any]]] = {t: {} for t in tables}
    for r in verify.rows(EXPECTED_SQL):
        row = dict(r["row"])
        row["_ts"] = r["ts"]
        out[r["tbl"]][row[KEYS[r["tbl"]]]] = row
    return out


def _copy_text(v: Any) -> str:
    if v is None:
        return "\\N"
    text = json.dumps(v) if isinstance(v, dict) else str(v)
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")
