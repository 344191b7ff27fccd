"""``cdr demo``: the whole product on one machine, with nothing to set up.

Starts an S3-compatible server on loopback, generates two days of exports for three
replicas and the tables ``products``, ``orders`` and ``accounts``, runs the pipeline for
both days (the second starts from the first one's state), prints what happened and where
the outputs are, and copies the store to ``<dir>/store`` for a look after the server stops.
"""

from __future__ import annotations

import logging
from datetime import date
from pathlib import Path

import yaml

from pipeline import layout
from pipeline.config import load_config
from pipeline.errors import GateError
from pipeline.generate import GenerateOptions, generate
from pipeline.report import format_report
from pipeline.s3server import create_bucket, restore_env, s3_server, use_endpoint
from pipeline.stages import RunOptions, run
from pipeline.store import FileStore, open_store

log = logging.getLogger(__name__)

BUCKET = "cdr-demo"
DATES = (date(2026, 11, 20), date(2026, 11, 21))

DEMO_CONFIG = {
    "store": f"s3://{BUCKET}/prod",
    "replicas": [
        {"id": "us-east", "system_id": 7301},
        {"id": "eu-west", "system_id": 7302},
        {"id": "ap-south", "system_id": 7303},
    ],
    "defaults": {"policy": "postgres"},
    "max_clock_skew_seconds": 300,
    "gc_grace_seconds": 864000,
    "on_divergence": "warn",
    "on_fk_violation": "warn",
    "tables": {
        "products": {
            "key": ["product_no"],
            "columns": {"product_no": "int", "name": "string", "price": "decimal(10,2)"},
        },
        "orders": {
            "key": ["order_id"],
            "columns": {"order_id": "bigint", "product_no": "int", "quantity": "int"},
            "not_null": ["product_no"],
            "foreign_keys": [{"columns": ["product_no"], "references": "products"}],
        },
        "accounts": {
            "key": ["id"],
            "columns": {"id": "bigint", "owner": "string", "balance": "bigint"},
            "unique": [["owner"]],
            "delta": ["balance"],
            "resolvers": {"update_deleted": "latest_timestamp_wins"},
            "defaults": {"owner": "unknown"},
        },
    },
    "cdc": {"enabled": True, "vnodes": 16, "shards": 4, "preimage": True, "postimage": True},
}


def _mirror(src_uri: str, dest: Path) -> None:
    src = open_store(src_uri)
    out = FileStore(dest)
    for key in src.list("published") + src.list("exports") + src.list("base"):
        out.write_bytes(key, src.read_bytes(key))


def demo(workdir: Path, events: int = 30_000, seed: int = 7, serve: bool = False) -> int:
    workdir.mkdir(parents=True, exist_ok=True)
    cfg_path = workdir / "cdr.yaml"
    cfg_path.write_text(yaml.safe_dump(DEMO_CONFIG, sort_keys=False))
    config = load_config(cfg_path)
    assert config.store
    with s3_server() as endpoint:
        previous = use_endpoint(endpoint)
        try:
            print(f"S3-compatible server (moto) on {endpoint}, bucket s3://{BUCKET}")
            create_bucket(BUCKET)
            store = open_store(config.store)
            status = 0
            for i, dt in enumerate(DATES):
                opts = GenerateOptions(
                    events=events, seed=seed + i, base_rows=events // 20 if i == 0 else None
                )
                stats = generate(config, store, dt, opts)
                print(
                    f"\n== {dt}: generated {stats['records']} event records from "
                    f"{len(config.replicas)} replicas in {config.store}/exports"
                )
                try:
                    report = run(config, dt, RunOptions(work_dir=workdir / "work"))
                except GateError as e:
                    print(f"run for {dt} failed its gate: {e}")
                    status = 1
                    break
                print(format_report(report))
                last = report
            copy = workdir / "store"
            _mirror(config.store, copy)
            print(f"\noutputs: {config.store}/published (copied to {copy}/published)")
            print(f"  snapshots:  {copy}/published/<table>/snapshot/ (Delta tables)")
            print(f"  conflicts:  {copy}/published/<table>/conflicts/ (by dt)")
            print(f"  runs:       {copy}/{layout.RUNS}/")
            print(f"  report:     {copy}/{layout.date_report(DATES[-1])}")
            if status == 0:
                docs = layout.validation_dir(DATES[-1], last["run_id"])
                print(f"  Data Docs:  {copy}/{docs}/data_docs/index.html")
            print(f"  CDC log:    {copy}/published/cdc/<table>/log/ (by dt)")
            print(f"  streams:    {copy}/published/cdc/cdc_streams_descriptions/")
            print(f"  config:     {cfg_path}")
            if serve:
                print(f"\nserving {endpoint} (AWS_ENDPOINT_URL_S3={endpoint}); Ctrl-C to stop")
                _wait_forever()
            return status
        finally:
            restore_env(previous)


def _wait_forever() -> None:
    import time

    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
