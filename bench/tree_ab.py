"""Two trees of the project, whole ``cdr run`` processes alternated on the same input:
the tree a change starts from (``BASE``: a ``git worktree`` of that commit) against this
one, with this checkout's ``.venv`` (its jars and packages) for both.

- ``whole``: a night of 1M event records on the whole-table path (the resolve bench's
  table, 3 replicas, 20% of keys contended), run again on the same store each time;
- ``inplace``: a night of 60K records merged in place into a table of 1M rows with a
  ``unique`` column (``multiple_unique_conflicts: apply``), each time on a fresh copy of
  the store the first night left.

    git worktree add /tmp/base <commit>
    .venv/bin/python bench/tree_ab.py /tmp/base            # both, 3 rounds
    ROUNDS=2 .venv/bin/python bench/tree_ab.py /tmp/base inplace

Each tree's ``pipeline`` comes first on its processes' ``PYTHONPATH``, and every process
starts in a folder of its own (Spark's Python workers import ``pipeline`` from their
working folder first). Prints each side's seconds per round and the ratio new / base,
best against best.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from tests.helpers import configs  # noqa: E402

CDR = str(ROOT / ".venv" / "bin" / "cdr")
ROUNDS = int(os.environ.get("ROUNDS", "3"))


def _timed(argv: list[str], env: dict[str, str], cwd: Path) -> float:
    t = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
    if done.returncode:
        print(done.stderr[-2000:], file=sys.stderr)
        raise SystemExit(f"{argv[:2]} failed ({done.returncode})")
    return time.perf_counter() - t


def whole(envs: dict[str, dict[str, str]], tmp: Path) -> dict[str, list[float]]:
    from resolve_bench import CONFIG, D

    cfg = tmp / "cdr.yaml"
    cfg.write_text(yaml.safe_dump({**CONFIG, "store": (tmp / "store").as_uri()}))
    gen = [CDR, "generate", "--config", str(cfg), "--date", D.isoformat(), "--events", "1000000"]
    subprocess.run([*gen, "--conflict-rate", "0.2", "--files", "4", "--seed", "11"], check=True)
    run = [CDR, "run", "--config", str(cfg), "--date", D.isoformat(), "--no-data-docs"]
    out: dict[str, list[float]] = {side: [] for side in envs}
    for _ in range(ROUNDS):
        for side, env in envs.items():
            work = ["--work-dir", str(tmp / f"work-{side}")]
            out[side].append(round(_timed([*run, *work], env, tmp), 1))
    return out


def inplace(envs: dict[str, dict[str, str]], tmp: Path) -> dict[str, list[float]]:
    columns = {**configs.ITEMS, "code": "string"}
    table = configs.table(
        columns, unique=[["code"]], resolvers={"multiple_unique_conflicts": "apply"}
    )
    conf = configs.config({"items": table}, replicas=("r1", "r2", "r3"), on_divergence="warn")
    cfg = configs.write(tmp / "cdr.yaml", conf, store=tmp / "store")
    gen = [CDR, "generate", "--config", str(cfg)]
    first = ["--date", "2026-11-20", "--events", "3000", "--base-rows", "1000000", "--seed", "1"]
    subprocess.run([*gen, *first], check=True)
    run = [CDR, "run", "--config", str(cfg), "--no-data-docs", "--work-dir", str(tmp / "w0")]
    _timed([*run, "--date", "2026-11-20"], envs["new"], tmp)
    subprocess.run([*gen, "--date", "2026-11-21", "--events", "60000", "--seed", "2"], check=True)
    out: dict[str, list[float]] = {side: [] for side in envs}
    for i in range(ROUNDS):
        for side, env in envs.items():
            copy = tmp / f"copy-{side}-{i}"
            shutil.copytree(tmp / "store", copy)
            c = configs.write(tmp / f"{side}-{i}.yaml", conf, store=copy)
            night = [CDR, "run", "--config", str(c), "--date", "2026-11-21", "--no-data-docs"]
            night += ["--work-dir", str(tmp / f"w-{side}-{i}")]
            out[side].append(round(_timed(night, env, tmp), 1))
            shutil.rmtree(copy)
    return out


def main() -> None:
    base = Path(sys.argv[1]).resolve()
    which = sys.argv[2] if len(sys.argv) > 2 else "both"
    common = {**os.environ, "CDR_DRIVER_MEMORY": "6g", "GX_ANALYTICS_ENABLED": "false"}
    envs = {
        "base": {**common, "PYTHONPATH": str(base)},
        "new": {**common, "PYTHONPATH": str(ROOT)},
    }
    results = {}
    for name, bench in (("whole", whole), ("inplace", inplace)):
        if which in ("both", name):
            got = bench(envs, Path(tempfile.mkdtemp(prefix=f"cdr-ab-{name}-")))
            results[name] = {**got, "new_over_base": round(min(got["new"]) / min(got["base"]), 3)}
    print(json.dumps(results))


if __name__ == "__main__":
    main()
