"""One night with the replicas' snapshot exports beside their change exports
(``exports/replica=R/table=T/snapshot/dt=D/``): pub's snapshot is the converged one, sub's
is given (the snapshot tests, and the stage tests that need a small run)."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import configs
from tests.helpers import scenarios as S

D = "2026-11-21"
T = 1_795_219_200_000_000  # 2026-11-21T00:00:00Z
S_ = 1_000_000


def setup(tmp: Path, on_divergence: str, sub_snapshot: list[dict]) -> Path:
    """The night's store under ``tmp/store`` (three inserts by pub, exported by both
    replicas; sub's snapshot is ``sub_snapshot``) and its ``cdr.yaml``, whose path it
    returns."""
    store = tmp / "store"
    cfg = configs.config(on_divergence=on_divergence)
    events = [
        {
            "op": "INSERT",
            "key": {"id": k},
            "after": {"id": k, "v": f"v{k}"},
            "ts": T + k * S_,
            "origin": "pub",
            "event_id": f"pub-{k}",
        }
        for k in (1, 2, 3)
    ]
    ex = {rep: {"t": [{**e, "seq": i} for i, e in enumerate(events)]} for rep in ("pub", "sub")}
    S.write_exports(store, D, ex)
    meta = {"table": "t", "dt": D}
    good = [{"id": k, "v": f"v{k}"} for k in (1, 2, 3)]
    S.write_jsonl(
        store / f"exports/replica=pub/table=t/snapshot/dt={D}", good, {**meta, "replica": "pub"}
    )
    S.write_jsonl(
        store / f"exports/replica=sub/table=t/snapshot/dt={D}",
        sub_snapshot,
        {**meta, "replica": "sub"},
    )
    return configs.write(tmp / "cdr.yaml", cfg, store=store)


# sub misses key 1, holds another value for 2, and a row 9 that the converged state lacks
SUB = [{"id": 2, "v": "stale"}, {"id": 3, "v": "v3"}, {"id": 9, "v": "ghost"}]
