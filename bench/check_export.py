"""Checking an export without Spark (issue 77): ``cdr check-export`` against ``cdr run``
finding the same broken export, whole processes, alternated.

The exports are ``cdr generate``'s (the resolve bench's table, 10,000 events by default,
two replicas) on a ``file://`` store; one file's sha256 in its manifest is wrong. Both
commands must fail on it, naming the file: ``cdr run`` after its Spark start (the fetch
checks the file in a Spark task), ``cdr check-export`` with no Spark at all. A wrong
``store`` is timed too: ``cdr run`` stops before it writes anything.

    .venv/bin/python bench/check_export.py           # 3 rounds, 10,000 events
    .venv/bin/python bench/check_export.py 5 100000
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).parent))
from resolve_bench import CONFIG, D

ROOT = Path(__file__).resolve().parent.parent
CDR = str(ROOT / ".venv" / "bin" / "cdr")


def failing(argv: list[str], says: str) -> float:
    """Wall seconds of a command that must fail saying ``says``."""
    t = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t
    said = done.stdout + done.stderr
    if done.returncode != 1 or says not in said:
        raise SystemExit(
            f"{argv[1]}: exit {done.returncode}, expected 1 saying {says!r}: {said[-2000:]}"
        )
    return wall


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    events = sys.argv[2] if len(sys.argv) > 2 else "10000"
    tmp = Path(tempfile.mkdtemp(prefix="cdr-check-"))
    cfg = tmp / "cdr.yaml"
    cfg.write_text(yaml.safe_dump({**CONFIG, "store": (tmp / "store").as_uri()}))
    day = D.isoformat()
    gen = [CDR, "generate", "--config", str(cfg), "--date", day, "--events", events]
    subprocess.run(gen, check=True, capture_output=True)
    manifest = next((tmp / "store").rglob("_manifest.json"))
    data = json.loads(manifest.read_text())
    data["files"][0]["sha256"] = "0" * 64
    manifest.write_text(json.dumps(data))
    common = ["--config", str(cfg), "--date", day]
    check = [CDR, "check-export", *common]
    run = [CDR, "run", *common, "--work-dir", str(tmp / "work"), "--no-data-docs"]
    wrong = [*run, "--store", (tmp / "nowhere").as_uri()]
    walls: dict[str, list[float]] = {"check_export": [], "run": [], "run_wrong_store": []}
    for i in range(rounds):
        walls["check_export"].append(failing(check, "sha256 mismatch"))
        walls["run"].append(failing(run, "sha256 mismatch"))
        walls["run_wrong_store"].append(failing(wrong, "is `store` right?"))
        print(json.dumps({"round": i, **{k: round(v[-1], 2) for k, v in walls.items()}}))
    med = {k: statistics.median(v) for k, v in walls.items()}
    ratio = statistics.median(
        c / r for c, r in zip(walls["check_export"], walls["run"], strict=True)
    )
    print(json.dumps({"median_s": {k: round(v, 2) for k, v in med.items()},
                      "check_export_over_run": round(ratio, 3)}))  # fmt: skip


if __name__ == "__main__":
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    main()
