"""What the tests (and the benchmarks) share: the config builder (``configs``), readers of
what a run published, exports as real tools write them, faults, an isolated Airflow."""

from __future__ import annotations

from pathlib import Path

#: the repository's root
REPO = Path(__file__).resolve().parents[2]
#: the project's own acceptance scenarios (``tests/golden/*.json``)
GOLDEN = REPO / "tests" / "golden"
