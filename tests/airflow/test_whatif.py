"""docs/operations.md#what-if: ``cdr whatif`` and the ``replica_cdr_whatif`` DAG. One generated
night is published under ``postgres``; the same night under a config whose resolvers are
all ``latest_timestamp_wins`` is run for real in a second store, as the reference. The
what-if over the first store reports exactly the keys whose snapshot rows differ between
the two, both runs' conflicts side by side, and publishes nothing."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest

from pipeline.app.cli import main
from tests.helpers import published as P
from tests.helpers.dagrun import dagbag
from tests.helpers.scenarios import write_exports
from tests.unit.test_whatif import REPLICAS, _config

D = "2026-11-21"
LWW = ("insert_exists", "update_differ", "update_deleted", "delete_differ", "pkey_exists")


def _rows(store: Path) -> dict[int, tuple]:
    return {r["id"]: (r["name"], r["qty"]) for r in P.snapshot(store, "items")}


def _night() -> dict:
    """Every replica's export of one night, each holding every event in ts order:
    keys 1 and 5 are updated (a full row) after another replica deleted them, which
    ``postgres`` skips (update_deleted) and ``latest_timestamp_wins`` applies; the other
    keys meet conflicts both policies resolve alike."""

    def ev(op: str, eid: str, key: int, minute: int, origin: str, **after: object) -> dict:
        e = {"op": op, "key": {"id": key}, "ts": f"{D}T10:{minute:02d}:00Z", "origin": origin}
        return {**e, "event_id": eid, **({"after": {"id": key, **after}} if after else {})}

    events = [
        ev("INSERT", "a1", 1, 0, "r1", name="one", qty=1),
        ev("INSERT", "a2", 2, 1, "r1", name="two", qty=2),
        ev("INSERT", "a3", 3, 2, "r1", name="three", qty=3),
        ev("INSERT", "a4", 4, 3, "r1", name="four", qty=4),
        ev("INSERT", "b4", 4, 4, "r2", name="four-b", qty=40),  # insert_exists
        ev("INSERT", "a5", 5, 5, "r1", name="five", qty=5),
        ev("DELETE", "b1", 1, 10, "r2"),
        ev("DELETE", "b3", 3, 11, "r2"),
        ev("DELETE", "b5", 5, 12, "r2"),
        ev("UPDATE", "c1", 1, 20, "r3", name="one-c", qty=10),  # update_deleted
        ev("UPDATE", "c2", 2, 21, "r3", name="two-c", qty=20),  # update_differ
        ev("UPDATE", "c5", 5, 22, "r3", name="five-c", qty=50),  # update_deleted
    ]
    numbered = [{**e, "seq": i} for i, e in enumerate(events, 1)]
    return {r: {"items": numbered} for r in REPLICAS}


def test_whatif_reports_exactly_the_rows_another_policy_changes(
    airflow, tmp_path: Path, monkeypatch, capsys
):
    store, reference = tmp_path / "store", tmp_path / "reference"
    base = _config(tmp_path / "cdr.yaml", store)
    other = {"resolvers": {t: "latest_timestamp_wins" for t in LWW}}
    (tmp_path / "whatif").mkdir()  # the what-if folder beside the main config
    lww = _config(tmp_path / "whatif" / "lww.yaml", store, **other)
    write_exports(store, D, _night())
    shutil.copytree(store / "exports", reference / "exports")
    work = ["--work-dir", str(tmp_path / "w")]
    quick = [*work, "--no-data-docs"]
    assert main(["run", "--config", str(base), "--date", D, *quick]) == 0
    ref = _config(tmp_path / "ref.yaml", reference, **other)
    assert main(["run", "--config", str(ref), "--date", D, *quick]) == 0
    published, expected = _rows(store), _rows(reference)
    differ = sorted(
        k for k in published.keys() | expected.keys() if published.get(k) != expected.get(k)
    )
    assert differ == [1, 5], differ  # the reference run agrees with the night's design
    versions = {
        p: P.table_version(store, p) for p in ("published/runs", "published/items/snapshot")
    }

    capsys.readouterr()
    assert main(["--log-format", "json", "whatif", "--config", str(lww), "--date", D, *work]) == 0
    out = json.loads(capsys.readouterr().out)
    saved = json.loads((store / f"published/reports/dt={D}/whatif/lww.json").read_text())
    assert saved == out and saved["same_exports"] is True
    items = saved["tables"]["items"]
    assert [k["id"] for k in items["differing_rows"]["keys"]] == differ
    assert items["differing_rows"]["count"] == len(differ)
    for s in items["differing_rows"]["sample"]:
        k = s["key"]["id"]
        assert s["published"] is None and k not in published
        assert (s["whatif"]["name"], s["whatif"]["qty"]) == expected[k]
    reports = {n: P.report(root, D) for n, root in (("p", store), ("r", reference))}
    tables = {n: r.tables["items"] for n, r in reports.items() if r is not None}
    assert items["conflicts"] == {
        "published": tables["p"].conflicts,
        "whatif": tables["r"].conflicts,
    }
    assert items["conflicts"]["published"] != items["conflicts"]["whatif"]
    assert items["divergent_keys"]["whatif"] == tables["r"].divergent_keys
    assert items["orphans"] == {"published": 0, "whatif": 0}
    page = (store / f"published/reports/dt={D}/whatif/lww.html").read_text()
    assert f"<b>{len(differ)}</b> differ" in page
    # published nothing: the same runs and snapshot, no run of its own
    assert {p: P.table_version(store, p) for p in versions} == versions
    assert [r["status"] for r in P.runs(store)] == ["published"]

    # the same what-if from the manual DAG's form
    monkeypatch.setenv("CDR_CONFIG", str(base))
    monkeypatch.setenv("CDR_WORK_DIR", str(tmp_path / "w"))
    dag = dagbag().get_dag("replica_cdr_whatif")
    run = dag.test(
        logical_date=datetime(2026, 11, 25, tzinfo=UTC), run_conf={"date": D, "config": "lww"}
    )
    assert {ti.task_id: ti.state for ti in run.get_task_instances()} == {"whatif": "success"}
    again = json.loads((store / f"published/reports/dt={D}/whatif/lww.json").read_text())
    assert again["whatif_run_id"] != saved["whatif_run_id"]
    assert again["tables"]["items"]["differing_rows"] == items["differing_rows"]


def test_the_whatif_form_needs_a_date_and_a_config(airflow):
    from airflow.sdk.definitions.param import ParamsDict

    params: ParamsDict = dagbag().get_dag("replica_cdr_whatif").params
    with pytest.raises(Exception, match=r"date|config|required"):
        params.validate()
    params.update({"date": D, "config": "other"})
    assert params.validate() == {"date": D, "config": "other"}
    with pytest.raises(Exception, match="config"):  # a path: not a name
        params.update({"date": D, "config": "/etc/cdr/other.yaml"})
        params.validate()
