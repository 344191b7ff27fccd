"""The storage of ``state`` + ``snapshot`` after ten nights against after the night that
built the table (issue 48's target: at most 1.5×, before any ``OPTIMIZE``), and what each
night took, whole processes.

The table is built as in ``bench/scale.py`` (``cdr generate --base-rows N`` and ``cdr
run`` of the first date); then ten nights of 60K event records each (3 replicas, 2% of
keys contended, skewed, new keys after the table's) are generated and run in date order,
each merged in place. The storage counts every file under the two tables' folders: data
files, deletion vectors, the Delta log and its checkpoints.

    .venv/bin/python bench/storage.py            # 1M rows
    .venv/bin/python bench/storage.py 4000000
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.scale import CDR, D0, NIGHT_RECORDS, build, sh, write_config  # noqa: E402

NIGHTS = 10


def stored_bytes(store: Path, table: str = "items") -> int:
    """Every file of the table's ``state`` and ``snapshot`` folders."""
    folders = [store / "published" / table / kind for kind in ("state", "snapshot")]
    return sum(f.stat().st_size for d in folders for f in d.rglob("*") if f.is_file())


def main() -> None:
    size = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    import os

    env = {**os.environ, "CDR_DRIVER_MEMORY": "6g", "GX_ANALYTICS_ENABLED": "false"}
    tmp = Path(tempfile.mkdtemp(prefix="cdr-storage-"))
    try:
        folder = tmp / "store-folder"
        took = build(size, folder, env)
        store = folder / "store"
        built = stored_bytes(store)
        print(f"built {size:,} rows in {took['run']:.1f} s: {built / 1e6:.1f} MB", flush=True)
        cfg = write_config(folder)
        seconds = []
        for i in range(1, NIGHTS + 1):
            day = (D0 + timedelta(days=i)).isoformat()
            gen = [CDR, "generate", "--config", str(cfg), "--date", day]
            sh([*gen, "--events", str(NIGHT_RECORDS), "--seed", str(i + 1)], env)
            run = [CDR, "run", "--config", str(cfg), "--date", day, "--no-data-docs"]
            seconds.append(round(sh([*run, "--work-dir", str(folder / "work")], env), 1))
            shutil.rmtree(folder / "work")
            now = stored_bytes(store)
            print(
                f"night {i}: {seconds[-1]} s, {now / 1e6:.1f} MB ({now / built:.2f}x)", flush=True
            )
        after = stored_bytes(store)
        print(
            json.dumps(
                {
                    "rows": size,
                    "built_mb": round(built / 1e6, 1),
                    "after_mb": round(after / 1e6, 1),
                    "ratio": round(after / built, 2),
                    "night_seconds": seconds,
                }
            )
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
