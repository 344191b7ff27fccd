"""The policy extensions (the extensions (docs/rules.md, docs/outputs.md#history)) without a
run: ``cdr generate``'s clock
offset names a configured replica, and a divergence's repair on an ``order_by`` table
carries its order value. (Two nights through ``cdr run``: tests/spark/.)"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from pipeline.app.cli import main
from tests.helpers import configs

CONFIG = configs.config(
    {
        "items": configs.table(
            {**configs.ITEMS, "at": "timestamp"},
            order_by="at",
            resolvers={"update_deleted": "latest_timestamp_wins"},
        )
    },
    replicas=("r1", "r2", "r3"),
    priority=["r2", "r3", "r1"],
    on_divergence="warn",
)


def test_a_clock_offset_names_a_configured_replica(tmp_path: Path, capsys):
    cfg = configs.write(tmp_path / "cdr.yaml", CONFIG, store=tmp_path / "s")
    gen = ["generate", "--config", str(cfg), "--date", "2026-11-21", "--clock-offset", "r9=5"]
    assert main(gen) != 0
    assert "'r9=5' is not REPLICA=SECONDS with one of: r1, r2, r3" in capsys.readouterr().err


def test_a_repair_of_an_order_by_table_carries_its_order_value():
    """A divergence's repair mutation is a canonical event record: on an ``order_by`` table
    it carries the order value (an UPDATE's ``after`` even when the value is unchanged, a
    DELETE's ``before``), or replaying it would be quarantined as malformed."""
    from datetime import date

    from pipeline.core.config_load import parse_config
    from pipeline.core.jsonvalues import dumps
    from pipeline.resolve.group_fold import repair_record
    from pipeline.rules.events import Version
    from pipeline.rules.guards import Typer, TypingSpec

    config = parse_config(CONFIG)
    table = config.tables["items"]
    now = 1795392000000000  # 2026-11-23T00:00:00Z
    at = datetime(2026, 11, 22, 10, tzinfo=UTC)
    seen = {"id": 1, "name": "y", "qty": 1, "at": at}
    typer = Typer(TypingSpec.of(config, table, now))
    live = Version({**seen, "name": "x"}, now - 10**9, "r1", "e1", 0)
    tomb = Version({"id": 1, "at": at}, now - 10**9, "r1", "e2", 0, True, now)
    for conv, op, image in ((live, "UPDATE", "after"), (tomb, "DELETE", "before")):
        rec = repair_record(table, "r2", (1,), seen, conv, date(2026, 11, 22), now)
        assert rec["op"] == op and rec[image]["at"] == at, rec
        assert typer.line(dumps(rec), "r2")["reason"] is None, rec
