"""The resolve stage on the same events exported as canonical JSONL, as wal2json, as
Debezium envelopes and as DMS CSV: what reading real tools' formats costs.

The input of ``bench/resolve_bench.py`` (one row table, 3 replicas, every event exported
by every replica, 20% of keys contended) is generated as canonical JSONL, then each
record is rewritten in the three other formats (a copy a replica applied from another
names its origin: wal2json's replication origin id mapped by the manifest, Debezium's
``origin`` field, DMS's origin column), and every variant is ingested. In ONE Spark
session, the resolve stage then runs on each, alternating, twice; the adapter's mapping
(parse, event ids, one window) is part of the resolve stage. It prints wall seconds
(best run) and the ratio to the JSONL run; an adapter's export is mapped again in every
round (its typed copies removed). Machines here are shared and noisy: read the ratios.

    .venv/bin/python bench/adapters_bench.py            # N = 1M
    .venv/bin/python bench/adapters_bench.py 200000
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import sys
import tempfile
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from resolve_bench import CONFIG, D, measure, staged_input

from pipeline.core.config_load import parse_config
from pipeline.ingest.exports import ingest
from pipeline.ingest.fetch import fetch
from pipeline.storage.context import RunContext, resolve_now
from pipeline.storage.store import open_store

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "2"))
REPLICAS = [r["id"] for r in CONFIG["replicas"]]
ORIGIN_IDS = {r: str(i + 1) for i, r in enumerate(REPLICAS)}  # replication origin ids
COLUMNS = list(CONFIG["tables"]["items"]["columns"])


def _pg_ts(us: int) -> str:
    return datetime.fromtimestamp(us / 1e6, UTC).strftime("%Y-%m-%d %H:%M:%S.%f") + "+00"


def _ts_us(ts: Any) -> int:
    if isinstance(ts, int):
        return ts
    return int(datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp() * 1_000_000)


def _cols(row: dict[str, Any] | None) -> list[dict[str, Any]]:
    return [{"name": k, "type": "text", "value": v} for k, v in (row or {}).items()]


def wal2json(e: dict[str, Any], replica: str, xid: int) -> str:
    """The event as its transaction: B, the change, C (as wal2json frames each)."""
    ts = _ts_us(e["ts"])
    action = {"INSERT": "I", "UPDATE": "U", "DELETE": "D", "TRUNCATE": "T"}[e["op"]]
    head = {
        "xid": xid,
        "timestamp": _pg_ts(ts),
        "origin": 0 if e["origin"] == replica else int(ORIGIN_IDS[e["origin"]]),
    }
    lsn = f"{e['seq'] >> 32:X}/{e['seq'] & 0xFFFFFFFF:X}"
    out: dict[str, Any] = {
        "action": action,
        **head,
        "lsn": lsn,
        "schema": "public",
        "table": "items",
    }
    if action in ("I", "U"):
        out["columns"] = _cols({**e.get("key", {}), **(e.get("new_key") or {}), **e["after"]})
    if action in ("U", "D"):
        out["identity"] = _cols({**e["key"], **(e.get("before") or {})})
    frame = json.dumps({"action": "B", **head, "lsn": lsn})
    return "\n".join([frame, json.dumps(out), frame.replace('"B"', '"C"', 1)])


def debezium(e: dict[str, Any], replica: str, xid: int) -> str:
    ts = _ts_us(e["ts"])
    op = {"INSERT": "c", "UPDATE": "u", "DELETE": "d", "TRUNCATE": "t"}[e["op"]]
    after = {**e.get("key", {}), **e["after"]} if op in ("c", "u") else None
    before = {**e["key"], **(e.get("before") or {})} if op in ("u", "d") else None
    out = {
        "before": before,
        "after": after,
        "source": {"ts_us": ts, "lsn": e["seq"], "txId": xid, "schema": "public", "table": "items"},
        "op": op,
        "ts_ms": ts // 1000,
    }
    if e["origin"] != replica:
        out["origin"] = e["origin"]
    return json.dumps(out)


def dms(e: dict[str, Any], replica: str, xid: int) -> str:
    del replica, xid
    row = {**e.get("key", {}), **(e.get("after") or {})}
    ts = datetime.fromtimestamp(_ts_us(e["ts"]) / 1e6, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    fields = [e["op"][0], ts, e["origin"], *[row.get(c) for c in COLUMNS]]
    return ",".join("" if v is None else f'"{v}"' if isinstance(v, str) else str(v) for v in fields)


def convert(src_dir: Path, dest_root: Path, fmt: str) -> Path:
    """The generated JSONL exports of ``src_dir`` (a file store) rewritten in ``fmt``."""
    write = {"wal2json": wal2json, "debezium": debezium, "dms": dms}[fmt]
    store_dir = dest_root / f"store-{fmt}"
    for manifest_path in src_dir.glob("exports/replica=*/table=items/dt=*/_manifest.json"):
        manifest = json.loads(manifest_path.read_text())
        replica = manifest["replica"]
        folder = store_dir / manifest_path.parent.relative_to(src_dir)
        folder.mkdir(parents=True)
        files = []
        for i, f in enumerate(manifest["files"]):
            raw = (manifest_path.parent / f["path"]).read_bytes()
            if raw[:2] == b"\x1f\x8b":
                raw = gzip.decompress(raw)
            lines = [
                out
                for n, line in enumerate(raw.splitlines())
                if line.strip()
                for out in write(json.loads(line), replica, 1000 + n).split("\n")
            ]
            data = ("\n".join(lines) + "\n").encode()
            name = f"part-{i}.{'csv' if fmt == 'dms' else 'json'}"
            (folder / name).write_bytes(data)
            files.append(
                {"path": name, "rows": len(lines), "sha256": hashlib.sha256(data).hexdigest()}
            )
        options: dict[str, Any] = {}
        if fmt == "wal2json":
            options = {"origins": {v: k for k, v in ORIGIN_IDS.items()}}
        if fmt == "dms":
            options = {
                "timestamp_column": "ts",
                "header": False,
                "columns": ["Op", "ts", "origin", *COLUMNS],
                "origin_column": "origin",
            }
        manifest.update(format=fmt, files=files, options=options)
        (folder / "_manifest.json").write_text(json.dumps(manifest))
    return store_dir


def bench(n: int, root: Path, spark) -> dict[str, Any]:
    from pipeline.resolve.stage import resolve_stage

    config, ctx, stats = staged_input(CONFIG, n, root, spark)
    runs = {"jsonl": (config, ctx)}
    for fmt in ("wal2json", "debezium", "dms"):
        store_dir = convert(root / f"store-{n}", root, fmt)
        cfg = parse_config({**CONFIG, "store": store_dir.as_uri()})
        c = RunContext.create(root / f"work-{fmt}", D, resolve_now(D, None), f"bench-{fmt}")
        c.save()
        ingest(cfg, open_store(store_dir.as_uri()), c, allow_missing=False)
        fetch(spark, cfg, c)
        runs[fmt] = (cfg, c)
    seconds: dict[str, list[float]] = {k: [] for k in runs}
    summaries: dict[str, dict] = {}
    for _ in range(ROUNDS):
        for fmt, (cfg, c) in runs.items():
            for typed in Path(str(c.staged / "items")).glob("replica=*/[cw][oa]*"):
                if fmt != "jsonl" and typed.name in ("copies", "waiting"):
                    shutil.rmtree(typed)  # an adapter's export is mapped every round
            s: dict = {}
            secs, _peak = measure(
                lambda cfg=cfg, c=c, s=s: s.update(r=resolve_stage(spark, cfg, c))
            )
            seconds[fmt].append(secs)
            summaries[fmt] = asdict(s["r"].tables["items"])
    best = {k: min(v) for k, v in seconds.items()}
    return {
        "records": stats["records"],
        "distinct_events": {k: s["distinct_events"] for k, s in summaries.items()},
        "quarantined": {k: sum(s["quarantined"].values()) for k, s in summaries.items()},
        "resolve_s": {k: [round(x, 1) for x in v] for k, v in seconds.items()},
        "ratio_to_jsonl": {k: round(best[k] / best["jsonl"], 2) for k in runs},
    }


def main() -> None:
    sizes = [int(a) for a in sys.argv[1:]] or [1_000_000]
    from pipeline.spark.session import get_spark

    spark = get_spark("local[2]", app="cdr-bench")
    spark.range(1000).selectExpr("sum(id)").collect()  # warm the JVM
    root = Path(tempfile.mkdtemp(prefix="cdr-bench-"))
    try:
        for n in sizes:
            print(json.dumps({"n": n, **bench(n, root, spark)}), flush=True)
            for p in root.iterdir():
                shutil.rmtree(p, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
