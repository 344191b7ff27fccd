"""The row fold's property on Spark (docs/rules.md#the-canonical-order,
docs/rules.md#convergence): with ``insert_exists: skip``, a
generated two-replica insert race is a divergence in the engine's report too, through
``cdr run``. (The properties of the Python fold: tests/unit/test_properties.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.app.cli import main
from pipeline.core.report import RunReport
from tests.helpers import configs
from tests.helpers import published as P
from tests.helpers import scenarios as S
from tests.helpers.fold_helpers import T0

MS = 1000


@pytest.mark.slow
@settings(
    max_examples=2,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    races=st.lists(
        st.tuples(st.integers(0, 100), st.integers(0, 100)),
        min_size=5,
        max_size=30,
        unique_by=lambda t: t,
    )
)
def test_engine_reports_a_generated_insert_race(races, tmp_path_factory, spark):
    """Through ``cdr run`` on Spark: each race key is inserted by pub and by sub, each
    replica exporting its own insert first; under ``insert_exists: skip`` every race key
    is divergent on exactly the replica whose insert lost."""
    tmp = tmp_path_factory.mktemp("race")
    cfg = configs.config(
        configs.table(resolvers={"insert_exists": "skip"}),
        replicas=configs.replicas(pub=7301, sub=7302),
        on_divergence="warn",
        store=tmp / "store",
    )
    exports: dict = {"pub": {"t": []}, "sub": {"t": []}}
    for k, (da, db) in enumerate(races):
        a = {
            "op": "INSERT",
            "key": {"id": k},
            "after": {"id": k, "v": f"pub{k}"},
            "ts": T0 + da * MS,
            "origin": "pub",
            "event_id": f"pub-{k}",
        }
        b = {
            "op": "INSERT",
            "key": {"id": k},
            "after": {"id": k, "v": f"sub{k}"},
            "ts": T0 + db * MS,
            "origin": "sub",
            "event_id": f"sub-{k}",
        }
        exports["pub"]["t"] += [a, b]
        exports["sub"]["t"] += [b, a]
    for rep in exports.values():
        for i, e in enumerate(rep["t"]):
            rep["t"][i] = {**e, "seq": i}
    S.write_exports(tmp / "store", "2026-11-21", exports)
    configs.write(tmp / "cdr.yaml", cfg)
    assert (
        main(
            [
                "run",
                "--config",
                str(tmp / "cdr.yaml"),
                "--date",
                "2026-11-21",
                "--work-dir",
                str(tmp / "work"),
                "--no-data-docs",
            ]
        )
        == 0
    )
    rows = P.log(tmp / "store", "t", "divergence", "2026-11-21")
    got = {(r["replica"], json.loads(r["key"])["id"]) for r in rows}
    # the converged winner is the first insert in canonical order (skip keeps it); the
    # replica that applied the other insert first diverges
    want = set()
    for k, (da, db) in enumerate(races):
        pub_first = (da, 0) < (db, 1)  # pub's tie rank is lower (higher system_id wins ties)
        want.add(("sub" if pub_first else "pub", k))
    assert got == want
    report = RunReport.from_json(
        Path(tmp / "store/published/reports/dt=2026-11-21/run_report.json").read_text()
    )
    assert sum(report.tables["t"].divergent_keys.values()) == len(races)
