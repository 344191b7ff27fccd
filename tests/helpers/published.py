"""Read what a run published, as a downstream user would: Delta tables read with the
``deltalake`` package's query engine, which applies deletion vectors (and, where a test
says so, DuckDB's ``delta`` extension), plain
files for the reports. Never through the pipeline's own reader."""

from __future__ import annotations

import json
import os
from collections import Counter
from datetime import date
from pathlib import Path
from typing import Any

import deltalake  # noqa: F401  (loaded before duckdb: the other order aborts at exit)
import pyarrow as pa

from pipeline.core.report import RunReport


def _options(uri: str) -> dict[str, str]:
    if not uri.startswith("s3://"):
        return {}
    endpoint = os.environ["AWS_ENDPOINT_URL_S3"]
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ALLOW_HTTP": "true",
        "AWS_ACCESS_KEY_ID": os.environ["AWS_ACCESS_KEY_ID"],
        "AWS_SECRET_ACCESS_KEY": os.environ["AWS_SECRET_ACCESS_KEY"],
        "AWS_REGION": "us-east-1",
    }


def root_uri(store: Any) -> str:
    """A store's root as a URI prefix: a ``Path`` (file store root) or a Store."""
    if isinstance(store, Path):
        return str(store)
    local = store.local_path("")
    return str(local).rstrip("/") if local is not None else store.uri


def table(
    store: Any, path: str, dt: date | str | None = None, version: int | None = None
) -> list[dict[str, Any]] | None:
    """The rows of ``published/...`` table ``path`` (of partition ``dt``), or None when
    there is no such table."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    uri = f"{root_uri(store)}/{path}"
    try:
        t = DeltaTable(uri, version=version, storage_options=_options(uri))
    except TableNotFoundError:
        return None
    return query(t, f"WHERE \"dt\" = DATE '{dt}'" if dt is not None else "")


def query(t: Any, where: str = "") -> list[dict[str, Any]]:
    """The rows of a loaded ``deltalake`` table through its query engine (its pyarrow
    reader refuses tables with deletion vectors), in the table's own schema."""
    from deltalake import QueryBuilder

    got = pa.table(QueryBuilder().register("t", t).execute(f"SELECT * FROM t {where}").read_all())
    schema = pa.schema(t.schema().to_arrow())
    data: pa.Table = got.select(schema.names).cast(schema)
    return data.to_pylist()


def table_version(store: Any, path: str) -> int:
    """The latest version of ``published/...`` table ``path``, as a reader sees it."""
    from deltalake import DeltaTable

    uri = f"{root_uri(store)}/{path}"
    return int(DeltaTable(uri, storage_options=_options(uri)).version())


def rows(store: Any, path: str, dt: date | str | None = None) -> list[dict[str, Any]]:
    return table(store, path, dt) or []


def snapshot(store: Any, name: str) -> list[dict[str, Any]]:
    return rows(store, f"published/{name}/snapshot")


def runs(store: Any) -> list[dict[str, Any]]:
    out = rows(store, "published/runs")
    for r in out:
        for k in ("inputs", "verdict", "counts", "versions"):
            r[k] = json.loads(r[k]) if r[k] else None
    return sorted(out, key=lambda r: r["finished_at"])


def last_run(store: Any, dt: date | str) -> dict[str, Any] | None:
    mine = [r for r in runs(store) if str(r["dt"]) == str(dt)]
    return mine[-1] if mine else None


def report(store: Any, dt: date | str, run_id: str | None = None) -> RunReport | None:
    """The date's report (of the published run), or one run's own."""
    key = f"published/reports/dt={dt}/" + (f"run={run_id}/" if run_id else "") + "run_report.json"
    if isinstance(store, Path):
        p = store / key
        return RunReport.from_json(p.read_text()) if p.exists() else None
    return RunReport.from_json(store.read_bytes(key)) if store.exists(key) else None


def duckdb_rows(store: Any, path: str, dt: date | str | None = None) -> list[dict[str, Any]]:
    """The same table through DuckDB's ``delta`` extension (the PyPI package of the
    release of the ``duckdb`` package; automatic extension downloads off)."""
    uri = f"{root_uri(store)}/{path}"
    where = f" WHERE dt = DATE '{dt}'" if dt is not None else ""
    return duckdb_query(store, f"SELECT * FROM delta_scan('{uri}'){where}")


def duckdb_query(store: Any, sql: str) -> list[dict[str, Any]]:
    """A query's rows through DuckDB with its ``delta`` extension loaded (and, for an
    ``s3://`` store, ``httpfs`` and a secret for the store's S3 server)."""
    import duckdb
    import duckdb_extension_delta

    def extension(module: Any, name: str) -> Path:
        return next(Path(module.__file__).parent.rglob(f"{name}.duckdb_extension"))

    con = duckdb.connect(
        config={"autoinstall_known_extensions": False, "autoload_known_extensions": False}
    )
    con.execute(f"LOAD '{extension(duckdb_extension_delta, 'delta')}'")
    uri = root_uri(store)
    if uri.startswith("s3://"):
        import duckdb_extension_httpfs  # the S3 secret type and reader

        con.execute(f"LOAD '{extension(duckdb_extension_httpfs, 'httpfs')}'")
        o = _options(uri)
        endpoint = o["AWS_ENDPOINT_URL"].removeprefix("http://")
        con.execute(
            "CREATE SECRET (TYPE s3, KEY_ID ?, SECRET ?, REGION 'us-east-1', ENDPOINT ?, "
            "URL_STYLE 'path', USE_SSL false)",
            [o["AWS_ACCESS_KEY_ID"], o["AWS_SECRET_ACCESS_KEY"], endpoint],
        )
    try:
        rel = con.sql(sql)
        cols = rel.columns
        return [dict(zip(cols, r, strict=True)) for r in rel.fetchall()]
    finally:
        con.close()


def snapshot_date(store: Any, name: str) -> str | None:
    """The date ``published/<name>/snapshot`` holds: its last commit's ``cdr.dt``."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    uri = f"{root_uri(store)}/published/{name}/snapshot"
    try:
        t = DeltaTable(uri, storage_options=_options(uri))
    except TableNotFoundError:
        return None
    return commit_meta(t.history(1)[0]).get("dt")


def commit_meta(info: dict[str, Any]) -> dict[str, Any]:
    """What a commit says of its run: its ``userMetadata`` (JSON), or the ``cdr.*`` keys
    of a table an older release wrote."""
    if info.get("userMetadata"):
        meta: dict[str, Any] = json.loads(info["userMetadata"])
        return meta
    return {k[4:]: v for k, v in info.items() if k.startswith("cdr.")}


def run_rows(store: Any, dt: date | str, status: str = "published") -> list[dict[str, Any]]:
    """The ``runs`` rows of ``dt`` with ``status``, oldest first."""
    return [r for r in runs(store) if str(r["dt"]) == str(dt) and r["status"] == status]


def as_of(store: Any, path: str, run: dict[str, Any]) -> list[dict[str, Any]]:
    """Table ``path`` as ``run`` left it: the version its ``runs`` row names (time travel)."""
    return table(store, path, version=run["versions"][path]) or []


def state(store: Any, table_name: str, dt: date | str) -> list[dict[str, Any]]:
    """The state published for ``dt``: the table and version its last published run's
    ``runs`` row names (``state``, or the run's own for a backfill)."""
    run = run_rows(store, dt)[-1]
    backfill = f"published/_backfills/run={run['run_id']}/{table_name}/state"
    path = next(p for p in (f"published/{table_name}/state", backfill) if p in run["versions"])
    return table(store, path, version=run["versions"][path]) or []


def log(store: Any, table_name: str, kind: str, dt: date | str) -> list[dict[str, Any]]:
    """A published dated log (``conflicts``, ``quarantine``, ...) of ``dt``."""
    return rows(store, f"published/{table_name}/{kind}", dt)


def cdc_log(store: Any, table_name: str, dt: date | str) -> list[dict[str, Any]]:
    return rows(store, f"published/cdc/{table_name}/log", dt)


def all_tables(store: Any, run_ids: tuple[str, ...] = ()) -> dict[str, Counter[str]]:
    """Every Delta table under ``published/`` but ``runs``, at its latest version, as a
    multiset of rows; ``run_ids`` are written as ``<run>`` (to compare runs by content)."""
    keys = [k for k in store.list("published") if "/_delta_log/" in k]
    out = {}
    for path in sorted({k.split("/_delta_log/")[0] for k in keys} - {"published/runs"}):
        texts = [json.dumps(r, sort_keys=True, default=str) for r in rows(store, path)]
        for run_id in run_ids:
            texts = [t.replace(run_id, "<run>") for t in texts]
        out[path] = Counter(texts)
    return out
